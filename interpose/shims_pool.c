/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_pool.c - the driver's explicit memory pools
 * (cuMemPoolCreate, cuMemPoolDestroy, cuMemAllocFromPoolAsync and its _ptsz
 * export): the program chose its pool, so libemm passes every call through
 * unchanged and only counts (EMM_STATS: pool allocs, creates, destroys) and
 * traces (EMM_LOG) what succeeded. Their frees come through cuMemFreeAsync,
 * which forwards pointers libemm did not hand out (shims_mem.c).
 *
 * The pool attribute calls (cuMemPoolGetAttribute, cuMemPoolSetAttribute,
 * cuMemPoolTrimTo) go to the driver first; for the device's default pool,
 * whose allocations libemm serves, the process layer then adds libemm's
 * books to the used/reserved answers, resets its high marks, applies a
 * release threshold or trims its idle memory (process/pool_attr.c).
 */
#include <cuda.h>
#include <stdbool.h>

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

typedef CUresult (*pool_attr_fn)(CUmemoryPool, CUmemPool_attribute, void *);

/* The driver answers first; then the books of a served pool (pool_attr.c). */
static CUresult pool_attr(bool set, CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	pool_attr_fn real = set ? VMM(cuMemPoolSetAttribute) : VMM(cuMemPoolGetAttribute);
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(pool, attr, value);
	if (r != CUDA_SUCCESS || !emm_state_enabled())
		return r;
	if (set)
		emm_pool_books_set(pool, attr, value);
	else
		(void)emm_pool_books_get(pool, attr, value);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	return pool_attr(false, pool, attr, value);
}

EMM_EXPORT CUresult CUDAAPI cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	return pool_attr(true, pool, attr, value);
}

EMM_EXPORT CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	CUresult r = CALL_VMM(cuMemPoolTrimTo, pool, minBytesToKeep);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_pool_books_trim(pool, minBytesToKeep);
	return r;
}
