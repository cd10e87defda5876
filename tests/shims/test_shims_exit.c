/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_exit.c - frees after main returns (run with
 * LD_PRELOAD=libemm.so over the test-double driver, EMM_STATS=1).
 *
 * An atexit handler registered before the first CUDA call runs after
 * libemm's own (registered at its initialisation), and a destructor of the
 * program runs later still: both free pool blocks then. Each free must
 * succeed without any driver call (the driver may be gone at that point in
 * a real process), and EMM_STATS must print without touching the driver.
 * Failure is an exit status: 1..5 say which check failed.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fakecuda.h"

#define NLATE 40

static CUdeviceptr late_block, late_block2, late_many[NLATE];
static void *late_host;

static const char *const watched[] = {
    "cuMemFree_v2",       "cuMemFreeHost",    "cuEventRecord",     "cuEventQuery",
    "cuEventSynchronize", "cuCtxSynchronize", "cuStreamWaitEvent", "cuEventCreate",
};
#define NWATCHED (sizeof(watched) / sizeof(watched[0]))

static uint64_t driver_calls(void)
{
	uint64_t n = 0;

	for (size_t i = 0; i < NWATCHED; i++)
		n += fakecuda_calls(watched[i]);
	return n;
}

static void late_free(void)
{
	uint64_t before = driver_calls();

	if (cuMemFree(late_block) != CUDA_SUCCESS)
		_exit(1);
	if (cuMemFreeHost(late_host) != CUDA_SUCCESS)
		_exit(2);
	/* Enough frees to close epochs (16 by default). */
	for (int i = 0; i < NLATE; i++)
		if (cuMemFree(late_many[i]) != CUDA_SUCCESS)
			_exit(3);
	if (driver_calls() != before) {
		fprintf(stderr, "exit: libemm called the driver after exit began (%llu calls)\n",
		        (unsigned long long)(driver_calls() - before));
		_exit(4);
	}
	fprintf(stderr, "exit: atexit frees ok\n");
}

__attribute__((destructor)) static void late_destructor(void)
{
	uint64_t before = driver_calls();

	if (cuMemFree(late_block2) != CUDA_SUCCESS || driver_calls() != before)
		_exit(5);
	fprintf(stderr, "exit: destructor free ok\n");
}

int main(void)
{
	CUdevice dev;
	CUcontext ctx;

	/* Registered before libemm initialises: runs after its handler. */
	atexit(late_free);
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		return 10;
	if (cuMemAlloc(&late_block, 4096) != CUDA_SUCCESS ||
	    cuMemAlloc(&late_block2, 100000) != CUDA_SUCCESS ||
	    cuMemAllocHost(&late_host, 4096) != CUDA_SUCCESS)
		return 11;
	for (int i = 0; i < NLATE; i++)
		if (cuMemAlloc(&late_many[i], 4096) != CUDA_SUCCESS)
			return 13;
	for (int i = 0; i < 100; i++) {
		CUdeviceptr d;
		if (cuMemAlloc(&d, 8192) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
			return 12;
	}
	printf("1 passed, 0 failed, 0 skipped\n");
	return 0;
}
