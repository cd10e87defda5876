/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_lazyclose.c - an epoch closed by bytes only when
 * memory is needed, through the driver shims over the test-double driver
 * (run with LD_PRELOAD=libemm.so, LD_LIBRARY_PATH=<fakecuda> and the
 * default EMM_EPOCH_BLOCKS/EMM_EPOCH_BYTES, 32 and 64 MiB):
 *
 *   - a LIFO loop of 64 MiB cuMemAlloc+cuMemFree pairs: no cuEventRecord in
 *     any cuMemFree, one device allocation for the whole loop (the same
 *     block every time), with no non-blocking stream and with an idle one;
 *     the driver calls per pair are printed;
 *   - a block freed while a non-blocking stream is busy: the allocation
 *     that misses records the events (legacy and the busy stream) and the
 *     block stays out of reach until the stream's work completes (the
 *     scenario of shims_busy.h).
 */
#include "emm_test.h"
#include "shims_common.h"
#include "shims_busy.h"

#define BIG ((size_t)64 << 20)

static void lifo_loop(bool idle_nb)
{
	enum { PAIRS = 200 };
	CUstream s = NULL;
	CUdeviceptr d, first = 0;
	struct emm_stats st, dst;
	struct fakecuda_stats f0, f1, fb, fa;
	uint64_t free_records = 0;

	if (idle_nb)
		assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	/* Warm: the segment exists before the loop. */
	assert_int_eq(cuMemAlloc(&d, BIG), CUDA_SUCCESS);
	first = d;
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st), 0);
	f0 = fake_stats();
	for (int i = 0; i < PAIRS; i++) {
		assert_int_eq(cuMemAlloc(&d, BIG), CUDA_SUCCESS);
		expect_u64_eq(d, first);
		fb = fake_stats();
		assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
		fa = fake_stats();
		free_records += fa.event_records - fb.event_records;
	}
	f1 = fake_stats();
	shims_stats_since(&st, &dst);
	fprintf(stderr,
	        "%s: per 64 MiB pair: %.2f event records, %.2f event queries, %.2f stream queries, "
	        "%.2f device allocations; %llu closes\n",
	        idle_nb ? "one idle non-blocking stream" : "no non-blocking stream",
	        (double)(f1.event_records - f0.event_records) / PAIRS,
	        (double)(f1.event_queries - f0.event_queries) / PAIRS,
	        (double)(f1.stream_queries - f0.stream_queries) / PAIRS,
	        (double)(f1.device_allocs - f0.device_allocs) / PAIRS, (unsigned long long)dst.epochs_closed);
	expect_u64_eq(free_records, 0);
	expect_u64_eq(f1.device_allocs - f0.device_allocs, 0);
	expect_u64_eq(dst.backend_allocs, 0);
	expect_u64_eq(dst.epochs_closed, PAIRS);
	expect_u64_eq(f1.event_records - f0.event_records, PAIRS); /* the legacy event, at each miss */
	if (idle_nb)
		assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

TEST_BEGIN(test_lifo_64m)
{
	lifo_loop(false);
}
TEST_END

TEST_BEGIN(test_lifo_64m_idle_stream)
{
	lifo_loop(true);
}
TEST_END

TEST_BEGIN(test_busy_stream_block_waits)
{
	struct busy_scenario bs;
	CUdeviceptr keep;
	struct fakecuda_stats f0, f1;

	/* The earlier tests' block, live meanwhile: only a can come back. */
	assert_int_eq(cuMemAlloc(&keep, BIG), CUDA_SUCCESS);
	assert_(busy_begin(&bs, BIG));
	f0 = fake_stats();
	assert_int_eq(cuMemFree(bs.a), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_u64_eq(f1.event_records - f0.event_records, 0); /* the free closes nothing */
	/* The miss closes the epoch: legacy + busy; neither complete. */
	assert_(busy_miss(&bs));
	f1 = fake_stats();
	expect_u64_eq(f1.event_records - f0.event_records, 2);
	assert_(busy_end(&bs));
	assert_int_eq(cuMemFree(keep), CUDA_SUCCESS);
}
TEST_END

int main(void)
{
	(void)shims_setup();
	return emm_test_run(test_lifo_64m, test_lifo_64m_idle_stream, test_busy_stream_block_waits, NULL);
}
