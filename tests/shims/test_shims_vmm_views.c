/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_vmm_views.c - what a cached VMM buffer looks like
 * from outside the XLA sequence (process/vmm.c), over the test-double
 * driver (run with LD_PRELOAD=libemm.so, LD_LIBRARY_PATH=<fakecuda> and
 * EMM_VMM_REAP_MS=200):
 *
 *   - its access, lowered by a later cuMemSetAccess, is what the cache
 *     records: a request for more access is not served from it;
 *   - a pointer query of a freed buffer gets the driver's answer for freed
 *     memory (the deferred free made real first);
 *   - one handle mapped at two ranges by two threads at once is never
 *     cached, so freeing one view cannot hand the other's memory out.
 */
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_common.h"
#include "vmm_calls.h"

#define MIB ((size_t)1 << 20)

static CUcontext g_ctx;

static CUresult xla_alloc(struct vmm_buf *b, size_t size)
{
	CUmemAllocationProp p = vmm_call_prop(0, CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = vmm_call_access(0);

	return vmm_call_alloc(b, size, &p, &d, 1);
}

TEST_BEGIN(test_lowered_access_is_not_served_as_read_write)
{
	struct vmm_buf a, b;
	CUmemAccessDesc ro = vmm_call_access(0);
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	unsigned long long flags = 0;

	expect_true(shims_release_idle(-1, 0) >= 0);
	ro.flags = CU_MEM_ACCESS_FLAGS_PROT_READ;
	assert_int_eq(xla_alloc(&a, 4 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemSetAccess(a.va, a.size, &ro, 1), CUDA_SUCCESS); /* read-only now */
	assert_int_eq(vmm_call_free(&a), CUDA_SUCCESS);
	assert_int_eq(xla_alloc(&b, 4 * MIB), CUDA_SUCCESS); /* asks for read-write */
	assert_int_eq(cuMemGetAccess(&flags, &loc, b.va), CUDA_SUCCESS);
	expect_u64_eq(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	expect_true(shims_release_idle(-1, 0) >= 0);
}
TEST_END

TEST_BEGIN(test_query_of_a_freed_buffer)
{
	struct vmm_buf a;
	size_t size = 0;
	CUdeviceptr base = 0;

	expect_true(shims_release_idle(-1, 0) >= 0);
	assert_int_eq(xla_alloc(&a, 4 * MIB), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&a), CUDA_SUCCESS);
	expect_int_eq(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a.va), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemGetAddressRange(&base, &size, a.va), CUDA_ERROR_NOT_FOUND);
	expect_true(shims_release_idle(-1, 0) >= 0);
}
TEST_END

struct map_arg {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle h;
	CUresult r;
};

static void *map_thread(void *p)
{
	struct map_arg *m = p;

	m->r = cuCtxSetCurrent(g_ctx);
	if (m->r == CUDA_SUCCESS)
		m->r = cuMemMap(m->va, m->size, 0, m->h, 0);
	return NULL;
}

/* Thread 2's cuMemMap(va2, h) is held in the driver while thread 1 maps
 * the same handle at va1 and finishes first. */
TEST_BEGIN(test_one_handle_mapped_twice_at_once)
{
	CUmemAllocationProp p = vmm_call_prop(0, CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = vmm_call_access(0);
	const size_t size = 4 * MIB;
	CUdeviceptr va1, va2;
	CUmemGenericAllocationHandle h;
	struct map_arg m;
	struct vmm_buf live, b;
	pthread_t t;

	expect_true(shims_release_idle(-1, 0) >= 0);
	assert_int_eq(xla_alloc(&live, 2 * MIB), CUDA_SUCCESS); /* the tables in use */
	assert_int_eq(cuMemAddressReserve(&va1, size, 0, 0, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemAddressReserve(&va2, size, 0, 0, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemCreate(&h, size, &p, 0), CUDA_SUCCESS);
	m = (struct map_arg){va2, size, h, CUDA_ERROR_UNKNOWN};
	assert_int_eq(fakecuda_hold_next_call("cuMemMap"), 0);
	assert_int_eq(pthread_create(&t, NULL, map_thread, &m), 0);
	for (int ms = 0; !fakecuda_held_waiting() && ms < 5000; ms++)
		usleep(1000);
	assert_true(fakecuda_held_waiting());
	assert_int_eq(cuMemMap(va1, size, 0, h, 0), CUDA_SUCCESS);
	fakecuda_release_held();
	assert_int_eq(pthread_join(t, NULL), 0);
	assert_int_eq(m.r, CUDA_SUCCESS);
	assert_int_eq(cuMemSetAccess(va1, size, &d, 1), CUDA_SUCCESS);
	assert_int_eq(cuMemSetAccess(va2, size, &d, 1), CUDA_SUCCESS);
	memset((void *)(uintptr_t)va2, 0x11, size);
	/* The va1 view freed (va2 still maps h), then a new buffer. */
	assert_int_eq(cuMemUnmap(va1, size), CUDA_SUCCESS);
	assert_int_eq(cuMemRelease(h), CUDA_SUCCESS);
	assert_int_eq(cuMemAddressFree(va1, size), CUDA_SUCCESS);
	assert_int_eq(xla_alloc(&b, size), CUDA_SUCCESS);
	memset((void *)(uintptr_t)b.va, 0x22, size);
	expect_int_eq(*(volatile unsigned char *)(uintptr_t)va2, 0x11);
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	assert_int_eq(cuMemUnmap(va2, size), CUDA_SUCCESS);
	assert_int_eq(cuMemAddressFree(va2, size), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&live), CUDA_SUCCESS);
}
TEST_END

int main(void)
{
	if (!fakecuda_known_function("cuMemCreate")) {
		printf("the test-double driver has no VMM calls: skipped\n");
		return 77;
	}
	g_ctx = shims_setup();
	return emm_test_run(test_lowered_access_is_not_served_as_read_write, test_query_of_a_freed_buffer,
	                    test_one_handle_mapped_twice_at_once, NULL);
}
