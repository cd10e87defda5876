/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_peer.c - peer access between contexts
 * (cuDeviceCanAccessPeer, cuCtxEnablePeerAccess, cuCtxDisablePeerAccess)
 * and the peer copies (cuMemcpyPeer, cuMemcpyPeerAsync and their per-thread
 * exports).
 *
 * Every pair of distinct devices can reach each other (an NVLink machine).
 * Access is enabled per (current context, peer context) pair, one way, and
 * ends when either context is destroyed or reset. The codes follow the
 * documented lists in cuda.h (README.md, "Peer access"): enabling twice is
 * CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, disabling what was not enabled
 * CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, the current context as its own peer
 * or an unknown one CUDA_ERROR_INVALID_CONTEXT, flags other than 0
 * CUDA_ERROR_INVALID_VALUE, a peer on the same device (which
 * cuDeviceCanAccessPeer answers 0 for) CUDA_ERROR_PEER_ACCESS_UNSUPPORTED.
 * Peer copies need no peer access (the real driver stages them); the
 * asynchronous one copies at once, as the fake has no copy engine.
 */
#include "fake.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

struct peer_link {
	struct fake_ctx *from, *to;
};

static struct peer_link *links;
static size_t nlinks, caplinks;

static struct peer_link *link_find_locked(struct fake_ctx *from, struct fake_ctx *to)
{
	for (size_t i = 0; i < nlinks; i++)
		if (links[i].from == from && links[i].to == to)
			return &links[i];
	return NULL;
}

void fake_peer_drop_ctx_locked(struct fake_ctx *ctx)
{
	for (size_t i = 0; i < nlinks;) {
		if (links[i].from == ctx || links[i].to == ctx)
			links[i] = links[--nlinks];
		else
			i++;
	}
}

void fake_peer_reset_locked(void)
{
	free(links);
	links = NULL;
	nlinks = caplinks = 0;
}

FAKE_API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
	FAKE_ENTER(cuDeviceCanAccessPeer);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!fake_device_valid(dev) || !fake_device_valid(peerDev)))
		r = CUDA_ERROR_INVALID_DEVICE;
	else if (r == CUDA_SUCCESS && !canAccessPeer)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS)
		*canAccessPeer = dev != peerDev;
	fake_unlock();
	return r;
}

/* The current context and a live peer context, or the documented error. */
static CUresult peer_args_locked(CUcontext peer, struct fake_ctx **cur, struct fake_ctx **other)
{
	CUresult r = fake_current_ctx_locked(cur);
	if (r != CUDA_SUCCESS)
		return r == CUDA_ERROR_CONTEXT_IS_DESTROYED ? r : CUDA_ERROR_INVALID_CONTEXT;
	*other = fake_ctx_lookup_locked(peer);
	if (!*other || (*other)->destroyed || !(*other)->alive)
		return CUDA_ERROR_INVALID_CONTEXT;
	/* Its own context: the real driver answers "unsupported" (measured on
	 * two H200, driver 580). */
	if (*other == *cur)
		return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
	return CUDA_SUCCESS;
}

/* compute-sanitizer drops the NVTX regions of a device's heaps once
 * another device gains access to its memory (a later unregister of one is
 * refused: tests/gpu/probe_nvtx_unreg.cu, case peer10). The fake tool
 * (tests/shims/fake_nvtx_tool.c), when loaded, is told the same. */
static void tell_tool(int device)
{
	const char *path = getenv("NVTX_INJECTION64_PATH");
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;
	void (*fn)(int) = h ? (void (*)(int))dlsym(h, "fake_nvtx_peer_access") : NULL;

	if (fn)
		fn(device);
	if (h)
		dlclose(h);
}

FAKE_API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
	FAKE_ENTER(cuCtxEnablePeerAccess);
	fake_lock();
	struct fake_ctx *cur = NULL, *peer = NULL;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS)
		r = peer_args_locked(peerContext, &cur, &peer);
	if (r == CUDA_SUCCESS && Flags != 0)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && cur->device == peer->device)
		r = CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
	if (r == CUDA_SUCCESS && link_find_locked(cur, peer))
		r = CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
	if (r == CUDA_SUCCESS && nlinks == caplinks) {
		size_t cap = caplinks ? caplinks * 2 : 8;
		struct peer_link *n = realloc(links, cap * sizeof(*n));
		if (n) {
			links = n;
			caplinks = cap;
		} else {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	int peer_device = -1;
	if (r == CUDA_SUCCESS) {
		links[nlinks++] = (struct peer_link){cur, peer};
		peer_device = peer->device;
	}
	fake_unlock();
	if (peer_device >= 0)
		tell_tool(peer_device);
	return r;
}

FAKE_API CUresult cuCtxDisablePeerAccess(CUcontext peerContext)
{
	FAKE_ENTER(cuCtxDisablePeerAccess);
	fake_lock();
	struct fake_ctx *cur = NULL, *peer = NULL;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS)
		r = peer_args_locked(peerContext, &cur, &peer);
	if (r == CUDA_SUCCESS) {
		struct peer_link *l = link_find_locked(cur, peer);
		if (!l)
			r = CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
		else
			*l = links[--nlinks];
	}
	fake_unlock();
	return r;
}

/* --- peer copies --- */

/* hs: NULL for the synchronous copy; any stream argument otherwise. */
static CUresult copy_peer(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, bool async,
			  CUstream hs, bool per_thread)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	bool captured = false;
	/* The contexts are not checked: with unified addressing the real
	 * driver copies by address (a NULL context: CUDA_SUCCESS, measured on
	 * two H200, driver 580). */
	(void)dctx;
	(void)sctx;
	if (r == CUDA_SUCCESS && async) {
		struct fake_stream *s;
		r = fake_stream_resolve_locked(hs, per_thread, &s);
		if (r == CUDA_SUCCESS)
			r = fake_stream_op_locked(s, &captured);
	}
	if (r == CUDA_SUCCESS && n > 0) {
		if (!fake_mem_device_range_locked((uintptr_t)dst, n) || !fake_mem_device_range_locked((uintptr_t)src, n))
			r = CUDA_ERROR_INVALID_VALUE;
		else if (!captured) /* a captured copy is a graph node the fake does not replay */
			memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
			       CUcontext srcContext, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyPeer);
	return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, false, NULL, false);
}

FAKE_API CUresult cuMemcpyPeer_ptds(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				    CUcontext srcContext, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyPeer_ptds);
	return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, false, NULL, true);
}

FAKE_API CUresult cuMemcpyPeerAsync(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
				    CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	FAKE_ENTER(cuMemcpyPeerAsync);
	return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, true, hStream, false);
}

FAKE_API CUresult cuMemcpyPeerAsync_ptsz(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
					 CUcontext srcContext, size_t ByteCount, CUstream hStream)
{
	FAKE_ENTER(cuMemcpyPeerAsync_ptsz);
	return copy_peer(dstDevice, dstContext, srcDevice, srcContext, ByteCount, true, hStream, true);
}
