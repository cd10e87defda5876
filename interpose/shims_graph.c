/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_graph.c - the driver API's graph entry points that move what a
 * captured graph may run: instantiation, cloning, child graphs, exec
 * updates and destruction. The graph quarantine (process/capture.c) keeps
 * blocks freed during a capture while any of these objects lives.
 */
#include <cuda.h>
#include <stdbool.h>

#include "common/compiler.h"
#include "interpose/shims.h"

/* --- graphs ------------------------------------------------------------- */

/* What a graph object may run: the quarantine follows every way a graph's
 * nodes reach another graph or an executable graph (capture.c). */

static CUresult instantiated(CUresult r, CUgraphExec *phGraphExec, CUgraph hGraph)
{
	if (r == CUDA_SUCCESS && phGraphExec && emm_state_enabled())
		emm_graph_derived(*phGraphExec, true, hGraph, false, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                               char *logBuffer, size_t bufferSize)
{
	return instantiated(CALL_EXTRA(graph_instantiate_v1, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                  CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)
{
	return instantiated(CALL_EXTRA(graph_instantiate_v2, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                        unsigned long long flags)
{
	return instantiated(CALL_EXTRA(cuGraphInstantiateWithFlags, phGraphExec, hGraph, flags), phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                         CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	return instantiated(CALL_EXTRA(graph_instantiate_with_params, phGraphExec, hGraph, instantiateParams),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                              CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	return instantiated(CALL_EXTRA(graph_instantiate_with_params_ptsz, phGraphExec, hGraph, instantiateParams),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph)
{
	CUresult r = CALL_EXTRA(cuGraphClone, phGraphClone, originalGraph);

	if (r == CUDA_SUCCESS && phGraphClone && emm_state_enabled())
		emm_graph_derived(*phGraphClone, false, originalGraph, false, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                                     const CUgraphNode *dependencies, size_t numDependencies,
                                                     CUgraph childGraph)
{
	CUresult r = CALL_EXTRA(cuGraphAddChildGraphNode, phGraphNode, hGraph, dependencies, numDependencies,
	                        childGraph);

	/* The child is cloned into the parent. */
	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_derived(hGraph, false, childGraph, false, false);
	return r;
}

/* A generic node that embeds a child graph: cloned, or moved (the child's
 * handle then belongs to the parent). */
static CUresult node_added(CUresult r, CUgraph hGraph, const CUgraphNodeParams *nodeParams)
{
	/* A memory-allocation node: the driver's graph memory, passed by. */
	if (r == CUDA_SUCCESS && nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC &&
	    emm_state_enabled())
		emm_state_passby(EMM_PASSBY_GRAPH_MEM, nodeParams->alloc.bytesize);
	if (r == CUDA_SUCCESS && nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH && emm_state_enabled())
		emm_graph_derived(hGraph, false, nodeParams->graph.graph, false,
		                  nodeParams->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                           size_t numDependencies, CUgraphNodeParams *nodeParams)
{
	return node_added(
	    CALL_EXTRA(graph_add_node_v1, phGraphNode, hGraph, dependencies, numDependencies, nodeParams), hGraph,
	    nodeParams);
}

EMM_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                              const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                                              size_t numDependencies, CUgraphNodeParams *nodeParams)
{
	return node_added(CALL_EXTRA(graph_add_node_v2, phGraphNode, hGraph, dependencies, dependencyData,
	                             numDependencies, nodeParams),
	                  hGraph, nodeParams);
}

/* Graph memory (the driver's, reserved when the graph is instantiated):
 * passed through, counted with its size. */
EMM_EXPORT CUresult CUDAAPI cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                                   const CUgraphNode *dependencies, size_t numDependencies,
                                                   CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams)
{
	CUresult r = CALL_EXTRA(cuGraphAddMemAllocNode, phGraphNode, hGraph, dependencies, numDependencies, nodeParams);

	if (r == CUDA_SUCCESS && nodeParams && emm_state_enabled())
		emm_state_passby(EMM_PASSBY_GRAPH_MEM, nodeParams->bytesize);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams *nodeParams)
{
	CUresult r = CALL_EXTRA(cuGraphNodeSetParams, hNode, nodeParams);

	/* The node's graph is not named: keep the child's blocks for good. */
	if (r == CUDA_SUCCESS && nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH && emm_state_enabled())
		emm_graph_pin(nodeParams->graph.graph, false);
	return r;
}

/* An executable graph updated from hGraph may now run hGraph's nodes (and
 * still its old ones, conservatively). */
static CUresult exec_updated(CUresult r, CUgraphExec hGraphExec, CUgraph hGraph)
{
	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_derived(hGraphExec, true, hGraph, false, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                                              CUgraphExecUpdateResult *updateResult_out)
{
	return exec_updated(CALL_EXTRA(graph_exec_update_v1, hGraphExec, hGraph, hErrorNode_out, updateResult_out),
	                    hGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                                 CUgraphExecUpdateResultInfo *resultInfo)
{
	return exec_updated(CALL_EXTRA(graph_exec_update_v2, hGraphExec, hGraph, resultInfo), hGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                               CUgraph childGraph)
{
	return exec_updated(CALL_EXTRA(cuGraphExecChildGraphNodeSetParams, hGraphExec, hNode, childGraph), hGraphExec,
	                    childGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                     CUgraphNodeParams *nodeParams)
{
	CUresult r = CALL_EXTRA(cuGraphExecNodeSetParams, hGraphExec, hNode, nodeParams);

	if (nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH)
		(void)exec_updated(r, hGraphExec, nodeParams->graph.graph);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
	CUresult r = CALL_EXTRA(cuGraphDestroy, hGraph);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_destroyed(hGraph, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	CUresult r = CALL_EXTRA(cuGraphExecDestroy, hGraphExec);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_destroyed(hGraphExec, true);
	return r;
}
