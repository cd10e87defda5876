/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/sanitize_planted.cu - memory errors planted for
 * compute-sanitizer, one a run, so that tests/gpu/run-sanitize.sh can run
 * each under the tool with and without libemm and require the same verdict
 * (issue 16). Without libemm's annotations (process/annotate.c) every
 * planted access lands inside a live segment and memcheck sees nothing.
 *
 *   sanitize-planted CASE
 *
 *   oob        write 40 bytes past the end of a 1000-byte block into its
 *              neighbour (memcheck: invalid __global__ write)
 *   uaf        write into a freed 1000-byte block whose segment stays live
 *              (memcheck: invalid __global__ write)
 *   leak       a 1000-byte block never freed (memcheck --leak-check full:
 *              "Leaked 1000 bytes")
 *   reuse      a 1000-byte block written, freed, then a block of the same
 *              size allocated (libemm hands out the same memory) and read
 *              before any write (initcheck: uninitialized read?)
 *   capture    a block allocated during a relaxed stream capture, written
 *              40 bytes past its end by the captured graph (memcheck)
 *   vmm-uaf    a 4 MiB buffer made with the VMM calls (reserve, create, map,
 *              set access) and freed (unmap, release, address free), then
 *              written (memcheck: invalid write; libemm keeps it mapped)
 *   pinned-oob a kernel writes 40 bytes past the end of a 1000-byte
 *              cudaMallocHost block (memcheck: invalid __global__ write;
 *              under libemm the write lands in a live pinned segment, seen
 *              because pinned segments are NVTX heaps and blocks regions)
 *   pinned-uaf a kernel writes into a freed 1000-byte cudaMallocHost block
 *              whose segment stays live (memcheck: invalid write)
 *   pinned-leak a 1000-byte cudaMallocHost block never freed (memcheck
 *              --leak-check full: whatever the tool says without libemm,
 *              it must say with libemm, whose pinned region stays live)
 *   managed-uninit a fresh cudaMallocManaged block read before any write
 *              (informational: does initcheck follow managed memory?)
 *   clean      all of the above done right: no report in either run
 *
 * Prints "libemm: loaded" or "libemm: absent" so the runner knows which
 * run it got. Exit 77 without a GPU; otherwise 0 whatever the tool found
 * (the verdict is the tool's output, not the exit status).
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

#include "gpu_common.h"
#include "vmm_calls.h"

__global__ void fill(unsigned char *p, size_t off, size_t n, unsigned char v)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;

	if (i < n)
		p[off + i] = v;
}

__global__ void copy(const unsigned char *src, unsigned char *dst, size_t n)
{
	size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;

	if (i < n)
		dst[i] = src[i];
}

static void sync_quiet(void)
{
	/* An error the tool caught may fail the launch: that is the point. */
	(void)cudaDeviceSynchronize();
	(void)cudaGetLastError();
}

int main(int argc, char **argv)
{
	const char *c = argc > 1 ? argv[1] : "clean";
	unsigned char *a = NULL, *b = NULL, *out = NULL;
	int n = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("skip: no GPU\n");
		return GPU_SKIP;
	}
	printf("libemm: %s\n", gpu_emm_present() ? "loaded" : "absent");
	if (cudaMalloc(&out, 1000) != cudaSuccess)
		return 1;
	cudaMemset(out, 0, 1000);

	if (strcmp(c, "oob") == 0) {
		cudaMalloc(&a, 1000);
		cudaMalloc(&b, 1000);
		fill<<<1, 40>>>(a, 1000, 40, 1); /* a[1000..1039] */
		sync_quiet();
		cudaFree(a);
		cudaFree(b);
	} else if (strcmp(c, "uaf") == 0) {
		cudaMalloc(&a, 1000);
		cudaMalloc(&b, 1000); /* keeps the segment alive */
		cudaFree(a);
		fill<<<1, 64>>>(a, 0, 64, 2);
		sync_quiet();
		cudaFree(b);
	} else if (strcmp(c, "leak") == 0) {
		cudaMalloc(&a, 1000);
		fill<<<4, 256>>>(a, 0, 1000, 3);
		sync_quiet();
		/* a is never freed */
	} else if (strcmp(c, "reuse") == 0) {
		cudaMalloc(&a, 1000);
		fill<<<4, 256>>>(a, 0, 1000, 4);
		sync_quiet();
		cudaFree(a);
		cudaMalloc(&b, 1000);
		printf("reused: %s\n", a == b ? "same address" : "other address");
		copy<<<4, 256>>>(b, out, 1000); /* reads b before any write */
		sync_quiet();
		cudaFree(b);
	} else if (strcmp(c, "managed-uninit") == 0) {
		/* Does initcheck follow managed memory at all? A fresh managed
		 * block read before any write (informational). */
		cudaMallocManaged(&b, 1000, cudaMemAttachGlobal);
		copy<<<4, 256>>>(b, out, 1000);
		sync_quiet();
		cudaFree(b);
	} else if (strcmp(c, "capture") == 0) {
		cudaStream_t s;
		cudaGraph_t g;
		cudaGraphExec_t ge;

		cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
		cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
		cudaMalloc(&a, 1000);
		cudaMalloc(&b, 1000);
		fill<<<1, 40, 0, s>>>(a, 1000, 40, 5);
		cudaStreamEndCapture(s, &g);
		if (cudaGraphInstantiate(&ge, g, 0) == cudaSuccess) {
			cudaGraphLaunch(ge, s);
			cudaStreamSynchronize(s);
			cudaGraphExecDestroy(ge);
		}
		sync_quiet();
		cudaGraphDestroy(g);
		cudaFree(a);
		cudaFree(b);
		cudaStreamDestroy(s);
	} else if (strcmp(c, "vmm-uaf") == 0) {
		CUmemAllocationProp p = vmm_call_prop(0, CU_MEM_HANDLE_TYPE_NONE);
		CUmemAccessDesc d = vmm_call_access(0);
		struct vmm_buf v;

		if (vmm_call_alloc(&v, 4u << 20, &p, &d, 1) != CUDA_SUCCESS)
			return 1;
		fill<<<1, 64>>>((unsigned char *)v.va, 0, 64, 9);
		sync_quiet();
		vmm_call_free(&v);
		fill<<<1, 64>>>((unsigned char *)v.va, 0, 64, 10);
		sync_quiet();
	} else if (strcmp(c, "pinned-oob") == 0) {
		unsigned char *h = NULL;

		cudaMallocHost(&h, 1000);
		cudaMallocHost(&a, 1000);
		fill<<<1, 40>>>(h, 1000, 40, 6);
		sync_quiet();
		cudaFreeHost(h);
		cudaFreeHost(a);
		a = NULL;
	} else if (strcmp(c, "pinned-uaf") == 0) {
		unsigned char *h = NULL;

		cudaMallocHost(&h, 1000);
		cudaMallocHost(&a, 1000); /* keeps the segment alive */
		cudaFreeHost(h);
		fill<<<1, 64>>>(h, 0, 64, 11);
		sync_quiet();
		cudaFreeHost(a);
		a = NULL;
	} else if (strcmp(c, "pinned-leak") == 0) {
		cudaMallocHost(&a, 1000);
		fill<<<4, 256>>>(a, 0, 1000, 12);
		sync_quiet();
		/* a is never freed */
	} else { /* clean */
		for (int i = 0; i < 4; i++) {
			cudaMalloc(&a, 1000);
			fill<<<4, 256>>>(a, 0, 1000, 7);
			copy<<<4, 256>>>(a, out, 1000);
			sync_quiet();
			cudaFree(a);
		}
		cudaMalloc(&a, 3u << 20);
		fill<<<(3u << 20) / 256, 256>>>(a, 0, 3u << 20, 8);
		sync_quiet();
		cudaFree(a);
		/* Pinned blocks written by a kernel and copied, in bounds. */
		for (int i = 0; i < 4; i++) {
			cudaMallocHost(&a, 1000);
			fill<<<4, 256>>>(a, 0, 1000, 13);
			sync_quiet();
			cudaMemcpy(out, a, 1000, cudaMemcpyHostToDevice);
			copy<<<4, 256>>>(out, a, 1000);
			sync_quiet();
			cudaFreeHost(a);
		}
	}
	cudaFree(out);
	printf("case %s: done\n", c);
	return 0;
}
