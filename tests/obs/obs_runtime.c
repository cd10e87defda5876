/* SPDX-License-Identifier: MIT */
/*
 * tests/obs/obs_runtime.c - cudaMalloc through the test-double shared
 * cudart until the (16 MiB) device is full: the failing request goes
 * through libemm's runtime fast path, then through the real runtime to
 * libemm's driver shim. check-obs.py checks that it is one failure in the
 * trace, in the statistics and in the out-of-memory report. Prints
 * "served N" (allocations that succeeded); exit 1 unless the last one
 * failed with cudaErrorMemoryAllocation.
 */
#include <cuda_runtime_api.h>
#include <stdio.h>

int main(void)
{
	void *p[64];
	int n = 0;
	cudaError_t r = cudaSuccess;

	while (n < 64 && (r = cudaMalloc(&p[n], 4u << 20)) == cudaSuccess)
		n++;
	printf("served %d\n", n);
	if (r != cudaErrorMemoryAllocation || cudaGetLastError() != cudaErrorMemoryAllocation)
		return 1;
	for (int i = 0; i < n; i++)
		cudaFree(p[i]);
	return 0;
}
