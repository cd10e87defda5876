/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/fakecudart/fakecudart.c - a test-double shared cudart
 * (soname libcudart.so.13) for libemm's runtime-API shims, modelling only
 * what those shims depend on:
 *
 *  - it reaches the driver as the real one does: dlopen("libcuda.so.1"),
 *    dlsym(cuGetProcAddress_v2), then every function through that resolver
 *    (so with libemm preloaded its driver calls land in libemm's shims);
 *  - lazy initialisation: the first call on a thread with no current
 *    context makes device 0's primary context current;
 *  - driver errors become runtime errors and the thread's last error
 *    (cudaGetLastError reads and clears it);
 *  - cudaGetDriverEntryPoint* answer from the driver's OWN resolver, found
 *    with glibc's dlsym (as a cudart would that bootstrapped before libemm
 *    was loaded), so libemm's wrappers are what substitutes there.
 *
 * fakecudart_calls(name) counts the calls of each runtime function, which
 * tells a test whether libemm served a call or delegated it.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define API __attribute__((visibility("default")))

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                  unsigned int cudaVersion, unsigned long long flags,
                                                  enum cudaDriverEntryPointQueryResult *driverStatus);
API uint64_t fakecudart_calls(const char *name);
API void fakecudart_reset_calls(void);

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* --- call counters ----------------------------------------------------------- */

#define FUNCTIONS(X)                                                                                         \
	X(cudaMalloc)                                                                                        \
	X(cudaFree) X(cudaMallocAsync) X(cudaMallocAsync_ptsz) X(cudaFreeAsync) X(cudaFreeAsync_ptsz)        \
	    X(cudaMallocPitch) X(cudaMallocHost) X(cudaHostAlloc) X(cudaFreeHost) X(cudaMallocManaged)       \
	        X(cudaHostRegister) X(cudaHostUnregister) X(cudaMemGetInfo) X(cudaGetLastError)              \
	            X(cudaGetDriverEntryPoint) X(cudaGetDriverEntryPoint_ptsz)                               \
	                X(cudaGetDriverEntryPointByVersion) X(cudaGetDriverEntryPointByVersion_ptsz)         \
	                    X(cudaMemset)

#define ENUM(name) FN_##name,
enum { FUNCTIONS(ENUM) FN__COUNT };
#undef ENUM
#define NAME(name) #name,
static const char *const function_names[] = {FUNCTIONS(NAME)};
#undef NAME

static atomic_uint_fast64_t calls[FN__COUNT];

#define ENTER(name) atomic_fetch_add(&calls[FN_##name], 1)

API uint64_t fakecudart_calls(const char *name)
{
	for (int i = 0; i < FN__COUNT; i++)
		if (strcmp(function_names[i], name) == 0)
			return atomic_load(&calls[i]);
	return 0;
}

API void fakecudart_reset_calls(void)
{
	for (int i = 0; i < FN__COUNT; i++)
		atomic_store(&calls[i], 0);
}

/* --- the driver, as cudart reaches it ----------------------------------------- */

static struct {
	gpa2_fn gpa;     /* through dlsym: libemm's when preloaded */
	gpa2_fn raw_gpa; /* through glibc's dlsym: the driver's own */
	CUresult (*init)(unsigned int);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*get_current)(CUcontext *);
	CUresult (*set_current)(CUcontext);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*alloc_async_ptsz)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUresult (*free_async_ptsz)(CUdeviceptr, CUstream);
	CUresult (*alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
	CUresult (*alloc_host)(void **, size_t);
	CUresult (*host_alloc)(void **, size_t, unsigned int);
	CUresult (*free_host)(void *);
	CUresult (*alloc_managed)(CUdeviceptr *, size_t, unsigned int);
	CUresult (*host_register)(void *, size_t, unsigned int);
	CUresult (*host_unregister)(void *);
	CUresult (*mem_get_info)(size_t *, size_t *);
	bool ok;
} drv;

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static _Thread_local cudaError_t last_error;

static void *resolve(const char *name, int version, cuuint64_t flags)
{
	void *p = NULL;

	return drv.gpa && drv.gpa(name, &p, version, flags, NULL) == CUDA_SUCCESS ? p : NULL;
}

static void drv_load(void)
{
	static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
	void *(*real_dlsym)(void *, const char *) = NULL;
	void *h = dlopen("libcuda.so.1", RTLD_NOW);

	if (!h)
		return;
	drv.gpa = (gpa2_fn)dlsym(h, "cuGetProcAddress_v2");
	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && !real_dlsym; i++)
		real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", versions[i]);
	if (real_dlsym)
		drv.raw_gpa = (gpa2_fn)real_dlsym(h, "cuGetProcAddress_v2");
#define R(field, name, version, flags) *(void **)&drv.field = resolve(name, version, flags)
	R(init, "cuInit", 2000, 0);
	R(device_get, "cuDeviceGet", 2000, 0);
	R(retain, "cuDevicePrimaryCtxRetain", 7000, 0);
	R(get_current, "cuCtxGetCurrent", 4000, 0);
	R(set_current, "cuCtxSetCurrent", 4000, 0);
	R(mem_alloc, "cuMemAlloc", 3020, 0);
	R(mem_free, "cuMemFree", 3020, 0);
	R(alloc_async, "cuMemAllocAsync", 11020, 1);
	R(alloc_async_ptsz, "cuMemAllocAsync", 11020, 2);
	R(free_async, "cuMemFreeAsync", 11020, 1);
	R(free_async_ptsz, "cuMemFreeAsync", 11020, 2);
	R(alloc_pitch, "cuMemAllocPitch", 3020, 0);
	R(alloc_host, "cuMemAllocHost", 3020, 0);
	R(host_alloc, "cuMemHostAlloc", 2020, 0);
	R(free_host, "cuMemFreeHost", 2000, 0);
	R(alloc_managed, "cuMemAllocManaged", 6000, 0);
	R(host_register, "cuMemHostRegister", 6050, 0);
	R(host_unregister, "cuMemHostUnregister", 4000, 0);
	R(mem_get_info, "cuMemGetInfo", 3020, 0);
#undef R
	drv.ok = drv.raw_gpa && drv.init && drv.init(0) == CUDA_SUCCESS;
}

static cudaError_t to_runtime(CUresult r)
{
	switch (r) {
	case CUDA_SUCCESS:
		return cudaSuccess;
	case CUDA_ERROR_INVALID_VALUE:
		return cudaErrorInvalidValue;
	case CUDA_ERROR_OUT_OF_MEMORY:
		return cudaErrorMemoryAllocation;
	case CUDA_ERROR_NOT_INITIALIZED:
		return cudaErrorInitializationError;
	case CUDA_ERROR_INVALID_HANDLE:
		return cudaErrorInvalidResourceHandle;
	case CUDA_ERROR_NOT_FOUND:
		return cudaErrorSymbolNotFound;
	default:
		/* The capture errors (900-907) share their numbers. */
		if (r >= 900 && r <= 907)
			return (cudaError_t)r;
		return cudaErrorUnknown;
	}
}

static cudaError_t record(cudaError_t err)
{
	if (err != cudaSuccess)
		last_error = err;
	return err;
}

/* Lazy initialisation: the driver once, a current context per thread. */
static cudaError_t lazy_init(void)
{
	CUcontext ctx = NULL;
	CUdevice dev;

	pthread_once(&drv_once, drv_load);
	if (!drv.ok)
		return record(cudaErrorInitializationError);
	if (drv.get_current(&ctx) == CUDA_SUCCESS && ctx)
		return cudaSuccess;
	if (drv.device_get(&dev, 0) != CUDA_SUCCESS || drv.retain(&ctx, dev) != CUDA_SUCCESS ||
	    drv.set_current(ctx) != CUDA_SUCCESS)
		return record(cudaErrorInitializationError);
	return cudaSuccess;
}

#define INIT_OR_RETURN()                                                                                     \
	do {                                                                                                 \
		cudaError_t e_ = lazy_init();                                                                \
		if (e_ != cudaSuccess)                                                                       \
			return e_;                                                                           \
	} while (0)

#define DRIVER(call) record(to_runtime(call))

/* --- the runtime API ------------------------------------------------------------- */

API cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;

	ENTER(cudaGetLastError);
	last_error = cudaSuccess;
	return e;
}

API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	ENTER(cudaMalloc);
	INIT_OR_RETURN();
	if (!devPtr)
		return record(cudaErrorInvalidValue);
	if (!size) {
		*devPtr = NULL;
		return cudaSuccess;
	}
	return DRIVER(drv.mem_alloc((CUdeviceptr *)devPtr, size));
}

API cudaError_t cudaFree(void *devPtr)
{
	ENTER(cudaFree);
	INIT_OR_RETURN();
	return devPtr ? DRIVER(drv.mem_free((CUdeviceptr)devPtr)) : cudaSuccess;
}

API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
	ENTER(cudaMallocAsync);
	INIT_OR_RETURN();
	return DRIVER(drv.alloc_async((CUdeviceptr *)devPtr, size, (CUstream)hStream));
}

API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
	ENTER(cudaMallocAsync_ptsz);
	INIT_OR_RETURN();
	return DRIVER(drv.alloc_async_ptsz((CUdeviceptr *)devPtr, size, (CUstream)hStream));
}

API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
	ENTER(cudaFreeAsync);
	INIT_OR_RETURN();
	return DRIVER(drv.free_async((CUdeviceptr)devPtr, (CUstream)hStream));
}

API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
	ENTER(cudaFreeAsync_ptsz);
	INIT_OR_RETURN();
	return DRIVER(drv.free_async_ptsz((CUdeviceptr)devPtr, (CUstream)hStream));
}

API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	ENTER(cudaMallocPitch);
	INIT_OR_RETURN();
	return DRIVER(drv.alloc_pitch((CUdeviceptr *)devPtr, pitch, width, height, 4));
}

API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	ENTER(cudaMallocHost);
	INIT_OR_RETURN();
	return DRIVER(drv.alloc_host(ptr, size));
}

API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	ENTER(cudaHostAlloc);
	INIT_OR_RETURN();
	return DRIVER(drv.host_alloc(pHost, size, flags));
}

API cudaError_t cudaFreeHost(void *ptr)
{
	ENTER(cudaFreeHost);
	INIT_OR_RETURN();
	return ptr ? DRIVER(drv.free_host(ptr)) : cudaSuccess;
}

API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	ENTER(cudaMallocManaged);
	INIT_OR_RETURN();
	return DRIVER(drv.alloc_managed((CUdeviceptr *)devPtr, size, flags));
}

API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	ENTER(cudaHostRegister);
	INIT_OR_RETURN();
	return DRIVER(drv.host_register(ptr, size, flags));
}

API cudaError_t cudaHostUnregister(void *ptr)
{
	ENTER(cudaHostUnregister);
	INIT_OR_RETURN();
	return DRIVER(drv.host_unregister(ptr));
}

API cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
	ENTER(cudaMemGetInfo);
	INIT_OR_RETURN();
	return DRIVER(drv.mem_get_info(free, total));
}

/* The test double's device memory is host memory. */
API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	ENTER(cudaMemset);
	INIT_OR_RETURN();
	if (!devPtr && count)
		return record(cudaErrorInvalidValue);
	memset(devPtr, value, count);
	return cudaSuccess;
}

static cudaError_t entry_point(const char *symbol, void **funcPtr, int version, unsigned long long flags,
                               enum cudaDriverEntryPointQueryResult *status)
{
	INIT_OR_RETURN();
	return DRIVER(drv.raw_gpa(symbol, funcPtr, version, flags, (CUdriverProcAddressQueryResult *)status));
}

static unsigned long long per_thread_flags(unsigned long long flags)
{
	return (flags & 3) ? flags : flags | cudaEnablePerThreadDefaultStream;
}

API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr, unsigned long long flags,
                                        enum cudaDriverEntryPointQueryResult *driverStatus)
{
	ENTER(cudaGetDriverEntryPoint);
	return entry_point(symbol, funcPtr, CUDART_VERSION, flags, driverStatus);
}

API cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                             enum cudaDriverEntryPointQueryResult *driverStatus)
{
	ENTER(cudaGetDriverEntryPoint_ptsz);
	return entry_point(symbol, funcPtr, CUDART_VERSION, per_thread_flags(flags), driverStatus);
}

API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr, unsigned int cudaVersion,
                                                 unsigned long long flags,
                                                 enum cudaDriverEntryPointQueryResult *driverStatus)
{
	ENTER(cudaGetDriverEntryPointByVersion);
	return entry_point(symbol, funcPtr, (int)cudaVersion, flags, driverStatus);
}

API cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                      unsigned int cudaVersion, unsigned long long flags,
                                                      enum cudaDriverEntryPointQueryResult *driverStatus)
{
	ENTER(cudaGetDriverEntryPointByVersion_ptsz);
	return entry_point(symbol, funcPtr, (int)cudaVersion, per_thread_flags(flags), driverStatus);
}
