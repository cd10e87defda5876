/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_passby.c - the "passed by" statistics (struct
 * emm_stats' passby_* fields, EMM_STATS' "passed by" rows): every family
 * of calls that reaches the driver without libemm serving it is counted
 * with its calls and bytes, over the test-double driver (run with
 * LD_PRELOAD=libemm.so, LD_LIBRARY_PATH=<fakecuda>).
 *
 * Arrays count the bytes of their descriptors (every mipmap level) and
 * keep the driver's error codes; failed calls count nothing. Managed
 * memory, host registration, explicit pools, stream-ordered allocations
 * during a capture, graph memory nodes, VMM handles the driver made and
 * frees of unknown pointers count theirs.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "emm_test.h"
#include "shims_common.h"

static struct emm_stats before;

static void mark(void)
{
	assert_int_eq(shims_stats(-1, &before), 0);
}

/* *d = the process-wide counters now minus at mark(). */
static void since(struct emm_stats *d)
{
	shims_stats_since(&before, d);
}

TEST_BEGIN(test_arrays)
{
	CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 100, .Height = 30, .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
	CUDA_ARRAY3D_DESCRIPTOR d3 = {
	    .Width = 16, .Height = 8, .Depth = 4, .Format = CU_AD_FORMAT_UNSIGNED_INT16, .NumChannels = 2};
	CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 64, .Height = 64, .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
	CUDA_ARRAY_DESCRIPTOR bad = d2;
	CUarray a2, a3, one;
	CUmipmappedArray m;
	struct emm_stats d;

	mark();
	assert_int_eq(cuArrayCreate(&a2, &d2), CUDA_SUCCESS);
	assert_int_eq(cuArray3DCreate(&a3, &d3), CUDA_SUCCESS);
	assert_int_eq(cuMipmappedArrayCreate(&m, &dm, 3), CUDA_SUCCESS);
	/* a 1-D array: height 0 is one row */
	bad.Height = 0;
	assert_int_eq(cuArrayCreate(&one, &bad), CUDA_SUCCESS);
	/* the driver's codes, nothing counted */
	bad.Width = 0;
	expect_int_eq(cuArrayCreate(&one, &bad), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuArrayCreate(NULL, &d2), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuArray3DCreate(&a3, NULL), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMipmappedArrayCreate(&m, &dm, 0), CUDA_ERROR_INVALID_VALUE);
	since(&d);
	expect_int_eq(d.passby_array_calls, 4);
	expect_int_eq(d.passby_array_bytes, 100 * 30 * 16 + 16 * 8 * 4 * 4 + (64 * 64 + 32 * 32 + 16 * 16) + 100 * 16);
	expect_int_eq(d.allocs, 0);
	expect_int_eq(cuArrayDestroy(a2), CUDA_SUCCESS);
	expect_int_eq(cuArrayDestroy(a3), CUDA_SUCCESS);
	expect_int_eq(cuArrayDestroy(one), CUDA_SUCCESS);
	expect_int_eq(cuArrayDestroy(one), CUDA_ERROR_INVALID_HANDLE);
	expect_int_eq(cuMipmappedArrayDestroy(m), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_managed_register_unknown_free)
{
	static char buf[3 * 4096] __attribute__((aligned(4096)));
	CUdeviceptr m;
	struct emm_stats d;

	mark();
	assert_int_eq(cuMemAllocManaged(&m, 12345, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
	assert_int_eq(cuMemHostRegister(buf, sizeof(buf), 0), CUDA_SUCCESS);
	expect_int_eq(cuMemHostRegister(NULL, sizeof(buf), 0), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemHostUnregister(buf), CUDA_SUCCESS);
	/* the managed pointer is not libemm's: its free passes by */
	assert_int_eq(cuMemFree(m), CUDA_SUCCESS);
	since(&d);
	expect_int_eq(d.passby_managed_calls, 1);
	expect_int_eq(d.passby_managed_bytes, 12345);
	expect_int_eq(d.passby_host_register_calls, 1);
	expect_int_eq(d.passby_host_register_bytes, sizeof(buf));
	expect_int_eq(d.passby_unknown_free_calls, 1);
	expect_int_eq(d.passby_unknown_free_bytes, 0);
	/* a device's row carries none of them */
	{
		struct emm_stats dev;
		assert_int_eq(shims_stats(0, &dev), 0);
		expect_int_eq(dev.passby_managed_calls, 0);
	}
}
TEST_END

TEST_BEGIN(test_pool_and_capture)
{
	CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
	                        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemoryPool pool;
	CUstream s;
	CUdeviceptr p, a;
	CUgraph graph = NULL;
	struct emm_stats d;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemPoolCreate(&pool, &props), CUDA_SUCCESS);
	mark();
	assert_int_eq(cuMemAllocFromPoolAsync(&p, 5000, pool, s), CUDA_SUCCESS);
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	assert_int_eq(cuMemAllocAsync(&a, 7000, s), CUDA_SUCCESS);
	assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	since(&d);
	expect_int_eq(d.passby_pool_calls, 1);
	expect_int_eq(d.passby_pool_bytes, 5000);
	expect_int_eq(d.passby_capture_calls, 1);
	expect_int_eq(d.passby_capture_bytes, 7000);
	assert_int_eq(cuMemFreeAsync(p, s), CUDA_SUCCESS);
	assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	assert_int_eq(cuMemPoolDestroy(pool), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_graph_memory_node)
{
	CUDA_MEM_ALLOC_NODE_PARAMS params = {
	    .poolProps = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
	                  .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}},
	    .bytesize = 3 << 20};
	CUgraph g;
	CUgraphNode node;
	struct emm_stats d;

	assert_int_eq(cuGraphCreate(&g, 0), CUDA_SUCCESS);
	mark();
	assert_int_eq(cuGraphAddMemAllocNode(&node, g, NULL, 0, &params), CUDA_SUCCESS);
	expect_true(params.dptr != 0);
	params.bytesize = 0;
	expect_int_eq(cuGraphAddMemAllocNode(&node, g, NULL, 0, &params), CUDA_ERROR_INVALID_VALUE);
	since(&d);
	expect_int_eq(d.passby_graph_mem_calls, 1);
	expect_int_eq(d.passby_graph_mem_bytes, 3 << 20);
	expect_int_eq(d.allocs, 0);
	assert_int_eq(cuGraphDestroy(g), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_vmm_driver_made)
{
	CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
	                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
	CUmemGenericAllocationHandle h;
	size_t gran = 0;
	struct emm_stats d;

	assert_int_eq(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
	mark();
	/* an odd multiple no earlier test made, so the VMM cache has none */
	assert_int_eq(cuMemCreate(&h, 7 * gran, &prop, 0), CUDA_SUCCESS);
	since(&d);
	expect_int_eq(d.passby_vmm_calls, 1);
	expect_int_eq(d.passby_vmm_bytes, 7 * gran);
	expect_int_eq(d.vmm_misses, 1);
	assert_int_eq(cuMemRelease(h), CUDA_SUCCESS);
}
TEST_END

int main(void)
{
	shims_setup();
	return emm_test_run(test_arrays, test_managed_register_unknown_free, test_pool_and_capture,
	                    test_graph_memory_node, test_vmm_driver_made, NULL);
}
