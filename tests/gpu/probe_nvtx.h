/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/probe_nvtx.h - the NVTX memory calls of the probes
 * (probe_nvtx_heaps.cu, probe_nvtx_peer.cu), made as libemm makes them
 * (process/annotate.c): a range as a sub-allocator heap of virtual
 * addresses, a block as one region of it; and the two-GPU check of the
 * peer probes.
 */
#ifndef EMM_TESTS_GPU_PROBE_NVTX_H
#define EMM_TESTS_GPU_PROBE_NVTX_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdio.h>

#define NVTX_AS_SYSTEM_HEADER
#include <nvtx3/nvToolsExtMem.h>

/* The heap's handle: its address when the tool took it. */
static inline nvtxMemHeapHandle_t probe_heap_register(const void *p, size_t size)
{
	nvtxMemVirtualRangeDesc_t range = {.size = size, .ptr = p};
	nvtxMemHeapDesc_t desc = {};
	desc.extCompatID = NVTX_EXT_COMPATID_MEM;
	desc.structSize = sizeof(desc);
	desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
	desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
	desc.typeSpecificDescSize = sizeof(range);
	desc.typeSpecificDesc = &range;
	return nvtxMemHeapRegister(NULL, &desc);
}

static inline void probe_region_register(nvtxMemHeapHandle_t heap, const void *p, size_t size)
{
	nvtxMemVirtualRangeDesc_t r = {.size = size, .ptr = p};
	nvtxMemRegionsRegisterBatch_t batch = {};
	batch.extCompatID = NVTX_EXT_COMPATID_MEM;
	batch.structSize = sizeof(batch);
	batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
	batch.heap = heap;
	batch.regionCount = 1;
	batch.regionDescElementSize = sizeof(r);
	batch.regionDescElements = &r;
	nvtxMemRegionsRegister(NULL, &batch);
}

/* A runtime call of the peer probes' main: on failure say which, return 1. */
#define RT_CK(x)                                                                             \
	do {                                                                                 \
		cudaError_t e_ = (x);                                                        \
		if (e_ != cudaSuccess) {                                                     \
			printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			return 1;                                                            \
		}                                                                            \
	} while (0)

/* 0 with two GPUs, device 0 able to reach device 1; else 77 (skip),
 * having said why. */
static inline int probe_two_gpus(void)
{
	int n = 0, can = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) {
		printf("skip: fewer than two GPUs\n");
		return 77;
	}
	if (cudaDeviceCanAccessPeer(&can, 0, 1) != cudaSuccess || !can) {
		printf("skip: device 0 cannot access device 1\n");
		return 77;
	}
	return 0;
}

#endif
