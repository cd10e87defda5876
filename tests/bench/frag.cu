// SPDX-License-Identifier: MIT
/*
 * tests/bench/frag.cu - the fragmentation benchmark of project issue 9, one
 * size pair per process (tests/bench/run-frag.sh runs the pairs raw and
 * under libemm with each backend and prints the table):
 *
 *   frag SMALL BIG        sizes with K/M/G suffixes, e.g. "frag 7M 64M"
 *
 * Phase 1: cudaMalloc(SMALL) until it fails. Then every other block is
 * freed. Phase 2: cudaMalloc(BIG) until it fails. Everything is freed at the
 * end. Only cudaMalloc/cudaFree run (no kernels), so filling a 141 GB device
 * takes seconds. What counts is the bytes the program got in each phase
 * (libemm adjusts cuMemGetInfo, so the driver's view is printed for
 * information only). Output, one line:
 *
 *   RESULT small=7340032 big=67108864 phase1_bytes=... phase2_bytes=... phase1_n=... phase2_n=...
 *          phase1_s=... phase2_s=... meminfo_free_start=... meminfo_total=... meminfo_free_end=...
 *
 * Exit 77 without a GPU, 1 on a CUDA error other than out-of-memory.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

static size_t parse_size(const char *s)
{
	char *end = NULL;
	unsigned long long v = strtoull(s, &end, 10);
	switch (end && *end ? *end : 0) {
	case 'k': case 'K': v <<= 10; break;
	case 'm': case 'M': v <<= 20; break;
	case 'g': case 'G': v <<= 30; break;
	default: break;
	}
	return (size_t)v;
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* cudaMalloc(size) until it fails: out-of-memory ends the phase, anything
 * else is an error. */
static int fill(std::vector<void *> &out, size_t size, size_t *bytes)
{
	for (;;) {
		void *p = NULL;
		cudaError_t e = cudaMalloc(&p, size);
		if (e == cudaErrorMemoryAllocation) {
			cudaGetLastError(); /* clear it */
			return 0;
		}
		if (e != cudaSuccess) {
			fprintf(stderr, "frag: cudaMalloc(%zu): %s\n", size, cudaGetErrorString(e));
			return -1;
		}
		out.push_back(p);
		*bytes += size;
	}
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s SMALL BIG (e.g. 7M 64M)\n", argv[0]);
		return 2;
	}
	size_t small = parse_size(argv[1]), big = parse_size(argv[2]);
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		printf("frag: no GPU, skipping\n");
		return 77;
	}
	size_t f0 = 0, total = 0, f1 = 0;
	cudaFree(0);
	cudaMemGetInfo(&f0, &total);

	std::vector<void *> a, b;
	size_t bytes1 = 0, bytes2 = 0;
	a.reserve(total / small + 16);
	b.reserve(total / big + 16);
	double t0 = now();
	if (fill(a, small, &bytes1))
		return 1;
	double t1 = now();
	size_t freed = 0;
	for (size_t i = 0; i < a.size(); i += 2) {
		cudaFree(a[i]);
		a[i] = NULL;
		freed += small;
	}
	double t2 = now();
	if (fill(b, big, &bytes2))
		return 1;
	double t3 = now();
	cudaMemGetInfo(&f1, &total);
	for (void *p : a)
		if (p)
			cudaFree(p);
	for (void *p : b)
		cudaFree(p);
	printf("RESULT small=%zu big=%zu phase1_bytes=%zu phase2_bytes=%zu phase1_n=%zu phase2_n=%zu freed_bytes=%zu "
	       "phase1_s=%.2f phase2_s=%.2f meminfo_free_start=%zu meminfo_total=%zu meminfo_free_end=%zu\n",
	       small, big, bytes1, bytes2, a.size(), b.size(), freed, t1 - t0, t3 - t2, f0, total, f1);
	return 0;
}
