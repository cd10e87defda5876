/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/test-driver-backend.c - the driver backend against a host
 * whose driver_proc hands out small fakes of the five driver functions it
 * uses.
 */
#include <cuda.h>
#include <errno.h>

#include "allocator/backend_loader.h"
#include "emm_test.h"

#define MIB        (UINT64_C(1) << 20)
#define FAKE_TOTAL (64 * MIB)

static const struct emm_backend *be;

/* --- the fake driver --- */

static size_t fake_used;
static CUdeviceptr fake_next = 0x700000000000ull;
static CUresult fake_fail_with; /* CUDA_SUCCESS: behave */
static int fake_allocs, fake_frees, fake_host_allocs, fake_host_frees;
static CUdeviceptr fake_last_freed;
static unsigned fake_last_flags;
static bool fake_no_alloc, fake_no_host;
static char host_buffer[4096] __attribute__((aligned(512)));

static CUresult fake_mem_alloc(CUdeviceptr *dptr, size_t size)
{
	if (fake_fail_with != CUDA_SUCCESS)
		return fake_fail_with;
	if (size > FAKE_TOTAL - fake_used)
		return CUDA_ERROR_OUT_OF_MEMORY;
	fake_used += size;
	fake_allocs++;
	*dptr = fake_next;
	fake_next += (size + MIB - 1) & ~(MIB - 1);
	return CUDA_SUCCESS;
}

static CUresult fake_mem_free(CUdeviceptr dptr)
{
	if (fake_fail_with != CUDA_SUCCESS)
		return fake_fail_with;
	fake_frees++;
	fake_last_freed = dptr;
	return CUDA_SUCCESS;
}

static CUresult fake_mem_get_info(size_t *free_bytes, size_t *total)
{
	if (fake_fail_with != CUDA_SUCCESS)
		return fake_fail_with;
	*free_bytes = FAKE_TOTAL - fake_used;
	*total = FAKE_TOTAL;
	return CUDA_SUCCESS;
}

static CUresult fake_mem_host_alloc(void **pp, size_t size, unsigned int flags)
{
	if (fake_fail_with != CUDA_SUCCESS)
		return fake_fail_with;
	fake_host_allocs++;
	fake_last_flags = flags;
	*pp = host_buffer;
	return CUDA_SUCCESS;
}

static CUresult fake_mem_free_host(void *p)
{
	fake_host_frees++;
	return p == host_buffer ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static int procs_asked;

static void *fake_driver_proc(const char *name)
{
	procs_asked++;
	if (strcmp(name, "cuMemAlloc_v2") == 0)
		return fake_no_alloc ? NULL : (void *)(uintptr_t)fake_mem_alloc;
	if (strcmp(name, "cuMemFree_v2") == 0)
		return (void *)(uintptr_t)fake_mem_free;
	if (strcmp(name, "cuMemGetInfo_v2") == 0)
		return (void *)(uintptr_t)fake_mem_get_info;
	if (strcmp(name, "cuMemHostAlloc") == 0)
		return fake_no_host ? NULL : (void *)(uintptr_t)fake_mem_host_alloc;
	if (strcmp(name, "cuMemFreeHost") == 0)
		return (void *)(uintptr_t)fake_mem_free_host;
	return NULL;
}

static int log_lines[4];
static char last_log[512];

static void test_log(enum emm_backend_log_level level, const char *msg)
{
	log_lines[level]++;
	snprintf(last_log, sizeof(last_log), "%s", msg);
}

static const struct emm_backend_host host = {
    .interface_version = 1,
    .struct_size = sizeof(struct emm_backend_host),
    .driver_proc = fake_driver_proc,
    .log = test_log,
    .options = "",
};

static void reset_fake(void)
{
	fake_used = 0;
	fake_fail_with = CUDA_SUCCESS;
	fake_allocs = fake_frees = fake_host_allocs = fake_host_frees = 0;
	fake_no_alloc = fake_no_host = false;
	memset(log_lines, 0, sizeof(log_lines));
}

TEST_BEGIN(test_table)
{
	expect_str_eq(be->name, "driver");
	expect_int_eq(be->caps, EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_HOST_PINNED | EMM_BACKEND_CAP_IPC);
	expect_ptr_not_null(be->host_segment_alloc);
	expect_ptr_not_null(be->host_segment_free);
}
TEST_END

TEST_BEGIN(test_success_path)
{
	void *st = NULL;
	uint64_t a = 0, b = 0, h = 0;
	size_t free_bytes = 0, total = 0;

	reset_fake();
	assert_int_eq(be->init(&host, 0, 0xabc, &st), 0);
	assert_ptr_not_null(st);
	expect_int_eq(be->segment_alloc(st, 2 * MIB, 0, &a), 0);
	expect_int_eq(be->segment_alloc(st, 20 * MIB, 0, &b), 0);
	expect_u64_eq(a, 0x700000000000ull);
	expect_u64_eq(b, a + 2 * MIB);
	expect_int_eq(fake_allocs, 2);
	expect_int_eq(be->mem_info(st, &free_bytes, &total), 0);
	expect_u64_eq(total, FAKE_TOTAL);
	expect_u64_eq(free_bytes, FAKE_TOTAL - 22 * MIB);
	expect_int_eq(be->segment_free(st, a, 2 * MIB, 0), 0);
	expect_u64_eq(fake_last_freed, a);
	expect_int_eq(fake_frees, 1);

	expect_int_eq(be->host_segment_alloc(st, 4096, 0x3, &h), 0);
	expect_ptr_eq((void *)(uintptr_t)h, host_buffer);
	expect_int_eq(fake_last_flags, 0x3);
	expect_int_eq(be->host_segment_free(st, h, 4096), 0);
	expect_int_eq(fake_host_frees, 1);
	expect_int_eq(be->segment_alloc(st, 0, 0, &a), -EINVAL);
	expect_int_eq(log_lines[EMM_BACKEND_LOG_ERROR] + log_lines[EMM_BACKEND_LOG_WARNING], 0);
	be->fini(st, true);
}
TEST_END

TEST_BEGIN(test_error_mapping)
{
	void *st = NULL;
	uint64_t a = 0x1234;
	size_t free_bytes = 77, total = 77;

	reset_fake();
	assert_int_eq(be->init(&host, 1, 0xabc, &st), 0);
	/* out of memory: -ENOMEM, out-parameter untouched */
	expect_int_eq(be->segment_alloc(st, 128 * MIB, 0, &a), -ENOMEM);
	expect_u64_eq(a, 0x1234);
	expect_true(strstr(last_log, "out of memory") != NULL);
	fake_fail_with = CUDA_ERROR_OUT_OF_MEMORY;
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -ENOMEM);
	expect_int_eq(be->host_segment_alloc(st, MIB, 0, &a), -ENOMEM);
	/* anything else: -EIO, logged at debug level only */
	fake_fail_with = CUDA_ERROR_INVALID_VALUE;
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -EIO);
	expect_int_eq(be->segment_free(st, 0x700000000000ull, MIB, 0), -EIO);
	expect_int_eq(be->mem_info(st, &free_bytes, &total), -EIO);
	expect_u64_eq(free_bytes, 77);
	fake_fail_with = CUDA_ERROR_DEINITIALIZED;
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), -EIO);
	expect_true(strstr(last_log, "CUresult 4") != NULL);
	expect_u64_eq(a, 0x1234);
	expect_true(log_lines[EMM_BACKEND_LOG_DEBUG] > 0);
	expect_int_eq(log_lines[EMM_BACKEND_LOG_ERROR] + log_lines[EMM_BACKEND_LOG_WARNING], 0);
	be->fini(st, true);
}
TEST_END

TEST_BEGIN(test_missing_driver_functions)
{
	void *st = (void *)0x1;
	struct emm_backend_host no_driver = host;
	uint64_t a = 0;

	reset_fake();
	fake_no_alloc = true;
	expect_int_eq(be->init(&host, 0, 0xabc, &st), -ENOENT);
	expect_ptr_eq(st, (void *)0x1);
	expect_int_eq(log_lines[EMM_BACKEND_LOG_ERROR], 1);
	expect_true(strstr(last_log, "cuMemAlloc_v2") != NULL);

	no_driver.driver_proc = NULL;
	expect_int_eq(be->init(&no_driver, 0, 0xabc, &st), -ENOENT);

	/* Without cuMemHostAlloc the device side still works; pinned is -ENOTSUP. */
	reset_fake();
	fake_no_host = true;
	assert_int_eq(be->init(&host, 0, 0xabc, &st), 0);
	expect_int_eq(be->segment_alloc(st, MIB, 0, &a), 0);
	expect_int_eq(be->host_segment_alloc(st, MIB, 0, &a), -ENOTSUP);
	expect_int_eq(be->host_segment_free(st, a, MIB), -ENOTSUP);
	be->fini(st, false);
}
TEST_END

int main(void)
{
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;

	if (emm_backend_builtin_driver(&version, &be) != 0 || version != EMM_BACKEND_INTERFACE_VERSION)
		return 1;
	return emm_test_run(test_table, test_success_path, test_error_mapping, test_missing_driver_functions,
	                    NULL);
}
