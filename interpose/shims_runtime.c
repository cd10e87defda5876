/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_runtime.c - owns the runtime-API allocation entry points
 * for programs linked to SHARED cudart (a static cudart binds inside the
 * executable and never calls these; it is caught at the driver layer).
 *
 * The fast path serves the common case straight from the allocator: libemm
 * enabled, EMM_RUNTIME_SHIMS on, valid arguments, a context current on this
 * thread (so cudart has already made its primary context current, or the
 * program made one), and for stream-ordered calls a stream that is not
 * capturing. Everything else - the first call (cudart's lazy
 * initialisation makes the context), every error (out of memory included),
 * every pointer libemm did not hand out, NULL - goes to the real runtime
 * function (the next definition after libemm). Its driver calls land in
 * libemm's driver shims anyway, so the program gets cudart's own error
 * codes and cudaGetLastError state, and nothing is counted twice: an
 * allocation is counted (heap statistics, EMM_LOG trace) once, by whichever
 * path served it. The fast path makes the same decisions as the driver shim
 * would for cudart's driver call (same heap, stream key, capture test), so
 * serving a call here never changes what the program gets, only how fast.
 *
 * Without a real runtime function to delegate to (cannot happen for a
 * caller linked to shared cudart, whose definitions are found through
 * RTLD_NEXT or among the loaded objects) a call the fast path cannot serve
 * returns cudaErrorInitializationError: the runtime could not be set up.
 *
 * cudaSetDevice, cudaDeviceReset, cudaThreadExit and cudaInitDevice change
 * the thread's current context (or reset one) inside cudart, through no
 * driver shim: they are passed through, and the context caches then ask the
 * driver again (process/contexts.c).
 *
 * Pass-through only (the driver shims account them): cudaMallocPitch (the
 * pitch is the device's), cudaMallocManaged, cudaHostRegister,
 * cudaHostUnregister, cudaMemGetInfo. cudaMallocFromPoolAsync (the program's
 * own pool) is passed through and counted here, once: its driver call
 * under it is not counted again.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/compiler.h"
#include "process/process.h"

/* The per-thread-default-stream variants, declared by cuda_runtime_api.h
 * only under --default-stream per-thread. */
cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream);

/* Removed from the headers in CUDA 13; older shared cudarts export it. */
cudaError_t cudaThreadExit(void);

#define RUNTIME_MISSING cudaErrorInitializationError

/* Forward to the next definition of `name`, typed as `type`. Each call
 * site keeps what it found (found once, it stays: a loaded cudart is never
 * unloaded under a program that calls it), so a delegated call pays one
 * load, not emm_real_runtime's hash and string compare (95 instructions a
 * call: tests/bench/RESULTS.md section 16). Not found is asked again. */
static inline void *next_runtime(_Atomic(void *) *found, const char *name)
{
	void *fn = atomic_load_explicit(found, memory_order_acquire);

	if (EMM_UNLIKELY(!fn)) {
		fn = emm_real_runtime(name);
		if (fn)
			atomic_store_explicit(found, fn, memory_order_release);
	}
	return fn;
}

#define DELEGATE(type, name, ...)                                                                            \
	do {                                                                                                 \
		static _Atomic(void *) found_;                                                               \
		void *fn_ = next_runtime(&found_, name);                                                     \
		return fn_ ? ((type)fn_)(__VA_ARGS__) : RUNTIME_MISSING;                                     \
	} while (0)

typedef cudaError_t (*malloc_fn)(void **, size_t);
typedef cudaError_t (*free_fn)(void *);
typedef cudaError_t (*malloc_async_fn)(void **, size_t, cudaStream_t);
typedef cudaError_t (*free_async_fn)(void *, cudaStream_t);
typedef cudaError_t (*malloc_pitch_fn)(void **, size_t *, size_t, size_t);
typedef cudaError_t (*host_alloc_fn)(void **, size_t, unsigned int);
typedef cudaError_t (*host_register_fn)(void *, size_t, unsigned int);
typedef cudaError_t (*mem_get_info_fn)(size_t *, size_t *);
typedef cudaError_t (*malloc_from_pool_fn)(void **, size_t, cudaMemPool_t, cudaStream_t);

/* cudaHostAlloc flags the pinned heaps know (they equal cuMemHostAlloc's). */
#define HOST_ALLOC_FLAGS (cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)

/* --- when the fast path may serve ------------------------------------------ */

static bool fast_path_on(void)
{
	return emm_state_enabled() && emm_state_options()->runtime_shims;
}

/* Device memory from the current context's heap (not served without a
 * current context: cudart's first call, which makes one). Any failure,
 * out of memory included, is left to the real runtime, whose driver call
 * reaches the driver shim: it reports and traces it once. */
static bool fast_device_alloc(void **ret_ptr, size_t size, emm_stream_t key, const void *stream)
{
	emm_addr_t addr;

	if (emm_serve_device_alloc(size, key, stream, false, &addr) != 0)
		return false;
	*ret_ptr = (void *)(uintptr_t)addr;
	return true;
}

/* Pinned host memory of flag set `flags`, once cudart is initialised. */
static bool fast_host_alloc(void **ret_ptr, size_t size, unsigned int flags)
{
	emm_addr_t addr;

	if ((flags & ~(unsigned int)HOST_ALLOC_FLAGS) || !emm_state_context_current() ||
	    emm_serve_host_alloc(size, flags, false, &addr) != 0)
		return false;
	*ret_ptr = (void *)(uintptr_t)addr;
	return true;
}

/*
 * Free `ptr` if it is the start of a live libemm block of the right space
 * (device or pinned host). False leaves it to the real runtime: not ours,
 * interior, already freed (a racing double free loses here too), or the
 * wrong kind of memory for this call - the driver shim then answers the
 * driver's error (and counts a bad free), which cudart records.
 */
static bool fast_free(void *ptr, bool pinned, emm_stream_t key, const void *stream)
{
	return emm_serve_free(NULL, (emm_addr_t)(uintptr_t)ptr, key, stream, pinned) == 0;
}

/* --- device memory ------------------------------------------------------------- */

EMM_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	if (devPtr && size && fast_path_on() && fast_device_alloc(devPtr, size, EMM_STREAM_SYNC, NULL))
		return cudaSuccess;
	DELEGATE(malloc_fn, "cudaMalloc", devPtr, size);
}

EMM_EXPORT cudaError_t cudaFree(void *devPtr)
{
	/* cudaFree(NULL) is the idiom for "initialise the runtime". */
	if (devPtr && fast_path_on() && fast_free(devPtr, false, EMM_STREAM_SYNC, NULL))
		return cudaSuccess;
	DELEGATE(free_fn, "cudaFree", devPtr);
}

/*
 * Stream-ordered calls: a capturing stream (tracked by the driver shims'
 * capture hooks) is left to cudart, whose driver call becomes a graph node
 * or gets the driver shim's capture handling. The block comes from the
 * current context's heap, as the driver shim serves it.
 */
static bool malloc_async_fast(void **devPtr, size_t size, cudaStream_t hStream, bool ptsz)
{
	CUstream stream = (CUstream)hStream;

	return devPtr && size && fast_path_on() && !emm_state_stream_capturing(stream, ptsz) &&
	       fast_device_alloc(devPtr, size, emm_state_stream_key(stream, ptsz), stream);
}

static bool free_async_fast(void *devPtr, cudaStream_t hStream, bool ptsz)
{
	CUstream stream = (CUstream)hStream;

	return devPtr && fast_path_on() && !emm_state_stream_capturing(stream, ptsz) &&
	       fast_free(devPtr, false, emm_state_stream_key(stream, ptsz), stream);
}

EMM_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
	if (malloc_async_fast(devPtr, size, hStream, false))
		return cudaSuccess;
	DELEGATE(malloc_async_fn, "cudaMallocAsync", devPtr, size, hStream);
}

EMM_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
	if (malloc_async_fast(devPtr, size, hStream, true))
		return cudaSuccess;
	DELEGATE(malloc_async_fn, "cudaMallocAsync_ptsz", devPtr, size, hStream);
}

EMM_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
	if (free_async_fast(devPtr, hStream, false))
		return cudaSuccess;
	DELEGATE(free_async_fn, "cudaFreeAsync", devPtr, hStream);
}

EMM_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
	if (free_async_fast(devPtr, hStream, true))
		return cudaSuccess;
	DELEGATE(free_async_fn, "cudaFreeAsync_ptsz", devPtr, hStream);
}

/* The program's own pool: the real runtime serves it; counted once. */
static cudaError_t malloc_from_pool(const char *name, void **ptr, size_t size, cudaMemPool_t memPool,
                                    cudaStream_t stream)
{
	malloc_from_pool_fn real = (malloc_from_pool_fn)emm_real_runtime(name);
	cudaError_t r;

	if (!real)
		return RUNTIME_MISSING;
	emm_vmm_runtime_pool_enter();
	r = real(ptr, size, memPool, stream);
	emm_vmm_runtime_pool_leave();
	if (r == cudaSuccess && ptr && emm_state_enabled())
		emm_vmm_count_pool(EMM_POOL_ALLOC, (CUdeviceptr)(uintptr_t)*ptr, size, stream);
	return r;
}

EMM_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream)
{
	return malloc_from_pool("cudaMallocFromPoolAsync", ptr, size, memPool, stream);
}

EMM_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
                                                    cudaStream_t stream)
{
	return malloc_from_pool("cudaMallocFromPoolAsync_ptsz", ptr, size, memPool, stream);
}

EMM_EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	DELEGATE(malloc_pitch_fn, "cudaMallocPitch", devPtr, pitch, width, height);
}

EMM_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	DELEGATE(host_alloc_fn, "cudaMallocManaged", devPtr, size, flags);
}

EMM_EXPORT cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
	DELEGATE(mem_get_info_fn, "cudaMemGetInfo", free, total);
}

/* --- pinned host memory ---------------------------------------------------------- */

EMM_EXPORT cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	if (ptr && size && fast_path_on() && fast_host_alloc(ptr, size, cudaHostAllocDefault))
		return cudaSuccess;
	DELEGATE(malloc_fn, "cudaMallocHost", ptr, size);
}

EMM_EXPORT cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	if (pHost && size && fast_path_on() && fast_host_alloc(pHost, size, flags))
		return cudaSuccess;
	DELEGATE(host_alloc_fn, "cudaHostAlloc", pHost, size, flags);
}

EMM_EXPORT cudaError_t cudaFreeHost(void *ptr)
{
	if (ptr && fast_path_on() && fast_free(ptr, true, EMM_STREAM_SYNC, NULL))
		return cudaSuccess;
	DELEGATE(free_fn, "cudaFreeHost", ptr);
}

EMM_EXPORT cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	DELEGATE(host_register_fn, "cudaHostRegister", ptr, size, flags);
}

EMM_EXPORT cudaError_t cudaHostUnregister(void *ptr)
{
	DELEGATE(free_fn, "cudaHostUnregister", ptr);
}

/* --- calls that change the current context inside cudart ---------------------- */

typedef cudaError_t (*int_fn)(int);
typedef cudaError_t (*void_fn)(void);
typedef cudaError_t (*init_device_fn)(int, unsigned int, unsigned int);

/* After the real call (whatever it returned): this thread's context cache,
 * or with `every_thread` all of them (a reset), asks the driver again. */
#define DELEGATE_THEN_FORGET(every_thread, type, name, ...)                                                  \
	do {                                                                                                 \
		static _Atomic(void *) found_;                                                               \
		void *fn_ = next_runtime(&found_, name);                                                     \
		cudaError_t e_;                                                                              \
                                                                                                             \
		if (!fn_)                                                                                    \
			return RUNTIME_MISSING;                                                              \
		e_ = ((type)fn_)(__VA_ARGS__);                                                               \
		if (emm_state_enabled())                                                                     \
			emm_state_current_changed(every_thread);                                             \
		return e_;                                                                                   \
	} while (0)

EMM_EXPORT cudaError_t cudaSetDevice(int device)
{
	DELEGATE_THEN_FORGET(false, int_fn, "cudaSetDevice", device);
}

EMM_EXPORT cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
	DELEGATE_THEN_FORGET(false, init_device_fn, "cudaInitDevice", device, deviceFlags, flags);
}

EMM_EXPORT cudaError_t cudaDeviceReset(void)
{
	DELEGATE_THEN_FORGET(true, void_fn, "cudaDeviceReset");
}

EMM_EXPORT cudaError_t cudaThreadExit(void)
{
	DELEGATE_THEN_FORGET(true, void_fn, "cudaThreadExit");
}
