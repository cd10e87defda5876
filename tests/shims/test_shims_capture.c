/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_capture.c - libemm during a global-mode stream
 * capture, over the test-double driver (run with LD_PRELOAD=libemm.so,
 * LD_LIBRARY_PATH=<fakecuda>). The fake refuses a potentially unsafe call
 * (cuMemAlloc, cuEventQuery, ...) made in GLOBAL thread mode while a GLOBAL
 * capture runs, with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and invalidates
 * the capture, as the real driver does; it counts the unsafe calls let
 * through by RELAXED thread mode (relaxed_unsafe_calls) and every fence-like
 * call made while a GLOBAL capture is active (fence_calls_in_global_capture).
 *
 *   - a miss during a global capture reaches the backend with the calling
 *     thread in relaxed mode, and the thread's own mode comes back after;
 *   - another thread allocating and freeing in a loop (misses, hits,
 *     stream-ordered calls on its own stream) leaves the capture valid: no
 *     refused call, no event record or query while the capture runs, no
 *     block handed out twice;
 *   - a capture begun while another thread is inside one of libemm's event
 *     queries waits for it to finish: the query never lands inside the
 *     capture.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_common.h"

static CUcontext g_ctx;

static CUstreamCaptureMode thread_mode(void)
{
	CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;

	if (cuThreadExchangeStreamCaptureMode(&m) != CUDA_SUCCESS)
		return (CUstreamCaptureMode)-1;
	CUstreamCaptureMode back = m;
	(void)cuThreadExchangeStreamCaptureMode(&back);
	return m;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

/* Launch the graph once; CUDA_SUCCESS if it instantiates and runs. */
static CUresult replay(CUgraph graph, CUstream s)
{
	CUgraphExec exec = NULL;
	CUresult r = cuGraphInstantiateWithFlags(&exec, graph, 0);

	if (r == CUDA_SUCCESS)
		r = cuGraphLaunch(exec, s);
	if (r == CUDA_SUCCESS)
		r = cuStreamSynchronize(s);
	if (exec)
		(void)cuGraphExecDestroy(exec);
	return r;
}

/* The global capture on s ran without a refused call or a fence call since
 * *f0: it ends cleanly (not invalidated), and its graph replays. */
static void end_and_replay(CUstream s, const struct fakecuda_stats *f0)
{
	struct fakecuda_stats f1 = fake_stats();
	CUgraph graph = NULL;

	expect_int_eq(f1.capture_violations - f0->capture_violations, 0);
	expect_int_eq(f1.fence_calls_in_global_capture - f0->fence_calls_in_global_capture, 0);
	expect_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_int_eq(f1.captures_invalidated - f0->captures_invalidated, 0);
	expect_ptr_not_null(graph);
	if (graph) {
		expect_int_eq(replay(graph, s), CUDA_SUCCESS);
		expect_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	}
}

/* A global capture whose allocations (device and pinned) miss the cache,
 * made from a thread in `mode`. */
static void global_capture_miss(CUstreamCaptureMode mode)
{
	/* Sizes no earlier block serves (one pair per mode). */
	const size_t BIG = ((size_t)(48 + 32 * mode) << 20) + 12345, HOST = ((size_t)(3 + 8 * mode) << 20) + 7;
	CUstream s;
	CUdeviceptr d = 0;
	void *h = NULL;
	struct emm_stats st0, st1;
	struct fakecuda_stats f0, f1;
	CUstreamCaptureMode m = mode;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st0), 0);
	f0 = fake_stats();
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	expect_int_eq(cuMemAlloc(&d, BIG), CUDA_SUCCESS);
	expect_int_eq(cuMemAllocHost(&h, HOST), CUDA_SUCCESS);
	f1 = fake_stats();
	assert_int_eq(shims_stats(-1, &st1), 0);
	/* Served by libemm, from new segments, in relaxed mode. */
	expect_true(st1.misses - st0.misses >= 1);
	expect_int_eq(st1.passthrough_allocs - st0.passthrough_allocs, 0);
	expect_true(f1.device_allocs - f0.device_allocs >= 1);
	/* Every segment the driver made during the capture, in relaxed mode. */
	expect_true(f1.relaxed_unsafe_calls - f0.relaxed_unsafe_calls >=
	            (f1.device_allocs - f0.device_allocs) + (f1.host_allocs - f0.host_allocs));
	expect_int_eq(thread_mode(), mode);
	if (d)
		memset((void *)(uintptr_t)d, 0x5a, 65536);
	if (h)
		memset(h, 0xa5, 65536);
	/* Freed during the capture: quarantined, no driver call. */
	if (d)
		expect_int_eq(cuMemFree(d), CUDA_SUCCESS);
	if (h)
		expect_int_eq(cuMemFreeHost(h), CUDA_SUCCESS);
	end_and_replay(s, &f0);
	/* The program's own mode is back. */
	m = CU_STREAM_CAPTURE_MODE_GLOBAL;
	assert_int_eq(cuThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
	expect_int_eq(m, mode);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}

TEST_BEGIN(test_global_capture_first_alloc_misses)
{
	global_capture_miss(CU_STREAM_CAPTURE_MODE_GLOBAL);
}
TEST_END

TEST_BEGIN(test_global_capture_miss_thread_local_thread)
{
	global_capture_miss(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
}
TEST_END

/* Fences that stay pending (the fake's events complete only after a
 * million queries): `n` (at most 64) blocks of 64 KiB allocated and freed;
 * a non-blocking stream must be alive, so that no epoch takes the fast
 * path. */
static void leave_fences_pending(int n, CUstream *ret_busy)
{
	CUdeviceptr d[64];
	CUstream busy;
	CUevent e;

	fakecuda_set_event_delay(1000000);
	/* A non-blocking stream with work pending: with every one idle, a close
	 * would make them wait for the legacy event and the blocks be ready at
	 * once, leaving no fence to poll. *ret_busy: for the test to destroy. */
	assert_int_eq(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	assert_int_eq(cuEventRecord(e, busy), CUDA_SUCCESS); /* kept: its countdown is the work */
	*ret_busy = busy;
	for (int i = 0; i < n; i++)
		assert_int_eq(cuMemAlloc(&d[i], 65536), CUDA_SUCCESS);
	for (int i = 0; i < n; i++)
		assert_int_eq(cuMemFree(d[i]), CUDA_SUCCESS);
}

/* --- another thread beside the capture ----------------------------------- */

struct beside {
	CUdeviceptr avoid;     /* allocated inside the capture: never handed out */
	size_t avoid_size;
	CUstream own;          /* the worker's non-blocking stream */
	unsigned iterations;
	unsigned errors;       /* failed calls */
	unsigned corruptions;  /* a block's bytes changed, or a block handed out twice */
	atomic_bool started;
};

static bool overlaps(CUdeviceptr a, size_t na, CUdeviceptr b, size_t nb)
{
	return a < b + nb && b < a + na;
}

/* The bytes of a block the worker tags and checks (the overlap checks
 * cover the whole block). */
static size_t tagged(size_t size)
{
	return size < 262144 ? size : 262144;
}

static void *beside_thread(void *arg)
{
	enum { LIVE = 8 };
	struct beside *w = arg;
	CUdeviceptr live[LIVE] = {0};
	size_t size[LIVE] = {0};
	unsigned char tag[LIVE] = {0};

	if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
		w->errors++;
		return NULL;
	}
	atomic_store(&w->started, true);
	for (unsigned i = 0; i < w->iterations; i++) {
		unsigned k = i % LIVE;
		if (live[k]) {
			const unsigned char *p = (const unsigned char *)(uintptr_t)live[k];
			for (size_t j = 0; j < tagged(size[k]); j += 997)
				if (p[j] != tag[k]) {
					w->corruptions++;
					break;
				}
			CUresult r = (i & 1) ? cuMemFreeAsync(live[k], w->own) : cuMemFree(live[k]);
			w->errors += r != CUDA_SUCCESS;
			live[k] = 0;
		}
		/* Mostly hits of earlier sizes; every 16th a size no block serves. */
		size[k] = (i % 16 == 15) ? ((size_t)24 << 20) + i : 4096u << (i % 6);
		CUresult r = (i & 2) ? cuMemAllocAsync(&live[k], size[k], w->own) : cuMemAlloc(&live[k], size[k]);
		if (r != CUDA_SUCCESS) {
			w->errors++;
			live[k] = 0;
			continue;
		}
		if (overlaps(live[k], size[k], w->avoid, w->avoid_size))
			w->corruptions++;
		for (unsigned j = 0; j < LIVE; j++)
			if (j != k && live[j] && overlaps(live[k], size[k], live[j], size[j]))
				w->corruptions++;
		tag[k] = (unsigned char)(i * 7 + 1);
		memset((void *)(uintptr_t)live[k], tag[k], tagged(size[k]));
	}
	for (unsigned k = 0; k < LIVE; k++)
		if (live[k])
			w->errors += cuMemFree(live[k]) != CUDA_SUCCESS;
	return NULL;
}

TEST_BEGIN(test_threads_beside_global_capture)
{
	CUstream s;
	CUdeviceptr g = 0;
	pthread_t t;
	struct fakecuda_stats f0, f1;
	struct beside w = {.iterations = 400};

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&w.own, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	/* Fences pending from before the capture: a poll would query them. */
	CUstream busy = 0;
	leave_fences_pending(64, &busy);
	f0 = fake_stats();
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	w.avoid_size = 1 << 20;
	expect_int_eq(cuMemAlloc(&g, w.avoid_size), CUDA_SUCCESS);
	w.avoid = g;
	assert_int_eq(pthread_create(&t, NULL, beside_thread, &w), 0);
	pthread_join(t, NULL);
	if (g)
		expect_int_eq(cuMemFree(g), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_int_eq(w.errors, 0);
	expect_int_eq(w.corruptions, 0);
	expect_true(f1.relaxed_unsafe_calls - f0.relaxed_unsafe_calls >= 1);
	end_and_replay(s, &f0);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuStreamDestroy(w.own), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	if (busy)
		assert_int_eq(cuStreamDestroy(busy), CUDA_SUCCESS);
}
TEST_END

/* --- a capture begun while another thread is inside an event query ------- */

struct poller {
	CUresult r;
	CUdeviceptr d;
};

static void *poller_thread(void *arg)
{
	struct poller *p = arg;

	if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
		p->r = CUDA_ERROR_INVALID_CONTEXT;
		return NULL;
	}
	/* No block serves this: the miss path polls the pending fences. */
	p->r = cuMemAlloc(&p->d, (size_t)200 << 20);
	return NULL;
}

struct capturer {
	CUstream s;
	CUresult begin, end;
	CUgraph graph;
	atomic_int stage; /* 1: begun; 2: may end; 3: ended */
};

static void *capturer_thread(void *arg)
{
	struct capturer *c = arg;

	(void)cuCtxSetCurrent(g_ctx);
	c->begin = cuStreamBeginCapture(c->s, CU_STREAM_CAPTURE_MODE_GLOBAL);
	atomic_store(&c->stage, 1);
	while (atomic_load(&c->stage) != 2)
		sleep_ms(1);
	c->end = c->begin == CUDA_SUCCESS ? cuStreamEndCapture(c->s, &c->graph) : c->begin;
	atomic_store(&c->stage, 3);
	return NULL;
}

TEST_BEGIN(test_capture_begin_waits_for_event_query)
{
	CUstream nb;
	pthread_t tp, tc;
	struct poller p = {0};
	struct capturer c = {0};
	struct fakecuda_stats f0, f1;
	uint64_t begins;

	assert_int_eq(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&c.s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	CUstream busy = 0;
	leave_fences_pending(64, &busy);
	f0 = fake_stats();
	assert_int_eq(fakecuda_hold_next_call("cuEventQuery"), 0);
	assert_int_eq(pthread_create(&tp, NULL, poller_thread, &p), 0);
	for (int i = 0; i < 5000 && !fakecuda_held_waiting(); i++)
		sleep_ms(1);
	assert_true(fakecuda_held_waiting());
	begins = fakecuda_calls("cuStreamBeginCapture_v2");
	assert_int_eq(pthread_create(&tc, NULL, capturer_thread, &c), 0);
	sleep_ms(150);
	/* The query began before the capture: the capture waits for it. */
	expect_u64_eq(fakecuda_calls("cuStreamBeginCapture_v2"), begins);
	fakecuda_release_held();
	pthread_join(tp, NULL);
	for (int i = 0; i < 5000 && atomic_load(&c.stage) != 1; i++)
		sleep_ms(1);
	atomic_store(&c.stage, 2);
	pthread_join(tc, NULL);
	f1 = fake_stats();
	expect_int_eq(p.r, CUDA_SUCCESS);
	expect_int_eq(c.begin, CUDA_SUCCESS);
	expect_int_eq(c.end, CUDA_SUCCESS);
	expect_int_eq(f1.capture_violations - f0.capture_violations, 0);
	expect_int_eq(f1.captures_invalidated - f0.captures_invalidated, 0);
	if (c.graph)
		expect_int_eq(cuGraphDestroy(c.graph), CUDA_SUCCESS);
	if (p.r == CUDA_SUCCESS)
		expect_int_eq(cuMemFree(p.d), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuStreamDestroy(c.s), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(nb), CUDA_SUCCESS);
	if (busy)
		assert_int_eq(cuStreamDestroy(busy), CUDA_SUCCESS);
}
TEST_END

/* --- a capture begun on an idle stream while its epoch closes ------------ */

struct freer {
	CUdeviceptr d[64];
	CUresult r;
};

static void *freer_thread(void *arg)
{
	struct freer *f = arg;

	f->r = cuCtxSetCurrent(g_ctx);
	for (int i = 0; i < 64 && f->r == CUDA_SUCCESS; i++)
		f->r = cuMemFree(f->d[i]); /* the 64th closes the epoch */
	return NULL;
}

struct begin_only {
	CUstream s;
	CUresult r;
	atomic_int done;
};

static void *begin_thread(void *arg)
{
	struct begin_only *b = arg;

	(void)cuCtxSetCurrent(g_ctx);
	b->r = cuStreamBeginCapture(b->s, CU_STREAM_CAPTURE_MODE_RELAXED);
	atomic_store(&b->done, 1);
	return NULL;
}

/* An epoch closes with non-blocking streams s0 and s1 idle, so each is to
 * wait for the legacy event (allocator/heap_fence.c: queries first, waits
 * after). A capture of s0 begins while s0's query is held in the driver:
 * libemm notes the capture, then waits for the query to leave the capture
 * gate before the driver's begin. The wait on s0 that follows must be
 * refused (st_capture_gate_enter_wait): were it made (held here until the
 * driver's begin has run), it would join s0's capture with an event from
 * outside it, which invalidates the capture. */
TEST_BEGIN(test_capture_begun_before_the_idle_wait)
{
	struct freer f = {.r = CUDA_SUCCESS};
	struct begin_only b = {0};
	struct fakecuda_stats f0, f1;
	pthread_t tf, tb;
	CUgraph graph = NULL;
	CUstream s1;
	uint64_t waits;

	assert_int_eq(cuStreamCreate(&b.s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS); /* s0 */
	assert_int_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000); /* the legacy event stays pending */
	for (int i = 0; i < 64; i++)
		assert_int_eq(cuMemAlloc(&f.d[i], 65536), CUDA_SUCCESS);
	f0 = fake_stats();
	waits = fakecuda_calls("cuStreamWaitEvent");
	assert_int_eq(fakecuda_hold_next_call("cuStreamQuery"), 0); /* s0's */
	assert_int_eq(fakecuda_hold_next_call("cuStreamWaitEvent"), 0);
	assert_int_eq(pthread_create(&tf, NULL, freer_thread, &f), 0);
	for (int i = 0; i < 5000 && !fakecuda_held_waiting(); i++)
		sleep_ms(1);
	assert_true(fakecuda_held_waiting());
	assert_int_eq(pthread_create(&tb, NULL, begin_thread, &b), 0);
	sleep_ms(150);
	expect_int_eq(atomic_load(&b.done), 0); /* waiting for the query */
	fakecuda_release_held();
	for (int i = 0; i < 5000 && !atomic_load(&b.done); i++)
		sleep_ms(1);
	expect_int_eq(atomic_load(&b.done), 1);
	fakecuda_hold_clear();
	fakecuda_release_held(); /* a wait held meanwhile (the bug) goes on now */
	pthread_join(tf, NULL);
	pthread_join(tb, NULL);
	f1 = fake_stats();
	expect_int_eq(f.r, CUDA_SUCCESS);
	expect_int_eq(b.r, CUDA_SUCCESS);
	expect_u64_eq(fakecuda_calls("cuStreamWaitEvent"), waits);
	expect_u64_eq(f1.captures_invalidated - f0.captures_invalidated, 0);
	expect_u64_eq(f1.capture_violations - f0.capture_violations, 0);
	if (b.r == CUDA_SUCCESS) {
		CUresult er = cuStreamEndCapture(b.s, &graph);
		expect_int_eq(er, CUDA_SUCCESS);
		if (graph)
			expect_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	}
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuStreamDestroy(s1), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(b.s), CUDA_SUCCESS);
}
TEST_END

int main(void)
{
	g_ctx = shims_setup();
	return emm_test_run(test_global_capture_first_alloc_misses, test_global_capture_miss_thread_local_thread,
	                    test_threads_beside_global_capture, test_capture_begin_waits_for_event_query,
	                    test_capture_begun_before_the_idle_wait, NULL);
}
