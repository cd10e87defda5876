/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_mem.c - memory: device, stream-ordered, pitched,
 * managed and pinned host allocations, host registration, copies and sets,
 * pointer queries, legacy IPC.
 *
 * Every allocation, registration and IPC mapping is one entry in a range
 * tree (glibc tsearch, keyed by [base, base + size)), so interior pointers
 * resolve to their allocation. Memory is mmap'd with MAP_NORESERVE, page
 * aligned (the driver promises 256 bytes). Synchronous device allocations
 * are mapped from one sparse memfd at file offset == address, so an IPC
 * handle (pid, fd, offset) opens in another process as the same bytes.
 * Allocations from an explicit pool (fake_pool.c) carry their pool, which
 * does their capacity accounting.
 */
#include "fake.h"

#include <fcntl.h>
#include <limits.h>
#include <search.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_32BIT
#define MAP_32BIT 0
#endif

enum alloc_kind {
	ALLOC_DEVICE,     /* cuMemAlloc_v2, cuMemAllocPitch_v2 */
	ALLOC_DEVICE_V1,  /* cuMemAlloc, cuMemAllocPitch: below 4 GiB */
	ALLOC_ASYNC,      /* cuMemAllocAsync */
	ALLOC_MANAGED,    /* cuMemAllocManaged */
	ALLOC_HOST,       /* cuMemAllocHost, cuMemHostAlloc */
	ALLOC_REGISTERED, /* cuMemHostRegister: the caller's memory */
	ALLOC_IPC,        /* cuIpcOpenMemHandle: another process's allocation */
};

struct alloc {
	struct alloc *prev, *next;     /* all_allocs */
	uintptr_t base;
	size_t size;                   /* as requested (pitch * height) */
	size_t map_size;               /* bytes mapped (0: not ours to unmap) */
	size_t accounted;              /* bytes against the device capacity */
	enum alloc_kind kind;
	bool shared;                   /* mapped from the memfd arena */
	struct fake_ctx *ctx;
	int device;
	unsigned flags;
	uint64_t buffer_id;
	/* ALLOC_IPC */
	int ipc_pid;
	uint64_t ipc_buffer_id;
	unsigned ipc_refs;
	/* ALLOC_ASYNC from an explicit pool: the pool accounts pool_bytes */
	struct fake_pool *pool;
	size_t pool_bytes;
};

static void *tree;
static struct alloc *all_allocs;
static uint64_t next_buffer_id;
static int arena_fd = -2;          /* -2: not tried, -1: unavailable */

/* --- the range tree --- */

static int range_cmp(const void *a, const void *b)
{
	const struct alloc *x = a, *y = b;
	uintptr_t xe = x->base + (x->size ? x->size : 1);
	uintptr_t ye = y->base + (y->size ? y->size : 1);
	if (xe <= y->base)
		return -1;
	if (ye <= x->base)
		return 1;
	return 0;
}

/* The entry containing [p, p + len) or overlapping it. */
static struct alloc *range_find(uintptr_t p, size_t len)
{
	struct alloc key = {.base = p, .size = len};
	void *hit = tfind(&key, &tree, range_cmp);
	return hit ? *(struct alloc **)hit : NULL;
}

static struct alloc *find(uintptr_t p)
{
	return p ? range_find(p, 1) : NULL;
}

static bool is_device_kind(enum alloc_kind k)
{
	return k == ALLOC_DEVICE || k == ALLOC_DEVICE_V1 || k == ALLOC_ASYNC || k == ALLOC_MANAGED;
}

static bool is_host_kind(enum alloc_kind k)
{
	return k == ALLOC_HOST || k == ALLOC_REGISTERED;
}

static bool insert_locked(struct alloc *a)
{
	if (!tsearch(a, &tree, range_cmp))
		return false;
	a->next = all_allocs;
	if (a->next)
		a->next->prev = a;
	all_allocs = a;
	if (is_device_kind(a->kind))
		g_fake.stats.live_device_allocations++;
	else if (is_host_kind(a->kind))
		g_fake.stats.live_host_allocations++;
	return true;
}

/* --- mapping --- */

static size_t page_size(void)
{
	static size_t ps;
	if (!ps)
		ps = (size_t)sysconf(_SC_PAGESIZE);
	return ps;
}

static int arena_locked(void)
{
	if (arena_fd == -2) {
		arena_fd = memfd_create("fakecuda-device-memory", MFD_CLOEXEC);
		/* File offset == virtual address, so the file spans the user
		 * address space; tmpfs keeps it sparse. */
		if (arena_fd >= 0 && ftruncate(arena_fd, (off_t)1 << 47) != 0) {
			close(arena_fd);
			arena_fd = -1;
		}
		if (arena_fd < 0)
			arena_fd = -1;
	}
	return arena_fd;
}

/* Maps `size` bytes (rounded to pages) of zeroed read-write memory. */
static void *map_memory_locked(size_t size, bool low32, bool shared, size_t *map_size, bool *is_shared)
{
	size_t ps = page_size();
	if (size > SIZE_MAX - ps)
		return NULL;
	size_t len = (size + ps - 1) & ~(ps - 1);
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | (low32 ? MAP_32BIT : 0);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	if (low32 && (uintptr_t)p + len > UINT32_MAX) {
		munmap(p, len);
		return NULL;
	}
	*is_shared = false;
	if (shared && arena_locked() >= 0) {
		void *q = mmap(p, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, arena_fd,
			       (off_t)(uintptr_t)p);
		if (q == p)
			*is_shared = true;
		else if (q == MAP_FAILED)
			*is_shared = false; /* p is still the private mapping */
	}
	*map_size = len;
	return p;
}

static void unmap_memory(struct alloc *a)
{
	if (!a->map_size)
		return;
	if (a->shared)
		fallocate(arena_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)a->base,
			  (off_t)a->map_size);
	munmap((void *)a->base, a->map_size);
}

static void remove_locked(struct alloc *a)
{
	tdelete(a, &tree, range_cmp);
	if (a->prev)
		a->prev->next = a->next;
	else
		all_allocs = a->next;
	if (a->next)
		a->next->prev = a->prev;
	if (is_device_kind(a->kind)) {
		g_fake.stats.live_device_allocations--;
		g_fake.used[a->device] -= a->accounted;
		if (a->pool)
			fake_pool_give_locked(a->pool, a->pool_bytes);
	} else if (is_host_kind(a->kind)) {
		g_fake.stats.live_host_allocations--;
	}
	unmap_memory(a);
	free(a);
}

void fake_mem_drop_ctx_locked(struct fake_ctx *ctx)
{
	for (struct alloc *a = all_allocs, *n; a; a = n) {
		n = a->next;
		/* Stream-ordered allocations belong to the device's pool, not
		 * the context (cuCtxDestroy leaves them). */
		if (a->ctx == ctx && a->kind != ALLOC_ASYNC)
			remove_locked(a);
	}
}

void fake_mem_after_fork_child_locked(void)
{
	for (struct alloc *a = all_allocs; a; a = a->next)
		a->shared = false;
	if (arena_fd >= 0)
		close(arena_fd);
	arena_fd = -2;
}

void fake_mem_reset_locked(void)
{
	while (all_allocs)
		remove_locked(all_allocs);
	tree = NULL;
}

/* --- allocation --- */

static size_t account_size(size_t size)
{
	return (size + FAKE_ALIGN - 1) & ~(size_t)(FAKE_ALIGN - 1);
}

static CUresult alloc_map_locked(enum alloc_kind kind, struct fake_ctx *ctx, size_t size, unsigned flags,
				 size_t accounted, struct alloc **out);

/* A new allocation of `size` bytes on ctx's device. Device kinds count
 * against the simulated capacity and honour fakecuda_fail_next_alloc. */
static CUresult alloc_new_locked(enum alloc_kind kind, struct fake_ctx *ctx, size_t size, unsigned flags,
				 struct alloc **out)
{
	int dev = ctx->device;
	size_t accounted = 0;
	if (kind != ALLOC_HOST && kind != ALLOC_MANAGED) {
		if (g_fake.fail_allocs > 0) {
			g_fake.fail_allocs--;
			g_fake.stats.failures_injected++;
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
		if (size > SIZE_MAX - FAKE_ALIGN)
			return CUDA_ERROR_OUT_OF_MEMORY;
		accounted = account_size(size);
		if (accounted > g_fake.capacity || g_fake.used[dev] > g_fake.capacity - accounted)
			return CUDA_ERROR_OUT_OF_MEMORY;
	} else if (kind == ALLOC_MANAGED && g_fake.fail_allocs > 0) {
		g_fake.fail_allocs--;
		g_fake.stats.failures_injected++;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	return alloc_map_locked(kind, ctx, size, flags, accounted, out);
}

/* Maps and records an allocation whose checks are done; `accounted` bytes
 * count against the device capacity. */
static CUresult alloc_map_locked(enum alloc_kind kind, struct fake_ctx *ctx, size_t size, unsigned flags,
				 size_t accounted, struct alloc **out)
{
	int dev = ctx->device;
	struct alloc *a = calloc(1, sizeof(*a));
	if (!a)
		return CUDA_ERROR_OUT_OF_MEMORY;
	bool shared = false;
	void *p = map_memory_locked(size, kind == ALLOC_DEVICE_V1,
				    kind == ALLOC_DEVICE || kind == ALLOC_DEVICE_V1, &a->map_size, &shared);
	if (!p) {
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->base = (uintptr_t)p;
	a->size = size;
	a->shared = shared;
	a->accounted = accounted;
	a->kind = kind;
	a->ctx = ctx;
	a->device = dev;
	a->flags = flags;
	a->buffer_id = ++next_buffer_id;
	if (!insert_locked(a)) {
		unmap_memory(a);
		free(a);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	g_fake.used[dev] += accounted;
	if (kind != ALLOC_HOST)
		g_fake.stats.device_allocs++;
	else
		g_fake.stats.host_allocs++;
	*out = a;
	return CUDA_SUCCESS;
}

/* Which contexts a memory call accepts: the calls that come in a 32-bit
 * and a _v2 form take only contexts of their own ABI; the others take any. */
enum call_abi { ABI_ANY, ABI_V1, ABI_V2 };

static CUresult current_ctx_for_locked(struct fake_ctx **ctx, enum call_abi abi)
{
	if (abi == ABI_ANY)
		return fake_current_ctx_locked(ctx);
	return fake_current_ctx_abi_locked(ctx, abi == ABI_V1);
}

/* The checks every synchronous allocation and free makes first: cuInit,
 * a current context the call accepts, and no stream capture that forbids
 * it. */
static CUresult sync_call_prologue_locked(struct fake_ctx **ctx, enum call_abi abi)
{
	CUresult r = current_ctx_for_locked(ctx, abi);
	if (r != CUDA_SUCCESS)
		return r;
	return fake_capture_check_unsafe_locked();
}

static enum call_abi abi_of(enum alloc_kind kind)
{
	return kind == ALLOC_DEVICE_V1 ? ABI_V1 : ABI_V2;
}

static CUresult mem_alloc(CUdeviceptr *dptr, size_t size, enum alloc_kind kind)
{
	fake_lock();
	struct fake_ctx *ctx;
	struct alloc *a = NULL;
	CUresult r = sync_call_prologue_locked(&ctx, abi_of(kind));
	if (r == CUDA_SUCCESS && (!dptr || size == 0))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		r = alloc_new_locked(kind, ctx, size, 0, &a);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)a->base;
	fake_unlock();
	return r;
}

/* The private export table's allocation (fake_procaddr.c): cuMemAlloc_v2's
 * memory, reached through no exported entry point. */
CUresult fake_mem_private_alloc(CUdeviceptr *dptr, size_t bytesize)
{
	return mem_alloc(dptr, bytesize, ALLOC_DEVICE);
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	FAKE_ENTER(cuMemAlloc_v2);
	return mem_alloc(dptr, bytesize, ALLOC_DEVICE);
}

/* The CUDA 2.0 ABI: 32-bit sizes and pointers, only in a context made by
 * cuCtxCreate (v1). The fake maps such memory below 4 GiB so that the
 * pointer fits. */
FAKE_API CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
	FAKE_ENTER(cuMemAlloc);
	CUdeviceptr p = 0;
	CUresult r = mem_alloc(dptr ? &p : NULL, bytesize, ALLOC_DEVICE_V1);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr_v1)p;
	return r;
}

static CUresult mem_alloc_pitch(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned elem,
				enum alloc_kind kind)
{
	fake_lock();
	struct fake_ctx *ctx;
	struct alloc *a = NULL;
	CUresult r = sync_call_prologue_locked(&ctx, abi_of(kind));
	if (r == CUDA_SUCCESS && (!dptr || !pitch || width == 0 || height == 0 ||
				  (elem != 4 && elem != 8 && elem != 16)))
		r = CUDA_ERROR_INVALID_VALUE;
	size_t p = 0;
	if (r == CUDA_SUCCESS) {
		if (width > SIZE_MAX - FAKE_PITCH_ALIGN)
			r = CUDA_ERROR_OUT_OF_MEMORY;
		p = (width + FAKE_PITCH_ALIGN - 1) & ~(size_t)(FAKE_PITCH_ALIGN - 1);
		if (r == CUDA_SUCCESS && height > SIZE_MAX / p)
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (r == CUDA_SUCCESS)
		r = alloc_new_locked(kind, ctx, p * height, 0, &a);
	if (r == CUDA_SUCCESS) {
		*dptr = (CUdeviceptr)a->base;
		*pitch = p;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
				     unsigned int ElementSizeBytes)
{
	FAKE_ENTER(cuMemAllocPitch_v2);
	return mem_alloc_pitch(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes, ALLOC_DEVICE);
}

FAKE_API CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
				  unsigned int Height, unsigned int ElementSizeBytes)
{
	FAKE_ENTER(cuMemAllocPitch);
	CUdeviceptr p = 0;
	size_t pitch = 0;
	CUresult r = mem_alloc_pitch(dptr ? &p : NULL, pPitch ? &pitch : NULL, WidthInBytes, Height,
				     ElementSizeBytes, ALLOC_DEVICE_V1);
	if (r == CUDA_SUCCESS) {
		*dptr = (CUdeviceptr_v1)p;
		*pPitch = (unsigned int)pitch;
	}
	return r;
}

/* cuMemFree: a synchronous free waits for the whole device first, as the
 * real one does (memory from cuMemAllocAsync excepted). cuMemFree_v2(0)
 * succeeds even without a context; the v1 call checks the context first. */
static CUresult mem_free(uintptr_t p, enum call_abi abi)
{
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && abi == ABI_V1)
		r = current_ctx_for_locked(&ctx, abi);
	if (r == CUDA_SUCCESS && p != 0)
		r = sync_call_prologue_locked(&ctx, abi);
	if (r == CUDA_SUCCESS && p != 0) {
		struct alloc *a = find(p);
		if (!a || a->base != p || !is_device_kind(a->kind)) {
			r = CUDA_ERROR_INVALID_VALUE;
		} else {
			if (a->kind != ALLOC_ASYNC)
				fake_device_sync_locked(a->device);
			g_fake.stats.device_frees++;
			remove_locked(a);
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	FAKE_ENTER(cuMemFree_v2);
	return mem_free((uintptr_t)dptr, ABI_V2);
}

FAKE_API CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
	FAKE_ENTER(cuMemFree);
	return mem_free((uintptr_t)dptr, ABI_V1);
}

/* --- stream-ordered allocation --- */

/* A stream-ordered call: on a capturing stream it becomes a graph node; on
 * any other stream it is one of the calls a capture forbids. */
static CUresult stream_ordered_prologue_locked(CUstream hs, bool ptds, struct fake_stream **s, bool *captured)
{
	CUresult r = fake_stream_resolve_locked(hs, ptds, s);
	if (r == CUDA_SUCCESS)
		r = fake_stream_op_locked(*s, captured);
	if (r == CUDA_SUCCESS && !*captured)
		r = fake_capture_check_unsafe_locked();
	return r;
}

/* From an explicit pool (fake_pool.c): checks are done; the pool takes the
 * bytes from the device capacity (or from what it keeps reserved). */
static CUresult alloc_from_pool_locked(struct fake_ctx *ctx, struct fake_pool *pool, size_t size,
				       struct alloc **out)
{
	if (g_fake.fail_allocs > 0) {
		g_fake.fail_allocs--;
		g_fake.stats.failures_injected++;
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (size > SIZE_MAX - FAKE_ALIGN)
		return CUDA_ERROR_OUT_OF_MEMORY;
	size_t bytes = account_size(size);
	CUresult r = fake_pool_take_locked(pool, bytes);
	if (r != CUDA_SUCCESS)
		return r;
	r = alloc_map_locked(ALLOC_ASYNC, ctx, size, 0, 0, out);
	if (r != CUDA_SUCCESS) {
		fake_pool_give_locked(pool, bytes);
		return r;
	}
	(*out)->pool = pool;
	(*out)->pool_bytes = bytes;
	return CUDA_SUCCESS;
}

/* cuMemAllocAsync (explicit false: the device's current pool) and
 * cuMemAllocFromPoolAsync (explicit true: hpool). */
CUresult fake_mem_alloc_async(CUdeviceptr *dptr, size_t size, CUstream hs, bool ptds, bool explicit,
			      CUmemoryPool hpool)
{
	fake_lock();
	struct fake_stream *s = NULL;
	struct fake_pool *pool = NULL;
	struct alloc *a = NULL;
	bool captured = false;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !dptr)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && explicit)
		r = fake_pool_lookup_locked(hpool, &pool);
	if (r == CUDA_SUCCESS)
		r = stream_ordered_prologue_locked(hs, ptds, &s, &captured);
	if (r == CUDA_SUCCESS && !explicit)
		pool = fake_pool_current_locked(s->ctx->device);
	if (r == CUDA_SUCCESS && size == 0) {
		*dptr = 0; /* nothing to allocate */
		fake_unlock();
		return CUDA_SUCCESS;
	}
	/* Captured, it is a graph allocation node; the fake maps the memory
	 * at once either way. */
	if (r == CUDA_SUCCESS && pool)
		r = alloc_from_pool_locked(s->ctx, pool, size, &a);
	else if (r == CUDA_SUCCESS)
		r = alloc_new_locked(ALLOC_ASYNC, s->ctx, size, 0, &a);
	if (r == CUDA_SUCCESS) {
		g_fake.stats.async_allocs++;
		*dptr = (CUdeviceptr)a->base;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	FAKE_ENTER(cuMemAllocAsync);
	return fake_mem_alloc_async(dptr, bytesize, hStream, false, false, NULL);
}

FAKE_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	FAKE_ENTER(cuMemAllocAsync_ptsz);
	return fake_mem_alloc_async(dptr, bytesize, hStream, true, false, NULL);
}

static CUresult mem_free_async(CUdeviceptr p, CUstream hs, bool ptds)
{
	fake_lock();
	struct fake_stream *s = NULL;
	bool captured = false;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS)
		r = stream_ordered_prologue_locked(hs, ptds, &s, &captured);
	if (r == CUDA_SUCCESS && p == 0) {
		fake_unlock();
		return CUDA_SUCCESS;
	}
	struct alloc *a = NULL;
	if (r == CUDA_SUCCESS) {
		a = find((uintptr_t)p);
		if (!a || a->base != (uintptr_t)p || !is_device_kind(a->kind))
			r = CUDA_ERROR_INVALID_VALUE;
	}
	if (r == CUDA_SUCCESS && captured) {
		/* A graph free node: the memory goes when the graph runs. */
		struct fake_graph *g = fake_stream_capture_graph(s);
		struct fake_deferred_free *f = malloc(sizeof(*f));
		if (!f) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			f->ptr = p;
			f->next = g->frees;
			g->frees = f;
		}
	} else if (r == CUDA_SUCCESS) {
		g_fake.stats.async_frees++;
		g_fake.stats.device_frees++;
		remove_locked(a);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	FAKE_ENTER(cuMemFreeAsync);
	return mem_free_async(dptr, hStream, false);
}

FAKE_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	FAKE_ENTER(cuMemFreeAsync_ptsz);
	return mem_free_async(dptr, hStream, true);
}

void fake_mem_free_deferred_locked(CUdeviceptr p)
{
	struct alloc *a = find((uintptr_t)p);
	if (a && a->base == (uintptr_t)p && is_device_kind(a->kind)) {
		g_fake.stats.async_frees++;
		g_fake.stats.device_frees++;
		remove_locked(a);
	}
}

/* --- managed memory --- */

FAKE_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	FAKE_ENTER(cuMemAllocManaged);
	fake_lock();
	struct fake_ctx *ctx;
	struct alloc *a = NULL;
	CUresult r = sync_call_prologue_locked(&ctx, ABI_ANY);
	if (r == CUDA_SUCCESS &&
	    (!dptr || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		r = alloc_new_locked(ALLOC_MANAGED, ctx, bytesize, flags, &a);
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)a->base;
	fake_unlock();
	return r;
}

/* --- pinned host memory and registration --- */

static CUresult host_alloc(void **pp, size_t size, unsigned flags, enum call_abi abi)
{
	const unsigned known = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
	fake_lock();
	struct fake_ctx *ctx;
	struct alloc *a = NULL;
	CUresult r = sync_call_prologue_locked(&ctx, abi);
	if (r == CUDA_SUCCESS && (!pp || (flags & ~known)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && size == 0) {
		/* The driver hands out no memory for 0 bytes. */
		*pp = NULL;
		fake_unlock();
		return CUDA_SUCCESS;
	}
	if (r == CUDA_SUCCESS)
		r = alloc_new_locked(ALLOC_HOST, ctx, size, flags, &a);
	if (r == CUDA_SUCCESS)
		*pp = (void *)a->base;
	fake_unlock();
	return r;
}

CUresult fake_mem_private_host_alloc(void **pp, size_t bytesize)
{
	return host_alloc(pp, bytesize, 0, ABI_V2);
}

FAKE_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	FAKE_ENTER(cuMemAllocHost_v2);
	return host_alloc(pp, bytesize, 0, ABI_V2);
}

FAKE_API CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
	FAKE_ENTER(cuMemAllocHost);
	return host_alloc(pp, bytesize, 0, ABI_V1);
}

FAKE_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	FAKE_ENTER(cuMemHostAlloc);
	return host_alloc(pp, bytesize, Flags, ABI_ANY);
}

FAKE_API CUresult cuMemFreeHost(void *p)
{
	FAKE_ENTER(cuMemFreeHost);
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && p)
		r = sync_call_prologue_locked(&ctx, ABI_ANY);
	if (r == CUDA_SUCCESS && p) {
		struct alloc *a = find((uintptr_t)p);
		if (!a || a->base != (uintptr_t)p || a->kind != ALLOC_HOST) {
			r = CUDA_ERROR_INVALID_VALUE;
		} else {
			fake_device_sync_locked(a->device);
			g_fake.stats.host_frees++;
			remove_locked(a);
		}
	}
	fake_unlock();
	return r;
}

static CUresult host_register(void *p, size_t size, unsigned flags)
{
	const unsigned known = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
			       CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY;
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = sync_call_prologue_locked(&ctx, ABI_ANY);
	if (r == CUDA_SUCCESS && (!p || size == 0 || (flags & ~known) || (uintptr_t)p > UINTPTR_MAX - size))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && range_find((uintptr_t)p, size))
		r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
	if (r == CUDA_SUCCESS) {
		struct alloc *a = calloc(1, sizeof(*a));
		if (!a) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			a->base = (uintptr_t)p;
			a->size = size;
			a->kind = ALLOC_REGISTERED;
			a->ctx = ctx;
			a->device = ctx->device;
			a->flags = flags;
			a->buffer_id = ++next_buffer_id;
			if (!insert_locked(a)) {
				free(a);
				r = CUDA_ERROR_OUT_OF_MEMORY;
			} else {
				g_fake.stats.host_registers++;
			}
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	FAKE_ENTER(cuMemHostRegister_v2);
	return host_register(p, bytesize, Flags);
}

FAKE_API CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
	FAKE_ENTER(cuMemHostRegister);
	return host_register(p, bytesize, Flags);
}

FAKE_API CUresult cuMemHostUnregister(void *p)
{
	FAKE_ENTER(cuMemHostUnregister);
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = sync_call_prologue_locked(&ctx, ABI_ANY);
	if (r == CUDA_SUCCESS && !p)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find((uintptr_t)p);
		if (a && a->kind == ALLOC_REGISTERED && a->base != (uintptr_t)p) {
			r = CUDA_ERROR_INVALID_VALUE; /* inside a registration */
		} else if (!a || a->kind != ALLOC_REGISTERED) {
			r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
		} else {
			g_fake.stats.host_unregisters++;
			remove_locked(a);
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
	FAKE_ENTER(cuMemHostGetDevicePointer_v2);
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = fake_current_ctx_locked(&ctx);
	if (r == CUDA_SUCCESS && (!pdptr || !p || Flags != 0))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find((uintptr_t)p);
		if (!a || !is_host_kind(a->kind))
			r = CUDA_ERROR_INVALID_VALUE;
		else
			*pdptr = (CUdeviceptr)(uintptr_t)p;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
	FAKE_ENTER(cuMemHostGetFlags);
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = fake_current_ctx_locked(&ctx);
	if (r == CUDA_SUCCESS && (!pFlags || !p))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find((uintptr_t)p);
		if (!a || a->kind != ALLOC_HOST)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			*pFlags = a->flags;
	}
	fake_unlock();
	return r;
}

/* --- information --- */

/* Either output may be NULL. */
static CUresult mem_get_info(size_t *freep, size_t *totalp, enum call_abi abi)
{
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = current_ctx_for_locked(&ctx, abi);
	if (r == CUDA_SUCCESS) {
		size_t used = g_fake.used[ctx->device];
		if (totalp)
			*totalp = g_fake.capacity;
		if (freep)
			*freep = used < g_fake.capacity ? g_fake.capacity - used : 0;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
	FAKE_ENTER(cuMemGetInfo_v2);
	return mem_get_info(free, total, ABI_V2);
}

FAKE_API CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
	FAKE_ENTER(cuMemGetInfo);
	size_t f = 0, t = 0;
	CUresult r = mem_get_info(&f, &t, ABI_V1);
	if (r == CUDA_SUCCESS && free)
		*free = f > UINT_MAX ? UINT_MAX : (unsigned int)f;
	if (r == CUDA_SUCCESS && total)
		*total = t > UINT_MAX ? UINT_MAX : (unsigned int)t;
	return r;
}

/* Device memory of every kind and pinned host memory have a range;
 * registered host memory has none. */
static CUresult address_range(uintptr_t p, uintptr_t *base, size_t *size, enum call_abi abi)
{
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = current_ctx_for_locked(&ctx, abi);
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find(p);
		if (!a || a->kind == ALLOC_REGISTERED) {
			r = CUDA_ERROR_NOT_FOUND;
		} else {
			if (base)
				*base = a->base;
			if (size)
				*size = a->size;
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	FAKE_ENTER(cuMemGetAddressRange_v2);
	uintptr_t base = 0;
	CUresult r = address_range((uintptr_t)dptr, &base, psize, ABI_V2);
	if (r == CUDA_SUCCESS && pbase)
		*pbase = (CUdeviceptr)base;
	return r;
}

FAKE_API CUresult cuMemGetAddressRange(CUdeviceptr_v1 *pbase, unsigned int *psize, CUdeviceptr_v1 dptr)
{
	FAKE_ENTER(cuMemGetAddressRange);
	uintptr_t base = 0;
	size_t size = 0;
	CUresult r = address_range((uintptr_t)dptr, &base, &size, ABI_V1);
	if (r == CUDA_SUCCESS) {
		if (pbase)
			*pbase = (CUdeviceptr_v1)base;
		if (psize)
			*psize = size > UINT_MAX ? UINT_MAX : (unsigned int)size;
	}
	return r;
}

/* One attribute of a known allocation `a` (or of an unknown pointer when a
 * is NULL: the defaults cuPointerGetAttributes reports). */
static CUresult pointer_attribute(const struct alloc *a, uintptr_t p, CUpointer_attribute attr, void *data,
				  bool defaults)
{
	bool host = a && is_host_kind(a->kind);
	bool dev = a && !host;
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = a ? (CUcontext)a->ctx : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : dev ? CU_MEMORYTYPE_DEVICE : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = a ? (CUdeviceptr)p : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_HOST_POINTER:
		/* Memory CUDA does not know is host memory at its own address. */
		if (a && !host && a->kind != ALLOC_MANAGED) {
			if (!defaults)
				return CUDA_ERROR_INVALID_VALUE;
			*(void **)data = NULL;
			return CUDA_SUCCESS;
		}
		*(void **)data = (void *)p;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
		*(int *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_BUFFER_ID:
	case CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID:
		*(unsigned long long *)data = a ? a->buffer_id : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_MANAGED:
		*(unsigned int *)data = a && a->kind == ALLOC_MANAGED;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = a ? a->device : -2;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = a && (a->kind == ALLOC_DEVICE || a->kind == ALLOC_DEVICE_V1);
		return CUDA_SUCCESS;
	/* An unknown pointer leaves the range attributes alone. */
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
	case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR:
		if (a)
			*(CUdeviceptr *)data = (CUdeviceptr)a->base;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		if (a)
			*(size_t *)data = a->size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPING_SIZE:
		if (a)
			*(size_t *)data = a->map_size ? a->map_size : a->size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = a != NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
		*(unsigned long long *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
		*(int *)data = dev;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
		*(int *)data = a ? CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
		*(CUmemoryPool *)data =
			a && a->kind == ALLOC_ASYNC ? fake_pool_handle_locked(a->pool, a->device) : NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE:
		*(int *)data = 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_P2P_TOKENS:
		return CUDA_ERROR_NOT_SUPPORTED;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

FAKE_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	FAKE_ENTER(cuPointerGetAttribute);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !data)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find((uintptr_t)ptr);
		if (!a) {
			r = fake_vmm_pointer_attribute_locked((uintptr_t)ptr, attribute, data);
			if (r == CUDA_ERROR_NOT_FOUND)
				r = CUDA_ERROR_INVALID_VALUE;
		} else
			r = pointer_attribute(a, (uintptr_t)ptr, attribute, data, false);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes, void **data,
					 CUdeviceptr ptr)
{
	FAKE_ENTER(cuPointerGetAttributes);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (numAttributes == 0 || !attributes || !data))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find((uintptr_t)ptr);
		for (unsigned i = 0; i < numAttributes && r == CUDA_SUCCESS; i++) {
			if (!data[i])
				r = CUDA_ERROR_INVALID_VALUE;
			else if (attributes[i] == CU_POINTER_ATTRIBUTE_P2P_TOKENS ||
				 attributes[i] == CU_POINTER_ATTRIBUTE_ACCESS_FLAGS)
				r = CUDA_ERROR_INVALID_VALUE; /* not in the supported list */
			else
				r = pointer_attribute(a, (uintptr_t)ptr, attributes[i], data[i], true);
		}
	}
	fake_unlock();
	return r;
}

/* --- copies and sets --- */

/* A device-side range [p, p + n): inside one allocation of any kind the
 * device can reach. */
static bool device_range_ok(uintptr_t p, size_t n)
{
	const struct alloc *a = find(p);
	if (!a) /* mapped VMM memory is device memory too */
		return fake_vmm_mapped_range_locked(p, n);
	return n <= a->size - (p - a->base);
}

bool fake_mem_device_range_locked(uintptr_t p, size_t n)
{
	return device_range_ok(p, n);
}

/* A pointer cuMemcpy may take: inside an allocation with room for n bytes,
 * or any other non-NULL address (host memory, as unified addressing has
 * it). */
static bool any_range_ok(uintptr_t p, size_t n)
{
	if (!p)
		return false;
	return find(p) ? device_range_ok(p, n) : true;
}

/* Synchronous copies and sets run on the legacy stream (per-thread for the
 * _ptds entry points): refused while that would touch a capture. */
static CUresult sync_op_prologue_locked(bool ptds)
{
	struct fake_stream *s;
	CUresult r = fake_stream_resolve_locked(NULL, ptds, &s);
	if (r != CUDA_SUCCESS)
		return r;
	r = fake_capture_check_stream_use_locked(s, true);
	if (r != CUDA_SUCCESS)
		return r;
	return fake_capture_check_unsafe_locked();
}

enum copy_kind { COPY_HTOD, COPY_DTOH, COPY_DTOD, COPY_ANY };

static CUresult copy(uintptr_t dst, uintptr_t src, size_t n, enum copy_kind kind, bool ptds)
{
	fake_lock();
	CUresult r = sync_op_prologue_locked(ptds);
	if (r == CUDA_SUCCESS && n > 0) {
		bool ok;
		switch (kind) {
		case COPY_HTOD: ok = src && device_range_ok(dst, n); break;
		case COPY_DTOH: ok = dst && device_range_ok(src, n); break;
		case COPY_DTOD: ok = device_range_ok(dst, n) && device_range_ok(src, n); break;
		default: ok = any_range_ok(dst, n) && any_range_ok(src, n); break;
		}
		if (!ok)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			memmove((void *)dst, (const void *)src, n);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyHtoD_v2);
	return copy((uintptr_t)dstDevice, (uintptr_t)srcHost, ByteCount, COPY_HTOD, false);
}

FAKE_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyHtoD_v2_ptds);
	return copy((uintptr_t)dstDevice, (uintptr_t)srcHost, ByteCount, COPY_HTOD, true);
}

FAKE_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyDtoH_v2);
	return copy((uintptr_t)dstHost, (uintptr_t)srcDevice, ByteCount, COPY_DTOH, false);
}

FAKE_API CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyDtoH_v2_ptds);
	return copy((uintptr_t)dstHost, (uintptr_t)srcDevice, ByteCount, COPY_DTOH, true);
}

FAKE_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyDtoD_v2);
	return copy((uintptr_t)dstDevice, (uintptr_t)srcDevice, ByteCount, COPY_DTOD, false);
}

FAKE_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpyDtoD_v2_ptds);
	return copy((uintptr_t)dstDevice, (uintptr_t)srcDevice, ByteCount, COPY_DTOD, true);
}

FAKE_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpy);
	return copy((uintptr_t)dst, (uintptr_t)src, ByteCount, COPY_ANY, false);
}

FAKE_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount)
{
	FAKE_ENTER(cuMemcpy_ptds);
	return copy((uintptr_t)dst, (uintptr_t)src, ByteCount, COPY_ANY, true);
}

static CUresult memset8(uintptr_t dst, unsigned char uc, size_t n, bool ptds)
{
	fake_lock();
	CUresult r = sync_op_prologue_locked(ptds);
	if (r == CUDA_SUCCESS && n > 0) {
		if (!device_range_ok(dst, n))
			r = CUDA_ERROR_INVALID_VALUE;
		else
			memset((void *)dst, uc, n);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	FAKE_ENTER(cuMemsetD8_v2);
	return memset8((uintptr_t)dstDevice, uc, N, false);
}

FAKE_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
	FAKE_ENTER(cuMemsetD8_v2_ptds);
	return memset8((uintptr_t)dstDevice, uc, N, true);
}

/* Stream-ordered: on a capturing stream a graph node (nothing runs), else
 * at once (the fake's streams complete their work when it is enqueued). */
static CUresult memset8_async(uintptr_t dst, unsigned char uc, size_t n, CUstream h, bool ptds)
{
	struct fake_stream *s;
	bool captured = false;

	fake_lock();
	CUresult r = fake_stream_resolve_locked(h, ptds, &s);
	if (r == CUDA_SUCCESS)
		r = fake_stream_op_locked(s, &captured);
	if (r == CUDA_SUCCESS && n > 0 && !device_range_ok(dst, n))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && n > 0 && !captured)
		memset((void *)dst, uc, n);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	FAKE_ENTER(cuMemsetD8Async);
	return memset8_async((uintptr_t)dstDevice, uc, N, hStream, false);
}

FAKE_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
	FAKE_ENTER(cuMemsetD8Async_ptsz);
	return memset8_async((uintptr_t)dstDevice, uc, N, hStream, true);
}

/* --- legacy IPC --- */

struct ipc_handle {
	char magic[8];
	int32_t pid;
	int32_t fd;
	uint64_t base;                 /* exporter's address == arena file offset */
	uint64_t size;
	uint64_t map_size;
	uint64_t buffer_id;
	int32_t device;
	char pad[CU_IPC_HANDLE_SIZE - 52];
};
_Static_assert(sizeof(struct ipc_handle) == CU_IPC_HANDLE_SIZE, "IPC handle size");

static const char ipc_magic[8] = "FAKEIPC1";

FAKE_API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	FAKE_ENTER(cuIpcGetMemHandle);
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = fake_current_ctx_locked(&ctx);
	if (r == CUDA_SUCCESS && !pHandle)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find((uintptr_t)dptr);
		if (!a || (a->kind != ALLOC_DEVICE && a->kind != ALLOC_DEVICE_V1)) {
			r = CUDA_ERROR_INVALID_VALUE;
		} else if (!a->shared) {
			r = CUDA_ERROR_NOT_SUPPORTED; /* no memfd on this system */
		} else {
			struct ipc_handle h;
			memset(&h, 0, sizeof(h));
			memcpy(h.magic, ipc_magic, sizeof(h.magic));
			h.pid = (int32_t)getpid();
			h.fd = arena_fd;
			h.base = a->base;
			h.size = a->size;
			h.map_size = a->map_size;
			h.buffer_id = a->buffer_id;
			h.device = a->device;
			memcpy(pHandle, &h, sizeof(h));
		}
	}
	fake_unlock();
	return r;
}

static CUresult ipc_open(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = fake_current_ctx_locked(&ctx);
	struct ipc_handle h;
	memcpy(&h, &handle, sizeof(h));
	if (r == CUDA_SUCCESS && (!pdptr || (flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && memcmp(h.magic, ipc_magic, sizeof(h.magic)) != 0)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && h.pid == (int32_t)getpid())
		r = CUDA_ERROR_INVALID_CONTEXT; /* the exporting process itself */
	if (r == CUDA_SUCCESS) {
		for (struct alloc *a = all_allocs; a; a = a->next) {
			if (a->kind == ALLOC_IPC && a->ipc_pid == h.pid && a->ipc_buffer_id == h.buffer_id) {
				a->ipc_refs++;
				*pdptr = (CUdeviceptr)a->base;
				fake_unlock();
				return CUDA_SUCCESS;
			}
		}
	}
	if (r == CUDA_SUCCESS) {
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
		int fd = open(path, O_RDWR | O_CLOEXEC);
		void *p = MAP_FAILED;
		if (fd >= 0) {
			p = mmap(NULL, (size_t)h.map_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd,
				 (off_t)h.base);
			close(fd);
		}
		struct alloc *a = p != MAP_FAILED ? calloc(1, sizeof(*a)) : NULL;
		if (!a) {
			if (p != MAP_FAILED)
				munmap(p, (size_t)h.map_size);
			r = fd < 0 ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_MAP_FAILED;
		} else {
			a->base = (uintptr_t)p;
			a->size = (size_t)h.size;
			a->map_size = (size_t)h.map_size;
			a->kind = ALLOC_IPC;
			a->ctx = ctx;
			a->device = ctx->device;
			a->buffer_id = ++next_buffer_id;
			a->ipc_pid = h.pid;
			a->ipc_buffer_id = h.buffer_id;
			a->ipc_refs = 1;
			if (!insert_locked(a)) {
				munmap(p, a->map_size);
				free(a);
				r = CUDA_ERROR_OUT_OF_MEMORY;
			} else {
				*pdptr = (CUdeviceptr)a->base;
			}
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	FAKE_ENTER(cuIpcOpenMemHandle_v2);
	return ipc_open(pdptr, handle, Flags);
}

FAKE_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	FAKE_ENTER(cuIpcOpenMemHandle);
	return ipc_open(pdptr, handle, Flags);
}

FAKE_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	FAKE_ENTER(cuIpcCloseMemHandle);
	fake_lock();
	struct fake_ctx *ctx;
	CUresult r = fake_current_ctx_locked(&ctx);
	if (r == CUDA_SUCCESS) {
		struct alloc *a = find((uintptr_t)dptr);
		if (!a || a->base != (uintptr_t)dptr || a->kind != ALLOC_IPC)
			r = CUDA_ERROR_INVALID_VALUE;
		else if (--a->ipc_refs == 0)
			remove_locked(a);
	}
	fake_unlock();
	return r;
}
