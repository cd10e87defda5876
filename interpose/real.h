/* SPDX-License-Identifier: MIT */
/*
 * interpose/real.h - the real entry points behind libemm's shims: the
 * driver's own functions (looked up in libcuda.so.1 with the real dlsym, so
 * never our own shims), the real dlsym, and the real runtime functions of a
 * shared libcudart (next in the lookup order after libemm).
 *
 * Everything resolves lazily and thread-safely on first use; nothing here
 * loads libcuda into a process that has not loaded it, except when a CUDA
 * entry point of ours is actually called (the program is using CUDA then).
 */
#ifndef EMM_INTERPOSE_REAL_H
#define EMM_INTERPOSE_REAL_H

#include <cuda.h>
#include <stdbool.h>

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
	CUresult (*cuStreamCreate)(CUstream *, unsigned int);
	CUresult (*cuStreamCreateWithPriority)(CUstream *, unsigned int, int);
	CUresult (*cuStreamDestroy_v2)(CUstream);
	CUresult (*cuStreamGetFlags)(CUstream, unsigned int *);
	CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned int);
	CUresult (*cuStreamIsCapturing)(CUstream, CUstreamCaptureStatus *);
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

#endif
