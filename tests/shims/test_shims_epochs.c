/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_epochs.c - what closing an epoch costs with live
 * non-blocking streams, through the shims over the test-double driver (run
 * with LD_PRELOAD=libemm.so, LD_LIBRARY_PATH=<fakecuda> and
 * EMM_EPOCH_BLOCKS=1: every synchronous free closes an epoch). Each
 * non-blocking stream is asked first (cuStreamQuery); the fake answers from
 * its event model (a stream is idle once every event recorded on it has
 * completed), so a stream is made busy here by recording an event of the
 * test's own on it with a long completion delay (shims_busy.h).
 *
 *   - idle streams: one cuStreamQuery each and no event per close, the
 *     legacy event alone, which each of them waits for (cuStreamWaitEvent),
 *     and the blocks come back at once;
 *   - a busy stream gets its event, and the blocks wait for it after the
 *     legacy one has completed;
 *   - during a global-mode capture no stream is queried (and the capture
 *     stays valid); the epoch closes after it;
 *   - the events a thread's epochs used go back to the context's pool when
 *     the thread exits (process/fence_cuda.c keeps a few per thread): a
 *     second thread doing the same work creates no event.
 */
#include <pthread.h>

#include "emm_test.h"
#include "shims_common.h"
#include "shims_busy.h"

#define BIG    ((size_t)32 << 20) /* a segment each: reuse shows as the address */
#define NSTREAMS 16

TEST_BEGIN(test_idle_streams_get_no_event)
{
	enum { PAIRS = 100 };
	CUstream s[NSTREAMS];
	CUdeviceptr d;
	struct emm_stats st, dst;
	struct fakecuda_stats f0, f1;

	for (int i = 0; i < NSTREAMS; i++)
		assert_int_eq(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st), 0);
	f0 = fake_stats();
	for (int i = 0; i < PAIRS; i++) {
		assert_int_eq(cuMemAlloc(&d, 64 << 10), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	}
	f1 = fake_stats();
	shims_stats_since(&st, &dst);
	fprintf(stderr, "%llu closes: %llu event records, %llu stream queries, %llu event queries\n",
	        (unsigned long long)dst.epochs_closed, (unsigned long long)(f1.event_records - f0.event_records),
	        (unsigned long long)(f1.stream_queries - f0.stream_queries),
	        (unsigned long long)(f1.event_queries - f0.event_queries));
	expect_u64_eq(dst.epochs_closed, PAIRS);
	expect_u64_eq(f1.event_records - f0.event_records, dst.epochs_closed);
	expect_u64_eq(dst.events_recorded, dst.epochs_closed);
	expect_u64_eq(f1.stream_queries - f0.stream_queries, NSTREAMS * dst.epochs_closed);
	for (int i = 0; i < NSTREAMS; i++)
		assert_int_eq(cuStreamDestroy(s[i]), CUDA_SUCCESS);
}
TEST_END

/* Idle non-blocking stream, legacy event incomplete: the stream waits for
 * the event (cuStreamWaitEvent) and the block comes back at once. */
TEST_BEGIN(test_idle_stream_waits_for_legacy_event)
{
	CUstream s;
	CUdeviceptr a, b;
	struct emm_stats st, dst;
	struct fakecuda_stats f0, f1;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(shims_stats(-1, &st), 0);
	f0 = fake_stats();
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, BIG), CUDA_SUCCESS);
	expect_u64_eq(b, a);
	f1 = fake_stats();
	shims_stats_since(&st, &dst);
	expect_u64_eq(dst.epochs_closed, 1);
	expect_u64_eq(dst.events_recorded, 1);
	expect_u64_eq(dst.host_waits, 0);
	expect_u64_eq(f1.stream_waits - f0.stream_waits, 1);
	expect_u64_eq(f1.event_syncs - f0.event_syncs, 0);
	expect_u64_eq(f1.pending_events, 1); /* the legacy event, still incomplete */
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_busy_stream_gets_event)
{
	struct busy_scenario bs;
	CUstream idle;
	struct emm_stats st, dst;
	struct fakecuda_stats f0, f1;

	assert_(busy_begin(&bs, BIG));
	assert_int_eq(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st), 0);
	f0 = fake_stats();
	assert_int_eq(cuMemFree(bs.a), CUDA_SUCCESS);
	f1 = fake_stats();
	shims_stats_since(&st, &dst);
	expect_u64_eq(dst.epochs_closed, 1);
	expect_u64_eq(dst.events_recorded, 2); /* legacy + busy */
	expect_u64_eq(f1.event_records - f0.event_records, 2);
	expect_u64_eq(f1.stream_queries - f0.stream_queries, 2);
	assert_(busy_miss(&bs));
	assert_(busy_end(&bs));
	assert_int_eq(cuStreamDestroy(idle), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_global_capture_queries_no_stream)
{
	CUstream cap, idle;
	CUdeviceptr a;
	CUgraph graph = NULL;
	struct emm_stats st, dst;
	struct fakecuda_stats f0, f1;

	assert_int_eq(cuStreamCreate(&cap, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st), 0);
	f0 = fake_stats();
	assert_int_eq(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_u64_eq(f1.stream_queries - f0.stream_queries, 0);
	expect_u64_eq(f1.event_records - f0.event_records, 0);
	expect_u64_eq(f1.fence_calls_in_global_capture - f0.fence_calls_in_global_capture, 0);
	expect_u64_eq(f1.capture_violations - f0.capture_violations, 0);
	expect_int_eq(cuStreamEndCapture(cap, &graph), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_u64_eq(f1.captures_invalidated - f0.captures_invalidated, 0);
	if (graph)
		expect_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	/* After it the epoch closes (at the capture's end or the next free),
	 * asking both streams. */
	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	f1 = fake_stats();
	shims_stats_since(&st, &dst);
	expect_true(dst.epochs_closed >= 1);
	expect_true(f1.stream_queries - f0.stream_queries >= 2);
	assert_int_eq(cuStreamDestroy(idle), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(cap), CUDA_SUCCESS);
}
TEST_END

static CUcontext primary;

static void *pairs_thread(void *arg)
{
	CUdeviceptr d;

	(void)arg;
	if (cuCtxSetCurrent(primary) != CUDA_SUCCESS)
		return (void *)1;
	for (int i = 0; i < 64; i++) {
		if (cuMemAlloc(&d, 64 << 10) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
			return (void *)1;
	}
	return NULL;
}

static uint64_t events_created_by_a_thread(void)
{
	uint64_t before = fakecuda_calls("cuEventCreate");
	pthread_t t;
	void *ret = (void *)1;

	if (pthread_create(&t, NULL, pairs_thread, NULL) != 0 || pthread_join(t, &ret) != 0)
		return UINT64_MAX;
	expect_ptr_null(ret);
	return fakecuda_calls("cuEventCreate") - before;
}

TEST_BEGIN(test_thread_events_back_at_exit)
{
	uint64_t first = events_created_by_a_thread();

	fprintf(stderr, "first thread: %llu events created\n", (unsigned long long)first);
	expect_true(first >= 1 && first != UINT64_MAX);
	/* The first thread's events went back at its exit: none needed. */
	expect_u64_eq(events_created_by_a_thread(), 0);
}
TEST_END

int main(void)
{
	primary = shims_setup();
	/* First: the context's event pool is empty, the first thread creates. */
	return emm_test_run(test_thread_events_back_at_exit, test_idle_streams_get_no_event,
	                    test_idle_stream_waits_for_legacy_event, test_busy_stream_gets_event,
	                    test_global_capture_queries_no_stream, NULL);
}
