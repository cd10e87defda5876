/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/probe_nvtx_peer.cu - does compute-sanitizer's memcheck accept a
 * kernel's peer access to a block that is an NVTX region of another
 * device's heap? (a measurement for project issue 16, not a test: run it
 * under `compute-sanitizer --tool memcheck`, without libemm, once per case;
 * the tool's ERROR SUMMARY is the answer). Under libemm the race test
 * race-multidevice, clean without the tool, got thousands of reports of its
 * peer-access kernel reading blocks of the other device.
 *
 * A 4 MiB cudaMalloc on device 1 plays a segment; its first 1 MiB a block.
 * A kernel reads the block's 1 MiB (or 4 bytes more with "-oob"):
 *
 *   plain          no annotation, the kernel on device 0 (the control)
 *   region-own     heap and region registered with device 1 current, the kernel on device 1
 *   region-peer    the same registration, the kernel on device 0
 *   region-both    heap and region registered again with device 0 current, the kernel on device 0
 *   region-perm    as region-peer, after nvtxMemCudaSetPeerAccess(device 0's permissions, peer 1, read+write)
 *   region-perm-1  as region-peer, after nvtxMemCudaSetPeerAccess(device 1's permissions, peer 0, read+write)
 *   region-assign  as region-peer, after nvtxMemPermissionsAssign of the block (by pointer) read+write+atomic
 *                  in the process-wide permissions
 *   region-assign-0  the same in device 0's device-wide permissions
 *
 * Each case with "-oob" appended reads past the block's end: a tool that
 * checks the region reports one error per thread past it.
 * Exit 0 after the case, 2 on bad usage, 77 without two GPUs with peer access.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "probe_nvtx.h"
#include <nvtx3/nvToolsExtMemCudaRt.h>

__global__ void sum_words(const uint32_t *p, size_t n, unsigned long long *out)
{
	unsigned long long s = 0;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		s += p[i];
	atomicAdd(out, s);
}

static nvtxMemHeapHandle_t heaps[2];
static int nheaps;

/* The segment as a sub-allocator heap and the block as its region, with
 * the current device's context current. */
static void annotate(void *seg, size_t seg_size, void *block, size_t block_size)
{
	nvtxMemHeapHandle_t h = probe_heap_register(seg, seg_size);
	printf("heap %s\n", h == (nvtxMemHeapHandle_t)seg ? "accepted" : "refused");
	heaps[nheaps++] = h;
	probe_region_register(h, block, block_size);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: probe-nvtx-peer plain|region-own|region-peer|region-both|region-perm|region-perm-1|"
		                "region-assign|region-assign-0[-oob]\n");
		return 2;
	}
	char name[64];
	snprintf(name, sizeof(name), "%s", argv[1]);
	bool oob = false;
	size_t len = strlen(name);
	if (len > 4 && strcmp(name + len - 4, "-oob") == 0) {
		oob = true;
		name[len - 4] = 0;
	}
	const char *cases[] = {"plain",	       "region-own",    "region-peer",   "region-both",
	                       "region-perm", "region-perm-1", "region-assign", "region-assign-0"};
	int c = -1;
	for (int i = 0; i < (int)(sizeof(cases) / sizeof(cases[0])); i++)
		if (strcmp(name, cases[i]) == 0)
			c = i;
	if (c < 0)
		return 2;
	if (probe_two_gpus() != 0)
		return 77;
	const size_t MiB = 1 << 20, seg_size = 4 * MiB, block = MiB;
	void *seg;
	RT_CK(cudaSetDevice(1));
	RT_CK(cudaMalloc(&seg, seg_size));
	RT_CK(cudaMemset(seg, 1, seg_size));
	if (c != 0)
		annotate(seg, seg_size, seg, block);
	int run_on = strcmp(name, "region-own") == 0 ? 1 : 0;
	RT_CK(cudaSetDevice(0));
	RT_CK(cudaDeviceEnablePeerAccess(1, 0));
	if (c == 3)
		annotate(seg, seg_size, seg, block);
	const uint32_t rw = NVTX_MEM_PERMISSIONS_REGION_FLAGS_READ | NVTX_MEM_PERMISSIONS_REGION_FLAGS_WRITE;
	if (c == 4)
		nvtxMemCudaSetPeerAccess(NULL, nvtxMemCudaGetDeviceWidePermissions(NULL, 0), 1, rw);
	if (c == 5)
		nvtxMemCudaSetPeerAccess(NULL, nvtxMemCudaGetDeviceWidePermissions(NULL, 1), 0, rw);
	if (c == 6 || c == 7) {
		nvtxMemPermissionsAssignRegionDesc_t r = {};
		r.flags = rw | NVTX_MEM_PERMISSIONS_REGION_FLAGS_ATOMIC;
		r.regionRefType = NVTX_MEM_REGION_REF_TYPE_POINTER;
		r.region.pointer = seg;
		nvtxMemPermissionsAssignBatch_t b = {};
		b.extCompatID = NVTX_EXT_COMPATID_MEM;
		b.structSize = sizeof(b);
		b.permissions = c == 6 ? NVTX_MEM_PERMISSIONS_HANDLE_PROCESS_WIDE : nvtxMemCudaGetDeviceWidePermissions(NULL, 0);
		b.regionCount = 1;
		b.regionElementSize = sizeof(r);
		b.regionElements = &r;
		nvtxMemPermissionsAssign(NULL, &b);
	}
	RT_CK(cudaSetDevice(run_on));
	unsigned long long *sum;
	RT_CK(cudaMallocManaged(&sum, sizeof(*sum)));
	*sum = 0;
	size_t words = (block + (oob ? 4 : 0)) / 4;
	sum_words<<<64, 256>>>((const uint32_t *)seg, words, sum);
	RT_CK(cudaGetLastError());
	RT_CK(cudaDeviceSynchronize());
	printf("PROBE %s%s: kernel on device %d read %zu words, sum %llu\n", name, oob ? "-oob" : "", run_on, words,
	       *sum);
	RT_CK(cudaFree(sum));
	RT_CK(cudaSetDevice(1));
	while (nheaps > 0)
		nvtxMemHeapUnregister(NULL, heaps[--nheaps]);
	RT_CK(cudaFree(seg));
	return 0;
}
