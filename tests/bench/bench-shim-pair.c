/* SPDX-License-Identifier: MIT */
/*
 * bench-shim-pair: the host cost of a cached cuMemAlloc + cuMemFree pair
 * through libemm's driver shims over the test-double driver (no GPU): the
 * whole shim path (exports, heap guard, serve.c, the NVTX annotation check,
 * the allocator), not just the core. Run it with
 *
 *   LD_PRELOAD=build/libemm.so LD_LIBRARY_PATH=build/tests/fakecuda \
 *       build/tests/bench/bench-shim-pair [PAIRS [SIZE]]
 *
 * It prints the median over 21 batches of ns per pair. Under callgrind
 * (--pairs fixed) the instruction count per pair compares two builds
 * exactly: see tests/bench/RESULTS.md.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BATCHES 21

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	long pairs = argc > 1 ? atol(argv[1]) : 200000;
	size_t size = argc > 2 ? (size_t)atol(argv[2]) : 65536;
	double ns[BATCHES];
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		return 1;
	/* Warm: the segment exists and the block is cached. */
	for (int i = 0; i < 1000; i++)
		if (cuMemAlloc(&p, size) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS)
			return 1;
	for (int b = 0; b < BATCHES; b++) {
		double t0 = now_ns();

		for (long i = 0; i < pairs / BATCHES; i++) {
			cuMemAlloc(&p, size);
			cuMemFree(p);
		}
		ns[b] = (now_ns() - t0) / (double)(pairs / BATCHES);
	}
	qsort(ns, BATCHES, sizeof(ns[0]), cmp);
	printf("cached cuMemAlloc+cuMemFree pair of %zu B: %.1f ns (p10 %.1f, p90 %.1f)\n", size, ns[BATCHES / 2],
	       ns[BATCHES / 10], ns[BATCHES - 1 - BATCHES / 10]);
	return 0;
}
