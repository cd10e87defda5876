/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/test-fake-pool.c - the fake's explicit memory pools
 * (fake_pool.c): accounting against the device capacity, reuse, the release
 * threshold, trim, the high watermarks, destroy with allocations out,
 * cuDeviceSetMemPool steering cuMemAllocAsync, cuGetProcAddress, and the
 * error codes.
 */
#include "emm_test.h"
#include "fakecuda.h"

#define MIB ((size_t)1 << 20)

/* Declared by cuda.h only for per-thread-default-stream builds. */
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);

static CUmemoryPool make_pool(int dev, size_t max_size)
{
	CUmemPoolProps props;
	CUmemoryPool pool = NULL;

	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = dev;
	props.maxSize = max_size;
	if (cuMemPoolCreate(&pool, &props) != CUDA_SUCCESS)
		return NULL;
	return pool;
}

static cuuint64_t attr(CUmemoryPool pool, CUmemPool_attribute a)
{
	cuuint64_t v = 0xdead;

	(void)cuMemPoolGetAttribute(pool, a, &v);
	return v;
}

static void start(void)
{
	CUcontext ctx;

	fakecuda_reset();
	fakecuda_set_mem_capacity(256 * MIB);
	if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
	    cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		exit(1);
}

TEST_BEGIN(test_accounting_and_reuse)
{
	CUmemoryPool pool;
	CUdeviceptr a, b;
	cuuint64_t keep = UINT64_MAX, zero = 0;
	size_t free_bytes, total;

	start();
	pool = make_pool(0, 0);
	assert_ptr_not_null(pool);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), 0);
	expect_int_eq(cuMemAllocFromPoolAsync(&a, 3 * MIB, pool, NULL), CUDA_SUCCESS);
	/* Reserved in 2 MiB steps, used as requested (rounded to 256). */
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 3 * MIB);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 4 * MIB);
	expect_u64_eq(fakecuda_mem_used(0), 4 * MIB);
	assert_int_eq(cuMemGetInfo(&free_bytes, &total), CUDA_SUCCESS);
	expect_u64_eq(free_bytes, 252 * MIB);
	memset((void *)(uintptr_t)a, 1, 3 * MIB); /* real memory */

	/* Threshold 0: a free gives the memory back at once. */
	expect_int_eq(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 0);
	expect_u64_eq(fakecuda_mem_used(0), 0);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 3 * MIB);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH), 4 * MIB);

	/* Threshold high: the pool keeps it and reuses it. */
	expect_int_eq(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep), CUDA_SUCCESS);
	expect_int_eq(cuMemAllocFromPoolAsync(&a, 10 * MIB, pool, NULL), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(a), CUDA_SUCCESS); /* a synchronous free returns it too */
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 0);
	expect_u64_eq(fakecuda_mem_used(0), 10 * MIB);
	expect_int_eq(cuMemAllocFromPoolAsync(&b, 6 * MIB, pool, NULL), CUDA_SUCCESS);
	expect_u64_eq(fakecuda_mem_used(0), 10 * MIB);
	/* Trim keeps what is used. */
	expect_int_eq(cuMemPoolTrimTo(pool, 0), CUDA_SUCCESS);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 6 * MIB);
	expect_u64_eq(fakecuda_mem_used(0), 6 * MIB);
	/* High watermarks reset to the current value, only with 0. */
	expect_int_eq(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &zero), CUDA_SUCCESS);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_HIGH), 6 * MIB);
	expect_int_eq(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, &keep),
	              CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &zero),
	              CUDA_ERROR_INVALID_VALUE);

	/* Beyond the device: out of memory, nothing taken. */
	expect_int_eq(cuMemAllocFromPoolAsync(&a, 300 * MIB, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY);
	fakecuda_fail_next_alloc(1);
	expect_int_eq(cuMemAllocFromPoolAsync(&a, MIB, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 6 * MIB);

	/* Destroy with an allocation out: returns at once, the memory goes
	 * with the last free. */
	expect_int_eq(cuMemPoolDestroy(pool), CUDA_SUCCESS);
	expect_int_eq(cuMemPoolTrimTo(pool, 0), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemAllocFromPoolAsync(&a, MIB, pool, NULL), CUDA_ERROR_INVALID_VALUE);
	expect_u64_eq(fakecuda_mem_used(0), 6 * MIB);
	expect_int_eq(cuMemFreeAsync(b, NULL), CUDA_SUCCESS);
	expect_u64_eq(fakecuda_mem_used(0), 0);
}
TEST_END

TEST_BEGIN(test_max_size_and_device_pool)
{
	CUmemoryPool pool, def = NULL, cur = NULL, h = NULL;
	CUdeviceptr a, b;

	start();
	pool = make_pool(0, 4 * MIB);
	assert_ptr_not_null(pool);
	expect_int_eq(cuMemAllocFromPoolAsync(&a, 4 * MIB, pool, NULL), CUDA_SUCCESS);
	expect_int_eq(cuMemAllocFromPoolAsync(&b, 256, pool, NULL), CUDA_ERROR_OUT_OF_MEMORY);
	expect_int_eq(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);

	assert_int_eq(cuDeviceGetDefaultMemPool(&def, 0), CUDA_SUCCESS);
	assert_int_eq(cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
	expect_ptr_eq(cur, def);
	/* cuMemAllocAsync follows the device's current pool. */
	expect_int_eq(cuDeviceSetMemPool(0, pool), CUDA_SUCCESS);
	assert_int_eq(cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
	expect_ptr_eq(cur, pool);
	expect_int_eq(cuMemAllocAsync(&a, MIB, NULL), CUDA_SUCCESS);
	expect_u64_eq(attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), MIB);
	expect_int_eq(cuPointerGetAttribute(&h, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a), CUDA_SUCCESS);
	expect_ptr_eq(h, pool);
	expect_int_eq(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
	/* Destroying the current pool falls back to the default one. */
	expect_int_eq(cuMemPoolDestroy(pool), CUDA_SUCCESS);
	assert_int_eq(cuDeviceGetMemPool(&cur, 0), CUDA_SUCCESS);
	expect_ptr_eq(cur, def);
	expect_int_eq(cuMemAllocAsync(&a, MIB, NULL), CUDA_SUCCESS);
	expect_int_eq(cuPointerGetAttribute(&h, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a), CUDA_SUCCESS);
	expect_ptr_eq(h, def);
	expect_int_eq(cuMemFreeAsync(a, NULL), CUDA_SUCCESS);
	/* The default pool is a handle: it cannot be destroyed. */
	expect_int_eq(cuMemPoolDestroy(def), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemPoolTrimTo(def, 0), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_errors)
{
	CUmemPoolProps props;
	CUmemoryPool pool = NULL;
	CUdeviceptr a = 0;
	void *fn = NULL;
	CUdriverProcAddressQueryResult q;

	fakecuda_reset();
	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	expect_int_eq(cuMemPoolCreate(&pool, &props), CUDA_ERROR_NOT_INITIALIZED);
	start();
	expect_int_eq(cuMemPoolCreate(NULL, &props), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemPoolCreate(&pool, NULL), CUDA_ERROR_INVALID_VALUE);
	props.location.id = 7;
	expect_int_eq(cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_DEVICE);
	props.location.id = 0;
	props.allocType = CU_MEM_ALLOCATION_TYPE_INVALID;
	expect_int_eq(cuMemPoolCreate(&pool, &props), CUDA_ERROR_INVALID_VALUE);
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	expect_int_eq(cuMemPoolCreate(&pool, &props), CUDA_ERROR_NOT_SUPPORTED);
	props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
	assert_int_eq(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
	expect_int_eq(cuMemAllocFromPoolAsync(NULL, 16, pool, NULL), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemAllocFromPoolAsync(&a, 0, pool, NULL), CUDA_SUCCESS);
	expect_u64_eq(a, 0);
	expect_int_eq(cuMemAllocFromPoolAsync(&a, 16, (CUmemoryPool)&props, NULL), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, NULL), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuDeviceGetDefaultMemPool(&pool, 9), CUDA_ERROR_INVALID_DEVICE);
	expect_int_eq(cuDeviceGetMemPool(NULL, 0), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemPoolDestroy(pool), CUDA_SUCCESS);
	expect_int_eq(cuMemPoolDestroy(pool), CUDA_ERROR_INVALID_VALUE);
	/* Resolvable by base name, the _ptsz form with the per-thread flag. */
	expect_int_eq(cuGetProcAddress_v2("cuMemAllocFromPoolAsync", &fn, 12000,
	                                  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &q),
	              CUDA_SUCCESS);
	expect_ptr_eq(fn, (void *)(uintptr_t)cuMemAllocFromPoolAsync_ptsz);
	expect_int_eq(cuGetProcAddress_v2("cuMemPoolCreate", &fn, 11000, 0, &q), CUDA_SUCCESS);
	expect_ptr_null(fn);
	expect_int_eq(q, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}
TEST_END

int main(void)
{
	return emm_test_run(test_accounting_and_reuse, test_max_size_and_device_pool, test_errors, NULL);
}
