/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_graph_mem.c - graph memory nodes
 * (cuGraphAddMemAllocNode): the node is added to a live graph and its
 * address written to the parameters, as the real driver does; the fake
 * keeps no memory behind it (it launches no such node). libemm passes the
 * call by and counts it.
 *
 * Errors as the real driver documents them: CUDA_ERROR_NOT_INITIALIZED
 * before cuInit, CUDA_ERROR_INVALID_CONTEXT without a current context,
 * CUDA_ERROR_INVALID_VALUE for a NULL node or parameters, an unknown
 * graph, dependencies missing, 0 bytes, an allocation type other than
 * pinned or a location other than a device, CUDA_ERROR_INVALID_DEVICE for
 * a bad device ordinal.
 */
#include <stdint.h>

#include "fake.h"

/* Graph memory's addresses: a range no other fake allocation uses. */
#define GRAPH_MEM_BASE  UINT64_C(0x7e0000000000)
#define GRAPH_MEM_ALIGN UINT64_C(0x200000)

FAKE_API CUresult cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                         size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
	static uint64_t next_va = GRAPH_MEM_BASE;
	struct fake_ctx *ctx;
	CUresult r;

	FAKE_ENTER(cuGraphAddMemAllocNode);
	fake_lock();
	r = fake_current_ctx_locked(&ctx);
	if (r == CUDA_SUCCESS && (!phGraphNode || !nodeParams || (numDependencies && !dependencies) ||
	                          !fake_ptrset_has(&g_fake.graph_set, hGraph) || !nodeParams->bytesize ||
	                          nodeParams->poolProps.allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
	                          nodeParams->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && !fake_device_valid(nodeParams->poolProps.location.id))
		r = CUDA_ERROR_INVALID_DEVICE;
	if (r == CUDA_SUCCESS) {
		nodeParams->dptr = (CUdeviceptr)next_va;
		next_va += (nodeParams->bytesize + GRAPH_MEM_ALIGN - 1) / GRAPH_MEM_ALIGN * GRAPH_MEM_ALIGN;
		*phGraphNode = (CUgraphNode)(uintptr_t)++g_fake.next_id;
	}
	fake_unlock();
	return r;
}
