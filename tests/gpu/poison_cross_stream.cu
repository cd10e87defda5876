/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/poison_cross_stream.cu - EMM_POISON on a GPU (issue 16): a
 * kernel that reads a block after its free, on another stream with no
 * dependency on the freeing one, must see the poison byte, not the stale
 * data. Three frees: cudaFreeAsync on stream s1 read from stream s2,
 * cudaFree (synchronous, the legacy stream) read from a non-blocking
 * stream s2, and the next cudaMalloc's owner reading before writing.
 *
 *   poison-cross-stream EXPECT
 *
 * EXPECT is the byte every read must give (165 under EMM_POISON=165) or
 * "stale" (libemm without EMM_POISON: the old data, 0x11, is still there:
 * what the poison makes visible). Exit 0 on success, 1 on a wrong byte,
 * 77 without a GPU or without libemm loaded.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

#define N (64u << 10)

__global__ void fill(unsigned char *p, size_t n, unsigned char v)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = v;
}

__global__ void copy(const unsigned char *src, unsigned char *dst, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		dst[i] = src[i];
}

static unsigned char host[N];

/* Reads the freed block a on stream s into out and checks every byte. */
static int check(const char *what, unsigned char *a, unsigned char *out, cudaStream_t s, int want)
{
	size_t bad = 0;

	copy<<<64, 256, 0, s>>>(a, out, N);
	if (cudaStreamSynchronize(s) != cudaSuccess || cudaMemcpy(host, out, N, cudaMemcpyDeviceToHost) != cudaSuccess) {
		printf("%s: the read failed\n", what);
		return 1;
	}
	for (size_t i = 0; i < N; i++)
		bad += host[i] != want;
	printf("%s: %zu of %u bytes are not %d (first %d)\n", what, bad, N, want, host[0]);
	return bad != 0;
}

int main(int argc, char **argv)
{
	const char *expect = argc > 1 ? argv[1] : "165";
	int want = strcmp(expect, "stale") == 0 ? 0x11 : atoi(expect);
	unsigned char *a, *out;
	cudaStream_t s1, s2;
	int n = 0, fail = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("skip: no GPU\n");
		return GPU_SKIP;
	}
	if (!gpu_emm_present()) {
		printf("skip: libemm is not loaded (LD_PRELOAD)\n");
		return GPU_SKIP;
	}
	cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
	cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
	if (cudaMalloc(&out, N) != cudaSuccess)
		return 1;

	/* 1. cudaFreeAsync on s1; read on s2 with no dependency on s1 (the host
	 * waits for s1 so that the read comes after the free in time). */
	cudaMallocAsync(&a, N, s1);
	fill<<<64, 256, 0, s1>>>(a, N, 0x11);
	cudaFreeAsync(a, s1);
	cudaStreamSynchronize(s1);
	fail |= check("cudaFreeAsync(s1), read on s2", a, out, s2, want);

	/* 2. cudaFree (the legacy stream); read on a non-blocking stream. */
	cudaMalloc(&a, N);
	fill<<<64, 256>>>(a, N, 0x11);
	cudaDeviceSynchronize();
	cudaFree(a);
	cudaDeviceSynchronize();
	fail |= check("cudaFree, read on non-blocking s2", a, out, s2, want);

	/* 3. The next owner of the memory reads before writing. */
	cudaMalloc(&a, N);
	fill<<<64, 256>>>(a, N, 0x11);
	cudaFree(a);
	unsigned char *b;
	cudaMalloc(&b, N);
	if (b == a)
		fail |= check("the next cudaMalloc's owner, read first", b, out, 0, want);
	else
		printf("EMM-PARTIAL: ran 2, skipped 1 (the next cudaMalloc got other memory)\n");
	cudaFree(b);

	cudaFree(out);
	cudaStreamDestroy(s1);
	cudaStreamDestroy(s2);
	printf("poison-cross-stream %s: %s\n", expect, fail ? "FAIL" : "ok");
	return fail;
}
