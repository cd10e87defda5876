/* SPDX-License-Identifier: MIT */
/*
 * process/process.h - the process layer as the shims see it: the one header
 * interpose/ includes. What a CUDA process has beyond one allocator heap:
 *   - the real entry points behind the shims (real.c; declared in real.h,
 *     which this header includes, so the shims still include this one);
 *   - lazy initialisation (options, backend, trace), exit and fork (state.c);
 *   - one heap per CUDA context, its teardown, the heap guard (contexts.c,
 *     guard.c), the backend that feeds the heaps (segments.c), pinned-host
 *     heaps per flag set (pinned.c);
 *   - serving and freeing blocks for a shim (serve.c, block_free.c);
 *   - stream keys and the live-stream registry (streams.c), capture tracking
 *     (capture.c) and the graph quarantine (quarantine.c), the fence ops over real CUDA
 *     events (fence_cuda.c);
 *   - counters and statistics (stats.c, stats_print.c);
 *   - the VMM calls' cache of whole freed buffers (vmm.c, vmm_table.c,
 *     vmm_idle.c; declared in vmm.h, which this header includes);
 *   - legacy IPC of any block and the per-user registry behind it (ipc.c,
 *     ipc_export.c, ipc_import.c, ipc_registry.c; declared in ipc.h, which
 *     this header includes);
 *   - the public API's allocation door (api.c; declared in api.h, which
 *     this header includes).
 * Files inside process/ share process_internal.h as well; nothing outside
 * includes that.
 *
 * Functions return 0 or a negative errno and leave outputs untouched on
 * failure; mapping to CUresult is the shims' job.
 *
 * Locks, in the order they may be taken (a debug build checks that none is
 * held across a driver call or a heap call, except where noted):
 *   ctx_lock     - the context registry; never held across a heap call or a
 *                  driver call (heaps are created and destroyed outside it).
 *   heap_life    - rwlock: walks over the heaps (shared) and a heap's
 *                  destruction (exclusive).
 *   stream_lock  - the stream registry (rwlock); a leaf.
 *   capture_lock - captures, graph objects, the graph quarantine; a leaf.
 *   gate drain   - serialises capture begins while they wait for fence ops
 *                  in flight (capture.c); held only across that wait.
 *   pool->lock   - a context's free CUDA events; a leaf.
 *   vmm_lock     - the VMM cache (vmm.c, vmm_table.c, vmm_idle.c); a leaf,
 *                  and the fence ops run outside it.
 *   ipc_tables.lock - exports, kept segments, imports and the registry
 *                  file's flock (ipc_internal.h); a leaf.
 */
#ifndef EMM_PROCESS_PROCESS_H
#define EMM_PROCESS_PROCESS_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/heap.h"
#include "config/options.h"
#include "emm/emm.h"
#include "process/api.h"
#include "process/ipc.h"
#include "process/real.h"
#include "process/vmm.h"

/* === process state (state.c, contexts.c) ================================= */

/* False under EMM_DISABLE=1 or when initialisation failed (then every shim
 * is a pure pass-through). Initialises on first call. */
bool emm_state_enabled(void);

/* The pinned-host heap for cuMemHostAlloc flags (created on first use);
 * -ENOSYS when pinned caching is off or disabled. */
int emm_state_pinned_heap(unsigned int flags, emm_heap_t **ret_heap);

/* The allocator's key for a stream handle as the caller passed it:
 * 0 means the legacy default stream unless `per_thread_default` (a _ptsz
 * entry point or CU_STREAM_PER_THREAD), then this thread's default stream. */
emm_stream_t emm_state_stream_key(CUstream stream, bool per_thread_default);

/* True after exit has begun or the driver is known gone: frees of our
 * blocks succeed without any driver call. */
bool emm_state_exiting(void);

/* Counters kept outside any heap (pass-through and refused calls). */
void emm_state_count_passthrough_alloc(void);
void emm_state_count_passthrough_free(void);
void emm_state_count_bad_free(void);

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
	/* the calling thread's capture mode (relaxed around backend calls) */
	CUresult (*cuThreadExchangeStreamCaptureMode)(CUstreamCaptureMode *);
	/* unique per context instance; NULL before driver 12.0 */
	CUresult (*cuCtxGetId)(CUcontext, unsigned long long *);
	/* graphs (the quarantine follows them; quarantine.c). The exports
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
	/* passed by, counted (shims_array.c, shims_graph.c) */
	CUresult (*cuArrayCreate_v2)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
	CUresult (*cuArray3DCreate_v2)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
	CUresult (*cuMipmappedArrayCreate)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned int);
	CUresult (*cuGraphAddMemAllocNode)(CUgraphNode *, CUgraph, const CUgraphNode *, size_t,
	                                   CUDA_MEM_ALLOC_NODE_PARAMS *);
};
const struct emm_state_real_extra *emm_state_real_extra(void);

/* Settings (after initialisation; the defaults before it). */
const struct emm_options *emm_state_options(void);

/* --- heaps ------------------------------------------------------------- */

/* The heap of the current context if it exists; never creates one.
 * 0, -ENODEV (no context or none yet), -ENOSYS (disabled). */
int emm_state_current_heap_lookup(emm_heap_t **ret_heap);

/* The row pitch cuMemAllocPitch uses on the current context's device:
 * max(512, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT) (the H200 driver
 * gives 512 for a texture alignment of 32). */
size_t emm_state_pitch_alignment(void);

/* True if `heap` serves pinned host memory (device -2). */
bool emm_state_heap_is_pinned(const emm_heap_t *heap);

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

/* Print the EMM_STATS table (stats_print.c); no driver calls. */
void emm_stats_print_exit(void);

/* Write the statistics as one line of JSON (stats_json.c; schema in
 * docs/stats-json.md); `reason` is "exit" or "signal". No driver calls. */
struct emm_outbuf;
void emm_stats_write_json(struct emm_outbuf *ob, const char *reason);

/* Log the out-of-memory report, once per burst of failures (oom_report.c). */
void emm_state_report_oom(emm_heap_t *heap, size_t size);

/* --- streams and capture ----------------------------------------------- */

/* A stream was created in the current context (after the real call). */
void emm_state_stream_created(CUstream stream, bool nonblocking);
/* A stream is about to be destroyed (before the real call): its freed
 * blocks are fenced by a marker recorded on it while it lives, and the heaps
 * stop recording on it. Then, after the real call: it succeeded - forget the
 * stream; it failed - the stream lives on and is fenced as before. */
void emm_state_stream_destroying(CUstream stream);
void emm_state_stream_destroyed(CUstream stream);
void emm_state_stream_destroy_failed(CUstream stream);

/* A capture is about to begin on `stream` (before the real call): it is
 * recorded now, so that no fence op of libemm's starts inside it, and the
 * begin waits (bounded) for the event records and queries other threads
 * have in flight. Then, after the real call, emm_state_capture_begun with
 * its result (false: the record is forgotten). */
struct emm_capture;
struct emm_capture *emm_state_capture_begin(CUstream stream, bool per_thread_default, CUstreamCaptureMode mode);
void emm_state_capture_begun(struct emm_capture *capture, bool ok);
/* Capture ended on `stream` (after the real call). `graph` is the graph
 * cuStreamEndCapture returned, NULL when the capture failed. */
void emm_state_capture_end(CUstream stream, bool per_thread_default, CUgraph graph);

/* True if stream-ordered allocation calls on `stream` must go to the driver
 * because the stream is capturing (tracked, or joined to a capture). */
bool emm_state_stream_capturing(CUstream stream, bool per_thread_default);

/* For the fence ops: is recording on / querying for `key` forbidden now?
 * (EMM_STREAM_SYNC: may anything be queried at all?) */
bool emm_state_capture_forbids(emm_stream_t key);

/* The context a real stream was created in (NULL if unknown). */
CUcontext emm_state_stream_context(emm_stream_t key);

/* --- the graph quarantine (quarantine.c, which documents the bound) ------ */

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
/* Blocks quarantined so far, released so far, held now; and frees let
 * through as their own thread's beside a capture (quarantine.c). */
void emm_capture_stats(uint64_t *ret_quarantined, uint64_t *ret_released, size_t *ret_held, uint64_t *ret_beside);

/* --- context teardown -------------------------------------------------- */

/* Before the driver destroys (or resets) ctx: its streams go as if each
 * were destroyed, in every heap (another device's heap may hold blocks
 * freed on them). After a failed destroy they are announced again. */
void emm_state_context_destroying(CUcontext ctx);
void emm_state_context_destroy_failed(CUcontext ctx);
/* Before a reset of dev's primary context: the same for it, if we know it;
 * its handle (NULL if not) for emm_state_context_destroy_failed. */
CUcontext emm_state_primary_resetting(CUdevice dev);
/* Forget the heaps of a context the driver destroyed (no driver calls). */
void emm_state_context_destroyed(CUcontext ctx);
/* Forget the heaps of the primary context of `dev` (after a reset). */
void emm_state_primary_reset(CUdevice dev);
/* Before a retain of dev's primary context: if it is inactive now, any heap
 * of ours for it is stale (reset behind our back, e.g. by cudaDeviceReset). */
void emm_state_primary_retaining(CUdevice dev);

/* Around cuCtxSynchronize (vmm_sync.c): the ticket before the call, and,
 * once it succeeded, that ticket (for the current context). */
uint64_t emm_state_ctx_sync_begin(void);
void emm_state_ctx_sync_done(uint64_t ticket);

/* cuCtxDestroy of `ctx` succeeded / a context `ctx` was made (created or
 * retained): under a tool libemm remembers which handles are dead, so that
 * it asks no id of one a thread still has current. */
void emm_state_context_gone(CUcontext ctx);
void emm_state_context_made(CUcontext ctx);

/* The current context gained access to `peer`'s memory
 * (cuCtxEnablePeerAccess): under a memory checker, the peer device's blocks
 * stop being annotated (annotate_peer.c). */
void emm_state_peer_access_enabled(CUcontext peer);

/* The calling thread's current context changed through a shim (set, push,
 * pop, create, cudaSetDevice), or, with `every_thread`, any thread's may
 * have (a destroy, a reset): the context caches ask the driver again. */
void emm_state_current_changed(bool every_thread);
/* A context is current on this thread (the cache when EMM_CONTEXT_CHECK is
 * off and it holds one; else cuCtxGetCurrent). */
bool emm_state_context_current(void);
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
	EMM_COUNT_IPC_REFUSED,   /* cuIpcGetMemHandle refused (backend without IPC, registry unusable) */
	EMM_COUNT__COUNT
};

void emm_state_count(enum emm_state_counter which);

/* The families of calls that reach the driver without libemm serving them
 * (EMM_STATS "passed by" rows; struct emm_stats' passby_* fields). Bytes
 * are what the call asked for where its arguments say (an array's from its
 * descriptor), 0 where they do not (a free of an unknown pointer). */
enum emm_passby {
	EMM_PASSBY_ARRAY,         /* cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate */
	EMM_PASSBY_GRAPH_MEM,     /* cuGraphAddMemAllocNode, memory-allocation nodes of cuGraphAddNode */
	EMM_PASSBY_MANAGED,       /* cuMemAllocManaged */
	EMM_PASSBY_HOST_REGISTER, /* cuMemHostRegister */
	EMM_PASSBY_VMM,           /* cuMemCreate made by the driver (not from the VMM cache) */
	EMM_PASSBY_POOL,          /* allocations from an explicit pool */
	EMM_PASSBY_CAPTURE,       /* stream-ordered allocations during a capture (driver) */
	EMM_PASSBY_UNKNOWN_FREE,  /* frees of pointers libemm did not hand out (driver) */
	EMM_PASSBY_DRIVER,        /* frees of memory a driver component got inside the driver */
	EMM_PASSBY__COUNT
};

/* Count one successful call of `family` of `bytes` (stats.c). */
void emm_state_passby(enum emm_passby family, uint64_t bytes);

/* Process-wide values of every counter (index by enum emm_state_counter). */
void emm_state_counters(uint64_t out[EMM_COUNT__COUNT]);

/* Counters attributed to `device` (-1 all, -2 pinned) added into *out:
 * passthrough_allocs/frees and bad_frees. */
void emm_state_add_counter_stats(int device, struct emm_stats *out);

/* The loaded backend's name and path, for messages ("none" if none). */
const char *emm_state_backend_name(void);
/* True if the loaded backend's segments can be exported with
 * cuIpcGetMemHandle (EMM_BACKEND_CAP_IPC). */
bool emm_state_backend_can_ipc(void);
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

/* === serving one call for a shim (serve.c) ================================ */

/*
 * Device memory of `size` bytes from the current context's heap, for use on
 * stream key `key` (`stream`: the caller's handle, for the trace). 0 and
 * *ret_addr. -ENOMEM: the pool is exhausted after its retry (reported and
 * traced when `report`). Any other error: not served, the driver answers
 * (-EINVAL size 0, -ENODEV no context yet, -ENOSYS libemm off for it).
 */
int emm_serve_device_alloc(size_t size, emm_stream_t key, const void *stream, bool report, emm_addr_t *ret_addr);
/* Pinned host memory of cuMemHostAlloc flag set `flags`; as above. */
int emm_serve_host_alloc(size_t size, unsigned int flags, bool report, emm_addr_t *ret_addr);
/*
 * The program frees `addr` with a call of the device (or, `pinned`, host)
 * space. 0: freed or quarantined, traced. -ENOENT: not ours, or of the
 * other space: the driver answers. -EINVAL: inside libemm's memory but no
 * live block start (double or interior free): counted and warned about
 * under the name `what` (NULL: neither; the caller lets the driver path
 * report it).
 */
int emm_serve_free(const char *what, emm_addr_t addr, emm_stream_t key, const void *stream, bool pinned);
/* The driver served an allocation (result 0 or -ENOMEM) or a free: count
 * it under `which` and trace it. */
void emm_serve_passed_alloc(enum emm_state_counter which, int result, emm_addr_t addr, size_t size,
                            const void *stream);
void emm_serve_passed_free(enum emm_state_counter which, emm_addr_t addr, const void *stream);
/* A free of a pointer libemm did not hand out, as the shims see it before
 * the driver's free: whether the code that frees it is a driver component
 * (emm_real_is_driver_component_address: then the memory is the driver's
 * own, counted under "passed by, driver components" with its bytes, not as
 * an unknown free) and the bytes of the driver's allocation (0 unknown). */
struct emm_foreign_free {
	bool driver_component;
	uint64_t bytes;
};
/* Fill *out for `addr`, freed by the code at `caller` (a return address),
 * before the driver's free: one dladdr, and for a driver component the
 * driver's CU_POINTER_ATTRIBUTE_RANGE_SIZE. With EMM_VERBOSE=2 also log
 * what the driver says of it (memory type, managed, explicit pool, range,
 * mapping: which allocation path it came from) and who frees it. */
void emm_serve_foreign_free_begin(emm_addr_t addr, const void *caller, struct emm_foreign_free *out);
/* After the driver freed it: count it as emm_serve_passed_free does, under
 * the family *ff says (NULL: an unknown free). */
void emm_serve_foreign_free_end(enum emm_state_counter which, emm_addr_t addr, const void *stream,
                                const struct emm_foreign_free *ff);
/* The live block containing `addr`: 0 and *ret_range; -ENXIO inside one of
 * libemm's segments but in no live block; -ENOENT not libemm's memory. */
int emm_serve_find_block(emm_addr_t addr, struct emm_block_range *ret_range);
/* The context whose device heap holds the live block at addr (the driver
 * names no context for a VMM-backed segment, libemm knows the block's):
 * 0, or -ENOENT (not a device block of libemm's). */
int emm_serve_block_context(emm_addr_t addr, CUcontext *ret_ctx);

/* emm_stats_get's answer: flush the trace, then the counters of `device`
 * into *out, as much of them as out->struct_size (>= 8) holds
 * (stats_print.c). */
void emm_state_stats_snapshot(int device, struct emm_stats *out);

/* The device's default pool, whose allocations libemm serves (pool_attr.c):
 * after the driver answered, add libemm's books to a USED/RESERVED
 * CURRENT/HIGH attribute of it (true if `pool` is served and `attr` one of
 * those); after the driver took a set, reset libemm's high mark or apply a
 * RELEASE_THRESHOLD; after cuMemPoolTrimTo, trim libemm's idle memory.
 * Other pools: nothing. */
bool emm_pool_books_get(CUmemoryPool pool, CUmemPool_attribute attr, void *value);
void emm_pool_books_set(CUmemoryPool pool, CUmemPool_attribute attr, const void *value);
void emm_pool_books_trim(CUmemoryPool pool, size_t keep);

/* Give idle memory back (emm_release_idle): device -1 all, -2 pinned. 0 and
 * the bytes released; a negative errno when nothing was released and a
 * heap failed (stats_print.c). */
int emm_state_release_idle(int device, size_t keep_bytes, long long *ret_released);

#endif
