/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_ctx_cache.c - the per-thread context cache of
 * process/contexts.c over the test-double driver (LD_PRELOAD=libemm.so).
 *
 * Argument "trust" (EMM_CONTEXT_CHECK=off, the default): a cached pair makes no
 * driver call at all - no context lookup (cuCtxGetId, cuCtxGetCurrent), no
 * event - for stream-ordered pairs, and no context lookup for synchronous
 * pairs (whose epochs still record an event per EMM_EPOCH_BLOCKS frees).
 * Argument "check" (run with EMM_CONTEXT_CHECK=on): one cuCtxGetId per
 * call, as documented. Argument "tool" (NVTX_INJECTION64_PATH set, as
 * compute-sanitizer does): a thread without a context is found without a
 * failed cuCtxGetId. All: every change of the current context through
 * the driver API (cuCtxCreate, cuCtxPushCurrent, cuCtxPopCurrent,
 * cuCtxSetCurrent), a context destroyed and another made (perhaps at the
 * same address), other threads, and a fork child are served from the heap
 * of the context current at the call, never a stale cache's.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_common.h"

/* The CUDA 12 ABI, which cuda.h 13 declares only for its own build. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);

enum { SZ = 65536, PAIRS = 2000 };

static CUcontext g_ctx;
static bool trust, tool;

/* The context the driver says `p` belongs to, as libemm answers it. */
static CUcontext ctx_of(CUdeviceptr p)
{
	CUcontext c = NULL;

	if (cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p) != CUDA_SUCCESS)
		return NULL;
	return c;
}

/* Two allocations in a row (the second is a cache hit) belong to `want`
 * and are usable memory of it; both freed. */
static void expect_served_from(CUcontext want)
{
	CUdeviceptr a = 0, b = 0;

	assert_int_eq(cuMemAlloc(&a, SZ), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, SZ), CUDA_SUCCESS);
	expect_ptr_eq(ctx_of(a), want);
	expect_ptr_eq(ctx_of(b), want);
	expect_int_eq(cuMemsetD8(b, 0x5a, SZ), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(a), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(b), CUDA_SUCCESS);
}

static uint64_t lookups(void)
{
	return fakecuda_calls("cuCtxGetId") + fakecuda_calls("cuCtxGetCurrent");
}

TEST_BEGIN(test_cached_pair_driver_calls)
{
	struct emm_stats st0, st1;
	CUstream s;
	CUdeviceptr p;
	const char *top = "none";
	uint64_t total;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	for (int i = 0; i < 100; i++) { /* warm: heap, segments, cache */
		assert_int_eq(cuMemAllocAsync(&p, SZ, s), CUDA_SUCCESS);
		assert_int_eq(cuMemFreeAsync(p, s), CUDA_SUCCESS);
	}
	assert_int_eq(shims_stats(-1, &st0), 0);
	fakecuda_reset_counters();
	for (int i = 0; i < PAIRS; i++) {
		assert_int_eq(cuMemAllocAsync(&p, SZ, s), CUDA_SUCCESS);
		assert_int_eq(cuMemFreeAsync(p, s), CUDA_SUCCESS);
	}
	total = fakecuda_calls_total(&top);
	assert_int_eq(shims_stats(-1, &st1), 0);
	/* Served by the pool, not passed to the driver. */
	expect_u64_eq(st1.allocs - st0.allocs, PAIRS);
	expect_u64_eq(st1.passthrough_allocs, st0.passthrough_allocs);
	if (trust) {
		if (total)
			fprintf(stderr, "%llu driver calls in %d cached async pairs (most: %s)\n",
			        (unsigned long long)total, PAIRS, top);
		expect_u64_eq(total, 0);
	} else {
		expect_u64_eq(fakecuda_calls("cuCtxGetId"), 2 * PAIRS);
	}

	expect_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);

	/* Synchronous pairs: no context lookup with the cache trusted; the
	 * epochs' events (one record per EMM_EPOCH_BLOCKS frees with no
	 * non-blocking stream alive) remain. */
	for (int i = 0; i < 100; i++) {
		assert_int_eq(cuMemAlloc(&p, SZ), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(p), CUDA_SUCCESS);
	}
	fakecuda_reset_counters();
	for (int i = 0; i < PAIRS; i++) {
		assert_int_eq(cuMemAlloc(&p, SZ), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(p), CUDA_SUCCESS);
	}
	total = fakecuda_calls_total(&top);
	if (trust) {
		expect_u64_eq(lookups(), 0);
		if (total > PAIRS / 16)
			fprintf(stderr, "%llu driver calls in %d cached sync pairs (most: %s)\n",
			        (unsigned long long)total, PAIRS, top);
		expect_true(total <= PAIRS / 16);
	} else {
		expect_u64_eq(fakecuda_calls("cuCtxGetId"), 2 * PAIRS);
	}
}
TEST_END

TEST_BEGIN(test_switches_seen)
{
	CUcontext c2 = NULL, c3 = NULL, popped = NULL;
	CUdevice dev = 0;

	expect_served_from(g_ctx);
	assert_int_eq(cuCtxCreate(&c2, NULL, 0, dev), CUDA_SUCCESS); /* pushed, current */
	expect_served_from(c2);
	assert_int_eq(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	expect_ptr_eq(popped, c2);
	expect_served_from(g_ctx);
	assert_int_eq(cuCtxPushCurrent(c2), CUDA_SUCCESS);
	expect_served_from(c2);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	expect_served_from(g_ctx);
	assert_int_eq(cuCtxSetCurrent(c2), CUDA_SUCCESS);
	expect_served_from(c2);

	/* Destroyed while current here (the driver pops it: the one below,
	 * g_ctx, is current), then another made, perhaps at the same address. */
	assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	expect_served_from(g_ctx);
	assert_int_eq(cuCtxCreate_v2(&c3, 0, dev), CUDA_SUCCESS); /* the older ABI */
	expect_served_from(c3);
	assert_int_eq(cuCtxDestroy(c3), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	expect_served_from(g_ctx);
}
TEST_END

/* A thread that has `arg` cached keeps allocating; the main thread destroys
 * it meanwhile: once the destroy returns, the thread's next call is not
 * served from the dead context's heap. */
struct other {
	CUcontext ctx;
	pthread_barrier_t cached, destroyed;
	intptr_t bad;
};

static void *other_thread(void *arg)
{
	struct other *o = arg;
	CUdeviceptr p = 0;

	o->bad |= cuCtxSetCurrent(o->ctx) != CUDA_SUCCESS;
	for (int i = 0; i < 3; i++) {
		o->bad |= (cuMemAlloc(&p, SZ) != CUDA_SUCCESS) << 1;
		o->bad |= (cuMemFree(p) != CUDA_SUCCESS) << 2;
	}
	pthread_barrier_wait(&o->cached);
	pthread_barrier_wait(&o->destroyed);
	/* Its current context is destroyed: the driver's error, not a block. */
	o->bad |= (cuMemAlloc(&p, SZ) == CUDA_SUCCESS) << 3;
	return NULL;
}

TEST_BEGIN(test_destroy_seen_by_other_threads)
{
	struct other o = {0};
	CUcontext c2 = NULL, popped = NULL;
	pthread_t t;

	assert_int_eq(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
	assert_int_eq(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
	o.ctx = c2;
	pthread_barrier_init(&o.cached, NULL, 2);
	pthread_barrier_init(&o.destroyed, NULL, 2);
	assert_int_eq(pthread_create(&t, NULL, other_thread, &o), 0);
	pthread_barrier_wait(&o.cached);
	expect_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	pthread_barrier_wait(&o.destroyed);
	pthread_join(t, NULL);
	expect_int_eq((int)o.bad, 0);
	pthread_barrier_destroy(&o.cached);
	pthread_barrier_destroy(&o.destroyed);
	expect_served_from(g_ctx);
}
TEST_END

/* A thread with no current context: the driver's answer, and under a tool
 * ("tool": NVTX_INJECTION64_PATH set, as compute-sanitizer does) no failed
 * cuCtxGetId on the way, which the tool would report as the program's. */
static void *contextless(void *arg)
{
	CUdeviceptr p = 0;

	(void)arg;
	fakecuda_reset_counters();
	expect_int_eq(cuMemAlloc(&p, SZ), CUDA_ERROR_INVALID_CONTEXT);
	expect_u64_eq(p, 0);
	if (tool)
		expect_u64_eq(fakecuda_calls("cuCtxGetId"), 0);
	else if (!trust)
		expect_u64_eq(fakecuda_calls("cuCtxGetId"), 1);
	return NULL;
}

TEST_BEGIN(test_thread_without_context)
{
	pthread_t t;

	assert_int_eq(pthread_create(&t, NULL, contextless, NULL), 0);
	assert_int_eq(pthread_join(t, NULL), 0);
	expect_served_from(g_ctx);
}
TEST_END

/* Under a tool: the primary context reset through the driver API, still
 * current (as cudaDeviceReset leaves it): the driver's answer, no failed
 * cuCtxGetId; retained again, served from a new heap. */
TEST_BEGIN(test_reset_primary_current)
{
	CUdeviceptr p = 0;
	CUcontext c = NULL;
	CUresult r;

	if (!tool)
		return;
	expect_served_from(g_ctx);
	assert_int_eq(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
	fakecuda_reset_counters();
	r = cuMemAlloc(&p, SZ);
	expect_true(r != CUDA_SUCCESS);
	expect_u64_eq(fakecuda_calls("cuCtxGetId"), 0);
	assert_int_eq(cuDevicePrimaryCtxRetain(&c, 0), CUDA_SUCCESS);
	expect_ptr_eq(c, g_ctx);
	expect_served_from(g_ctx);
}
TEST_END

/* A fork child has no CUDA: its first allocation gets the driver's error,
 * never a block from the parent's cached heap. */
TEST_BEGIN(test_fork_child)
{
	int status = 0;
	pid_t pid;

	expect_served_from(g_ctx); /* cached here */
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		CUdeviceptr p = 0;
		_exit(cuMemAlloc(&p, SZ) == CUDA_SUCCESS ? 1 : 0);
	}
	assert_int_eq(waitpid(pid, &status, 0), pid);
	expect_true(WIFEXITED(status));
	expect_int_eq(WEXITSTATUS(status), 0);
	expect_served_from(g_ctx);
}
TEST_END

int main(int argc, char **argv)
{
	trust = argc > 1 && strcmp(argv[1], "trust") == 0;
	tool = argc > 1 && strcmp(argv[1], "tool") == 0;
	g_ctx = shims_setup();
	return emm_test_run(test_cached_pair_driver_calls, test_switches_seen, test_destroy_seen_by_other_threads,
	                    test_thread_without_context, test_fork_child, test_reset_primary_current, NULL);
}
