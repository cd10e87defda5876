/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/test-async-backend.c - the async backend (a private
 * CUmemoryPool per context) over the fake driver: the pool it makes, its
 * segments and their reuse, mem_info, trim, the detour around a capturing
 * stream, fini with the driver alive, after the context went (the pool
 * outlives it: fini releases it) and with the driver gone, and the failures.
 */
#include <errno.h>

#include "allocator/backend_loader.h"
#include "backend_host.h"

#define MIB (UINT64_C(1) << 20)

static const struct emm_backend *be;

/* The pool behind a segment, and one of its attributes. */
static CUmemoryPool pool_of(uint64_t addr)
{
	CUmemoryPool pool = NULL;

	if (cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)addr) != CUDA_SUCCESS)
		return NULL;
	return pool;
}

static uint64_t pool_attr(CUmemoryPool pool, CUmemPool_attribute attr)
{
	cuuint64_t v = UINT64_C(0xdead);

	if (cuMemPoolGetAttribute(pool, attr, &v) != CUDA_SUCCESS)
		return UINT64_C(0xdead);
	return v;
}

TEST_BEGIN(test_table)
{
	expect_str_eq(be->name, "async");
	expect_u64_eq(be->caps, EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_STREAM_ORDERED);
	expect_ptr_not_null(be->trim);
	expect_true(be->host_segment_alloc == NULL && be->host_segment_free == NULL);
}
TEST_END

TEST_BEGIN(test_pool_segments_reuse)
{
	void *st = NULL;
	uint64_t a = 0, b = 0, c = 0;
	CUmemoryPool pool, def = NULL;
	CUstream s;
	size_t free_bytes = 0, total = 0;
	unsigned char in[4096], out[4096];

	bh_reset(1024 * MIB);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	assert_ptr_not_null(st);
	expect_u64_eq(fakecuda_calls("cuMemPoolCreate"), 1);
	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);

	expect_int_eq(be->segment_alloc(st, 2 * MIB, 0, &a), 0);
	expect_int_eq(be->segment_alloc(st, 20 * MIB, (uint64_t)(uintptr_t)s, &b), 0);
	expect_u64_eq(fakecuda_calls("cuMemAllocFromPoolAsync"), 2);
	expect_u64_eq(fakecuda_calls("cuMemAlloc_v2"), 0);
	/* A private pool, keeping everything: threshold UINT64_MAX. */
	pool = pool_of(a);
	assert_ptr_not_null(pool);
	expect_ptr_eq(pool_of(b), pool);
	assert_int_eq(cuDeviceGetDefaultMemPool(&def, 0), CUDA_SUCCESS);
	expect_true(pool != def);
	expect_u64_eq(pool_attr(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD), UINT64_MAX);
	expect_u64_eq(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 22 * MIB);
	expect_u64_eq(fakecuda_mem_used(0), 22 * MIB);

	/* The memory holds data. */
	for (size_t i = 0; i < sizeof(in); i++)
		in[i] = (unsigned char)(i * 7);
	expect_int_eq(cuMemcpyHtoD(b + 5 * MIB, in, sizeof(in)), CUDA_SUCCESS);
	expect_int_eq(cuMemcpyDtoH(out, b + 5 * MIB, sizeof(out)), CUDA_SUCCESS);
	expect_true(memcmp(in, out, sizeof(in)) == 0);

	expect_int_eq(be->mem_info(st, &free_bytes, &total), 0);
	expect_u64_eq(total, 1024 * MIB);
	expect_u64_eq(free_bytes, (1024 - 22) * MIB);

	/* Freed with cuMemFreeAsync: the pool keeps the bytes and reuses them. */
	expect_int_eq(be->segment_free(st, b, 20 * MIB, 0), 0);
	expect_u64_eq(fakecuda_calls("cuMemFreeAsync"), 1);
	expect_u64_eq(pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT), 2 * MIB);
	expect_u64_eq(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 22 * MIB);
	expect_u64_eq(fakecuda_mem_used(0), 22 * MIB);
	expect_int_eq(be->segment_alloc(st, 16 * MIB, (uint64_t)(uintptr_t)s, &c), 0);
	expect_u64_eq(fakecuda_mem_used(0), 22 * MIB);

	/* trim gives back what no segment uses, down to `keep`. */
	expect_int_eq(be->segment_free(st, c, 16 * MIB, 0), 0);
	expect_int_eq(be->trim(st, 0), 0);
	expect_u64_eq(pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), 2 * MIB);
	expect_u64_eq(fakecuda_mem_used(0), 2 * MIB);

	/* fini with the driver alive: the segment left is freed, the pool
	 * destroyed, the device has everything back. */
	expect_int_eq(bh_complaints(), 0);
	be->fini(st, true);
	expect_u64_eq(fakecuda_calls("cuMemPoolDestroy"), 1);
	expect_u64_eq(fakecuda_mem_used(0), 0);
	expect_int_eq(cuMemPoolTrimTo(pool, 0), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

/* Two contexts, two pools. */
TEST_BEGIN(test_pool_per_context)
{
	void *st1 = NULL, *st2 = NULL;
	uint64_t a = 0, b = 0;
	CUcontext c2;

	bh_reset(0);
	assert_int_eq(be->init(&bh_host, 0, 1, &st1), 0);
	assert_int_eq(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
	assert_int_eq(be->init(&bh_host, 0, 2, &st2), 0);
	assert_int_eq(be->segment_alloc(st1, 2 * MIB, 0, &a), 0);
	assert_int_eq(be->segment_alloc(st2, 2 * MIB, 0, &b), 0);
	expect_true(pool_of(a) != NULL && pool_of(b) != NULL && pool_of(a) != pool_of(b));
	be->fini(st2, true);
	expect_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	be->fini(st1, true);
	expect_u64_eq(fakecuda_calls("cuMemPoolDestroy"), 2);
}
TEST_END

/* A capturing stream, or the legacy stream while a blocking stream
 * captures, never carries the pool call: the backend's own stream does,
 * and the capture survives. */
TEST_BEGIN(test_capture_detour)
{
	void *st = NULL;
	uint64_t a = 0, b = 0;
	CUstream s, blocking;
	CUgraph graph = NULL;

	bh_reset(0);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&blocking, 0), CUDA_SUCCESS);

	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	expect_int_eq(be->segment_alloc(st, 2 * MIB, (uint64_t)(uintptr_t)s, &a), 0);
	expect_u64_eq(fakecuda_calls("cuStreamCreate"), 3); /* s, blocking, the backend's */
	expect_true(fakecuda_calls("cuStreamSynchronize") >= 1);
	expect_int_eq(be->segment_free(st, a, 2 * MIB, (uint64_t)(uintptr_t)s), 0);
	expect_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	expect_ptr_not_null(graph);
	if (graph)
		expect_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);

	/* Stream 0 (legacy) while a blocking stream captures. */
	assert_int_eq(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	expect_int_eq(be->segment_alloc(st, 4 * MIB, 0, &b), 0);
	expect_int_eq(be->segment_free(st, b, 4 * MIB, 0), 0);
	graph = NULL;
	expect_int_eq(cuStreamEndCapture(blocking, &graph), CUDA_SUCCESS);
	if (graph)
		expect_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	expect_u64_eq(fakecuda_calls("cuStreamCreate"), 3); /* made once */
	expect_int_eq(bh_complaints(), 0);
	be->fini(st, true);
	expect_u64_eq(fakecuda_calls("cuStreamDestroy_v2"), 1);
	expect_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	expect_int_eq(cuStreamDestroy(blocking), CUDA_SUCCESS);
}
TEST_END

/* The calls fini may make after the context went. */
static const char *const fini_calls[] = {"cuMemPoolDestroy", "cuMemFreeAsync", "cuStreamDestroy_v2",
                                         "cuStreamSynchronize", "cuMemPoolTrimTo", "cuDevicePrimaryCtxRetain",
                                         "cuCtxPushCurrent_v2"};
#define NFINI (sizeof(fini_calls) / sizeof(fini_calls[0]))

TEST_BEGIN(test_fini_driver_gone_calls_nothing)
{
	uint64_t before[NFINI];
	void *st = NULL;
	uint64_t a = 0;

	bh_reset(0);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	assert_int_eq(be->segment_alloc(st, 2 * MIB, 0, &a), 0);
	for (size_t i = 0; i < NFINI; i++)
		before[i] = fakecuda_calls(fini_calls[i]);
	/* The driver no longer answers: only the probe is called. */
	assert_int_eq(fakecuda_fail_next_call("cuCtxGetCurrent", CUDA_ERROR_DEINITIALIZED, 1), 0);
	be->fini(st, false);
	for (size_t i = 0; i < NFINI; i++)
		expect_u64_eq(fakecuda_calls(fini_calls[i]), before[i]);
	expect_u64_eq(fakecuda_mem_used(0), 2 * MIB);
}
TEST_END

/* A context destroyed under its segments (cuCtxDestroy with another
 * context of the device current): the driver leaves the pool, fini(false)
 * frees the segments and destroys it through the current context, so the
 * device has everything back and the old addresses are unknown to the
 * driver, as the driver backend's would be. */
TEST_BEGIN(test_fini_after_context_destroyed)
{
	void *st = NULL;
	uint64_t a = 0, b = 0;
	CUcontext primary = bh_reset(0), c2, cur = NULL;

	assert_int_eq(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
	assert_int_eq(be->init(&bh_host, 0, 2, &st), 0);
	assert_int_eq(be->segment_alloc(st, 2 * MIB, 0, &a), 0);
	assert_int_eq(be->segment_alloc(st, 20 * MIB, 0, &b), 0);
	assert_int_eq(be->segment_free(st, b, 20 * MIB, 0), 0); /* kept by the pool */
	expect_u64_eq(fakecuda_mem_used(0), 22 * MIB);
	assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	assert_int_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	expect_ptr_eq(cur, primary);
	/* The pool outlived the context. */
	expect_u64_eq(fakecuda_mem_used(0), 22 * MIB);
	be->fini(st, false);
	expect_u64_eq(fakecuda_calls("cuMemPoolDestroy"), 1);
	expect_u64_eq(fakecuda_calls("cuDevicePrimaryCtxRetain"), 1); /* bh_reset's only */
	expect_u64_eq(fakecuda_mem_used(0), 0);
	expect_int_eq(cuMemFree((CUdeviceptr)a), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(bh_complaints(), 0);
}
TEST_END

/* The same with no live context current (the destroyed one was, or a
 * reset primary context is): the device's primary context carries the
 * frees, retained and pushed for the time, and is left as it was. */
TEST_BEGIN(test_fini_after_context_destroyed_none_current)
{
	void *st = NULL;
	uint64_t a = 0;
	CUcontext cur = NULL;
	unsigned flags = 0;
	int active = 0;

	bh_reset(0);
	assert_int_eq(be->init(&bh_host, 0, 1, &st), 0);
	assert_int_eq(be->segment_alloc(st, 4 * MIB, 0, &a), 0);
	assert_int_eq(cuCtxSetCurrent(NULL), CUDA_SUCCESS);
	be->fini(st, false);
	expect_u64_eq(fakecuda_calls("cuCtxPushCurrent_v2"), 1);
	expect_u64_eq(fakecuda_calls("cuMemPoolDestroy"), 1);
	expect_u64_eq(fakecuda_mem_used(0), 0);
	assert_int_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	expect_ptr_null(cur);
	/* Still retained once (bh_reset's) and active. */
	expect_int_eq(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	expect_int_eq(active, 1);
	expect_int_eq(cuDevicePrimaryCtxRelease(0), CUDA_SUCCESS);
	expect_int_eq(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
	expect_int_eq(active, 0);
	expect_int_eq(bh_complaints(), 0);
}
TEST_END

/* A reset primary context current (cudaDeviceReset before the runtime's
 * next call): the primary context is not brought back; a context of the
 * backend's own carries the frees and goes. */
TEST_BEGIN(test_fini_after_primary_reset)
{
	for (int v4 = 0; v4 <= 1; v4++) {
		void *st = NULL;
		uint64_t a = 0;
		CUcontext primary = bh_reset(0), cur = NULL;
		unsigned flags = 0;
		int active = 1;

		/* A driver without cuCtxCreate_v2: cuCtxCreate_v4. */
		bh_hidden = v4 ? "cuCtxCreate_v2" : NULL;
		assert_int_eq(be->init(&bh_host, 0, 1, &st), 0);
		assert_int_eq(be->segment_alloc(st, 6 * MIB, 0, &a), 0);
		assert_int_eq(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
		expect_u64_eq(fakecuda_mem_used(0), 6 * MIB); /* the pool outlived it */
		be->fini(st, false);
		expect_u64_eq(fakecuda_calls(v4 ? "cuCtxCreate_v4" : "cuCtxCreate_v2"), 1);
		/* Nothing tried in the dead primary first (a failed call a
		 * memory checker would report): one free, in the own context. */
		expect_u64_eq(fakecuda_calls("cuMemFreeAsync"), 1);
		expect_u64_eq(fakecuda_calls("cuMemPoolDestroy"), 1);
		expect_u64_eq(fakecuda_mem_used(0), 0);
		expect_int_eq(cuDevicePrimaryCtxGetState(0, &flags, &active), CUDA_SUCCESS);
		expect_int_eq(active, 0);
		assert_int_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
		expect_ptr_eq(cur, primary);
		expect_int_eq(cuMemFree((CUdeviceptr)a), CUDA_ERROR_CONTEXT_IS_DESTROYED);
		expect_int_eq(bh_complaints(), 0);
	}
}
TEST_END

TEST_BEGIN(test_failures)
{
	void *st = NULL;
	uint64_t a = 0x1234, b = 0;
	size_t free_bytes = 77, total = 77;

	bh_reset(64 * MIB);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	/* Out of memory: -ENOMEM, output untouched. */
	expect_int_eq(be->segment_alloc(st, 128 * MIB, 0, &a), -ENOMEM);
	expect_u64_eq(a, 0x1234);
	expect_true(strstr(bh_last_log, "out of memory") != NULL);
	fakecuda_fail_next_alloc(1);
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -ENOMEM);
	/* Any other error: -EIO, logged at debug level. */
	assert_int_eq(fakecuda_fail_next_call("cuMemAllocFromPoolAsync", CUDA_ERROR_INVALID_VALUE, 1), 0);
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -EIO);
	expect_true(strstr(bh_last_log, "CUresult 1") != NULL);
	expect_u64_eq(a, 0x1234);
	expect_int_eq(be->segment_alloc(st, 0, 0, &a), -EINVAL);
	assert_int_eq(fakecuda_fail_next_call("cuMemGetInfo_v2", CUDA_ERROR_INVALID_CONTEXT, 1), 0);
	expect_int_eq(be->mem_info(st, &free_bytes, &total), -EIO);
	expect_u64_eq(free_bytes, 77);
	/* A failed free keeps the segment; an unknown address is -EINVAL. */
	assert_int_eq(be->segment_alloc(st, 2 * MIB, 0, &b), 0);
	assert_int_eq(fakecuda_fail_next_call("cuMemFreeAsync", CUDA_ERROR_INVALID_VALUE, 1), 0);
	expect_int_eq(be->segment_free(st, b, 2 * MIB, 0), -EIO);
	expect_int_eq(be->segment_free(st, b + 4096, 2 * MIB, 0), -EINVAL);
	expect_int_eq(be->segment_free(st, b, 2 * MIB, 0), 0);
	expect_int_eq(be->segment_free(st, b, 2 * MIB, 0), -EINVAL);
	assert_int_eq(fakecuda_fail_next_call("cuMemPoolTrimTo", CUDA_ERROR_INVALID_VALUE, 1), 0);
	expect_int_eq(be->trim(st, 0), -EIO);
	expect_int_eq(bh_complaints(), 0);
	be->fini(st, true);
}
TEST_END

TEST_BEGIN(test_init_failures)
{
	void *st = (void *)0x1;

	/* A driver without pools: -ENOENT, one error line naming the call. */
	bh_reset(0);
	bh_hidden = "cuMemAllocFromPoolAsync";
	expect_int_eq(be->init(&bh_host, 0, 0xabc, &st), -ENOENT);
	expect_ptr_eq(st, (void *)0x1);
	expect_int_eq(bh_log_lines[EMM_BACKEND_LOG_ERROR], 1);
	expect_true(strstr(bh_last_log, "cuMemAllocFromPoolAsync") != NULL);

	/* A device without pools: -ENOTSUP, no pool made. */
	bh_reset(0);
	bh_replaced = "cuDeviceGetAttribute";
	bh_replacement = (void *)(uintptr_t)bh_attribute_zero;
	expect_int_eq(be->init(&bh_host, 0, 0xabc, &st), -ENOTSUP);
	expect_u64_eq(fakecuda_calls("cuMemPoolCreate"), 0);

	/* cuMemPoolCreate refusing. */
	bh_reset(0);
	assert_int_eq(fakecuda_fail_next_call("cuMemPoolCreate", CUDA_ERROR_NOT_SUPPORTED, 1), 0);
	expect_int_eq(be->init(&bh_host, 0, 0xabc, &st), -ENOTSUP);
	assert_int_eq(fakecuda_fail_next_call("cuMemPoolCreate", CUDA_ERROR_OUT_OF_MEMORY, 1), 0);
	expect_int_eq(be->init(&bh_host, 0, 0xabc, &st), -ENOMEM);
	assert_int_eq(fakecuda_fail_next_call("cuMemPoolCreate", CUDA_ERROR_INVALID_DEVICE, 1), 0);
	expect_int_eq(be->init(&bh_host, 0, 0xabc, &st), -EIO);
	expect_ptr_eq(st, (void *)0x1);

	/* No release threshold: a warning, the pool still serves. */
	bh_reset(0);
	assert_int_eq(fakecuda_fail_next_call("cuMemPoolSetAttribute", CUDA_ERROR_INVALID_VALUE, 1), 0);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	expect_int_eq(bh_log_lines[EMM_BACKEND_LOG_WARNING], 1);
	be->fini(st, true);

	/* No host at all. */
	expect_int_eq(be->init(NULL, 0, 0xabc, &st), -EINVAL);
}
TEST_END

int main(void)
{
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;

	if (emm_backend_builtin_async(&version, &be) != 0 || version != EMM_BACKEND_INTERFACE_VERSION)
		return 1;
	return emm_test_run(test_table, test_pool_segments_reuse, test_pool_per_context, test_capture_detour,
	                    test_fini_driver_gone_calls_nothing, test_fini_after_context_destroyed,
	                    test_fini_after_context_destroyed_none_current, test_fini_after_primary_reset,
	                    test_failures, test_init_failures, NULL);
}
