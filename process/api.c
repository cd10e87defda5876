/* SPDX-License-Identifier: MIT */
/*
 * process/api.c - owns the public API's allocation door (include/emm/emm.h:
 * emm_device_alloc, emm_alloc and the rest), used by frameworks that load
 * libemm with dlopen/ctypes instead of LD_PRELOAD: PyTorch's pluggable
 * allocator, Numba's external memory manager, CuPy's allocator hook.
 *
 * Each call names its device: it runs in the context current on this thread
 * when that context is on the device, else in the device's primary context
 * (retained once, the driver initialised first if nobody did), pushed around
 * the call. It is then served exactly as a shim serves cuMemAllocAsync /
 * cuMemFreeAsync (a stream given) or cuMemAlloc / cuMemFree (none), from the
 * same heaps, so a preloaded libemm and this door share one heap and one set
 * of statistics.
 *
 * A call without a stream is a cuMemAlloc / cuMemFree: its frees are fenced
 * in epochs, whose markers order the legacy and blocking streams and every
 * non-blocking stream libemm knows of. Preloaded, libemm knows them all.
 * Without the preload it knows none of the program's, so a non-blocking
 * stream that allocates through this door is looked up once (its flags)
 * and announced as if it had just been created (PyTorch's streams, which
 * live as long as the process): blocks freed without a stream are then
 * fenced for it too. Such a stream must outlive libemm's use of it;
 * streams that come and go should allocate without a stream (emm.cupy and
 * emm.numba do).
 *
 * What the heap does not serve goes to the driver, as with the shims: libemm
 * off (EMM_DISABLE), an allocation on a capturing stream (a graph memory node,
 * cuMemAllocAsync), a pointer libemm did not hand out. Without the preload no
 * capture is tracked, so the capture test asks the driver; a block of ours
 * freed on a capturing stream is then kept for good (a captured graph may use
 * it whenever it runs) rather than reused too early.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/log.h"
#include "process/process.h"
#include "process/process_internal.h"

#define API_MAX_DEVICES 64

/* Primary contexts this door retained, per device (never released: the
 * heaps in them live until exit, as the frameworks' own do). */
static _Atomic(CUcontext) primary_ctx[API_MAX_DEVICES];
static atomic_uint_fast64_t kept_on_capture;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static void api_fork_init(void);

static int cu_errno(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return -ENOMEM;
	case CUDA_ERROR_INVALID_VALUE:
		return -EINVAL;
	case CUDA_ERROR_INVALID_DEVICE:
	case CUDA_ERROR_NO_DEVICE:
	case CUDA_ERROR_NOT_INITIALIZED:
	case CUDA_ERROR_DEINITIALIZED:
	case CUDA_ERROR_INVALID_CONTEXT:
		return -ENODEV;
	default:
		return -EIO;
	}
}

static CUcontext retain_primary(int device)
{
	const struct emm_real_driver_table *real = st_real_table();
	const struct emm_state_real_extra *x = st_real_extra();
	CUcontext ctx = atomic_load_explicit(&primary_ctx[device], memory_order_acquire), expected = NULL;

	if (ctx)
		return ctx;
	pthread_once(&fork_once, api_fork_init);
	if (!x->cuDevicePrimaryCtxRetain || !real->cuInit || real->cuInit(0) != CUDA_SUCCESS)
		return NULL;
	if (x->cuDevicePrimaryCtxRetain(&ctx, (CUdevice)device) != CUDA_SUCCESS || !ctx)
		return NULL;
	/* A racing thread retained it too: its extra reference is harmless. */
	if (!atomic_compare_exchange_strong(&primary_ctx[device], &expected, ctx))
		ctx = expected;
	return ctx;
}

/* Make a context of `device` (< 0: the current one, else device 0) current:
 * 0 and *pushed (st_pop_ctx after), or -ENODEV. A thread with no current
 * context is found without a failing call (a tool such as compute-sanitizer
 * reports each). Without `activate`, a primary context the program has
 * released is not brought back (-ENODEV): nothing of libemm lives in it. */
static int enter_device(int device, bool *pushed, bool activate)
{
	const struct emm_real_driver_table *real = st_real_table();
	const struct emm_state_real_extra *x = st_real_extra();
	CUdevice cur, dev = device < 0 ? 0 : device;
	CUcontext ctx = NULL;

	if (device >= API_MAX_DEVICES || !real->cuCtxGetDevice)
		return -ENODEV;
	*pushed = false;
	if ((!real->cuCtxGetCurrent || (real->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)) &&
	    real->cuCtxGetDevice(&cur) == CUDA_SUCCESS && (device < 0 || cur == device)) {
		/* Without the preload no context change of the program passes
		 * a shim of ours, so the thread's context cache (trusted unless
		 * EMM_CONTEXT_CHECK=on: process/contexts.c) may name a context
		 * that is no longer current: the call looks it up again. */
		emm_state_current_changed(false);
		return 0;
	}
	if (!activate && atomic_load_explicit(&primary_ctx[dev], memory_order_acquire) == NULL &&
	    st_primary_state(dev) != 1)
		return -ENODEV;
	ctx = retain_primary(dev);
	if (!ctx || !x->cuCtxPushCurrent_v2 || !x->cuCtxPopCurrent_v2 || x->cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
		return -ENODEV;
	emm_state_current_changed(false); /* the thread's context cache (st_pop_ctx empties it again) */
	*pushed = true;
	return 0;
}

/* Is `stream` capturing? Through libemm's tracker when the shims see the
 * captures (preloaded), else by asking the driver. */
static bool capturing(CUstream stream, bool hooked)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;

	if (hooked)
		return emm_state_stream_capturing(stream, false);
	return real->cuStreamIsCapturing && real->cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS &&
	       status != CU_STREAM_CAPTURE_STATUS_NONE;
}

static int driver_alloc(size_t size, CUstream stream, bool has_stream, enum emm_state_counter which,
                        void **ret_ptr)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUdeviceptr p = 0;
	CUresult r;
	int e;

	if (has_stream)
		r = real->cuMemAllocAsync ? real->cuMemAllocAsync(&p, size, stream) : CUDA_ERROR_NOT_INITIALIZED;
	else
		r = real->cuMemAlloc_v2 ? real->cuMemAlloc_v2(&p, size) : CUDA_ERROR_NOT_INITIALIZED;
	e = cu_errno(r);
	if (st_is_enabled())
		emm_serve_passed_alloc(which, e, p, size, stream);
	if (e == 0)
		*ret_ptr = (void *)(uintptr_t)p;
	return e;
}

/* --- streams met without the preload -------------------------------------- */

#define SEEN_SLOTS 1024u /* a power of two; PyTorch keeps ~100 streams a device */

/* Non-blocking stream handles announced (0: empty). Fixed, lock-free,
 * emptied in a fork child (the registry is). */
static _Atomic(uintptr_t) seen[SEEN_SLOTS];

/* A fork child starts with libemm's state empty: no stream announced, no
 * primary context retained by this door. */
static void api_fork_child(void)
{
	for (unsigned i = 0; i < SEEN_SLOTS; i++)
		atomic_store_explicit(&seen[i], 0, memory_order_relaxed);
	for (unsigned i = 0; i < API_MAX_DEVICES; i++)
		atomic_store_explicit(&primary_ctx[i], NULL, memory_order_relaxed);
}

static void api_fork_init(void)
{
	pthread_atfork(NULL, NULL, api_fork_child);
}

/* True if `h` is in the set. */
static bool seen_has(uintptr_t h, unsigned *ret_slot)
{
	unsigned i = (unsigned)((h >> 4) * UINT64_C(0x9E3779B97F4A7C15) >> 54) & (SEEN_SLOTS - 1);

	*ret_slot = i;
	for (unsigned n = 0; n < 16; n++, i = (i + 1) & (SEEN_SLOTS - 1)) {
		uintptr_t cur = atomic_load_explicit(&seen[i], memory_order_acquire);

		if (cur == h)
			return true;
		if (cur == 0)
			return false;
	}
	return false;
}

/* Add `h` (full around its slot: not cached, looked up again next time). */
static void seen_add(uintptr_t h, unsigned i)
{
	for (unsigned n = 0; n < 16; n++, i = (i + 1) & (SEEN_SLOTS - 1)) {
		uintptr_t expected = 0;

		if (atomic_compare_exchange_strong(&seen[i], &expected, h) || expected == h)
			return;
	}
}

/*
 * A stream this door allocates for, unknown to libemm without the preload:
 * announce it if it is non-blocking (see the top of this file). Only the
 * non-blocking ones are remembered: a blocking stream's handle may be
 * reused by a non-blocking stream after a destroy libemm does not see, so
 * it is asked again each time (one cuStreamGetFlags).
 */
static void learn_stream(CUstream stream)
{
	const struct emm_real_driver_table *real = st_real_table();
	unsigned int flags = 0;
	unsigned slot;

	if (!EMM_STREAM_IS_HANDLE(emm_state_stream_key(stream, false)))
		return;
	pthread_once(&fork_once, api_fork_init);
	if (seen_has((uintptr_t)stream, &slot))
		return;
	if (real->cuStreamGetFlags && real->cuStreamGetFlags(stream, &flags) == CUDA_SUCCESS &&
	    (flags & CU_STREAM_NON_BLOCKING)) {
		emm_state_stream_created(stream, true);
		seen_add((uintptr_t)stream, slot);
	}
}

/* The allocator's key for a call's stream. */
static emm_stream_t api_key(CUstream stream, bool has_stream)
{
	return has_stream ? emm_state_stream_key(stream, false) : EMM_STREAM_SYNC;
}

int emm_api_device_alloc(size_t size, int device, CUstream stream, bool has_stream, bool hooked, void **ret_ptr)
{
	emm_stream_t key = api_key(stream, has_stream);
	emm_addr_t addr;
	bool pushed;
	int r;

	if (!ret_ptr || size == 0)
		return -EINVAL;
	if (!st_real_table()->cuCtxGetDevice)
		return -ENODEV; /* no driver */
	r = enter_device(device, &pushed, true);
	if (r < 0)
		return r;
	if (has_stream && capturing(stream, hooked)) {
		r = driver_alloc(size, stream, true, EMM_COUNT_CAPTURE_ALLOC, ret_ptr);
	} else {
		if (has_stream && !hooked && st_is_enabled())
			learn_stream(stream);
		r = emm_state_enabled() ? emm_serve_device_alloc(size, key, stream, true, &addr) : -ENOSYS;
		if (r == 0)
			*ret_ptr = (void *)(uintptr_t)addr;
		else if (r != -ENOMEM)
			r = driver_alloc(size, stream, has_stream, EMM_COUNT_PASS_ALLOC, ret_ptr);
	}
	st_pop_ctx(pushed);
	return r;
}

static int driver_free(void *ptr, CUstream stream, bool has_stream)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
	CUresult r;

	if (has_stream)
		r = real->cuMemFreeAsync ? real->cuMemFreeAsync(p, stream) : CUDA_ERROR_NOT_INITIALIZED;
	else
		r = real->cuMemFree_v2 ? real->cuMemFree_v2(p) : CUDA_ERROR_NOT_INITIALIZED;
	if (r == CUDA_SUCCESS && st_is_enabled())
		emm_serve_passed_free(EMM_COUNT_PASS_FREE, p, stream);
	return cu_errno(r);
}

int emm_api_device_free(void *ptr, int device, CUstream stream, bool has_stream, bool hooked)
{
	emm_addr_t addr = (emm_addr_t)(uintptr_t)ptr;
	struct emm_block_range range;
	emm_stream_t key = api_key(stream, has_stream);
	bool pushed;
	int r;

	if (!ptr)
		return 0; /* as cudaFree(NULL) */
	if (!st_real_table()->cuCtxGetDevice)
		return -ENODEV;
	r = enter_device(device, &pushed, true);
	if (r < 0)
		return r;
	if (!emm_state_enabled()) {
		r = driver_free(ptr, stream, has_stream);
	} else if (has_stream && !hooked && capturing(stream, false) && emm_serve_find_block(addr, &range) == 0) {
		/* No tracker saw this capture: keep the block for good. */
		if (atomic_fetch_add(&kept_on_capture, 1) == 0)
			emm_warn("emm_free(%p) on a capturing stream without the preload: the block is kept, never "
			         "reused (preload libemm to have it released with the graph)",
			         ptr);
		r = 0;
	} else {
		if (has_stream && hooked && capturing(stream, true))
			key = EMM_STREAM_SYNC; /* the graph quarantine keeps it (as cuMemFreeAsync's shim) */
		r = emm_serve_free("emm_free", addr, key, stream, false);
		if (r == -ENOENT)
			r = driver_free(ptr, stream, has_stream);
	}
	st_pop_ctx(pushed);
	return r;
}

int emm_api_host_alloc(size_t size, unsigned int flags, void **ret_ptr)
{
	const struct emm_real_driver_table *real = st_real_table();
	emm_addr_t addr;
	bool pushed;
	int r;

	if (!ret_ptr || size == 0)
		return -EINVAL;
	if (!real->cuCtxGetDevice)
		return -ENODEV;
	r = enter_device(-1, &pushed, true);
	if (r < 0)
		return r;
	r = emm_state_enabled() ? emm_serve_host_alloc(size, flags, true, &addr) : -ENOSYS;
	if (r == 0) {
		*ret_ptr = (void *)(uintptr_t)addr;
	} else if (r != -ENOMEM) {
		void *p = NULL;

		r = cu_errno(real->cuMemHostAlloc ? real->cuMemHostAlloc(&p, size, flags) : CUDA_ERROR_NOT_INITIALIZED);
		if (st_is_enabled())
			emm_serve_passed_alloc(EMM_COUNT_PASS_HOST_ALLOC, r, (emm_addr_t)(uintptr_t)p, size, NULL);
		if (r == 0)
			*ret_ptr = p;
	}
	st_pop_ctx(pushed);
	return r;
}

int emm_api_host_free(void *ptr)
{
	const struct emm_real_driver_table *real = st_real_table();
	bool pushed;
	int r;

	if (!ptr)
		return 0;
	if (!real->cuCtxGetDevice)
		return -ENODEV;
	r = enter_device(-1, &pushed, true);
	if (r < 0)
		return r;
	r = emm_state_enabled() ? emm_serve_free("emm_host_free", (emm_addr_t)(uintptr_t)ptr, EMM_STREAM_SYNC,
	                                         NULL, true)
	                        : -ENOENT;
	if (r == -ENOENT) {
		r = cu_errno(real->cuMemFreeHost ? real->cuMemFreeHost(ptr) : CUDA_ERROR_NOT_INITIALIZED);
		if (r == 0 && st_is_enabled())
			emm_serve_passed_free(EMM_COUNT_PASS_HOST_FREE, (emm_addr_t)(uintptr_t)ptr, NULL);
	}
	st_pop_ctx(pushed);
	return r;
}

int emm_api_mem_info(int device, size_t *ret_free, size_t *ret_total)
{
	const struct emm_real_driver_table *real = st_real_table();
	size_t free_b = 0, total_b = 0;
	bool pushed;
	int r;

	if (!ret_free || !ret_total)
		return -EINVAL;
	if (!real->cuMemGetInfo_v2)
		return -ENODEV;
	r = enter_device(device, &pushed, true);
	if (r < 0)
		return r;
	if (emm_vmm_mode() == EMM_VMM_MODE_CACHE)
		emm_vmm_flush_pending();
	r = cu_errno(real->cuMemGetInfo_v2(&free_b, &total_b));
	/* Idle cache counts as free, as cuMemGetInfo's shim reports it. */
	if (r == 0 && emm_state_enabled() && emm_state_options()->meminfo_cached) {
		size_t idle = emm_state_idle_bytes_current_device();

		free_b = (free_b >= total_b || idle >= total_b - free_b) ? total_b : free_b + idle;
	}
	st_pop_ctx(pushed);
	if (r == 0) {
		*ret_free = free_b;
		*ret_total = total_b;
	}
	return r;
}

int emm_api_release_idle(int device, size_t keep_bytes, long long *ret_released)
{
	bool pushed = false;
	int r;

	/* A thread with no current context (a framework's worker, Python
	 * without the preload) releases through a context of the device: the
	 * epoch fences closed on the way are recorded in it; a primary context
	 * released behind our back is not brought back for that (its heaps
	 * are dropped in emm_state_release_idle). */
	if (st_real_table()->cuCtxGetDevice && device >= -1 && enter_device(device, &pushed, false) < 0)
		pushed = false;
	r = emm_state_release_idle(device, keep_bytes, ret_released);
	st_pop_ctx(pushed);
	return r;
}
