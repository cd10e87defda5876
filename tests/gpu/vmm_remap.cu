// SPDX-License-Identifier: MIT
/*
 * tests/gpu/vmm_remap.cu - data integrity across page give-back under
 * EMM_BACKEND=vmm (meson test 'vmm-remap', suite gpu; exit 77 without a
 * GPU). Under libemm with the vmm backend:
 *
 *   1. allocate blocks of mixed large sizes, write each with a kernel;
 *   2. free every other one, emm_release_idle(0, 0): the pages under the
 *      freed blocks go back to the driver (page_unmaps > 0) while the live
 *      blocks around them keep their data (checked by a kernel);
 *   3. allocate again (the same sizes, then bigger ones): the given-back
 *      ranges are mapped again (page_maps > 0) or segments grow in place;
 *      write and check every live block, old and new;
 *   4. free everything.
 *
 * Before them, with nothing mapped yet (so the high-water mark is this
 * phase's): EMM_HOLD_PEAK (on unless the environment turns it off): 64 +
 * 64 MiB, the first freed and its fence passed, then 96 MiB, too big for
 * the hole: the hole's pages go back before the segment grows, so the
 * peak of mapped bytes stays under 200 MiB (not held: 224 MiB and up); the
 * live blocks keep their data.
 *
 * Prints "vmm-remap: ... PASS" or "... FAIL" with the counters; exits 1 on
 * any mismatch or if libemm is absent or not using the vmm backend (the
 * counters stay 0). Takes a second or two.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emm/emm.h"
#include "gpu_common.h"

#define MIB ((size_t)1 << 20)
#define NBLK 48


__global__ void fill(uint32_t *p, size_t n, uint32_t seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = seed * 2654435761u + (uint32_t)i;
}

__global__ void check(const uint32_t *p, size_t n, uint32_t seed, unsigned long long *bad)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		if (p[i] != seed * 2654435761u + (uint32_t)i)
			atomicAdd(bad, 1ull);
}

static struct emm_stats stats(void)
{
	struct emm_stats s;

	(void)gpu_stats(GPU_SCOPE_DEVICE, &s);
	return s;
}

struct blk {
	void *p;
	size_t size;
	uint32_t seed;
};

static unsigned long long *bad;

static bool verify(const struct blk *b, int n, const char *when)
{
	unsigned long long host = 0;
	cudaMemset(bad, 0, sizeof(*bad));
	for (int i = 0; i < n; i++)
		if (b[i].p)
			check<<<256, 256>>>((const uint32_t *)b[i].p, b[i].size / 4, b[i].seed, bad);
	if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(&host, bad, sizeof(host), cudaMemcpyDeviceToHost) != cudaSuccess) {
		printf("vmm-remap: CUDA error while checking %s: %s\n", when, cudaGetErrorString(cudaGetLastError()));
		return false;
	}
	if (host)
		printf("vmm-remap: %llu words wrong %s\n", host, when);
	return host == 0;
}

static bool alloc_fill(struct blk *b, size_t size, uint32_t seed)
{
	b->size = size;
	b->seed = seed;
	if (cudaMalloc(&b->p, size) != cudaSuccess) {
		printf("vmm-remap: cudaMalloc(%zu) failed\n", size);
		b->p = NULL;
		return false;
	}
	fill<<<256, 256>>>((uint32_t *)b->p, size / 4, seed);
	return true;
}

int main(void)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("vmm-remap: no GPU, skipping\n");
		return 77;
	}
	if (!gpu_emm_present()) {
		printf("vmm-remap: FAIL: libemm is not loaded (LD_PRELOAD=libemm.so, EMM_BACKEND=vmm)\n");
		return 1;
	}
	const size_t sizes[] = {3 * MIB, 7 * MIB, 13 * MIB + 4096, 40 * MIB, 5 * MIB + 512, 21 * MIB};
	struct blk b[NBLK * 2];
	memset(b, 0, sizeof(b));
	bool ok = cudaMalloc((void **)&bad, sizeof(*bad)) == cudaSuccess;

	/* 0. The peak held (see the top). */
	bool hold = gpu_hold_peak_on();
	struct blk h[3];
	memset(h, 0, sizeof(h));
	ok = ok && alloc_fill(&h[0], 64 * MIB, 11u) && alloc_fill(&h[1], 64 * MIB, 12u);
	cudaFree(h[0].p);
	h[0].p = NULL;
	/* Its epoch closed, its fence passed (nothing released: keep is huge). */
	(void)gpu_release_idle(0, (size_t)1 << 60);
	cudaDeviceSynchronize();
	(void)gpu_release_idle(0, (size_t)1 << 60);
	ok = ok && alloc_fill(&h[2], 96 * MIB, 13u) && verify(h, 3, "after the held growth");
	struct emm_stats sh = stats();
	printf("vmm-remap: held peak %s: peak mapped %.1f MiB (64 + 64 MiB, one freed, then 96 MiB)\n",
	       hold ? "on" : "off", sh.reserved_bytes_peak / (double)MIB);
	if (hold && sh.reserved_bytes_peak >= 200 * MIB) {
		printf("vmm-remap: FAIL: the freed block's pages were not given back before the growth\n");
		ok = false;
	}
	cudaFree(h[1].p);
	cudaFree(h[2].p);

	for (int i = 0; ok && i < NBLK; i++)
		ok = alloc_fill(&b[i], sizes[i % 6], 1000u + i);
	ok = ok && verify(b, NBLK, "after the first fill");
	struct emm_stats s0 = stats();

	for (int i = 0; i < NBLK; i += 2) {
		cudaFree(b[i].p);
		b[i].p = NULL;
	}
	long long given = gpu_release_idle(0, 0);
	struct emm_stats s1 = stats();
	ok = ok && verify(b, NBLK, "after give-back (live neighbours of unmapped pages)");

	for (int i = 0; ok && i < NBLK; i += 2)
		ok = alloc_fill(&b[i], sizes[(i + 3) % 6], 2000u + i);
	for (int i = NBLK; ok && i < NBLK + 8; i++)
		ok = alloc_fill(&b[i], 96 * MIB, 3000u + i);
	ok = ok && verify(b, NBLK + 8, "after reallocation");

	/* Once more: everything freed and given back, then reused. */
	for (int i = 0; i < NBLK + 8; i += 3) {
		cudaFree(b[i].p);
		b[i].p = NULL;
	}
	given += gpu_release_idle(0, 0);
	for (int i = 0; ok && i < NBLK + 8; i += 3)
		ok = alloc_fill(&b[i], sizes[i % 6] + 2 * MIB, 4000u + i);
	ok = ok && verify(b, NBLK + 8, "after the second round");
	struct emm_stats s2 = stats();
	for (int i = 0; i < NBLK + 8; i++)
		if (b[i].p)
			cudaFree(b[i].p);
	cudaFree(bad);

	bool paged = s1.page_unmaps > s0.page_unmaps && s2.page_maps + s2.segment_grows > s1.page_maps + s1.segment_grows;
	if (!paged)
		printf("vmm-remap: no pages were given back or mapped again: is EMM_BACKEND=vmm in effect, and "
		       "the process layer wiring the backend's page operations into the heap?\n");
	printf("vmm-remap: unmaps=%llu maps=%llu grows=%llu given_back=%lld unmapped_total=%llu remapped_total=%llu "
	       "%s\n",
	       (unsigned long long)s2.page_unmaps, (unsigned long long)s2.page_maps,
	       (unsigned long long)s2.segment_grows, given, (unsigned long long)s2.unmapped_bytes_total,
	       (unsigned long long)s2.remapped_bytes_total, ok && paged ? "PASS" : "FAIL");
	return ok && paged ? 0 : 1;
}
