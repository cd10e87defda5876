/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_vmm_fence.c - what the fence of a cached VMM free
 * costs with live non-blocking streams (XLA keeps 18 per GPU), through the
 * shims over the test-double driver (run with LD_PRELOAD=libemm.so). At the
 * free each non-blocking stream is asked first (cuStreamQuery); the fake
 * answers from its event model (a stream is idle once every event recorded
 * on it has completed), so a stream is made busy here by recording an
 * event of the test's own on it with a long completion delay.
 *
 *   - 18 idle streams: each cached free + reuse records the legacy event
 *     alone (one cuStreamQuery per stream at the free, one cuEventQuery at
 *     the reuse), and the reuse is still served by the cache;
 *   - idle streams, legacy event incomplete: the buffer waits for it;
 *   - one busy stream among idle ones gets its event, and the buffer is not
 *     handed back until that stream's work has completed (the legacy
 *     event's completion is not enough); then the cache serves it;
 *   - during a global-mode capture no stream is queried (the capture stays
 *     valid) and the free is made real.
 */
#include "emm_test.h"
#include "shims_common.h"
#include "vmm_calls.h"

#define MIB	 ((size_t)1 << 20)
#define NSTREAMS 18 /* XLA's non-blocking streams per GPU */

static const char *const vmm_names[] = {"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                                        "cuMemUnmap", "cuMemRelease", "cuMemAddressFree"};

static uint64_t vmm_calls(void)
{
	uint64_t n = 0;

	for (size_t i = 0; i < sizeof(vmm_names) / sizeof(vmm_names[0]); i++)
		n += fakecuda_calls(vmm_names[i]);
	return n;
}

/* XLA's allocation on device 0. */
static CUresult xla_alloc(struct vmm_buf *b, size_t size)
{
	CUmemAllocationProp p = vmm_call_prop(0, CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = vmm_call_access(0);

	return vmm_call_alloc(b, size, &p, &d, 1);
}

static void streams_create(CUstream *s, int n)
{
	for (int i = 0; i < n; i++)
		assert_int_eq(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
}

static void streams_destroy(CUstream *s, int n)
{
	for (int i = 0; i < n; i++)
		assert_int_eq(cuStreamDestroy(s[i]), CUDA_SUCCESS);
}

TEST_BEGIN(test_idle_streams_get_no_event)
{
	enum { ROUNDS = 50 };
	CUstream s[NSTREAMS];
	struct vmm_buf b;
	struct emm_stats st, dst;
	struct fakecuda_stats f0, f1;

	streams_create(s, NSTREAMS);
	shims_release_idle(-1, 0);
	assert_int_eq(xla_alloc(&b, 2 * MIB), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st), 0);
	fakecuda_reset_counters();
	f0 = fake_stats();
	for (int i = 0; i < ROUNDS; i++) {
		assert_int_eq(xla_alloc(&b, 2 * MIB), CUDA_SUCCESS);
		assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	}
	f1 = fake_stats();
	shims_stats_since(&st, &dst);
	fprintf(stderr, "%d cached VMM buffers, %d idle streams: %llu event records, %llu stream queries, "
	                "%llu event queries\n",
	        ROUNDS, NSTREAMS, (unsigned long long)(f1.event_records - f0.event_records),
	        (unsigned long long)(f1.stream_queries - f0.stream_queries),
	        (unsigned long long)(f1.event_queries - f0.event_queries));
	expect_u64_eq(dst.vmm_hits, ROUNDS);
	expect_u64_eq(vmm_calls(), 0);
	expect_u64_eq(f1.event_records - f0.event_records, ROUNDS);   /* the legacy one */
	expect_u64_eq(f1.event_queries - f0.event_queries, ROUNDS);   /* at each reuse */
	expect_u64_eq(f1.stream_queries - f0.stream_queries, (uint64_t)NSTREAMS * ROUNDS);
	expect_u64_eq(f1.event_syncs + f1.ctx_syncs + f1.stream_syncs, 0); /* no host wait */
	streams_destroy(s, NSTREAMS);
}
TEST_END

/* Idle non-blocking streams, legacy event incomplete: the buffer waits. */
TEST_BEGIN(test_idle_streams_buffer_waits_for_legacy_event)
{
	CUstream s[NSTREAMS];
	struct vmm_buf a, b, c;

	streams_create(s, NSTREAMS);
	shims_release_idle(-1, 0);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(xla_alloc(&a, 6 * MIB), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&a), CUDA_SUCCESS);
	assert_int_eq(xla_alloc(&b, 6 * MIB), CUDA_SUCCESS);
	expect_true(b.va != a.va);
	/* The legacy stream's work done: a comes back from the cache. */
	assert_int_eq(cuStreamSynchronize(NULL), CUDA_SUCCESS);
	fakecuda_reset_counters();
	assert_int_eq(xla_alloc(&c, 6 * MIB), CUDA_SUCCESS);
	expect_u64_eq(c.va, a.va);
	expect_u64_eq(vmm_calls(), 0);
	assert_int_eq(vmm_call_free(&c), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	streams_destroy(s, NSTREAMS);
}
TEST_END

TEST_BEGIN(test_busy_stream_holds_buffer)
{
	CUstream s[NSTREAMS];
	CUevent work;
	struct vmm_buf a, b, c, d;
	struct fakecuda_stats f0, f1;
	CUstream busy;

	streams_create(s, NSTREAMS);
	busy = s[NSTREAMS / 2];
	shims_release_idle(-1, 0);
	assert_int_eq(cuEventCreate(&work, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(xla_alloc(&a, 10 * MIB), CUDA_SUCCESS);
	/* "Work" on busy that may touch a: an event that completes only when
	 * synchronized. */
	assert_int_eq(cuEventRecord(work, busy), CUDA_SUCCESS);
	f0 = fake_stats();
	assert_int_eq(vmm_call_free(&a), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_u64_eq(f1.event_records - f0.event_records, 2); /* legacy + busy */
	expect_u64_eq(f1.stream_queries - f0.stream_queries, NSTREAMS);
	/* Neither event complete: a stays out of reach. */
	assert_int_eq(xla_alloc(&b, 10 * MIB), CUDA_SUCCESS);
	expect_true(b.va != a.va);
	/* The legacy event completes; busy's does not: still out of reach. */
	assert_int_eq(cuStreamSynchronize(NULL), CUDA_SUCCESS);
	assert_int_eq(xla_alloc(&c, 10 * MIB), CUDA_SUCCESS);
	expect_true(c.va != a.va);
	/* busy's work done: the cache hands a back, no driver VMM call. */
	assert_int_eq(cuStreamSynchronize(busy), CUDA_SUCCESS);
	fakecuda_reset_counters();
	assert_int_eq(xla_alloc(&d, 10 * MIB), CUDA_SUCCESS);
	expect_u64_eq(d.va, a.va);
	expect_u64_eq(vmm_calls(), 0);
	assert_int_eq(vmm_call_free(&d), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&c), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuEventDestroy(work), CUDA_SUCCESS);
	streams_destroy(s, NSTREAMS);
}
TEST_END

/* A global-mode capture forbids every query: the free is not fenced (no
 * stream asked, the capture stays valid) but made real. */
TEST_BEGIN(test_global_capture_queries_no_stream)
{
	CUstream s[2];
	CUgraph graph = NULL;
	struct vmm_buf a;
	struct emm_stats st, dst;
	struct fakecuda_stats f0, f1;

	streams_create(s, 2);
	shims_release_idle(-1, 0);
	assert_int_eq(xla_alloc(&a, 4 * MIB), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st), 0);
	f0 = fake_stats();
	assert_int_eq(cuStreamBeginCapture(s[0], CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&a), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_u64_eq(f1.stream_queries - f0.stream_queries, 0);
	expect_u64_eq(f1.event_records - f0.event_records, 0);
	expect_u64_eq(f1.fence_calls_in_global_capture - f0.fence_calls_in_global_capture, 0);
	expect_u64_eq(f1.capture_violations - f0.capture_violations, 0);
	expect_int_eq(cuStreamEndCapture(s[0], &graph), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_u64_eq(f1.captures_invalidated - f0.captures_invalidated, 0);
	if (graph)
		expect_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	shims_stats_since(&st, &dst);
	expect_u64_eq(dst.vmm_idle_bytes, 0);
	streams_destroy(s, 2);
}
TEST_END

int main(void)
{
	if (!fakecuda_known_function("cuMemCreate")) {
		printf("the test-double driver has no VMM calls: skipped\n");
		return 77;
	}
	(void)shims_setup();
	return emm_test_run(test_idle_streams_get_no_event, test_idle_streams_buffer_waits_for_legacy_event,
	                    test_busy_stream_holds_buffer, test_global_capture_queries_no_stream, NULL);
}
