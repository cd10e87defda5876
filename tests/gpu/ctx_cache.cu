/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/ctx_cache.cu - is a trusted context cache (EMM_CONTEXT_CHECK=off:
 * a cached lookup makes no driver call, process/contexts.c) right on the
 * real driver? Built with static and with shared cudart (ctx-cache-static,
 * ctx-cache-shared), run under LD_PRELOAD=libemm.so with the check off and
 * on. Every allocation below must belong to the context current at the
 * call (cuPointerGetAttribute CONTEXT and DEVICE_ORDINAL) and be usable
 * memory (a memset and a copy back), after each way a program changes the
 * current context:
 *   1. cuCtxCreate / cuCtxPopCurrent / cuCtxPushCurrent / cuCtxSetCurrent;
 *   2. cudaSetDevice between two devices (2+ GPUs; skipped with one);
 *   3. cudaDeviceReset with a cached block, then cudaMalloc: with a static
 *      cudart the reset passes no shim of libemm (verified), so this is the
 *      case that decides whether the check may be off for such programs.
 * Each step allocates twice in a row so that the second is a cache hit.
 * Exit 0, 1 on a wrong or unusable block, 77 without a GPU.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "gpu_common.h"

static int failures;

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);                                          \
			printf(__VA_ARGS__);                                                                 \
			printf("\n");                                                                        \
			failures++;                                                                          \
		}                                                                                            \
	} while (0)

enum { SZ = 1 << 20 };

/* Two blocks in a row through `rt` (cudaMalloc) or the driver: both of the
 * current context and device, writable and read back. */
static void expect_current(const char *step, bool rt)
{
	CUcontext cur = NULL, owner = NULL;
	int dev = -1, ord = -2;
	static unsigned char host[SZ];

	for (int i = 0; i < 2; i++) {
		CUdeviceptr p = 0;
		void *q = NULL;
		bool ok;

		if (rt) {
			ok = cudaMalloc(&q, SZ) == cudaSuccess;
			p = (CUdeviceptr)q;
		} else {
			ok = cuMemAlloc(&p, SZ) == CUDA_SUCCESS;
		}
		CHECK(ok, "%s: allocation %d failed", step, i);
		if (!ok)
			continue;
		/* Read after the call: cudart's first call after a reset makes
		 * its context current again inside it. */
		cur = NULL;
		dev = -1;
		cuCtxGetCurrent(&cur);
		cuCtxGetDevice(&dev);
		owner = NULL;
		CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, p) == CUDA_SUCCESS &&
		          owner == cur,
		      "%s: block %d belongs to context %p, %p is current", step, i, (void *)owner, (void *)cur);
		CHECK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) == CUDA_SUCCESS &&
		          ord == dev,
		      "%s: block %d is on device %d, device %d is current", step, i, ord, dev);
		memset(host, 0, sizeof(host));
		CHECK(cuMemsetD8(p, (unsigned char)(0x40 + i), SZ) == CUDA_SUCCESS &&
		          cuCtxSynchronize() == CUDA_SUCCESS && cuMemcpyDtoH(host, p, SZ) == CUDA_SUCCESS &&
		          host[0] == 0x40 + i && host[SZ - 1] == 0x40 + i,
		      "%s: block %d is not usable memory of the current context", step, i);
		/* Freed at once: the second allocation may reuse it. */
		if (rt)
			cudaFree(q);
		else
			cuMemFree(p);
	}
}

int main(void)
{
	struct emm_stats s0, s1;
	CUcontext primary = NULL, c2 = NULL, popped = NULL;
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("no GPU\n");
		return GPU_SKIP;
	}
	if (!gpu_emm_present()) {
		printf("FAIL: libemm is not loaded (LD_PRELOAD)\n");
		return 1;
	}
	gpu_stats(GPU_SCOPE_PROCESS, &s0);
	cudaSetDevice(0);
	cudaFree(0); /* cudart's context current */
	cuCtxGetCurrent(&primary);
	expect_current("cudart's primary context", true);
	expect_current("cudart's primary context, driver API", false);

	/* 1. the driver's own switches */
#if CUDA_VERSION >= 13000
	CHECK(cuCtxCreate(&c2, NULL, 0, 0) == CUDA_SUCCESS, "cuCtxCreate");
#else
	CHECK(cuCtxCreate(&c2, 0, 0) == CUDA_SUCCESS, "cuCtxCreate");
#endif
	expect_current("after cuCtxCreate", false);
	CHECK(cuCtxPopCurrent(&popped) == CUDA_SUCCESS && popped == c2, "cuCtxPopCurrent");
	expect_current("after cuCtxPopCurrent", false);
	CHECK(cuCtxPushCurrent(c2) == CUDA_SUCCESS, "cuCtxPushCurrent");
	expect_current("after cuCtxPushCurrent", false);
	CHECK(cuCtxSetCurrent(primary) == CUDA_SUCCESS, "cuCtxSetCurrent");
	expect_current("after cuCtxSetCurrent(primary)", true);
	CHECK(cuCtxSetCurrent(c2) == CUDA_SUCCESS, "cuCtxSetCurrent");
	expect_current("after cuCtxSetCurrent(c2)", false);
	CHECK(cuCtxDestroy(c2) == CUDA_SUCCESS, "cuCtxDestroy");
	cuCtxSetCurrent(primary);
	expect_current("after cuCtxDestroy", true);

	/* 2. cudart's switch between devices */
	if (n >= 2) {
		for (int round = 0; round < 3; round++) {
			cudaSetDevice(1);
			expect_current("after cudaSetDevice(1)", true);
			cudaSetDevice(0);
			expect_current("after cudaSetDevice(0)", true);
		}
	} else {
		printf("info: one GPU: cudaSetDevice between devices not tried\n");
	}

	/* 3. cudaDeviceReset with a cached block */
	{
		void *x = NULL;
		CHECK(cudaMalloc(&x, SZ) == cudaSuccess, "cudaMalloc before the reset");
		cudaFree(x);
		gpu_stats(GPU_SCOPE_PROCESS, &s1);
		/* 8 steps of two allocations each before the devices' switch
		 * (4 more per cudaSetDevice with two GPUs), and this one. */
		unsigned long long want = 8 * 2 + (n >= 2 ? 3 * 2 * 2 : 0) + 1;
		CHECK(s1.allocs - s0.allocs >= want, "the pool served %llu allocations, expected at least %llu",
		      (unsigned long long)(s1.allocs - s0.allocs), want);
		CHECK(cudaDeviceReset() == cudaSuccess, "cudaDeviceReset");
		gpu_stats(GPU_SCOPE_PROCESS, &s0);
		expect_current("after cudaDeviceReset", true);
		expect_current("after cudaDeviceReset, driver API", false);
		gpu_stats(GPU_SCOPE_PROCESS, &s1);
		CHECK(s1.allocs - s0.allocs >= 4, "after the reset the pool served %llu allocations, expected 4",
		      (unsigned long long)(s1.allocs - s0.allocs));
	}

	printf("%s\n", failures ? "FAILED" : "ok");
	return failures != 0;
}
