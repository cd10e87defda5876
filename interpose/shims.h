/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims.h - what the files of interpose/ share: the rules every
 * shim follows, the macros that call the real driver, the declarations of
 * exports cuda.h does not declare (per-thread-default-stream variants, old
 * ABIs it renames away), and the substitution table the resolvers use.
 *
 * interpose/ holds only exported entry points, one file per family:
 *   shims_mem.c      driver-API allocation and free (device, stream-ordered,
 *                    pinned host, registration, managed)
 *   shims_query.c    memory info, address ranges, pointer attributes, IPC
 *   shims_stream.c   streams, stream capture, context lifecycle
 *   shims_graph.c    graph objects (what a captured graph may still run)
 *   shims_vmm.c      virtual memory: reserve, create, map, set access and
 *                    their frees (a whole freed buffer is cached), queries
 *   shims_pool.c     explicit memory pools (passed through, counted)
 *   shims_array.c    CUDA arrays (passed through, counted with their bytes)
 *   shims_runtime.c  shared cudart's allocation calls (the fast path)
 *   public_api.c     include/emm/emm.h
 *   resolve.c        dlsym, cuGetProcAddress*, cudaGetDriverEntryPoint*
 *   shim_table.c     exported driver name -> libemm's replacement
 * Each shim translates: arguments into a call of the process layer
 * (process/process.h), its errno result into the driver's CUresult.
 *
 * Every shim follows the same rules:
 *   - libemm disabled (EMM_DISABLE, no backend): the real call, unchanged.
 *   - anything the pool does not serve - a NULL out-pointer, size 0, no
 *     current context, before cuInit, an argument the driver validates - is
 *     the real call with the same arguments, so the program sees exactly the
 *     driver's answer;
 *   - a free of a pointer libemm did not hand out goes to the driver
 *     (counted); a double or interior free inside libemm's memory is refused
 *     with CUDA_ERROR_INVALID_VALUE, the driver's code for it (the driver
 *     must not see it: it would free the whole segment);
 *   - the pool running dry (after releasing idle memory and retrying) is
 *     CUDA_ERROR_OUT_OF_MEMORY;
 *   - stream-ordered calls on a capturing stream go to the driver (graph
 *     memory nodes);
 *   - a free of one of our blocks while a captured graph may still use it is
 *     quarantined until that graph and everything instantiated from it are
 *     destroyed (process/capture.c; the graph shims tell it which graphs and
 *     executable graphs exist).
 */
#ifndef EMM_INTERPOSE_SHIMS_H
#define EMM_INTERPOSE_SHIMS_H

#include <cuda.h>

#include "process/process.h"

#define REAL(fn) (emm_state_real()->fn)
/* The real driver function; a process without a driver reads as not
 * initialised (it cannot have reached here through libcuda anyway). */
#define CALL_REAL(fn, ...) (REAL(fn) ? REAL(fn)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)
#define CALL_EXTRA(fn, ...)                                                                                  \
	(emm_state_real_extra()->fn ? emm_state_real_extra()->fn(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* The per-thread-default-stream exports, which cuda.h declares only when
 * the including program itself is built for per-thread default streams. */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode *dependencies,
                                                  const CUgraphEdgeData *dependencyData,
                                                  size_t numDependencies, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);

/* cuda.h maps these names to the newest ABI; the exports of the same names
 * are the old ABIs, which programs built against older headers still call. */
#undef cuGraphInstantiate
#undef cuGraphExecUpdate
#undef cuGraphAddNode
#undef cuGraphInstantiateWithParams
#undef cuStreamBeginCapture
#undef cuIpcOpenMemHandle
#undef cuCtxCreate
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent

/* The context calls' exports (shims_ctx.c) that cuda.h renames away or
 * declares only for its own build. */
CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                CUdevice dev);
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx);
CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx);
CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags);
CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                    char *logBuffer, size_t bufferSize);
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize);
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                                   CUgraphExecUpdateResult *updateResult_out);
CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUgraphNodeParams *nodeParams);
CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);

/* libemm's replacement for the driver export `exported_name`, or NULL
 * (shim_table.c). The resolvers (dlsym, cuGetProcAddress*,
 * cudaGetDriverEntryPoint*) call the real resolver first, take the exported
 * name of what it returned (dladdr), and substitute emm_shim_for(name) when
 * it is not NULL. This keeps the caller's ABI choice (cudaVersion, _v2,
 * _ptsz) exactly: a shim exists per exported ABI, never per base name. */
void *emm_shim_for(const char *exported_name);

/* The resolvers' own replacements (resolve.c), for the table. */
void *emm_resolver_shim_for(const char *exported_name);

#endif
