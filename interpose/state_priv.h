/* SPDX-License-Identifier: MIT */
/*
 * interpose/state_priv.h - the parts of libemm's process state that only the
 * driver shims (shims_driver.c), the fence ops (fence_cuda.c) and the public
 * query API (public_api.c) use, beyond the contract in state.h: stream and
 * capture registries, context teardown, counters by kind, and walking the
 * heaps for statistics.
 *
 * Locks (never held while calling a heap function, except emm_heap_create):
 *   ctx_lock     - the context registry and heap creation; taken first.
 *   stream_lock  - the stream registry (rwlock); a leaf.
 *   capture_lock - captures, graph objects, the graph quarantine
 *                  (capture.c); a leaf.
 *   pool->lock   - a context's free CUDA events; a leaf.
 */
#ifndef EMM_INTERPOSE_STATE_PRIV_H
#define EMM_INTERPOSE_STATE_PRIV_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/heap.h"
#include "config/options.h"
#include "emm/emm.h"
#include "interpose/real.h"

/* --- real entry points ------------------------------------------------- */

/* The real driver table; never NULL (a table of NULLs without a driver). */
const struct emm_real_driver_table *emm_state_real(void);

/* Driver functions the shared table in real.h does not carry. */
struct emm_state_real_extra {
	CUresult (*cuCtxPushCurrent_v2)(CUcontext);
	CUresult (*cuCtxPopCurrent_v2)(CUcontext *);
	CUresult (*cuDeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
	CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
	CUresult (*cuStreamBeginCapture_v2_ptsz)(CUstream, CUstreamCaptureMode);
	CUresult (*cuStreamEndCapture_ptsz)(CUstream, CUgraph *);
	CUresult (*cuStreamBeginCaptureToGraph)(CUstream, CUgraph, const CUgraphNode *,
	                                        const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
	CUresult (*cuStreamBeginCaptureToGraph_ptsz)(CUstream, CUgraph, const CUgraphNode *,
	                                             const CUgraphEdgeData *, size_t, CUstreamCaptureMode);
	CUresult (*cuStreamIsCapturing_ptsz)(CUstream, CUstreamCaptureStatus *);
	/* the first capture ABI (relaxed mode); cuda.h renames the name away */
	CUresult (*stream_begin_capture_v1)(CUstream);
	CUresult (*cuStreamBeginCapture_ptsz)(CUstream);
	/* unique per context instance; NULL before driver 12.0 */
	CUresult (*cuCtxGetId)(CUcontext, unsigned long long *);
	/* graphs (the quarantine follows them; capture.c). The exports
	 * cuGraphInstantiate / cuGraphInstantiate_v2 (5 arguments),
	 * cuGraphExecUpdate (4) and cuGraphAddNode (5) are the old ABIs that
	 * cuda.h renames away, hence the member names. */
	CUresult (*graph_instantiate_v1)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
	CUresult (*graph_instantiate_v2)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);
	CUresult (*cuGraphInstantiateWithFlags)(CUgraphExec *, CUgraph, unsigned long long);
	CUresult (*graph_instantiate_with_params)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
	CUresult (*graph_instantiate_with_params_ptsz)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);
	CUresult (*cuGraphClone)(CUgraph *, CUgraph);
	CUresult (*cuGraphDestroy)(CUgraph);
	CUresult (*cuGraphExecDestroy)(CUgraphExec);
	CUresult (*cuGraphAddChildGraphNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraph);
	CUresult (*graph_add_node_v1)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t, CUgraphNodeParams *);
	CUresult (*graph_add_node_v2)(CUgraphNode *, CUgraph, const CUgraphNode *, const CUgraphEdgeData *, size_t,
	                              CUgraphNodeParams *);
	CUresult (*graph_exec_update_v1)(CUgraphExec, CUgraph, CUgraphNode *, CUgraphExecUpdateResult *);
	CUresult (*graph_exec_update_v2)(CUgraphExec, CUgraph, CUgraphExecUpdateResultInfo *);
	CUresult (*cuGraphExecChildGraphNodeSetParams)(CUgraphExec, CUgraphNode, CUgraph);
	CUresult (*cuGraphExecNodeSetParams)(CUgraphExec, CUgraphNode, CUgraphNodeParams *);
	CUresult (*cuGraphNodeSetParams)(CUgraphNode, CUgraphNodeParams *);
};
const struct emm_state_real_extra *emm_state_real_extra(void);

/* Settings (after initialisation; the defaults before it). */
const struct emm_options *emm_state_options(void);

/* --- heaps ------------------------------------------------------------- */

/* Bracket everything that touches a heap (a heap pointer from the
 * functions below, emm_heap_* on one of our addresses): a heap is destroyed
 * (context teardown) only while no thread is between the two. Nest freely;
 * cheap (a store, a barrier, a load). */
void emm_state_enter(void);
void emm_state_leave(void);

/* The heap of the current context if it exists; never creates one.
 * 0, -ENODEV (no context or none yet), -ENOSYS (disabled). */
int emm_state_current_heap_lookup(emm_heap_t **ret_heap);

/* The row pitch cuMemAllocPitch uses on the current context's device:
 * max(512, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT) (the H200 driver
 * gives 512 for a texture alignment of 32). */
size_t emm_state_pitch_alignment(void);

/* True if `heap` serves pinned host memory (device -2). */
bool emm_state_heap_is_pinned(const emm_heap_t *heap);

/* True once any pinned heap exists (cuMemFree must then check the space of
 * the block before freeing it). */
bool emm_state_have_pinned(void);

/* Idle cached bytes of every device heap on the current context's device
 * (for cuMemGetInfo); 0 when none. */
size_t emm_state_idle_bytes_current_device(void);

/* Call fn(heap, device, arg) for every live heap (device and pinned), with
 * no lock held during the calls. `push` makes each heap's context current
 * around the call (for calls that may reach the driver); only valid when
 * the driver is alive. */
void emm_state_for_each_heap(void (*fn)(emm_heap_t *heap, int device, void *arg), void *arg, bool push);

/* Sum the counters of `device` (-1 all, -2 pinned) into *out: live heaps,
 * heaps of contexts already torn down, and the pass-through counters. */
void emm_state_collect_stats(int device, struct emm_stats *out);

/* Print the EMM_STATS table (public_api.c); no driver calls. */
void emm_stats_print_exit(void);

/* Log an out-of-memory report (EMM_VERBOSE >= 1). */
void emm_state_report_oom(emm_heap_t *heap, size_t size);

/* --- streams and capture ----------------------------------------------- */

/* A stream was created in the current context (after the real call). */
void emm_state_stream_created(CUstream stream, bool nonblocking);
/* A stream is about to be destroyed (before the real call). */
void emm_state_stream_destroyed(CUstream stream);

/* Capture begun / ended on `stream` (after the real call). `graph` is the
 * graph cuStreamEndCapture returned, NULL when the capture failed. */
void emm_state_capture_begin(CUstream stream, bool per_thread_default, CUstreamCaptureMode mode);
void emm_state_capture_end(CUstream stream, bool per_thread_default, CUgraph graph);

/* True if stream-ordered allocation calls on `stream` must go to the driver
 * because the stream is capturing (tracked, or joined to a capture). */
bool emm_state_stream_capturing(CUstream stream, bool per_thread_default);

/* For the fence ops: is recording on / querying for `key` forbidden now?
 * (EMM_STREAM_SYNC: may anything be queried at all?) */
bool emm_state_capture_forbids(emm_stream_t key);

/* The context a real stream was created in (NULL if unknown). */
CUcontext emm_state_stream_context(emm_stream_t key);

/* --- the graph quarantine (capture.c; the bound is documented there) ----- */

/* A pool block was just handed out: if captures are active, the graphs they
 * make may use it (watched until those graphs are gone). */
void emm_capture_note_alloc(emm_addr_t addr, emm_heap_t *heap);

/*
 * The program frees `addr` (pinned: through cuMemFreeHost). If a captured
 * graph may still touch the block (a capture is active, or the block was
 * allocated during a capture whose graph lives), keep it: 1 and its
 * requested size. 0: not quarantined, free it normally. -EINVAL: it is
 * already quarantined (a double free).
 */
int emm_capture_quarantine_free(emm_addr_t addr, bool pinned, size_t *ret_requested);

/* `dst` (a CUgraphExec if dst_exec, else a CUgraph) may run what `src` may:
 * it takes references to src's quarantine sets. `move`: src's handle is
 * consumed (child graph moved into its parent). */
void emm_graph_derived(const void *dst, bool dst_exec, const void *src, bool src_exec, bool move);
/* src's sets are referenced from somewhere we cannot follow: keep them
 * until the context goes. */
void emm_graph_pin(const void *src, bool src_exec);
/* cuGraphDestroy / cuGraphExecDestroy succeeded. */
void emm_graph_destroyed(const void *handle, bool exec);

/* A stream was destroyed (the real call succeeded): a capture still
 * recorded on it is over without a graph. */
void emm_capture_stream_destroyed(CUstream stream);
/* The context is gone: forget its captures, graphs and quarantined blocks
 * (of `heaps`, which are about to be destroyed) without freeing them. */
void emm_capture_context_dropped(CUcontext ctx, emm_heap_t *const *heaps, size_t nheaps);
void emm_capture_fork_child(void);
/* Blocks quarantined so far, released so far, held now. */
void emm_capture_stats(uint64_t *ret_quarantined, uint64_t *ret_released, size_t *ret_held);

/*
 * Free `addr` for the program, under the heap guard (block_free.c): 0 and
 * the block's requested size when libemm took it (freed, or quarantined for
 * a captured graph); -ENOENT when it is not ours or is of the other space
 * (device vs pinned: the driver refuses it without touching it); -EINVAL
 * when it lies in our memory but is no live block start (double free,
 * interior pointer).
 */
int emm_state_free_block(emm_addr_t addr, emm_stream_t key, bool pinned, size_t *ret_requested);

/* --- context teardown -------------------------------------------------- */

/* Forget the heaps of a context the driver destroyed (no driver calls). */
void emm_state_context_destroyed(CUcontext ctx);
/* Forget the heaps of the primary context of `dev` (after a reset). */
void emm_state_primary_reset(CUdevice dev);
/* Before a retain of dev's primary context: if it is inactive now, any heap
 * of ours for it is stale (reset behind our back, e.g. by cudaDeviceReset). */
void emm_state_primary_retaining(CUdevice dev);

/* Before a free of one of our blocks: make sure the heap of the current
 * context still belongs to the live context (a reset that bypassed our
 * shims is noticed here, so the stale block goes to the driver). Cheap:
 * one cuCtxGetId and a thread-local compare. */
void emm_state_validate_current(void);
/* After a primary-context release: forget its heaps if it is now inactive. */
void emm_state_primary_released(CUdevice dev);

/* The driver reported itself gone (CUDA_ERROR_DEINITIALIZED): behave as at
 * exit from now on. */
void emm_state_driver_gone(void);

/* --- counters ---------------------------------------------------------- */

enum emm_state_counter {
	EMM_COUNT_PASS_ALLOC,      /* device allocation forwarded to the driver */
	EMM_COUNT_PASS_FREE,       /* device free forwarded to the driver */
	EMM_COUNT_PASS_HOST_ALLOC, /* pinned allocation forwarded */
	EMM_COUNT_PASS_HOST_FREE,  /* pinned free forwarded */
	EMM_COUNT_HOST_REGISTER,   /* cuMemHostRegister (always forwarded) */
	EMM_COUNT_HOST_UNREGISTER,
	EMM_COUNT_MANAGED_ALLOC, /* cuMemAllocManaged (always forwarded) */
	EMM_COUNT_CAPTURE_ALLOC, /* stream-ordered allocation made during capture (driver) */
	EMM_COUNT_BAD_FREE,      /* double/interior free refused */
	EMM_COUNT_IPC_REFUSED,   /* cuIpcGetMemHandle refused for a sub-allocated block */
	EMM_COUNT__COUNT
};

void emm_state_count(enum emm_state_counter which);

/* Process-wide values of every counter (index by enum emm_state_counter). */
void emm_state_counters(uint64_t out[EMM_COUNT__COUNT]);

/* Counters attributed to `device` (-1 all, -2 pinned) added into *out:
 * passthrough_allocs/frees and bad_frees. */
void emm_state_add_counter_stats(int device, struct emm_stats *out);

/* The loaded backend's name and path, for messages ("none" if none). */
const char *emm_state_backend_name(void);
const char *emm_state_backend_path(void);

/* --- fence ops over CUDA events (fence_cuda.c) -------------------------- */

struct emm_fence_pool;

/* The event pool of `ctx` (created on first use; NULL without memory).
 * Pools are never freed: markers that outlive their context find the pool
 * dead and read as complete. */
struct emm_fence_pool *emm_fence_pool_get(CUcontext ctx);
/* The context is gone (its events with it): mark its pool dead. */
void emm_fence_pool_drop(CUcontext ctx);
/* Fill *ops with the event fences of this pool. */
void emm_fence_ops_init(struct emm_fence_pool *pool, struct emm_fence_ops *ops);
/* In a fork child: forget every pool without calling the driver. */
void emm_fence_fork_child(void);

/* The CUstream a stream key names, for the thread calling. */
CUstream emm_state_stream_handle(emm_stream_t key);

#endif
