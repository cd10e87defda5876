/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/probe_nvtx_unreg.cu - what makes compute-sanitizer refuse the
 * unregister of an NVTX region it was given? (a measurement for project
 * issue 16, not a test: run it under `compute-sanitizer --tool memcheck`,
 * without libemm, once per case, and count the tool's "Call to
 * nvtxMemRegionsUnregister failed" warnings). race-multidevice under libemm
 * draws one for a 24-byte block registered on device 0 at the start and
 * freed at the end, after the other device came up and peer access was
 * enabled.
 *
 * On device 0 a 2 MiB cudaMalloc plays a segment (a sub-allocator heap);
 * a 24-byte region at its start and a 4 KiB region at +512 are written by
 * a kernel. Then, per case, before both regions and the heap are
 * unregistered (device 0 current):
 *
 *   alone      nothing (the control)
 *   ctx1       device 1's primary context made (cudaSetDevice(1), cudaFree(0))
 *   peer10     device 1 enables peer access to device 0
 *   peer01     device 0 enables peer access to device 1
 *   copypeer   cudaMemcpyPeer from a plain device 0 buffer to device 1
 *   copyregion cudaMemcpyPeer from the 4 KiB region to device 1
 *   other      the regions unregistered with device 1 current (nothing else)
 *
 * Exit 0 after the case, 2 on bad usage, 77 without two GPUs with peer access.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "probe_nvtx.h"

__global__ void fill_words(uint32_t *p, size_t n, uint32_t v)
{
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = v;
}

static void region_unregister(const void *p)
{
	nvtxMemRegionRef_t ref = {};
	ref.pointer = p;
	nvtxMemRegionsUnregisterBatch_t b = {};
	b.extCompatID = NVTX_EXT_COMPATID_MEM;
	b.structSize = sizeof(b);
	b.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
	b.refCount = 1;
	b.refElementSize = sizeof(ref);
	b.refElements = &ref;
	printf("unregister region %p\n", p);
	fflush(stdout);
	nvtxMemRegionsUnregister(NULL, &b);
}

int main(int argc, char **argv)
{
	const char *cases[] = {"alone", "ctx1", "peer10", "peer01", "copypeer", "copyregion", "other"};
	int c = -1;
	for (int i = 0; argc == 2 && i < (int)(sizeof(cases) / sizeof(cases[0])); i++)
		if (strcmp(argv[1], cases[i]) == 0)
			c = i;
	if (c < 0) {
		fprintf(stderr, "usage: probe-nvtx-unreg alone|ctx1|peer10|peer01|copypeer|copyregion|other\n");
		return 2;
	}
	if (probe_two_gpus() != 0)
		return 77;
	const size_t seg_size = 2u << 20, small = 24, big = 4096;
	char *seg, *plain, *dst;
	RT_CK(cudaSetDevice(0));
	RT_CK(cudaMalloc((void **)&seg, seg_size));
	RT_CK(cudaMalloc((void **)&plain, big));
	nvtxMemHeapHandle_t h = probe_heap_register(seg, seg_size);
	printf("heap %s\n", h == (nvtxMemHeapHandle_t)seg ? "accepted" : "refused");
	probe_region_register(h, seg, small);
	probe_region_register(h, seg + 512, big);
	fill_words<<<1, 32>>>((uint32_t *)seg, small / 4, 1);
	fill_words<<<4, 256>>>((uint32_t *)(seg + 512), big / 4, 2);
	RT_CK(cudaGetLastError());
	RT_CK(cudaDeviceSynchronize());

	if (c == 1 || c == 2 || c == 4 || c == 5 || c == 6) {
		RT_CK(cudaSetDevice(1));
		RT_CK(cudaFree(0));
	}
	if (c == 2)
		RT_CK(cudaDeviceEnablePeerAccess(0, 0));
	if (c == 4 || c == 5) {
		RT_CK(cudaMalloc((void **)&dst, big));
		RT_CK(cudaMemcpyPeer(dst, 1, c == 4 ? plain : seg + 512, 0, big));
		RT_CK(cudaDeviceSynchronize());
		RT_CK(cudaFree(dst));
	}
	RT_CK(cudaSetDevice(0));
	if (c == 3)
		RT_CK(cudaDeviceEnablePeerAccess(1, 0));
	if (c == 6)
		RT_CK(cudaSetDevice(1));
	region_unregister(seg + 512);
	region_unregister(seg);
	RT_CK(cudaSetDevice(0));
	nvtxMemHeapUnregister(NULL, h);
	RT_CK(cudaFree(plain));
	RT_CK(cudaFree(seg));
	printf("PROBE %s done\n", argv[1]);
	return 0;
}
