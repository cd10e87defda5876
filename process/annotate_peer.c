/* SPDX-License-Identifier: MIT */
/*
 * process/annotate_peer.c - peer access under a memory checker: once a
 * context gains access to another device's memory (cuCtxEnablePeerAccess,
 * which cudaDeviceEnablePeerAccess calls), that device's segments stop
 * being NVTX heaps and its blocks regions. compute-sanitizer (CUDA 13.0)
 * checks a kernel's access against the regions of its own device only:
 * from a plain program, every word a kernel on device 0 read of a region
 * registered on device 1 was reported as out of bounds, whether the heap
 * was registered on one device or both, and with nvtxMemCudaSetPeerAccess
 * (tests/gpu/probe_nvtx_peer.cu). Left annotated, a program that is clean
 * without libemm would get thousands of reports; unannotated, the device's
 * segments are plain allocations to the tool, as cudaMalloc's are, and only
 * errors inside a segment go unseen. libemm says so once per device.
 * cudart enables peer access through no call libemm sees (race-multidevice:
 * cudaDeviceEnablePeerAccess answered "already enabled" after
 * cudaMemcpyPeer, without libemm too), so once a second device has a
 * segment every device is left unannotated as well (st_annotate_device_used).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "allocator/heap_walk.h"
#include "common/log.h"
#include "process/annotate.h"
#include "process/process_internal.h"
#include "process/process.h"

struct seg_list {
	struct emm_walk_segment *v;
	size_t n, cap;
};

static int collect(void *arg, const struct emm_walk_segment *s)
{
	struct seg_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct emm_walk_segment *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return -1; /* the rest stay annotated */
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = *s;
	return 0;
}

static int skip_block(void *arg, const struct emm_walk_block *b)
{
	(void)arg;
	(void)b;
	return 0;
}

static bool match_ctx(const struct ctx_entry *e, const void *arg)
{
	return e->ctx == (CUcontext)arg;
}

/* The device of `ctx`: the driver's answer, else the registry's; -1. */
static int device_of(CUcontext ctx)
{
	const struct emm_real_driver_table *real = st_real_table();
	struct ctx_entry *e;
	CUdevice dev;
	int ret = -1;

	if (real && real->cuCtxGetDevice_v2 && real->cuCtxGetDevice_v2(&dev, ctx) == CUDA_SUCCESS)
		return dev;
	st_lock(&st_ctx_lock);
	e = st_ctx_find_locked(match_ctx, ctx, false);
	if (e)
		ret = e->device;
	st_unlock(&st_ctx_lock);
	return ret;
}

/* Device `device`'s heaps unregistered: collected under the locks,
 * unregistered after (no NVTX call under a lock). */
static void drop_device(int device)
{
	struct seg_list segs = {NULL, 0, 0};
	struct heap_ref *refs = NULL;
	size_t n = 0;

	if (!atomic_load_explicit(&st_annotate_on, memory_order_relaxed))
		return;
	pthread_rwlock_rdlock(&st_heap_life_lock);
	st_lock(&st_ctx_lock);
	refs = st_snapshot_locked(&n);
	st_unlock(&st_ctx_lock);
	for (size_t i = 0; refs && i < n; i++)
		if (refs[i].device == device && emm_heap_device(refs[i].heap) == device)
			(void)emm_heap_walk(refs[i].heap, collect, skip_block, &segs);
	pthread_rwlock_unlock(&st_heap_life_lock);
	free(refs);
	for (size_t i = 0; i < segs.n; i++)
		st_annotate_heap_drop(segs.v[i].base, segs.v[i].size);
	free(segs.v);
}

void emm_state_peer_access_enabled(CUcontext peer)
{
	int device;

	/* Before the first segment the tool is not probed yet: a tool
	 * injected is enough to remember the device. */
	if (!st_tool_injected || !peer || !st_enabled || st_is_exiting())
		return;
	device = device_of(peer);
	if (device < 0 || !st_annotate_set_device_off(device))
		return;
	emm_warn("annotations: peer access to device %d is enabled: the memory checker does not check a peer's "
	         "access to a region of another device, so device %d's blocks are no longer annotated (errors "
	         "inside its segments go unseen; accesses from other devices are not reported falsely)",
	         device, device);
	drop_device(device);
}

void st_annotate_device_used(int device)
{
	static atomic_uint_fast64_t seen;
	static atomic_bool warned;
	uint_fast64_t bit, prev;

	if (device < 0 || device >= 64)
		return;
	bit = (uint_fast64_t)1 << device;
	if (atomic_load_explicit(&seen, memory_order_relaxed) & bit)
		return;
	prev = atomic_fetch_or(&seen, bit);
	if ((prev & bit) || !(prev & ~bit))
		return;
	/* A second device: the runtime may have enabled peer access
	 * already, through no call libemm sees. */
	if (!atomic_exchange(&warned, true))
		emm_warn("annotations: blocks on several devices (%d is the second): the CUDA runtime enables peer "
		         "access without a call libemm sees (cudaMemcpyPeer did), and the memory checker does not "
		         "check a peer's access to a region of another device, so no device's blocks are annotated "
		         "from here on (errors inside segments go unseen; no access is reported falsely)",
		         device);
	for (int d = 0; d < 64; d++)
		if (((prev | bit) >> d & 1) && st_annotate_set_device_off(d) && d != device)
			drop_device(d);
}
