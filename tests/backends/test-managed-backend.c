/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/test-managed-backend.c - the managed backend over the fake
 * driver: managed segments (cuMemAllocManaged, CU_MEM_ATTACH_GLOBAL) that
 * the host can touch, cuMemFree_v2, mem_info, fini, and the failures.
 */
#include <errno.h>

#include "allocator/backend_loader.h"
#include "backend_host.h"

#define MIB (UINT64_C(1) << 20)

static const struct emm_backend *be;

TEST_BEGIN(test_table)
{
	expect_str_eq(be->name, "managed");
	expect_u64_eq(be->caps, EMM_BACKEND_CAP_DEVICE);
	expect_true(be->trim == NULL && be->host_segment_alloc == NULL && be->host_segment_free == NULL);
}
TEST_END

TEST_BEGIN(test_segments)
{
	struct fakecuda_stats f;
	void *st = NULL;
	uint64_t a = 0, b = 0;
	unsigned int managed = 0;
	size_t free_bytes = 0, total = 0;
	unsigned char out[256];

	bh_reset(64 * MIB);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	assert_ptr_not_null(st);
	/* Larger than the device: managed memory oversubscribes. */
	expect_int_eq(be->segment_alloc(st, 2 * MIB, 0, &a), 0);
	expect_int_eq(be->segment_alloc(st, 128 * MIB, 0, &b), 0);
	expect_u64_eq(fakecuda_calls("cuMemAllocManaged"), 2);
	expect_u64_eq(fakecuda_calls("cuMemAlloc_v2"), 0);
	expect_int_eq(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)b),
	              CUDA_SUCCESS);
	expect_int_eq(managed, 1);
	/* The host may touch it; the device sees the same bytes. */
	memset((void *)(uintptr_t)(b + 100 * MIB), 0x5a, sizeof(out));
	expect_int_eq(cuMemcpyDtoH(out, b + 100 * MIB, sizeof(out)), CUDA_SUCCESS);
	expect_true(out[0] == 0x5a && out[sizeof(out) - 1] == 0x5a);

	/* cuMemGetInfo: the device's own memory (the fake counts no managed
	 * bytes as used). */
	expect_int_eq(be->mem_info(st, &free_bytes, &total), 0);
	expect_u64_eq(total, 64 * MIB);
	expect_u64_eq(free_bytes, 64 * MIB);

	expect_int_eq(be->segment_free(st, b, 128 * MIB, 0), 0);
	expect_int_eq(be->segment_free(st, a, 2 * MIB, 0), 0);
	expect_u64_eq(fakecuda_calls("cuMemFree_v2"), 2);
	fakecuda_get_stats(&f);
	expect_u64_eq(f.live_device_allocations, 0);
	expect_int_eq(bh_complaints(), 0);
	be->fini(st, true);
}
TEST_END

TEST_BEGIN(test_fini_driver_gone_calls_nothing)
{
	void *st = NULL;
	uint64_t a = 0, frees;

	bh_reset(0);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	assert_int_eq(be->segment_alloc(st, 2 * MIB, 0, &a), 0);
	frees = fakecuda_calls("cuMemFree_v2");
	be->fini(st, false);
	expect_u64_eq(fakecuda_calls("cuMemFree_v2"), frees);
}
TEST_END

TEST_BEGIN(test_failures)
{
	void *st = NULL;
	uint64_t a = 0x1234;
	size_t free_bytes = 77, total = 77;

	bh_reset(0);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	fakecuda_fail_next_alloc(1);
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -ENOMEM);
	expect_true(strstr(bh_last_log, "out of memory") != NULL);
	expect_u64_eq(a, 0x1234);
	assert_int_eq(fakecuda_fail_next_call("cuMemAllocManaged", CUDA_ERROR_INVALID_VALUE, 1), 0);
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -EIO);
	expect_true(strstr(bh_last_log, "CUresult 1") != NULL);
	assert_int_eq(fakecuda_fail_next_call("cuMemAllocManaged", CUDA_ERROR_NOT_SUPPORTED, 1), 0);
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -ENOTSUP);
	expect_int_eq(be->segment_alloc(st, 0, 0, &a), -EINVAL);
	expect_u64_eq(a, 0x1234);
	/* The driver refuses a free of what is not a segment. */
	expect_int_eq(be->segment_free(st, 0x1000, MIB, 0), -EIO);
	assert_int_eq(fakecuda_fail_next_call("cuMemGetInfo_v2", CUDA_ERROR_INVALID_CONTEXT, 1), 0);
	expect_int_eq(be->mem_info(st, &free_bytes, &total), -EIO);
	expect_u64_eq(free_bytes, 77);
	expect_u64_eq(total, 77);
	expect_int_eq(bh_complaints(), 0);
	be->fini(st, true);
}
TEST_END

TEST_BEGIN(test_init_failures)
{
	void *st = (void *)0x1;

	bh_reset(0);
	bh_hidden = "cuMemAllocManaged";
	expect_int_eq(be->init(&bh_host, 0, 0xabc, &st), -ENOENT);
	expect_int_eq(bh_log_lines[EMM_BACKEND_LOG_ERROR], 1);
	expect_true(strstr(bh_last_log, "cuMemAllocManaged") != NULL);

	/* A device without managed memory. */
	bh_reset(0);
	bh_replaced = "cuDeviceGetAttribute";
	bh_replacement = (void *)(uintptr_t)bh_attribute_zero;
	expect_int_eq(be->init(&bh_host, 0, 0xabc, &st), -ENOTSUP);
	expect_int_eq(bh_log_lines[EMM_BACKEND_LOG_WARNING], 1);
	expect_ptr_eq(st, (void *)0x1);

	/* An attribute the driver cannot answer is no verdict. */
	bh_reset(0);
	assert_int_eq(fakecuda_fail_next_call("cuDeviceGetAttribute", CUDA_ERROR_INVALID_VALUE, 1), 0);
	assert_int_eq(be->init(&bh_host, 0, 0xabc, &st), 0);
	be->fini(st, true);
	expect_int_eq(be->init(NULL, 0, 0xabc, &st), -EINVAL);
}
TEST_END

int main(void)
{
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;

	if (emm_backend_builtin_managed(&version, &be) != 0 || version != EMM_BACKEND_INTERFACE_VERSION)
		return 1;
	return emm_test_run(test_table, test_segments, test_fini_driver_gone_calls_nothing, test_failures,
	                    test_init_failures, NULL);
}
