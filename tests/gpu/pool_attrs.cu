/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/pool_attrs.cu - the device's default pool attributes
 * (cudaMemPoolGetAttribute: USED_MEM_CURRENT/HIGH, RESERVED_MEM_CURRENT/
 * HIGH) after cudaMallocAsync/cudaFreeAsync sequences, a high-mark reset
 * and cudaMemPoolTrimTo (issue 16). Run by tests/race/run-test.sh
 * --compare-disabled: once as EMM_DISABLE=1 (the driver's pool serves the
 * allocations) and once with libemm (its books answer), and the "RC" lines
 * - what both must agree on - must match:
 *   - relations at every step: used <= reserved, high >= current,
 *     used >= the bytes the program holds;
 *   - used == 0 once everything is freed and synchronised;
 *   - a high mark set to 0 reads the current value;
 *   - reserved after cudaMemPoolTrimTo(0) is no more than before.
 * The raw values go to "info" lines (they differ: rounding, caching).
 * Exit 77 without a GPU.
 */
#include <cuda_runtime.h>
#include <stdio.h>

#include "gpu_common.h"

static cudaMemPool_t pool;
static int failures;

static unsigned long long attr(cudaMemPoolAttr a)
{
	unsigned long long v = 0;

	if (cudaMemPoolGetAttribute(pool, a, &v) != cudaSuccess) {
		printf("cudaMemPoolGetAttribute(%d) failed\n", (int)a);
		failures++;
	}
	return v;
}

/* Prints the four values and the relations' RC line for step `what`. */
static void step(const char *what, unsigned long long held)
{
	unsigned long long used = attr(cudaMemPoolAttrUsedMemCurrent), used_high = attr(cudaMemPoolAttrUsedMemHigh);
	unsigned long long res = attr(cudaMemPoolAttrReservedMemCurrent), res_high = attr(cudaMemPoolAttrReservedMemHigh);
	int ok = used <= res && used_high >= used && res_high >= res && used >= held;

	printf("info %s: used %llu high %llu reserved %llu high %llu (held %llu)\n", what, used, used_high, res,
	       res_high, held);
	printf("RC %s relations %d\n", what, ok);
	if (!ok)
		failures++;
}

int main(void)
{
	cudaStream_t s;
	void *p[8];
	unsigned long long held = 0, before, zero = 0;
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("skip: no GPU\n");
		return GPU_SKIP;
	}
	printf("libemm: %s\n", gpu_emm_present() ? "loaded" : "absent");
	cudaDeviceGetDefaultMemPool(&pool, 0);
	cudaStreamCreate(&s);

	step("start", 0);
	for (int i = 0; i < 8; i++) {
		size_t size = (size_t)(i + 1) << 20;
		cudaMallocAsync(&p[i], size, s);
		held += size;
	}
	cudaStreamSynchronize(s);
	step("8 allocations", held);
	for (int i = 0; i < 8; i += 2) {
		cudaFreeAsync(p[i], s);
		held -= (size_t)(i + 1) << 20;
	}
	cudaStreamSynchronize(s);
	step("4 freed", held);

	cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
	cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero);
	printf("RC reset: used high == current %d\n",
	       attr(cudaMemPoolAttrUsedMemHigh) == attr(cudaMemPoolAttrUsedMemCurrent));
	printf("RC reset: reserved high == current %d\n",
	       attr(cudaMemPoolAttrReservedMemHigh) == attr(cudaMemPoolAttrReservedMemCurrent));
	step("after reset", held);

	for (int i = 1; i < 8; i += 2)
		cudaFreeAsync(p[i], s);
	cudaStreamSynchronize(s);
	held = 0;
	step("all freed", 0);
	printf("RC all freed: used == 0 %d\n", attr(cudaMemPoolAttrUsedMemCurrent) == 0);

	before = attr(cudaMemPoolAttrReservedMemCurrent);
	cudaMemPoolTrimTo(pool, 0);
	printf("info trimmed: reserved %llu -> %llu\n", before, attr(cudaMemPoolAttrReservedMemCurrent));
	printf("RC trim: reserved not more %d\n", attr(cudaMemPoolAttrReservedMemCurrent) <= before);
	step("trimmed", 0);

	cudaStreamDestroy(s);
	printf("pool-attrs: %s\n", failures ? "FAIL" : "ok");
	return failures != 0;
}
