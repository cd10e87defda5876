/* SPDX-License-Identifier: MIT */
/*
 * process/real.h - the real entry points behind the shims (real.c): the
 * real dlsym, the driver's exports by name, the tests that tell the
 * driver's and libemm's own code apart, the runtime's next definitions,
 * and the typed tables of the driver functions the shims, the fence ops
 * and the VMM cache call. Part of process.h, which includes it: the shims
 * include process.h, never this.
 */
#ifndef EMM_PROCESS_REAL_H
#define EMM_PROCESS_REAL_H

#include <cuda.h>
#include <stdbool.h>

/* === the real entry points (real.c) ====================================== */

/* The real dlsym (glibc's), found with dlvsym. Never NULL after init. */
void *emm_real_dlsym(void *handle, const char *name);

/* For the dlsym trampoline (resolve.c): the real dlsym as a pointer,
 * resolved on first call (aborts with a message if glibc has none), and the
 * variable holding it once resolved (NULL before; read with acquire). */
typedef void *(*emm_dlsym_fn)(void *, const char *);
emm_dlsym_fn emm_real_dlsym_get(void);
extern void *emm_real_dlsym_ptr __attribute__((visibility("hidden")));

/* The driver's function with this exact exported name ("cuMemAlloc_v2"),
 * or NULL if there is no driver or no such export. Cached per name. */
void *emm_real_driver(const char *exported_name);

/* True if `fn` is the export `exported_name` of the libcuda.so.1 of the
 * base namespace (not a dlmopen copy, not another library). Never loads the
 * driver. */
bool emm_real_is_driver_export(const void *fn, const char *exported_name);

/* The handle of libcuda.so.1 (loading it if needed); NULL if absent. */
void *emm_real_libcuda_handle(void);

/* True if `addr` lies inside the driver library (libcuda.so*) or another
 * NVIDIA driver library (libnvidia-*): lookups made from there are never
 * substituted. */
bool emm_real_is_driver_address(const void *addr);
/* The same test on a path (dladdr's dli_fname). */
bool emm_real_is_driver_path(const char *path);

/* True if `addr` lies inside a driver component: a library of the driver
 * (emm_real_is_driver_address) or its video and JPEG engine library
 * (libnvcuvid.so*, which nvJPEG's hardware path loads). Such a library
 * gets device memory from the driver through its private tables, where
 * libemm cannot see or serve it, and frees it through the public
 * cuMemFree_v2. One dladdr: for the rare free of a pointer libemm did not
 * hand out, never on a hot path. */
bool emm_real_is_driver_component_address(const void *addr);

/* True if `addr` lies inside libemm or a libemm backend (libemm*.so):
 * lookups made from there are never substituted either. */
bool emm_real_is_libemm_address(const void *addr);

/* The next definition of a runtime function (shared libcudart's
 * "cudaMalloc"), looked up after libemm; NULL if the program has none. */
void *emm_real_runtime(const char *name);

/* Typed table of the driver functions the shims and fence ops call on hot
 * paths; members are NULL if the driver lacks them. Resolved once. */
struct emm_real_driver_table {
	CUresult (*cuInit)(unsigned int);
	CUresult (*cuGetProcAddress_v2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
	/* the 4-argument export "cuGetProcAddress" (cuda.h #defines that name
	 * to cuGetProcAddress_v2, so the member cannot carry it) */
	CUresult (*cuGetProcAddress_v1)(const char *, void **, int, cuuint64_t);
	CUresult (*cuCtxGetCurrent)(CUcontext *);
	CUresult (*cuCtxGetDevice)(CUdevice *);
	CUresult (*cuCtxGetDevice_v2)(CUdevice *, CUcontext); /* CUDA 13: any context's device */
	CUresult (*cuCtxSynchronize)(void);
	CUresult (*cuDevicePrimaryCtxGetState)(CUdevice, unsigned int *, int *);
	CUresult (*cuMemAlloc_v2)(CUdeviceptr *, size_t);
	CUresult (*cuMemFree_v2)(CUdeviceptr);
	CUresult (*cuMemAllocPitch_v2)(CUdeviceptr *, size_t *, size_t, size_t, unsigned int);
	CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
	CUresult (*cuMemAllocAsync_ptsz)(CUdeviceptr *, size_t, CUstream);
	CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
	CUresult (*cuMemFreeAsync_ptsz)(CUdeviceptr, CUstream);
	CUresult (*cuMemAllocHost_v2)(void **, size_t);
	CUresult (*cuMemHostAlloc)(void **, size_t, unsigned int);
	CUresult (*cuMemFreeHost)(void *);
	CUresult (*cuMemHostRegister_v2)(void *, size_t, unsigned int);
	CUresult (*cuMemHostUnregister)(void *);
	CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned int);
	CUresult (*cuMemGetInfo_v2)(size_t *, size_t *);
	CUresult (*cuMemGetAddressRange_v2)(CUdeviceptr *, size_t *, CUdeviceptr);
	CUresult (*cuPointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr);
	CUresult (*cuPointerGetAttributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
	CUresult (*cuIpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
	CUresult (*cuIpcOpenMemHandle_v2)(CUdeviceptr *, CUipcMemHandle, unsigned int);
	CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
	CUresult (*cuStreamCreate)(CUstream *, unsigned int);
	CUresult (*cuStreamCreateWithPriority)(CUstream *, unsigned int, int);
	CUresult (*cuStreamDestroy_v2)(CUstream);
	CUresult (*cuStreamGetFlags)(CUstream, unsigned int *);
	CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
	CUresult (*cuStreamQuery)(CUstream);
	CUresult (*cuStreamBeginCapture_v2)(CUstream, CUstreamCaptureMode);
	CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
	CUresult (*cuEventCreate)(CUevent *, unsigned int);
	CUresult (*cuEventRecord)(CUevent, CUstream);
	CUresult (*cuEventQuery)(CUevent);
	CUresult (*cuEventSynchronize)(CUevent);
	CUresult (*cuEventDestroy_v2)(CUevent);
	CUresult (*cuCtxDestroy_v2)(CUcontext);
	CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice);
	CUresult (*cuDevicePrimaryCtxReset_v2)(CUdevice);
};

/* The table; NULL if libcuda.so.1 cannot be found. */
const struct emm_real_driver_table *emm_real_driver_table(void);

/* The virtual-memory (VMM) and explicit-pool calls (vmm.c and the shims of
 * interpose/shims_vmm.c, shims_pool.c); members NULL without the driver or
 * the export. Never NULL. */
struct emm_real_vmm_table {
	CUresult (*cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
	                        unsigned long long);
	CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
	CUresult (*cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
	CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
	CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
	CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
	CUresult (*cuMemGetAccess)(unsigned long long *, const CUmemLocation *, CUdeviceptr);
	CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle *, void *);
	CUresult (*cuMemGetAllocationPropertiesFromHandle)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
	CUresult (*cuMemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
	                                         unsigned long long);
	CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
	                                           CUmemAllocationHandleType);
	CUresult (*cuMemPoolCreate)(CUmemoryPool *, const CUmemPoolProps *);
	CUresult (*cuMemPoolDestroy)(CUmemoryPool);
	/* the exports cuMemAllocFromPoolAsync and cuMemAllocFromPoolAsync_ptsz */
	CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	CUresult (*alloc_from_pool_ptsz)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
	/* the pools' attributes and the default pool (shims_pool.c, pool_attr.c) */
	CUresult (*cuMemPoolGetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*cuMemPoolSetAttribute)(CUmemoryPool, CUmemPool_attribute, void *);
	CUresult (*cuMemPoolTrimTo)(CUmemoryPool, size_t);
	CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*cuDeviceGetMemPool)(CUmemoryPool *, CUdevice);
	CUresult (*cuDeviceGetCount)(int *);
	/* EMM_POISON's fill (poison.c) */
	CUresult (*cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
};
const struct emm_real_vmm_table *emm_real_vmm(void);

#endif
