/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_pool.c - the driver's explicit memory pools
 * (cuMemPoolCreate, cuMemPoolDestroy, cuMemAllocFromPoolAsync and its _ptsz
 * export): the program chose its pool, so libemm passes every call through
 * unchanged and only counts (EMM_STATS: pool allocs, creates, destroys) and
 * traces (EMM_LOG) what succeeded. Their frees come through cuMemFreeAsync,
 * which forwards pointers libemm did not hand out (shims_mem.c).
 */
#include <cuda.h>

#include "common/compiler.h"
#include "interpose/shims.h"

#define VMM(fn)		   (emm_real_vmm()->fn)
#define CALL_VMM(fn, ...) (VMM(fn) ? VMM(fn)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

typedef CUresult (*alloc_from_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);

static CUresult alloc_from_pool(alloc_from_pool_fn real, CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                CUstream hStream)
{
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(dptr, bytesize, pool, hStream);
	if (r == CUDA_SUCCESS && dptr && emm_state_enabled())
		emm_vmm_count_pool(EMM_POOL_ALLOC, *dptr, bytesize, hStream);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                    CUstream hStream)
{
	return alloc_from_pool(VMM(alloc_from_pool), dptr, bytesize, pool, hStream);
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                         CUstream hStream)
{
	return alloc_from_pool(VMM(alloc_from_pool_ptsz), dptr, bytesize, pool, hStream);
}

EMM_EXPORT CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
	CUresult r = CALL_VMM(cuMemPoolCreate, pool, poolProps);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_vmm_count_pool(EMM_POOL_CREATE, 0, 0, NULL);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
	CUresult r = CALL_VMM(cuMemPoolDestroy, pool);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_vmm_count_pool(EMM_POOL_DESTROY, 0, 0, NULL);
	return r;
}
