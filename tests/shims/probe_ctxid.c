/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/probe_ctxid.c - what libemm's context-reset detection relies
 * on, measured on the real driver (suite 'gpu'; exit 77 without a GPU), and
 * the hot-path cost it adds. Linked with static cudart and libcuda.
 *
 *  1. cudaDeviceReset: the primary context keeps its handle, cuCtxGetId of
 *     the current context answers CUDA_ERROR_CONTEXT_IS_DESTROYED until the
 *     runtime's next call retains it again, and the id changes.
 *  2. Cost per call of cuCtxGetCurrent, cuCtxGetId(NULL) and
 *     cuCtxGetId(ctx) (the shims call one of them per allocation and per
 *     free), and of a cached cuMemAlloc_v2 + cuMemFree_v2 pair and a
 *     cudaMalloc + cudaFree pair (under LD_PRELOAD=libemm.so these are
 *     libemm's hot paths).
 *
 * Prints "RESULT name value" lines; fails (exit 1) only if 1. does not hold.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Median over 21 batches of n calls, ns per call. */
#define TIME_PER_CALL(result, n, body)                                                   \
	do {                                                                             \
		double t_[21];                                                           \
		for (int b_ = 0; b_ < 21; b_++) {                                        \
			double t0_ = now_ns();                                           \
			for (int i_ = 0; i_ < (n); i_++) {                               \
				body;                                                    \
			}                                                                \
			t_[b_] = (now_ns() - t0_) / (n);                                 \
		}                                                                        \
		qsort(t_, 21, sizeof(t_[0]), cmp_double);                                \
		(result) = t_[10];                                                       \
	} while (0)

int main(void)
{
	CUcontext c0 = NULL, c1 = NULL, cur = NULL;
	unsigned long long id0 = 0, id1 = 0, idx = 0;
	unsigned int flags = 0;
	int active = -1, fails = 0;
	CUresult r;
	void *x = NULL;
	double t;

	if (cudaFree(0) != cudaSuccess) {
		printf("SKIP: no usable CUDA device\n");
		return 77;
	}
	cuCtxGetCurrent(&c0);
	cuCtxGetId(c0, &id0);
	printf("RESULT primary_handle_before %p id %llu\n", (void *)c0, id0);

	/* 2. costs */
	TIME_PER_CALL(t, 100000, cuCtxGetCurrent(&cur));
	printf("RESULT ns_cuCtxGetCurrent %.1f\n", t);
	TIME_PER_CALL(t, 100000, cuCtxGetId(NULL, &idx));
	printf("RESULT ns_cuCtxGetId_NULL %.1f\n", t);
	TIME_PER_CALL(t, 100000, cuCtxGetId(c0, &idx));
	printf("RESULT ns_cuCtxGetId_ctx %.1f\n", t);
	{
		CUdeviceptr d;
		void *p;

		for (int i = 0; i < 100; i++) { /* warm the cache */
			cuMemAlloc(&d, 4096);
			cuMemFree(d);
		}
		TIME_PER_CALL(t, 1000, (cuMemAlloc(&d, 4096), cuMemFree(d)));
		printf("RESULT ns_pair_cuMemAlloc_cuMemFree_4KiB %.1f\n", t);
		TIME_PER_CALL(t, 1000, (cuMemAlloc(&d, 1 << 20), cuMemFree(d)));
		printf("RESULT ns_pair_cuMemAlloc_cuMemFree_1MiB %.1f\n", t);
		TIME_PER_CALL(t, 1000, (cudaMalloc(&p, 4096), cudaFree(p)));
		printf("RESULT ns_pair_cudaMalloc_cudaFree_4KiB %.1f\n", t);
	}

	/* 1. cudaDeviceReset */
	cudaMalloc(&x, 1 << 20);
	if (cudaDeviceReset() != cudaSuccess) {
		printf("FAIL: cudaDeviceReset\n");
		return 1;
	}
	cuCtxGetCurrent(&cur);
	cuDevicePrimaryCtxGetState(0, &flags, &active);
	r = cuCtxGetId(NULL, &idx);
	printf("RESULT after_reset current %p (same handle %d) primary_active %d cuCtxGetId(NULL) -> %d\n",
	       (void *)cur, cur == c0, active, (int)r);
	fails += r != CUDA_ERROR_CONTEXT_IS_DESTROYED && !(cur == NULL && r == CUDA_ERROR_INVALID_CONTEXT);
	r = cuMemFree((CUdeviceptr)(uintptr_t)x);
	printf("RESULT after_reset cuMemFree(old) -> %d (before the runtime's next call)\n", (int)r);
	cudaFree(0); /* the runtime initialises again */
	cuCtxGetCurrent(&c1);
	cuCtxGetId(c1, &id1);
	printf("RESULT after_reinit handle %p (same %d) id %llu (changed %d)\n", (void *)c1, c1 == c0, id1,
	       id1 != id0);
	fails += id1 == id0;
	printf("RESULT cudaFree(old) after reinit -> %d\n", (int)cudaFree(x));
	printf(fails ? "FAIL\n" : "ok\n");
	return fails ? 1 : 0;
}
