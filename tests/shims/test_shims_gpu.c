/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_gpu.c - libemm's driver-API shims over the real
 * driver (suite 'gpu'; exits 77 without a GPU or over the test double).
 * Run with LD_PRELOAD=libemm.so.
 *
 * Checks what only the real driver can answer: the same error codes with
 * and without libemm for the fixed call sequence of shims_codes.h; a
 * global-mode stream capture that libemm's frees and allocations leave
 * valid; pool serving, data, ranges and IPC handles; frees after main
 * returns. Prints the host cost of a cached cuMemAlloc+cuMemFree pair (and
 * the async and pinned pairs) with libemm and, from a child run with
 * EMM_DISABLE=1, without it.
 *
 * Modes (one argument): codes, exit, bench.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "emm_test.h"
#include "shims_codes.h"

#include "emm/emm.h"

static CUcontext g_ctx;

static int stats(int device, struct emm_stats *out)
{
	int (*get)(int, struct emm_stats *) =
	    (int (*)(int, struct emm_stats *))dlsym(RTLD_DEFAULT, "emm_stats_get");

	memset(out, 0, sizeof(*out));
	out->struct_size = sizeof(*out);
	return get ? get(device, out) : -1;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int setup(void)
{
	CUdevice dev;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&g_ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
		return -1;
	return 0;
}

/* --- mode "bench": microseconds per pair, one line each ----------------- */

static int mode_bench(void)
{
	enum { N = 2000 };
	CUdeviceptr d;
	CUstream s;
	void *h;
	double t0;

	if (setup() < 0 || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return 1;
	static const size_t sizes[] = {256, 65536, (size_t)1 << 20, (size_t)16 << 20};
	for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
		for (int i = 0; i < 10; i++) { /* warm: segments and events exist */
			(void)cuMemAlloc(&d, sizes[k]);
			(void)cuMemFree(d);
		}
		t0 = now_us();
		for (int i = 0; i < N; i++) {
			if (cuMemAlloc(&d, sizes[k]) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
				return 1;
		}
		printf("sync %zu %.3f\n", sizes[k], (now_us() - t0) / N);
		t0 = now_us();
		for (int i = 0; i < N; i++) {
			if (cuMemAllocAsync(&d, sizes[k], s) != CUDA_SUCCESS ||
			    cuMemFreeAsync(d, s) != CUDA_SUCCESS)
				return 1;
		}
		(void)cuStreamSynchronize(s);
		printf("async %zu %.3f\n", sizes[k], (now_us() - t0) / N);
	}
	t0 = now_us();
	for (int i = 0; i < 200; i++) {
		if (cuMemHostAlloc(&h, 65536, 0) != CUDA_SUCCESS || cuMemFreeHost(h) != CUDA_SUCCESS)
			return 1;
	}
	printf("pinned 65536 %.3f\n", (now_us() - t0) / 200);
	(void)cuStreamDestroy(s);
	return 0;
}

/* --- mode "exit": frees after main returns ----------------------------- */

static CUdeviceptr late_block;
static void *late_host;

static void late_free(void)
{
	if (cuMemFree(late_block) != CUDA_SUCCESS || cuMemFreeHost(late_host) != CUDA_SUCCESS)
		_exit(3);
	printf("late frees ok\n");
	fflush(stdout);
}

static int mode_exit(void)
{
	atexit(late_free); /* before libemm initialises: runs after its handler */
	if (setup() < 0 || cuMemAlloc(&late_block, 4096) != CUDA_SUCCESS ||
	    cuMemAllocHost(&late_host, 4096) != CUDA_SUCCESS)
		return 1;
	return 0;
}

/* --- tests ------------------------------------------------------------- */

TEST_BEGIN(test_codes_match_driver)
{
	static char with[16384], without[16384];
	const char *const env_on[] = {"EMM_DISABLE", NULL, NULL};
	const char *const env_off[] = {"EMM_DISABLE", "1", NULL};

	assert_int_eq(run_self("codes", env_on, with, sizeof(with)), 0);
	assert_int_eq(run_self("codes", env_off, without, sizeof(without)), 0);
	if (strcmp(with, without) != 0) {
		fprintf(stderr, "--- with libemm:\n%s--- EMM_DISABLE=1:\n%s", with, without);
		expect_true(false);
	}
}
TEST_END

TEST_BEGIN(test_pool_serves_and_data)
{
	struct emm_stats s0, s1;
	CUdeviceptr d[8], base;
	size_t size;
	unsigned char in[5000], out[5000];

	assert_int_eq(stats(-1, &s0), 0);
	for (int i = 0; i < 8; i++) {
		memset(in, i + 1, sizeof(in));
		assert_int_eq(cuMemAlloc(&d[i], 5000), CUDA_SUCCESS);
		assert_int_eq(cuMemcpyHtoD(d[i], in, sizeof(in)), CUDA_SUCCESS);
	}
	for (int i = 0; i < 8; i++) {
		memset(in, i + 1, sizeof(in));
		assert_int_eq(cuMemcpyDtoH(out, d[i], sizeof(out)), CUDA_SUCCESS);
		expect_int_eq(memcmp(in, out, sizeof(in)), 0);
		assert_int_eq(cuMemGetAddressRange(&base, &size, d[i] + 4999), CUDA_SUCCESS);
		expect_u64_eq(base, d[i]);
		expect_int_eq(size, 5000);
	}
	for (int i = 0; i < 8; i++)
		assert_int_eq(cuMemFree(d[i]), CUDA_SUCCESS);
	assert_int_eq(stats(-1, &s1), 0);
	expect_int_eq(s1.allocs - s0.allocs, 8);
	expect_int_eq(s1.passthrough_allocs, s0.passthrough_allocs);
}
TEST_END

TEST_BEGIN(test_capture_stays_valid)
{
	CUstream s;
	CUdeviceptr pooled, g;
	CUgraph graph = NULL;
	CUgraphExec exec = NULL;
	struct emm_stats s0, s1;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&pooled, 4096), CUDA_SUCCESS);
	assert_int_eq(stats(-1, &s0), 0);
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	assert_int_eq(cuMemAllocAsync(&g, 1 << 20, s), CUDA_SUCCESS); /* a graph memory node */
	assert_int_eq(cuMemsetD8Async(g, 7, 1 << 20, s), CUDA_SUCCESS);
	assert_int_eq(cuMemFreeAsync(g, s), CUDA_SUCCESS);
	/* The real cuMemFree would invalidate the capture (900); the pooled
	 * free must not, and must record nothing on the legacy stream. */
	assert_int_eq(cuMemFree(pooled), CUDA_SUCCESS);
	assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	assert_int_eq(cuGraphInstantiate(&exec, graph, 0), CUDA_SUCCESS);
	assert_int_eq(cuGraphLaunch(exec, s), CUDA_SUCCESS);
	assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	assert_int_eq(stats(-1, &s1), 0);
	expect_int_eq(s1.passthrough_allocs - s0.passthrough_allocs, 1);
	/* The pooled block waits for the graph and its exec (quarantine). */
	expect_int_eq(s1.frees - s0.frees, 0);
	assert_int_eq(cuGraphExecDestroy(exec), CUDA_SUCCESS);
	assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	assert_int_eq(stats(-1, &s1), 0);
	expect_int_eq(s1.frees - s0.frees, 1);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_ipc_handles_of_blocks)
{
	long long (*rel)(int, size_t) = (long long (*)(int, size_t))dlsym(RTLD_DEFAULT, "emm_release_idle");
	CUdeviceptr a, b, q;
	CUipcMemHandle ha, hb;
	const char *backend = getenv("EMM_BACKEND");
	bool shareable = !backend || !*backend || strcmp(backend, "driver") == 0;
	CUresult want = shareable ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;

	assert_ptr_not_null(rel);
	(void)rel(-1, 0);
	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 4096), CUDA_SUCCESS);
	/* Blocks of one segment: a libemm handle each (tests/gpu/ipc_blocks.cu
	 * opens them in other processes), also the one at the segment's start. */
	expect_int_eq(cuIpcGetMemHandle(&ha, a), want);
	expect_int_eq(cuIpcGetMemHandle(&hb, b), want);
	if (shareable) {
		expect_true(memcmp(ha.reserved, "libemm-ipc-blk1", 16) == 0);
		expect_true(memcmp(&ha, &hb, sizeof(ha)) != 0);
		/* Opened by the exporting process: the driver's own answer. */
		expect_int_ne(cuIpcOpenMemHandle(&q, ha, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
	}
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	/* Freed (its segment still cached): never the segment's handle; the
	 * code the test double gives for memory nobody allocated (to confirm
	 * against the driver's own answer for freed memory). */
	expect_int_eq(cuIpcGetMemHandle(&ha, a), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	/* A block that is its whole segment (12 MiB: a segment of its own,
	 * rounded to 2 MiB, nothing left over): the driver's own handle -
	 * where the backend's memory can be shared at all (the driver
	 * backend's). */
	assert_int_eq(cuMemAlloc(&a, (size_t)12 << 20), CUDA_SUCCESS);
	expect_int_eq(cuIpcGetMemHandle(&ha, a), want);
	if (shareable)
		expect_true(memcmp(ha.reserved, "libemm-ipc-blk1", 16) != 0);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_exit_frees)
{
	static char out[4096];

	expect_int_eq(run_self("exit", NULL, out, sizeof(out)), 0);
	expect_true(strstr(out, "late frees ok") != NULL);
}
TEST_END

TEST_BEGIN(test_bench)
{
	static char with[4096], without[4096];
	const char *const env_on[] = {"EMM_DISABLE", NULL, NULL};
	const char *const env_off[] = {"EMM_DISABLE", "1", NULL};

	assert_int_eq(run_self("bench", env_on, with, sizeof(with)), 0);
	assert_int_eq(run_self("bench", env_off, without, sizeof(without)), 0);
	fprintf(stderr, "us per pair with libemm:\n%sus per pair with EMM_DISABLE=1:\n%s", with, without);
}
TEST_END

int main(int argc, char **argv)
{
	if (argc > 1) {
		if (!strcmp(argv[1], "codes"))
			return mode_codes();
		if (!strcmp(argv[1], "exit"))
			return mode_exit();
		if (!strcmp(argv[1], "bench"))
			return mode_bench();
		return 2;
	}
	if (dlsym(RTLD_DEFAULT, "fakecuda_reset") || setup() < 0) {
		printf("0 passed, 0 failed, 1 skipped\n");
		fprintf(stderr, "no GPU (or the test-double driver): skipped\n");
		return 77;
	}
	if (!dlsym(RTLD_DEFAULT, "emm_stats_get")) {
		fprintf(stderr, "libemm.so is not preloaded\n");
		return 1;
	}
	return emm_test_run(test_codes_match_driver, test_pool_serves_and_data, test_capture_stays_valid,
	                    test_ipc_handles_of_blocks, test_exit_frees, test_bench, NULL);
}
