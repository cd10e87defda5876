/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/fill_equal.c - project issue 9's first column under libemm's
 * driver backend: a program that allocates equal blocks with cuMemAlloc
 * until the device is full must get at least what the driver's own 2 MiB
 * pages would give it (7 MiB blocks: 7/8 of the free memory), less at most
 * one segment at the end. With one 20 MiB segment per request below
 * 10 MiB (PyTorch's rule) 7 MiB blocks got 70 % (97.5 of 139.3 GiB on an
 * H200, where cudaMalloc alone gets 121.9); segments of as many requests
 * as fit 20 MiB (two 7 MiB blocks in 14) get nearly all of it.
 *
 * For each size: release every idle segment (emm_release_idle), read the
 * free memory, allocate until out of memory, free everything. Prints one
 * "fill:" line per size. Exit 77 without a GPU. The same program runs over
 * the test-double driver as shims-fill-equal (tests/shims, suite unit).
 */
#include <cuda.h>
#include <stdlib.h>

#include "gpu_common.h"

#define MIB ((size_t)1 << 20)

/* Blocks of `size` cuMemAlloc gives before running out, after giving the
 * cache's idle memory back; *free0: the free bytes before the fill. */
static size_t fill(size_t size, size_t *free0)
{
	size_t cap = 1024, n = 0, total = 0;
	CUdeviceptr *p = malloc(cap * sizeof(*p));
	CUresult r = CUDA_SUCCESS;

	if (!p)
		return 0;
	(void)gpu_release_idle(0, 0);
	if (cuMemGetInfo(free0, &total) != CUDA_SUCCESS)
		*free0 = 0;
	for (;;) {
		if (n == cap) {
			CUdeviceptr *q = realloc(p, 2 * cap * sizeof(*p));
			if (!q)
				break;
			p = q;
			cap *= 2;
		}
		r = cuMemAlloc(&p[n], size);
		if (r != CUDA_SUCCESS)
			break;
		n++;
	}
	if (r != CUDA_ERROR_OUT_OF_MEMORY)
		emm_test_fail_("%zu B blocks: stopped after %zu with %d, not out of memory", size, n, (int)r);
	for (size_t i = 0; i < n; i++)
		if (cuMemFree(p[i]) != CUDA_SUCCESS)
			emm_test_fail_("cuMemFree of block %zu failed", i);
	free(p);
	gpu_made += n;
	return n;
}

TEST_BEGIN(test_fill_equal)
{
	/* 7 MiB (issue 9), the worst rounding (7 MiB + 512: two in 16 MiB,
	 * 7/8 as with cudaMalloc), and a few more below 10 MiB. */
	static const size_t sizes[] = {7 * MIB,      7 * MIB + 512, 3 * MIB,
	                               11 * MIB / 2, 9 * MIB,       1 * MIB + 4096};

	assert_emm_present();
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		size_t s = sizes[i], free0 = 0;
		size_t n = fill(s, &free0);
		size_t page = (s + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
		size_t raw = free0 / page; /* what cudaMalloc alone gets */
		printf("fill: %zu B blocks: %zu (%.1f GiB) of %.1f GiB free; cudaMalloc alone about %zu "
		       "(%.1f GiB)\n",
		       s, n, (double)(n * s) / (1 << 30), (double)free0 / (1 << 30), raw,
		       (double)(raw * s) / (1 << 30));
		if (free0 < 64 * MIB) {
			emm_test_fail_("only %zu B free on the device", free0);
			continue;
		}
		if (n < (free0 - 20 * MIB) / page)
			emm_test_fail_("%zu B blocks: %zu, fewer than cudaMalloc's %zu less one segment", s,
			               n, (free0 - 20 * MIB) / page);
		if (s == 7 * MIB && n * s < free0 / 100 * 97)
			emm_test_fail_("7 MiB blocks: %zu B of %zu B free (under 97 %%)", n * s, free0);
	}
}
TEST_END

int main(void)
{
	CUdevice dev;
	CUcontext ctx;
	int rc = gpu_primary_current(&dev, &ctx);

	if (rc != 0)
		return rc;
	emm_test_fn tests[] = {test_fill_equal, NULL};
	rc = emm_test_run_list(tests);
	gpu_print_served("fill-equal");
	cuDevicePrimaryCtxRelease(dev);
	return rc;
}
