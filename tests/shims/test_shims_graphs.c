/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_graphs.c - the graph quarantine and context-reset
 * detection of libemm's driver shims, over the test-double driver (run with
 * LD_PRELOAD=libemm.so, LD_LIBRARY_PATH=<fakecuda>).
 *
 * Quarantine: a pool block freed while a stream capture is active (any
 * mode, any stream) is not freed into the heap: it stays allocated, is never
 * handed out again, and a second free of it is refused, until the captured
 * graph and everything derived from it (executable graphs of every
 * instantiate ABI, clones, parents embedding it as a child graph) are
 * destroyed; a capture that fails releases it at once. Blocks allocated
 * during a capture and freed while its graph lives are kept the same way,
 * except a thread's own: allocated during the capture by a thread that
 * captures nothing and freed by it, they go back to the heap at once (a
 * loop beside a capture does not grow). "Freed into the heap" is seen
 * through libemm's own counters (frees).
 *
 * Resets: a primary context reset behind libemm's back (what cudaDeviceReset
 * does: fakecuda_device_reset) must drop the old heap, so a free of a block
 * from before the reset gets the driver's error and new blocks are served
 * from fresh segments the driver knows.
 */
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_common.h"

/* The old 5-argument ABI, which cuda.h renames to cuGraphInstantiateWithFlags. */
#undef cuGraphInstantiate
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                    char *logBuffer, size_t bufferSize);

enum { SZ = 8192, MANY = 64 };

static CUcontext g_ctx;

static uint64_t pool_frees(void)
{
	struct emm_stats st;

	shims_stats(-1, &st);
	return st.frees;
}

/* Allocate MANY blocks of SZ; true if none of them is `avoid`. Frees them
 * and moves *f0 past those frees. */
static bool never_served(CUdeviceptr avoid, uint64_t *f0)
{
	CUdeviceptr d[MANY];
	uint64_t before = pool_frees();
	bool ok = true;

	fakecuda_complete_all();
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < MANY; i++) {
			if (cuMemAlloc(&d[i], SZ) != CUDA_SUCCESS)
				return false;
			ok &= d[i] != avoid;
		}
		for (int i = 0; i < MANY; i++)
			if (cuMemFree(d[i]) != CUDA_SUCCESS)
				return false;
		fakecuda_complete_all();
	}
	if (f0)
		*f0 += pool_frees() - before;
	return ok;
}

/* True if `want` is handed out again within a few hundred allocations. */
static bool served_again(CUdeviceptr want)
{
	enum { N = 512 };
	static CUdeviceptr d[N];
	bool found = false;
	int n = 0;

	/* The release was a normal synchronous free: its epoch closes after
	 * EMM_EPOCH_BLOCKS more frees, and then its fence completes. */
	for (int i = 0; i < 40; i++)
		if (cuMemAlloc(&d[i], 1024) != CUDA_SUCCESS)
			return false;
	for (int i = 0; i < 40; i++)
		(void)cuMemFree(d[i]);
	fakecuda_complete_all();
	while (n < N && !found) {
		if (cuMemAlloc(&d[n], SZ) != CUDA_SUCCESS)
			break;
		found = d[n++] == want;
	}
	for (int i = 0; i < n; i++)
		(void)cuMemFree(d[i]);
	return found;
}

/* Capture on s (relaxed) with `b` freed inside; returns the graph. */
static CUgraph capture_freeing(CUstream s, CUdeviceptr b)
{
	CUgraph graph = NULL;

	if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS)
		return NULL;
	if (cuMemFree(b) != CUDA_SUCCESS)
		fprintf(stderr, "cuMemFree during capture failed\n");
	if (cuStreamEndCapture(s, &graph) != CUDA_SUCCESS)
		return NULL;
	return graph;
}

TEST_BEGIN(test_freed_during_capture_kept_while_exec_lives)
{
	CUstream s;
	CUdeviceptr b;
	CUgraph graph;
	CUgraphExec exec;
	uint64_t f0;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	f0 = pool_frees();
	graph = capture_freeing(s, b);
	assert_ptr_not_null(graph);
	/* Not freed into the heap: the graph may write it on every launch. */
	expect_int_eq(pool_frees() - f0, 0);
	assert_int_eq(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
	assert_int_eq(cuGraphLaunch(exec, s), CUDA_SUCCESS);
	/* The graph goes, its executable graph stays (PyTorch's pattern). */
	assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	expect_true(never_served(b, &f0));
	/* Freeing it again is a double free. */
	expect_int_eq(cuMemFree(b), CUDA_ERROR_INVALID_VALUE);
	f0 = pool_frees();
	assert_int_eq(cuGraphExecDestroy(exec), CUDA_SUCCESS);
	/* Now it is freed, with a normal (fenced) free. */
	expect_int_eq(pool_frees() - f0, 1);
	expect_true(served_again(b));
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_every_mode_and_free_kind)
{
	static const CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
	                                            CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
	                                            CU_STREAM_CAPTURE_MODE_RELAXED};
	CUstream s, other;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	for (unsigned m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		CUdeviceptr a, b, c;
		void *h;
		CUgraph graph = NULL;
		uint64_t f0;

		assert_int_eq(cuMemAlloc(&a, SZ), CUDA_SUCCESS);
		assert_int_eq(cuMemAllocAsync(&b, SZ, other), CUDA_SUCCESS);
		assert_int_eq(cuMemAllocAsync(&c, SZ, s), CUDA_SUCCESS);
		assert_int_eq(cuMemAllocHost(&h, 4096), CUDA_SUCCESS);
		f0 = pool_frees();
		assert_int_eq(cuStreamBeginCapture(s, modes[m]), CUDA_SUCCESS);
		expect_int_eq(cuMemFree(a), CUDA_SUCCESS);
		expect_int_eq(cuMemFreeAsync(b, other), CUDA_SUCCESS); /* a stream not capturing */
		expect_int_eq(cuMemFreeAsync(c, s), CUDA_SUCCESS);     /* the capturing stream */
		expect_int_eq(cuMemFreeHost(h), CUDA_SUCCESS);
		expect_int_eq(cuMemFreeHost(h), CUDA_ERROR_INVALID_VALUE);
		assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
		expect_int_eq(pool_frees() - f0, 0);
		expect_true(never_served(a, &f0));
		assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
		expect_int_eq(pool_frees() - f0, 4);
	}
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(other), CUDA_SUCCESS);
}
TEST_END

/* --- a thread beside a capture -------------------------------------------- */

enum { BESIDE_LOOP = 200 };

struct beside {
	CUdeviceptr old;   /* allocated before the capture: the worker frees it */
	CUdeviceptr given; /* the worker allocates it during the capture, the capturing thread frees it */
	CUdeviceptr other; /* the worker allocates it, a second thread frees it */
	uint64_t frees_in_loop;
	unsigned errors;
};

static void *beside_loop(void *arg)
{
	struct beside *w = arg;

	if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
		w->errors++;
		return NULL;
	}
	uint64_t f0 = pool_frees();
	for (int i = 0; i < BESIDE_LOOP; i++) {
		CUdeviceptr d;
		if (cuMemAlloc(&d, SZ) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
			w->errors++;
	}
	w->frees_in_loop = pool_frees() - f0;
	w->errors += cuMemFree(w->old) != CUDA_SUCCESS;
	w->errors += cuMemAlloc(&w->given, SZ) != CUDA_SUCCESS;
	w->errors += cuMemAlloc(&w->other, SZ) != CUDA_SUCCESS;
	return NULL;
}

static void *free_other(void *arg)
{
	struct beside *w = arg;

	if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS || cuMemFree(w->other) != CUDA_SUCCESS)
		w->errors++;
	return NULL;
}

/* While another thread captures, a thread's own blocks, allocated and
 * freed in a loop, go back to the heap at each free; what the capture may
 * use stays held until the graph goes: a block older than the capture, one
 * the capturing thread frees, one another thread frees, and the capturing
 * thread's own. */
TEST_BEGIN(test_thread_beside_capture_frees_its_own)
{
	CUstream s;
	CUdeviceptr mine;
	CUgraph graph = NULL;
	pthread_t t;
	struct beside w = {0};
	uint64_t f0;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&w.old, SZ), CUDA_SUCCESS);
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	assert_int_eq(pthread_create(&t, NULL, beside_loop, &w), 0);
	pthread_join(t, NULL);
	assert_int_eq(w.errors, 0);
	expect_int_eq(w.frees_in_loop, BESIDE_LOOP);
	f0 = pool_frees();
	assert_int_eq(pthread_create(&t, NULL, free_other, &w), 0);
	pthread_join(t, NULL);
	expect_int_eq(w.errors, 0);
	expect_int_eq(cuMemFree(w.given), CUDA_SUCCESS);
	expect_int_eq(cuMemAlloc(&mine, SZ), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(mine), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	assert_ptr_not_null(graph);
	f0 = pool_frees();
	expect_true(never_served(w.old, &f0));
	expect_true(never_served(w.given, &f0));
	expect_int_eq(cuMemFree(w.old), CUDA_ERROR_INVALID_VALUE); /* held, so freed twice */
	assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	/* old, given, other and the capturing thread's own. */
	expect_int_eq(pool_frees() - f0, 4);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

/* A capture that fails makes no graph: its blocks are freed at once. */
TEST_BEGIN(test_failed_capture_releases_at_once)
{
	CUstream s;
	CUdeviceptr b;
	CUgraph graph = NULL;
	uint64_t f0;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	f0 = pool_frees();
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(b), CUDA_SUCCESS);
	/* Unsafe during a global capture: the driver invalidates it. */
	expect_int_eq(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	expect_int_eq(pool_frees() - f0, 0);
	expect_int_eq(cuStreamEndCapture(s, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	expect_ptr_null(graph);
	expect_int_eq(pool_frees() - f0, 1);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

/* A capturing stream destroyed: its capture makes no graph. */
TEST_BEGIN(test_stream_destroyed_while_capturing)
{
	CUstream s;
	CUdeviceptr b;
	uint64_t f0;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	f0 = pool_frees();
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(b), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 1);
	/* No capture is left: frees are ordinary again. */
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(b), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 2);
}
TEST_END

/* Allocated during the capture, freed after it while the graph lives. */
TEST_BEGIN(test_allocated_during_capture)
{
	CUstream s;
	CUdeviceptr a, b;
	CUgraph graph = NULL;
	uint64_t f0;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&a, SZ), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	f0 = pool_frees();
	expect_int_eq(cuMemFree(a), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	expect_true(never_served(a, &f0));
	expect_int_eq(cuMemFree(a), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 1);
	/* Its graph is gone: an ordinary free. */
	expect_int_eq(cuMemFree(b), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 2);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

/* Clones, child graphs and every instantiate ABI keep the blocks. */
TEST_BEGIN(test_derived_graphs)
{
	CUstream s;
	CUdeviceptr b;
	CUgraph graph, clone, parent;
	CUgraphNode node;
	CUgraphExec x1, x2;
	CUDA_GRAPH_INSTANTIATE_PARAMS params;
	uint64_t f0;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	f0 = pool_frees();
	graph = capture_freeing(s, b);
	assert_ptr_not_null(graph);
	assert_int_eq(cuGraphClone(&clone, graph), CUDA_SUCCESS);
	assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	assert_int_eq(cuGraphCreate(&parent, 0), CUDA_SUCCESS);
	assert_int_eq(cuGraphAddChildGraphNode(&node, parent, NULL, 0, clone), CUDA_SUCCESS);
	assert_int_eq(cuGraphDestroy(clone), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	assert_int_eq(cuGraphInstantiate(&x1, parent, NULL, NULL, 0), CUDA_SUCCESS);
	memset(&params, 0, sizeof(params));
	assert_int_eq(cuGraphInstantiateWithParams(&x2, parent, &params), CUDA_SUCCESS);
	assert_int_eq(cuGraphDestroy(parent), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	expect_true(never_served(b, &f0));
	assert_int_eq(cuGraphExecDestroy(x1), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	assert_int_eq(cuGraphExecDestroy(x2), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 1);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

/* Two captures overlap: a block freed while both run waits for both graphs. */
TEST_BEGIN(test_overlapping_captures)
{
	CUstream s1, s2;
	CUdeviceptr b;
	CUgraph g1 = NULL, g2 = NULL;
	uint64_t f0;

	assert_int_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	f0 = pool_frees();
	assert_int_eq(cuStreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	assert_int_eq(cuStreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(b), CUDA_SUCCESS);
	assert_int_eq(cuStreamEndCapture(s1, &g1), CUDA_SUCCESS);
	assert_int_eq(cuStreamEndCapture(s2, &g2), CUDA_SUCCESS);
	assert_int_eq(cuGraphDestroy(g2), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 0);
	assert_int_eq(cuGraphDestroy(g1), CUDA_SUCCESS);
	expect_int_eq(pool_frees() - f0, 1);
	assert_int_eq(cuStreamDestroy(s1), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s2), CUDA_SUCCESS);
}
TEST_END

/* A context destroyed with quarantined blocks: they go with it. */
TEST_BEGIN(test_context_destroyed_with_quarantine)
{
	CUdevice dev;
	CUcontext c2;
	CUstream s;
	CUdeviceptr b;
	CUgraph graph;

	assert_int_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
	assert_int_eq(cuCtxCreate(&c2, NULL, 0, dev), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	graph = capture_freeing(s, b);
	assert_ptr_not_null(graph);
	assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	/* The driver's answer for memory of a destroyed context. */
	expect_int_eq(cuMemFree(b), CUDA_ERROR_INVALID_VALUE);
	(void)cuGraphDestroy(graph);
	expect_true(never_served(b, NULL));
}
TEST_END

/* A capture in a context libemm keeps no heap for, destroyed with the
 * context while it runs: the capture goes with it, and epochs close again
 * (a capture left recorded kept every free pending for good). */
TEST_BEGIN(test_capture_gone_with_a_heapless_context)
{
	CUdevice dev;
	CUcontext c2;
	CUstream s;
	CUdeviceptr d[64];
	struct emm_stats a, b;

	assert_int_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
	assert_int_eq(cuCtxCreate(&c2, NULL, 0, dev), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &a), 0);
	for (int round = 0; round < 3; round++) {
		for (int i = 0; i < 64; i++)
			assert_int_eq(cuMemAlloc(&d[i], SZ), CUDA_SUCCESS);
		for (int i = 0; i < 64; i++)
			assert_int_eq(cuMemFree(d[i]), CUDA_SUCCESS);
	}
	shims_stats_since(&a, &b);
	expect_true(b.epochs_closed > 0);
}
TEST_END

/* cudaDeviceReset resets the primary context without any shim call; the
 * runtime's next call retains it again (same handle, new context id). */
TEST_BEGIN(test_hidden_reset_detected)
{
	CUdeviceptr x, y, z;
	struct emm_stats st0, st1;
	static unsigned char buf[1 << 20];

	for (int retain_by_fake = 1; retain_by_fake >= 0; retain_by_fake--) {
		CUcontext cur = NULL;

		assert_int_eq(cuMemAlloc(&x, 1 << 20), CUDA_SUCCESS);
		assert_int_eq(cuMemAlloc(&y, 1 << 20), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(y), CUDA_SUCCESS); /* cached */
		assert_int_eq(fakecuda_device_reset(0, retain_by_fake), 0);
		if (!retain_by_fake) {
			/* Before the runtime retains it again, the reset context is
			 * still current: the driver's answer (709), not the pool's. */
			expect_int_eq(cuMemFree(x), CUDA_ERROR_CONTEXT_IS_DESTROYED);
			/* Retained through libemm's shim this time. */
			assert_int_eq(cuDevicePrimaryCtxRetain(&cur, 0), CUDA_SUCCESS);
			expect_ptr_eq(cur, g_ctx);
		}
		assert_int_eq(shims_stats(-1, &st0), 0);
		/* The driver freed x with the context: its answer. */
		expect_int_eq(cuMemFree(x), CUDA_ERROR_INVALID_VALUE);
		/* New blocks are real memory of the new context. */
		for (int i = 0; i < 3; i++) {
			size_t n = (size_t)(1 << 18) << i;
			assert_int_eq(cuMemAlloc(&z, n), CUDA_SUCCESS);
			expect_int_eq(cuMemsetD8(z, 0x5b, n), CUDA_SUCCESS);
			expect_int_eq(cuMemcpyDtoH(buf, z, n < sizeof(buf) ? n : sizeof(buf)), CUDA_SUCCESS);
			expect_int_eq(buf[n / 2 < sizeof(buf) ? n / 2 : 0], 0x5b);
			assert_int_eq(cuMemFree(z), CUDA_SUCCESS);
		}
		assert_int_eq(shims_stats(-1, &st1), 0);
		expect_true(st1.allocs - st0.allocs >= 3);
		expect_int_eq(st1.passthrough_allocs, st0.passthrough_allocs);
	}
}
TEST_END

/* A thread that had the context cached notices the reset too. */
static void *other_thread_after_reset(void *arg)
{
	CUdeviceptr *stale = arg;
	CUdeviceptr z;
	intptr_t bad = 0;

	bad |= cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS;
	bad |= cuMemFree(*stale) != CUDA_ERROR_INVALID_VALUE;
	bad |= cuMemAlloc(&z, 4096) != CUDA_SUCCESS;
	bad |= cuMemsetD8(z, 1, 4096) != CUDA_SUCCESS;
	bad |= cuMemFree(z) != CUDA_SUCCESS;
	return (void *)bad;
}

static void *warm_thread(void *arg)
{
	CUdeviceptr *out = arg;
	intptr_t bad = 0;

	bad |= cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS;
	bad |= cuMemAlloc(&out[0], 4096) != CUDA_SUCCESS;
	bad |= cuMemAlloc(&out[1], 4096) != CUDA_SUCCESS;
	return (void *)bad;
}

TEST_BEGIN(test_hidden_reset_other_threads)
{
	CUdeviceptr blocks[2];
	pthread_t t;
	void *ret;

	assert_int_eq(pthread_create(&t, NULL, warm_thread, blocks), 0);
	pthread_join(t, &ret);
	assert_int_eq((intptr_t)ret, 0);
	assert_int_eq(fakecuda_device_reset(0, 1), 0);
	assert_int_eq(pthread_create(&t, NULL, other_thread_after_reset, &blocks[0]), 0);
	pthread_join(t, &ret);
	expect_int_eq((intptr_t)ret, 0);
	expect_int_eq(cuMemFree(blocks[1]), CUDA_ERROR_INVALID_VALUE);
}
TEST_END

int main(void)
{
	g_ctx = shims_setup();
	return emm_test_run(test_freed_during_capture_kept_while_exec_lives, test_every_mode_and_free_kind,
	                    test_failed_capture_releases_at_once, test_stream_destroyed_while_capturing,
	                    test_allocated_during_capture, test_derived_graphs,
	                    test_overlapping_captures, test_context_destroyed_with_quarantine,
	                    test_capture_gone_with_a_heapless_context,
	                    test_hidden_reset_detected, test_hidden_reset_other_threads,
	                    test_thread_beside_capture_frees_its_own, NULL);
}
