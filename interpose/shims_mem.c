/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_mem.c - the driver API's allocation and free entry points:
 * device memory (cuMemAlloc, cuMemFree, cuMemAllocPitch), stream-ordered
 * (cuMemAllocAsync, cuMemFreeAsync and their _ptsz exports), pinned host
 * memory (cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost), host registration
 * and managed memory (accounted, passed through). The rules are in shims.h;
 * the serving is process/serve.c's.
 */
#include <cuda.h>
#include <errno.h>
#include <stdint.h>

#include "common/compiler.h"
#include "common/log.h"
#include "interpose/shims.h"

/* --- translation into the process layer ------------------------------- */

/* True and *ret when the pool answered (success, or out of memory after its
 * retry); false when the driver should answer. */
static bool device_alloc(CUdeviceptr *dptr, size_t size, emm_stream_t key, CUstream stream, CUresult *ret)
{
	emm_addr_t addr;
	int r;

	if (!dptr)
		return false;
	r = emm_serve_device_alloc(size, key, stream, true, &addr);
	if (r == 0) {
		*dptr = (CUdeviceptr)addr;
		*ret = CUDA_SUCCESS;
		return true;
	}
	if (r == -ENOMEM) {
		*ret = CUDA_ERROR_OUT_OF_MEMORY;
		return true;
	}
	return false;
}

static bool host_alloc(void **pp, size_t size, unsigned int flags, CUresult *ret)
{
	emm_addr_t addr;
	int r;

	if (!pp)
		return false;
	r = emm_serve_host_alloc(size, flags, true, &addr);
	if (r == 0) {
		*pp = (void *)(uintptr_t)addr;
		*ret = CUDA_SUCCESS;
		return true;
	}
	if (r == -ENOMEM) {
		*ret = CUDA_ERROR_OUT_OF_MEMORY;
		return true;
	}
	return false;
}

/* True and *ret when libemm answered the free; false when the driver should
 * (not ours, or ours but of the other space: the driver then refuses it
 * without touching it). */
static bool pool_free(const char *what, uint64_t ptr, emm_stream_t key, CUstream stream, bool pinned,
                      CUresult *ret)
{
	int r = emm_serve_free(what, ptr, key, stream, pinned);

	if (r == 0) {
		*ret = CUDA_SUCCESS;
		return true;
	}
	if (r == -EINVAL) {
		*ret = CUDA_ERROR_INVALID_VALUE;
		return true;
	}
	return false;
}

/* Account for an allocation or a free the driver made. */
static CUresult passed_alloc(CUresult r, uint64_t ptr, size_t size, CUstream stream,
                             enum emm_state_counter which)
{
	emm_serve_passed_alloc(which, r == CUDA_SUCCESS ? 0 : r == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO, ptr,
	                       size, stream);
	return r;
}

/* Account for a free the driver made. ff: what emm_serve_foreign_free_begin
 * found of the pointer before the driver's free (whether a driver component
 * frees it, its size); NULL: an unknown free. */
static CUresult passed_free(CUresult r, uint64_t ptr, CUstream stream, enum emm_state_counter which,
                            const struct emm_foreign_free *ff)
{
	if (r == CUDA_SUCCESS)
		emm_serve_foreign_free_end(which, ptr, stream, ff);
	return r;
}

/* --- device memory ----------------------------------------------------- */

EMM_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemAlloc_v2, dptr, bytesize);
	if (device_alloc(dptr, bytesize, EMM_STREAM_SYNC, NULL, &r))
		return r;
	r = CALL_REAL(cuMemAlloc_v2, dptr, bytesize);
	return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, bytesize, NULL, EMM_COUNT_PASS_ALLOC);
}

EMM_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
	struct emm_foreign_free ff;
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemFree_v2, dptr);
	if (pool_free("cuMemFree", dptr, EMM_STREAM_SYNC, NULL, false, &r))
		return r;
	emm_serve_foreign_free_begin(dptr, __builtin_return_address(0), &ff);
	r = CALL_REAL(cuMemFree_v2, dptr);
	return passed_free(r, dptr, NULL, EMM_COUNT_PASS_FREE, &ff);
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                               size_t Height, unsigned int ElementSizeBytes)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	/* The driver validates the element size (4, 8, 16) and rounds the
	 * width to the pitch alignment; anything else is its to answer. */
	if (dptr && pPitch && WidthInBytes && Height &&
	    (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16)) {
		size_t align = emm_state_pitch_alignment();
		size_t pitch = (WidthInBytes + align - 1) / align * align;

		if (pitch >= WidthInBytes && Height <= SIZE_MAX / pitch &&
		    device_alloc(dptr, pitch * Height, EMM_STREAM_SYNC, NULL, &r)) {
			if (r == CUDA_SUCCESS)
				*pPitch = pitch;
			return r;
		}
	}
	r = CALL_REAL(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, r == CUDA_SUCCESS ? *pPitch * Height : 0, NULL,
	                    EMM_COUNT_PASS_ALLOC);
}

/* --- stream-ordered device memory -------------------------------------- */

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

static CUresult alloc_async(alloc_async_fn real, CUdeviceptr *dptr, size_t bytesize, CUstream hStream,
                            bool ptsz)
{
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!emm_state_enabled())
		return real(dptr, bytesize, hStream);
	if (emm_state_stream_capturing(hStream, ptsz)) {
		/* The driver turns it into a graph memory node. */
		r = real(dptr, bytesize, hStream);
		return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, bytesize, hStream,
		                    EMM_COUNT_CAPTURE_ALLOC);
	}
	if (dptr && bytesize &&
	    device_alloc(dptr, bytesize, emm_state_stream_key(hStream, ptsz), hStream, &r))
		return r;
	r = real(dptr, bytesize, hStream);
	return passed_alloc(r, r == CUDA_SUCCESS && dptr ? *dptr : 0, bytesize, hStream,
	                    EMM_COUNT_PASS_ALLOC);
}

static CUresult free_async(free_async_fn real, CUdeviceptr dptr, CUstream hStream, bool ptsz,
                           const void *caller)
{
	struct emm_block_range range;
	struct emm_foreign_free ff;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!emm_state_enabled())
		return real(dptr, hStream);
	if (dptr && emm_state_stream_capturing(hStream, ptsz)) {
		/* Only a pointer outside our segments is the driver's: a double
		 * or interior free of ours (-ENXIO) is refused below, as outside
		 * a capture; the driver would free the segment under it. */
		int fr = emm_serve_find_block(dptr, &range);
		if (fr == -ENOENT) {
			emm_serve_foreign_free_begin(dptr, caller, &ff);
			r = real(dptr, hStream);
			return passed_free(r, dptr, hStream, EMM_COUNT_PASS_FREE, &ff);
		}
		/* One of our blocks freed inside a capture: the driver cannot
		 * make a graph node of it. The graph quarantine keeps it until
		 * the graph is gone (as for a synchronous free during capture). */
		if (fr == 0)
			emm_debug("cuMemFreeAsync(%#llx) of a libemm block on a capturing stream: quarantined "
			          "while the captured graph lives",
			          (unsigned long long)dptr);
		if (pool_free("cuMemFreeAsync", dptr, EMM_STREAM_SYNC, hStream, false, &r))
			return r;
		return passed_free(real(dptr, hStream), dptr, hStream, EMM_COUNT_PASS_FREE, NULL);
	}
	if (pool_free("cuMemFreeAsync", dptr, emm_state_stream_key(hStream, ptsz), hStream, false, &r))
		return r;
	emm_serve_foreign_free_begin(dptr, caller, &ff);
	r = real(dptr, hStream);
	return passed_free(r, dptr, hStream, EMM_COUNT_PASS_FREE, &ff);
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(REAL(cuMemAllocAsync), dptr, bytesize, hStream, false);
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(REAL(cuMemAllocAsync_ptsz), dptr, bytesize, hStream, true);
}

EMM_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(REAL(cuMemFreeAsync), dptr, hStream, false, __builtin_return_address(0));
}

EMM_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(REAL(cuMemFreeAsync_ptsz), dptr, hStream, true, __builtin_return_address(0));
}

/* --- pinned host memory ------------------------------------------------ */

EMM_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemAllocHost_v2, pp, bytesize);
	if (host_alloc(pp, bytesize, 0, &r))
		return r;
	r = CALL_REAL(cuMemAllocHost_v2, pp, bytesize);
	return passed_alloc(r, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pp : 0, bytesize, NULL,
	                    EMM_COUNT_PASS_HOST_ALLOC);
}

EMM_EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemHostAlloc, pp, bytesize, Flags);
	if (host_alloc(pp, bytesize, Flags, &r))
		return r;
	r = CALL_REAL(cuMemHostAlloc, pp, bytesize, Flags);
	return passed_alloc(r, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pp : 0, bytesize, NULL,
	                    EMM_COUNT_PASS_HOST_ALLOC);
}

EMM_EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
	struct emm_foreign_free ff;
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemFreeHost, p);
	if (pool_free("cuMemFreeHost", (uint64_t)(uintptr_t)p, EMM_STREAM_SYNC, NULL, true, &r))
		return r;
	emm_serve_foreign_free_begin((uint64_t)(uintptr_t)p, __builtin_return_address(0), &ff);
	r = CALL_REAL(cuMemFreeHost, p);
	return passed_free(r, (uint64_t)(uintptr_t)p, NULL, EMM_COUNT_PASS_HOST_FREE, &ff);
}

EMM_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	CUresult r = CALL_REAL(cuMemHostRegister_v2, p, bytesize, Flags);

	if (r == CUDA_SUCCESS && emm_state_enabled()) {
		emm_state_count(EMM_COUNT_HOST_REGISTER);
		emm_state_passby(EMM_PASSBY_HOST_REGISTER, bytesize);
	}
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	CUresult r = CALL_REAL(cuMemHostUnregister, p);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_count(EMM_COUNT_HOST_UNREGISTER);
	return r;
}

/* --- managed memory (accounted, passed through) ------------------------ */

EMM_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	CUresult r = CALL_REAL(cuMemAllocManaged, dptr, bytesize, flags);

	if (!emm_state_enabled())
		return r;
	return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, bytesize, NULL, EMM_COUNT_MANAGED_ALLOC);
}
