/* SPDX-License-Identifier: MIT */
/*
 * allocator/backends/async.c - the "async" backend: segments from a private
 * CUDA memory pool (stream-ordered allocator), one pool per context libemm
 * serves. cuMemPoolCreate on the context's device with the release threshold
 * at UINT64_MAX, so the pool keeps what libemm gives back instead of
 * returning it to the device at every synchronisation; segments come from
 * cuMemAllocFromPoolAsync on the stream libemm names (0: the legacy stream)
 * and go back with cuMemFreeAsync; mem_info is cuMemGetInfo_v2; trim is
 * cuMemPoolTrimTo; fini destroys the pool (driver alive) or forgets it.
 *
 * One file, two builds, as driver.c: libemm-backend-async.so exports only
 * emm_backend_get; with -DEMM_BACKEND_BUILTIN the entry is the hidden
 * emm_backend_builtin_async. Driver functions come only from
 * host->driver_proc (libemm intercepts the exported names).
 *
 * Reuse and streams. cuMemFreeAsync(seg, S) makes the pool consider the
 * memory free at S's current point: an allocation on S may get it back at
 * once (stream order covers it); an allocation on another stream gets it
 * only once the driver knows the free has executed, or, with the pool's
 * default REUSE_ALLOW_INTERNAL_DEPENDENCIES, by making that stream wait for
 * S at that point. Either way the pool never hands memory to new work
 * before the work ordered before the free on S. libemm frees a segment only
 * when it is idle and fenced (no block in use, every GPU use of it known
 * complete) and passes stream 0, so the free is on the legacy stream:
 *   - there is no data hazard: nothing that touched the segment can still be
 *     running, whichever stream the free is ordered on, and the pool is
 *     private, so nothing but libemm's own fenced segments ever returns
 *     memory to it;
 *   - the one cost is ordering: until the legacy stream reaches the free (it
 *     waits for earlier work of every blocking stream), the pool either
 *     grows instead of reusing the bytes or makes the next allocating stream
 *     wait for the legacy stream. Segment frees are rare (libemm caches), so
 *     that is accepted rather than synchronising here.
 * An allocation on stream S is formally usable on S only, until other
 * streams synchronise with S; libemm hands blocks of a segment to any
 * stream. Memory the private pool returns has no earlier GPU user that is
 * still running (above), so that cross-stream use reads and writes nothing
 * another piece of work still owns; the driver maps new pool memory before
 * cuMemAllocFromPoolAsync returns.
 *
 * Stream capture. A stream-ordered allocation on a capturing stream would be
 * a graph node (memory valid only while the graph runs), and one on the
 * legacy stream while a blocking stream captures is refused (and invalidates
 * that capture). So when cuStreamIsCapturing says the stream libemm named
 * captures (or cannot say), the backend uses a private non-blocking stream
 * of its own instead, and synchronises it after an allocation so the
 * segment is usable from every stream at once. As with cuMemAlloc under
 * the driver backend, a capture in global mode refuses the call.
 *
 * The backend keeps a list of its live segments: fini with the driver alive
 * frees what is left, then destroys the pool (a pool with allocations out
 * would otherwise live on until they are freed).
 *
 * A context destroyed by the program (cuCtxDestroy, a primary context
 * reset, cudaDeviceReset) before libemm gave its segments back: the driver
 * frees the context's own memory with it, but a pool belongs to the device
 * and outlives the context, and so would its segments (still freeable by
 * the program, and still counted as used). fini is then called with
 * driver_alive false (the context is gone) and does what the driver did for
 * the driver backend's segments: frees what is left and destroys the pool,
 * through a live context of the device (the current one, else the
 * primary context if active, retained for the time, else a context the
 * backend creates and destroys for it: a reset primary context is not
 * brought back behind the program's back), so the memory goes back and a
 * later free of an old pointer gets the driver's own error. A driver that
 * no longer answers (cuCtxGetCurrent fails) gets no further call.
 *
 * Limits: pooled memory counts as used in cuMemGetInfo (and for every other
 * process) until trim; segments cannot be exported with cuIpcGetMemHandle
 * (no IPC cap).
 */
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/backends/backend_util.h"
#include "emm/emm_backend.h"

#ifdef EMM_BACKEND_BUILTIN
#include "allocator/backend_loader.h"
#define ASYNC_ENTRY emm_backend_builtin_async
#else
#define ASYNC_ENTRY emm_backend_get
__attribute__((visibility("default"))) int emm_backend_get(uint32_t *inout_version,
                                                           const struct emm_backend **ret_table);
#endif

typedef CUresult (*pool_create_fn)(CUmemoryPool *pool, const CUmemPoolProps *props);
typedef CUresult (*pool_destroy_fn)(CUmemoryPool pool);
typedef CUresult (*pool_set_attribute_fn)(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
typedef CUresult (*pool_trim_to_fn)(CUmemoryPool pool, size_t keep);
typedef CUresult (*alloc_from_pool_fn)(CUdeviceptr *dptr, size_t size, CUmemoryPool pool, CUstream stream);
typedef CUresult (*free_async_fn)(CUdeviceptr dptr, CUstream stream);
typedef CUresult (*mem_get_info_fn)(size_t *free, size_t *total);
typedef CUresult (*device_get_attribute_fn)(int *value, CUdevice_attribute attr, CUdevice dev);
typedef CUresult (*stream_is_capturing_fn)(CUstream stream, CUstreamCaptureStatus *status);
typedef CUresult (*stream_create_fn)(CUstream *stream, unsigned int flags);
typedef CUresult (*stream_synchronize_fn)(CUstream stream);
typedef CUresult (*stream_destroy_fn)(CUstream stream);

struct async_state {
	const struct emm_backend_host *host;
	int device;
	CUmemoryPool pool;
	pool_destroy_fn pool_destroy;
	pool_trim_to_fn pool_trim_to; /* NULL: no trim */
	alloc_from_pool_fn alloc_from_pool;
	free_async_fn free_async;
	mem_get_info_fn mem_get_info;
	/* The capture detour (all NULL when the driver lacks one of them). */
	stream_is_capturing_fn stream_is_capturing;
	stream_create_fn stream_create;
	stream_synchronize_fn stream_synchronize;
	stream_destroy_fn stream_destroy;
	pthread_mutex_t lock;	  /* guards own_stream's creation and segs */
	CUstream own_stream;	  /* NULL until first needed */
	/* Live segments, so that fini can free what is left before it
	 * destroys the pool (a pool with allocations out is only released
	 * once they are freed). */
	uint64_t *segs;
	size_t nsegs, segs_cap;
};

#define async_log emm_bk_log

/* Out of memory is -ENOMEM (the allocator releases cache and retries), a
 * device without pools -ENOTSUP, everything else -EIO. */
static int async_error(const struct emm_backend_host *host, int device, const char *what, size_t size,
                       CUresult res)
{
	return emm_bk_error(host, EMM_BACKEND_LOG_DEBUG, "async", device, what, size, res);
}

static void *proc(const struct emm_backend_host *host, const char *name)
{
	return host->driver_proc ? host->driver_proc(name) : NULL;
}

/* 0, or -ENOTSUP when the device says it has no memory pools. An attribute
 * the driver cannot answer is no verdict: cuMemPoolCreate decides. */
static int check_pools_supported(const struct emm_backend_host *host, int device)
{
	device_get_attribute_fn get_attribute;
	int supported = 1;

	*(void **)&get_attribute = proc(host, "cuDeviceGetAttribute");
	if (get_attribute &&
	    get_attribute(&supported, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, (CUdevice)device) ==
	        CUDA_SUCCESS &&
	    !supported) {
		async_log(host, EMM_BACKEND_LOG_WARNING,
		          "async backend: device %d does not support memory pools", device);
		return -ENOTSUP;
	}
	return 0;
}

/* The private pool on `device`, keeping everything given back to it. */
static int create_pool(struct async_state *st, pool_create_fn pool_create, pool_set_attribute_fn set_attribute)
{
	CUmemPoolProps props;
	cuuint64_t threshold = UINT64_MAX;
	CUmemoryPool pool = NULL;
	CUresult res;

	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = st->device;
	res = pool_create(&pool, &props);
	if (res != CUDA_SUCCESS) {
		async_log(st->host, EMM_BACKEND_LOG_WARNING,
		          "async backend: cuMemPoolCreate on device %d failed with CUresult %d", st->device,
		          (int)res);
		return async_error(st->host, st->device, "cuMemPoolCreate", 0, res);
	}
	res = set_attribute ? set_attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold)
	                    : CUDA_ERROR_NOT_FOUND;
	if (res != CUDA_SUCCESS)
		async_log(st->host, EMM_BACKEND_LOG_WARNING,
		          "async backend: cannot set the release threshold of the pool on device %d (CUresult "
		          "%d): it returns memory to the device at each synchronisation",
		          st->device, (int)res);
	st->pool = pool;
	return 0;
}

static int async_init(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state)
{
	pool_create_fn pool_create;
	pool_set_attribute_fn set_attribute;
	struct async_state *st;
	const char *missing = NULL;
	int err;

	if (!host || !ret_state)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->host = host;
	st->device = device;
	*(void **)&pool_create = proc(host, "cuMemPoolCreate");
	*(void **)&set_attribute = proc(host, "cuMemPoolSetAttribute");
	*(void **)&st->pool_destroy = proc(host, "cuMemPoolDestroy");
	*(void **)&st->pool_trim_to = proc(host, "cuMemPoolTrimTo");
	*(void **)&st->alloc_from_pool = proc(host, "cuMemAllocFromPoolAsync");
	*(void **)&st->free_async = proc(host, "cuMemFreeAsync");
	*(void **)&st->mem_get_info = proc(host, "cuMemGetInfo_v2");
	*(void **)&st->stream_is_capturing = proc(host, "cuStreamIsCapturing");
	*(void **)&st->stream_create = proc(host, "cuStreamCreate");
	*(void **)&st->stream_synchronize = proc(host, "cuStreamSynchronize");
	*(void **)&st->stream_destroy = proc(host, "cuStreamDestroy_v2");
	if (!pool_create)
		missing = "cuMemPoolCreate";
	else if (!st->pool_destroy)
		missing = "cuMemPoolDestroy";
	else if (!st->alloc_from_pool)
		missing = "cuMemAllocFromPoolAsync";
	else if (!st->free_async)
		missing = "cuMemFreeAsync";
	else if (!st->mem_get_info)
		missing = "cuMemGetInfo_v2";
	if (missing) {
		async_log(host, EMM_BACKEND_LOG_ERROR, "async backend: the driver lacks %s", missing);
		free(st);
		return -ENOENT;
	}
	if (!st->stream_is_capturing || !st->stream_create || !st->stream_synchronize || !st->stream_destroy) {
		st->stream_is_capturing = NULL;
		st->stream_create = NULL;
		st->stream_synchronize = NULL;
		st->stream_destroy = NULL;
	}
	err = check_pools_supported(host, device);
	if (err == 0)
		err = create_pool(st, pool_create, set_attribute);
	if (err < 0) {
		free(st);
		return err;
	}
	pthread_mutex_init(&st->lock, NULL);
	async_log(host, EMM_BACKEND_LOG_DEBUG, "async backend: device %d, context 0x%llx, pool %p", device,
	          (unsigned long long)context, (void *)st->pool);
	*ret_state = st;
	return 0;
}

/* Frees the segments left on the legacy stream of the current context,
 * which is a live one of st's device, and waits for the frees, so that the
 * pool has the bytes back; a segment whose free fails stays listed. Then,
 * with none left, destroys the pool (its memory goes back to the device).
 * True when the pool was destroyed. */
static bool release_here(struct async_state *st)
{
	size_t kept = 0, freed = 0;
	CUresult res;

	for (size_t i = 0; i < st->nsegs; i++) {
		if (st->free_async((CUdeviceptr)st->segs[i], NULL) == CUDA_SUCCESS)
			freed++;
		else
			st->segs[kept++] = st->segs[i];
	}
	st->nsegs = kept;
	if (freed && st->stream_synchronize)
		(void)st->stream_synchronize(NULL);
	if (kept)
		return false;
	res = st->pool_destroy(st->pool);
	if (res != CUDA_SUCCESS)
		async_log(st->host, EMM_BACKEND_LOG_DEBUG,
		          "async backend: cuMemPoolDestroy on device %d failed with CUresult %d", st->device, (int)res);
	return true;
}

/* The context calls fini needs after the context went (NULL: missing). */
struct ctx_calls {
	CUresult (*get_current)(CUcontext *ctx);
	CUresult (*get_device)(CUdevice *dev);
	CUresult (*push)(CUcontext ctx);
	CUresult (*pop)(CUcontext *ctx);
	CUresult (*primary_state)(CUdevice dev, unsigned int *flags, int *active);
	CUresult (*primary_retain)(CUcontext *ctx, CUdevice dev);
	CUresult (*primary_release)(CUdevice dev);
	CUresult (*create)(CUcontext *ctx, unsigned int flags, CUdevice dev);
	/* Where a driver has no cuCtxCreate_v2 any more: */
	CUresult (*create_v4)(CUcontext *ctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev);
	CUresult (*destroy)(CUcontext ctx);
};

static void ctx_calls_get(const struct emm_backend_host *host, struct ctx_calls *c)
{
	*(void **)&c->get_current = proc(host, "cuCtxGetCurrent");
	*(void **)&c->get_device = proc(host, "cuCtxGetDevice");
	*(void **)&c->push = proc(host, "cuCtxPushCurrent_v2");
	*(void **)&c->pop = proc(host, "cuCtxPopCurrent_v2");
	*(void **)&c->primary_state = proc(host, "cuDevicePrimaryCtxGetState");
	*(void **)&c->primary_retain = proc(host, "cuDevicePrimaryCtxRetain");
	*(void **)&c->primary_release = proc(host, "cuDevicePrimaryCtxRelease_v2");
	*(void **)&c->create = proc(host, "cuCtxCreate_v2");
	*(void **)&c->create_v4 = proc(host, "cuCtxCreate_v4");
	*(void **)&c->destroy = proc(host, "cuCtxDestroy_v2");
}

static bool primary_active(const struct async_state *st, const struct ctx_calls *c)
{
	unsigned int flags = 0;
	int active = 0;

	return c->primary_state && c->primary_state((CUdevice)st->device, &flags, &active) == CUDA_SUCCESS &&
	       active;
}

/* Through the device's primary context if it is active (retaining an
 * active one only counts; an inactive one is left so: a reset primary
 * context stays reset until the program retains it). */
static bool release_in_primary(struct async_state *st, const struct ctx_calls *c)
{
	CUdevice dev = (CUdevice)st->device;
	CUcontext primary = NULL, popped = NULL;
	bool done = false;

	if (!c->push || !c->pop || !c->primary_retain || !c->primary_release || !primary_active(st, c) ||
	    c->primary_retain(&primary, dev) != CUDA_SUCCESS)
		return false;
	if (c->push(primary) == CUDA_SUCCESS) {
		done = release_here(st);
		(void)c->pop(&popped);
	}
	(void)c->primary_release(dev);
	return done;
}

/* Through a context of the backend's own, made current for the time and
 * destroyed (which makes the one before it current again). */
static bool release_in_own_context(struct async_state *st, const struct ctx_calls *c)
{
	CUcontext own = NULL;
	CUresult res = CUDA_ERROR_NOT_FOUND;
	bool done;

	if (!c->destroy)
		return false;
	if (c->create)
		res = c->create(&own, 0, (CUdevice)st->device);
	else if (c->create_v4)
		res = c->create_v4(&own, NULL, 0, (CUdevice)st->device);
	if (res != CUDA_SUCCESS)
		return false;
	done = release_here(st);
	(void)c->destroy(own);
	return done;
}

/* fini after the context went (see the top): the pool and the segments
 * left in it are released through a live context of the device: the
 * current one, else the active primary context, else one made for it.
 * Nothing is called once the driver stops answering. */
static void release_after_context(struct async_state *st)
{
	struct ctx_calls c;
	CUcontext cur = NULL;
	CUdevice dev = -1;

	ctx_calls_get(st->host, &c);
	if (!c.get_current || c.get_current(&cur) != CUDA_SUCCESS)
		return; /* the driver is gone */
	/* A reset primary context stays current (cudaDeviceReset, a primary
	 * reset): while the device's primary is inactive the current context
	 * may be that dead one, whose calls fail (and a memory checker reports
	 * each): a context of our own is used instead. */
	if (cur && c.get_device && c.get_device(&dev) == CUDA_SUCCESS && dev == st->device &&
	    primary_active(st, &c) && release_here(st))
		return;
	if (release_in_primary(st, &c) || release_in_own_context(st, &c))
		return;
	async_log(st->host, EMM_BACKEND_LOG_WARNING,
	          "async backend: the pool of a destroyed context on device %d could not be released (%zu "
	          "segments left): its memory stays with the device",
	          st->device, st->nsegs);
}

static void async_fini(void *state, bool driver_alive)
{
	struct async_state *st = state;

	if (!st)
		return;
	if (driver_alive) {
		/* The context goes: what libemm did not give back goes too,
		 * as the context's memory would under the driver backend. */
		if (st->own_stream)
			(void)st->stream_destroy(st->own_stream);
		for (size_t i = 0; i < st->nsegs; i++)
			(void)st->free_async((CUdeviceptr)st->segs[i], NULL);
		st->nsegs = 0;
		(void)release_here(st);
	} else {
		/* The context is gone, its own stream with it. */
		release_after_context(st);
	}
	pthread_mutex_destroy(&st->lock);
	free(st->segs);
	free(st);
}

/* True when `stream` must not carry the pool call: it captures, or the
 * driver cannot tell (the legacy stream while a blocking stream captures
 * answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). */
static bool stream_unusable(const struct async_state *st, CUstream stream)
{
	CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;

	if (!st->stream_is_capturing)
		return false;
	return st->stream_is_capturing(stream, &status) != CUDA_SUCCESS ||
	       status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* The backend's own non-blocking stream, created on first use. */
static int own_stream(struct async_state *st, CUstream *ret)
{
	CUresult res = CUDA_SUCCESS;

	if (!st->stream_create)
		return -ENOTSUP;
	pthread_mutex_lock(&st->lock);
	if (!st->own_stream)
		res = st->stream_create(&st->own_stream, CU_STREAM_NON_BLOCKING);
	if (res != CUDA_SUCCESS)
		st->own_stream = NULL;
	*ret = st->own_stream;
	pthread_mutex_unlock(&st->lock);
	if (res != CUDA_SUCCESS)
		return async_error(st->host, st->device, "cuStreamCreate", 0, res);
	return 0;
}

/* Remember a new segment: false without memory. */
static bool segs_add(struct async_state *st, uint64_t addr)
{
	bool ok = true;

	pthread_mutex_lock(&st->lock);
	if (st->nsegs == st->segs_cap) {
		size_t cap = st->segs_cap ? st->segs_cap * 2 : 64;
		uint64_t *n = realloc(st->segs, cap * sizeof(*n));

		if (n) {
			st->segs = n;
			st->segs_cap = cap;
		} else {
			ok = false;
		}
	}
	if (ok)
		st->segs[st->nsegs++] = addr;
	pthread_mutex_unlock(&st->lock);
	return ok;
}

/* Forget a segment: false if it is not one of ours. */
static bool segs_remove(struct async_state *st, uint64_t addr)
{
	bool found = false;

	pthread_mutex_lock(&st->lock);
	for (size_t i = st->nsegs; i-- > 0;) {
		if (st->segs[i] == addr) {
			st->segs[i] = st->segs[--st->nsegs];
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&st->lock);
	return found;
}

static int async_segment_alloc(void *state, size_t size, uint64_t stream, uint64_t *ret_addr)
{
	struct async_state *st = state;
	CUstream s = (CUstream)(uintptr_t)stream;
	bool detour;
	CUdeviceptr dptr = 0;
	CUresult res;
	int err;

	if (size == 0 || !ret_addr)
		return -EINVAL;
	detour = stream_unusable(st, s);
	if (detour) {
		err = own_stream(st, &s);
		if (err < 0)
			return err;
	}
	res = st->alloc_from_pool(&dptr, size, st->pool, s);
	if (res != CUDA_SUCCESS)
		return async_error(st->host, st->device, "cuMemAllocFromPoolAsync", size, res);
	if (detour) {
		/* Usable from every stream (the capturing one too) once the
		 * private stream has passed the allocation. */
		res = st->stream_synchronize(s);
		if (res != CUDA_SUCCESS) {
			(void)st->free_async(dptr, s);
			return async_error(st->host, st->device, "cuStreamSynchronize", size, res);
		}
	}
	if (!segs_add(st, (uint64_t)dptr)) {
		(void)st->free_async(dptr, s);
		return -ENOMEM;
	}
	*ret_addr = (uint64_t)dptr;
	return 0;
}

static int async_segment_free(void *state, uint64_t addr, size_t size, uint64_t stream)
{
	struct async_state *st = state;
	CUstream s = (CUstream)(uintptr_t)stream;
	CUresult res;
	int err;

	if (!segs_remove(st, addr))
		return -EINVAL;
	/* Idle and fenced: any stream may carry the free (see the top). */
	if (stream_unusable(st, s)) {
		err = own_stream(st, &s);
		if (err < 0) {
			segs_add(st, addr);
			return err;
		}
	}
	res = st->free_async((CUdeviceptr)addr, s);
	if (res != CUDA_SUCCESS) {
		segs_add(st, addr); /* still ours (a failed free frees nothing) */
		return async_error(st->host, st->device, "cuMemFreeAsync", size, res);
	}
	return 0;
}

static int async_mem_info(void *state, size_t *ret_free, size_t *ret_total)
{
	struct async_state *st = state;

	return emm_bk_mem_info(st->host, EMM_BACKEND_LOG_DEBUG, "async", st->device, st->mem_get_info, ret_free, ret_total);
}

/* Memory the pool keeps beyond what segments use goes back to the device,
 * down to `keep` bytes reserved. */
static int async_trim(void *state, size_t keep)
{
	struct async_state *st = state;
	CUresult res;

	if (!st->pool_trim_to)
		return -ENOTSUP;
	res = st->pool_trim_to(st->pool, keep);
	if (res != CUDA_SUCCESS)
		return async_error(st->host, st->device, "cuMemPoolTrimTo", keep, res);
	return 0;
}

static const struct emm_backend async_backend = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
    .struct_size = sizeof(struct emm_backend),
    .name = "async",
    .caps = EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_STREAM_ORDERED,
    .init = async_init,
    .fini = async_fini,
    .segment_alloc = async_segment_alloc,
    .segment_free = async_segment_free,
    .mem_info = async_mem_info,
    .trim = async_trim,
    .host_segment_alloc = NULL,
    .host_segment_free = NULL,
};

int ASYNC_ENTRY(uint32_t *inout_version, const struct emm_backend **ret_table)
{
	return emm_bk_negotiate(inout_version, ret_table, &async_backend, 1);
}
