// SPDX-License-Identifier: MIT
/*
 * tests/gpu/vmm_inflight.cu - under EMM_BACKEND=vmm, libemm never gives
 * back the pages of a freed block while a kernel launched before the free
 * still reads it (meson test 'vmm-inflight', suite gpu; exit 77 without a
 * GPU). cuMemUnmap does not wait for the device (RESULTS.md section 7),
 * and a synchronous free whose epoch closes with no non-blocking stream
 * alive makes its block ready-any at once (stream order covers its reuse,
 * not an unmap): PyTorch training under EMM_BACKEND=vmm with EMM_HOLD_PEAK
 * hit "an illegal memory access" in Adam's step that way.
 *
 * Only the legacy stream is used (no non-blocking stream: the fast path).
 * Each phase launches a kernel that reads block A for ~300 ms, frees A at
 * once (cudaFree: libemm returns without waiting) and then, while the
 * kernel runs, makes libemm give pages back:
 *
 *   1. hold-peak: 64 + 64 MiB, A (the first) freed, emm_release_idle with
 *      a huge keep to close the epoch, then 96 MiB: past the high-water mark,
 *      so (EMM_HOLD_PEAK on) A's pages go back before the segment grows;
 *   2. release-idle: A (48 MiB) freed, emm_release_idle(0, 0).
 *
 * Every phase must end with cudaDeviceSynchronize() == cudaSuccess and the
 * kernel's sum right; page_unmaps (or backend_frees: a whole segment's
 * free unmaps too) must have grown (else the test proved nothing: FAIL). Prints "vmm-inflight: PASS" or "... FAIL".
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


__global__ void fill(uint32_t *p, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = 1u;
}

/* Read all of p over and over for `ns` nanoseconds; each pass adds n. */
__global__ void slow_read(const uint32_t *p, size_t n, unsigned long long ns, unsigned long long *passes,
                          unsigned long long *bad)
{
	unsigned long long t0, t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	do {
		unsigned long long sum = 0;
		for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
		     i += (size_t)gridDim.x * blockDim.x)
			sum += p[i];
		size_t mine = 0;
		for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
		     i += (size_t)gridDim.x * blockDim.x)
			mine++;
		if (sum != mine)
			atomicAdd(bad, 1ull);
		if (threadIdx.x == 0 && blockIdx.x == 0)
			atomicAdd(passes, 1ull);
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	} while (t - t0 < ns);
}

static struct emm_stats stats(void)
{
	struct emm_stats s;

	(void)gpu_stats(GPU_SCOPE_DEVICE, &s);
	return s;
}

static unsigned long long *counters; /* [0] passes, [1] bad */

static void *alloc_filled(size_t size)
{
	void *p = NULL;
	if (cudaMalloc(&p, size) != cudaSuccess) {
		printf("vmm-inflight: cudaMalloc(%zu) failed\n", size);
		return NULL;
	}
	fill<<<256, 256>>>((uint32_t *)p, size / 4);
	return p;
}

/* Launch the reader on a, then free a without waiting. */
static void read_and_free(void *a, size_t size)
{
	cudaMemset(counters, 0, 2 * sizeof(*counters));
	slow_read<<<132, 256>>>((const uint32_t *)a, size / 4, 300ull * 1000 * 1000, &counters[0], &counters[1]);
	cudaFree(a);
}

/* Pages or whole segments given back so far (a whole segment's free
 * unmaps too). */
static uint64_t given_back(void)
{
	struct emm_stats s = stats();
	return s.page_unmaps + s.backend_frees;
}

static bool finish(const char *phase, uint64_t unmaps0)
{
	unsigned long long host[2] = {0, 0};
	cudaError_t e = cudaDeviceSynchronize();
	if (e == cudaSuccess)
		e = cudaMemcpy(host, counters, sizeof(host), cudaMemcpyDeviceToHost);
	uint64_t unmaps = given_back();
	printf("vmm-inflight: %s: %s, %llu passes, %llu wrong sums, give-backs %llu -> %llu\n", phase,
	       cudaGetErrorString(e), host[0], host[1], (unsigned long long)unmaps0, (unsigned long long)unmaps);
	if (e != cudaSuccess) {
		printf("vmm-inflight: FAIL: %s: pages unmapped under a running kernel\n", phase);
		return false;
	}
	if (host[1] || host[0] == 0) {
		printf("vmm-inflight: FAIL: %s: the kernel read wrong data\n", phase);
		return false;
	}
	if (unmaps == unmaps0) {
		printf("vmm-inflight: FAIL: %s: no page went back (is EMM_BACKEND=vmm?)\n", phase);
		return false;
	}
	return true;
}

int main(void)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("vmm-inflight: no GPU, skipping\n");
		return 77;
	}
	if (!gpu_emm_present()) {
		printf("vmm-inflight: FAIL: libemm is not loaded (LD_PRELOAD=libemm.so, EMM_BACKEND=vmm)\n");
		return 1;
	}
	bool ok = cudaMalloc((void **)&counters, 2 * sizeof(*counters)) == cudaSuccess;
	bool hold = gpu_hold_peak_on();

	/* 1. The held peak's give-back before a growth. */
	if (ok && hold) {
		void *a = alloc_filled(64 * MIB), *b = alloc_filled(64 * MIB);
		ok = a && b && cudaDeviceSynchronize() == cudaSuccess;
		uint64_t u0 = given_back();
		if (ok) {
			read_and_free(a, 64 * MIB);
			(void)gpu_release_idle(0, (size_t)1 << 60); /* closes the epoch, gives nothing back */
			void *c = alloc_filled(96 * MIB);
			ok = c && finish("hold-peak", u0);
			cudaFree(c);
		}
		cudaFree(b);
	}

	/* 2. emm_release_idle right after the free. */
	if (ok) {
		void *a = alloc_filled(48 * MIB), *b = alloc_filled(16 * MIB);
		ok = a && b && cudaDeviceSynchronize() == cudaSuccess;
		uint64_t u0 = given_back();
		if (ok) {
			read_and_free(a, 48 * MIB);
			(void)gpu_release_idle(0, 0);
			ok = finish("release-idle", u0);
		}
		cudaFree(b);
	}
	printf("vmm-inflight: %s\n", ok ? "PASS" : "FAIL");
	return ok ? 0 : 1;
}
