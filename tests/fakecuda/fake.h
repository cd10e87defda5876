/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake.h - shared state of the test-double driver.
 *
 * One global lock (g_fake.lock) guards all state; every exported entry point
 * counts itself (fake_enter), takes the lock, calls a static helper, drops
 * the lock. Helpers named *_locked assume the lock is held. Nothing blocks
 * while holding it: the fake has no device, so every wait completes at once.
 *
 * cuda.h is included with __CUDA_API_VERSION_INTERNAL (as NVIDIA builds the
 * driver), which declares every versioned entry point under its exported
 * name (cuMemAlloc_v2, cuMemAlloc, cuMemAllocAsync_ptsz, ...), so each
 * definition here is checked against the real prototype.
 */
#ifndef FAKECUDA_FAKE_H
#define FAKECUDA_FAKE_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fakecuda.h"

/* Marks an exported driver entry point (everything else is hidden). */
#define FAKE_API __attribute__((visibility("default")))

#define FAKE_DRIVER_VERSION 13000
#define FAKE_MAX_DEVICES 16
#define FAKE_ALIGN 256          /* cuMemAlloc alignment and accounting unit */
#define FAKE_PITCH_ALIGN 512    /* cuMemAllocPitch row alignment */

/* Every driver entry point the fake exports, by exported name. The order is
 * free; the enum and the name table come from this list. */
#define FAKE_FUNCTIONS(X)                                                        \
	X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)    \
	X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuGetExportTable)           \
	X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName)                    \
	X(cuDeviceGetAttribute) X(cuDeviceTotalMem_v2) X(cuDeviceGetUuid)        \
	X(cuDeviceGetUuid_v2)                                                    \
	X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                 \
	X(cuDevicePrimaryCtxRelease_v2) X(cuDevicePrimaryCtxReset)               \
	X(cuDevicePrimaryCtxReset_v2) X(cuDevicePrimaryCtxGetState)              \
	X(cuDevicePrimaryCtxSetFlags) X(cuDevicePrimaryCtxSetFlags_v2)           \
	X(cuCtxCreate) X(cuCtxCreate_v2) X(cuCtxCreate_v3) X(cuCtxCreate_v4)     \
	X(cuCtxDestroy) X(cuCtxDestroy_v2) X(cuCtxGetCurrent) X(cuCtxSetCurrent) \
	X(cuCtxPushCurrent) X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent)            \
	X(cuCtxPopCurrent_v2) X(cuCtxGetDevice) X(cuCtxGetDevice_v2)             \
	X(cuCtxSynchronize) X(cuCtxSynchronize_v2)                               \
	X(cuCtxGetStreamPriorityRange)                                           \
	X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemFree) X(cuMemFree_v2)              \
	X(cuMemAllocPitch) X(cuMemAllocPitch_v2)                                 \
	X(cuMemAllocAsync) X(cuMemAllocAsync_ptsz)                               \
	X(cuMemFreeAsync) X(cuMemFreeAsync_ptsz)                                 \
	X(cuMemAllocHost) X(cuMemAllocHost_v2) X(cuMemHostAlloc)                 \
	X(cuMemFreeHost) X(cuMemHostRegister) X(cuMemHostRegister_v2)            \
	X(cuMemHostUnregister) X(cuMemHostGetDevicePointer_v2)                   \
	X(cuMemHostGetFlags) X(cuMemAllocManaged)                                \
	X(cuMemGetInfo) X(cuMemGetInfo_v2)                                       \
	X(cuMemGetAddressRange) X(cuMemGetAddressRange_v2)                       \
	X(cuPointerGetAttribute) X(cuPointerGetAttributes)                       \
	X(cuMemsetD8_v2) X(cuMemsetD8_v2_ptds) X(cuMemsetD8Async) X(cuMemsetD8Async_ptsz) \
	X(cuMemcpyHtoD_v2) X(cuMemcpyHtoD_v2_ptds)                               \
	X(cuMemcpyDtoH_v2) X(cuMemcpyDtoH_v2_ptds)                               \
	X(cuMemcpyDtoD_v2) X(cuMemcpyDtoD_v2_ptds)                               \
	X(cuMemcpy) X(cuMemcpy_ptds)                                             \
	X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcOpenMemHandle_v2)      \
	X(cuIpcCloseMemHandle)                                                   \
	X(cuStreamCreate) X(cuStreamCreateWithPriority)                          \
	X(cuStreamDestroy) X(cuStreamDestroy_v2)                                 \
	X(cuStreamGetFlags) X(cuStreamGetFlags_ptsz)                             \
	X(cuStreamGetPriority) X(cuStreamGetPriority_ptsz)                       \
	X(cuStreamGetCtx) X(cuStreamGetCtx_ptsz)                                 \
	X(cuStreamGetCtx_v2) X(cuStreamGetCtx_v2_ptsz)                           \
	X(cuStreamGetId) X(cuStreamGetId_ptsz)                                   \
	X(cuStreamSynchronize) X(cuStreamSynchronize_ptsz)                       \
	X(cuStreamQuery) X(cuStreamQuery_ptsz)                                   \
	X(cuStreamWaitEvent) X(cuStreamWaitEvent_ptsz)                           \
	X(cuStreamBeginCapture) X(cuStreamBeginCapture_ptsz)                     \
	X(cuStreamBeginCapture_v2) X(cuStreamBeginCapture_v2_ptsz)               \
	X(cuStreamEndCapture) X(cuStreamEndCapture_ptsz)                         \
	X(cuStreamIsCapturing) X(cuStreamIsCapturing_ptsz)                       \
	X(cuStreamGetCaptureInfo) X(cuStreamGetCaptureInfo_ptsz)                 \
	X(cuStreamGetCaptureInfo_v2) X(cuStreamGetCaptureInfo_v2_ptsz)           \
	X(cuStreamGetCaptureInfo_v3) X(cuStreamGetCaptureInfo_v3_ptsz)           \
	X(cuThreadExchangeStreamCaptureMode)                                     \
	X(cuEventCreate) X(cuEventRecord) X(cuEventRecord_ptsz)                  \
	X(cuEventRecordWithFlags) X(cuEventRecordWithFlags_ptsz)                 \
	X(cuEventQuery) X(cuEventSynchronize)                                    \
	X(cuEventDestroy) X(cuEventDestroy_v2)                                   \
	X(cuGraphDestroy) X(cuGraphInstantiateWithFlags)                         \
	X(cuGraphLaunch) X(cuGraphLaunch_ptsz) X(cuGraphExecDestroy)             \
	X(cuCtxGetId) X(cuGraphCreate) X(cuGraphClone)                           \
	X(cuGraphAddChildGraphNode) X(cuGraphInstantiate)                        \
	X(cuGraphInstantiate_v2) X(cuGraphInstantiateWithParams)                 \
	X(cuGraphInstantiateWithParams_ptsz)                                     \
	X(cuMemPoolCreate) X(cuMemPoolDestroy) X(cuMemPoolTrimTo)                \
	X(cuMemPoolSetAttribute) X(cuMemPoolGetAttribute)                        \
	X(cuMemAllocFromPoolAsync) X(cuMemAllocFromPoolAsync_ptsz)               \
	X(cuDeviceGetDefaultMemPool) X(cuDeviceGetMemPool) X(cuDeviceSetMemPool) \
	X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease) \
	X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess)            \
	X(cuMemGetAllocationGranularity) X(cuMemGetAllocationPropertiesFromHandle) \
	X(cuMemRetainAllocationHandle)                                           \
	X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess) X(cuCtxDisablePeerAccess) \
	X(cuMemcpyPeer) X(cuMemcpyPeer_ptds)                                     \
	X(cuMemcpyPeerAsync) X(cuMemcpyPeerAsync_ptsz)                           \
	X(cuArrayCreate_v2) X(cuArray3DCreate_v2) X(cuMipmappedArrayCreate)     \
	X(cuArrayDestroy) X(cuMipmappedArrayDestroy) X(cuGraphAddMemAllocNode)

enum fake_fn {
#define FAKE_FN_ENUM(name) FN_##name,
	FAKE_FUNCTIONS(FAKE_FN_ENUM)
#undef FAKE_FN_ENUM
	FN_COUNT_
};

/* Counts the call; returns an injected error (fakecuda_fail_next_call) or
 * CUDA_SUCCESS. Lock-free. */
CUresult fake_enter(enum fake_fn fn);

#define FAKE_ENTER(name)                                        \
	do {                                                    \
		CUresult injected_ = fake_enter(FN_##name);     \
		if (injected_ != CUDA_SUCCESS)                  \
			return injected_;                       \
	} while (0)

/* --- objects --- */

struct fake_stream;
struct fake_capture;

/* A stream's sequence of work. Events recorded on the stream take the next
 * sequence number; the timeline is complete up to completed_seq. Waits on
 * other timelines (cuStreamWaitEvent, the legacy-stream barrier) hold back
 * every later sequence number. Refcounted: events keep a destroyed stream's
 * timeline alive until they are done with it. */
struct fake_wait {
	struct fake_wait *next;
	uint64_t at_seq;               /* applies to work with seq >= at_seq */
	struct fake_timeline *dep;     /* holds a reference */
	uint64_t dep_seq;
};

struct fake_timeline {
	struct fake_timeline *prev, *next; /* g_fake.timelines */
	struct fake_ctx *ctx;          /* the stream's context (never freed before a reset) */
	int device;
	uint64_t last_seq;             /* highest sequence number handed out */
	uint64_t completed_seq;
	struct fake_wait *waits;
	struct fake_event *pending;    /* events recorded here, not yet complete */
	unsigned refs;
};

struct fake_ctx {
	struct fake_ctx *next;         /* g_fake.contexts (live and destroyed) */
	int device;
	unsigned flags;
	bool primary;
	bool alive;                    /* false once destroyed / primary inactive */
	bool destroyed;                /* cuCtxDestroy'd (handle stays known) */
	bool abi_v1;                   /* made by cuCtxCreate (v1): only the 32-bit memory calls work */
	int primary_refs;
	uint64_t id;                   /* cuCtxGetId: new each time the context is (re)activated */
	uint64_t epoch;                /* changes each time the context is (re)activated */
	struct fake_stream *legacy;    /* the NULL / CU_STREAM_LEGACY stream */
	struct fake_stream *streams;   /* every stream of the context, legacy included */
	struct fake_event *events;
};

enum fake_stream_kind { STREAM_USER, STREAM_LEGACY, STREAM_PER_THREAD };

struct fake_stream {
	struct fake_stream *prev, *next; /* ctx->streams */
	struct fake_ctx *ctx;
	enum fake_stream_kind kind;
	unsigned flags;
	int priority;
	uint64_t id;
	struct fake_timeline *tl;
	struct fake_capture *capture;  /* capture sequence the stream belongs to */
};

enum fake_event_state { EVENT_NEVER, EVENT_RECORDED, EVENT_CAPTURED };

struct fake_event {
	struct fake_event *prev, *next;     /* ctx->events */
	struct fake_event *pprev, *pnext;   /* tl->pending */
	struct fake_ctx *ctx;
	unsigned flags;
	enum fake_event_state state;
	struct fake_timeline *tl;      /* EVENT_RECORDED: holds a reference */
	uint64_t seq;
	unsigned remaining;            /* queries still to answer NOT_READY */
	struct fake_capture *capture;  /* EVENT_CAPTURED, NULL once that capture ended */
};

struct fake_graph {
	uint64_t id;
	struct fake_deferred_free *frees; /* cuMemFreeAsync captured into it */
};

struct fake_deferred_free {
	struct fake_deferred_free *next;
	CUdeviceptr ptr;
};

struct fake_graph_exec {
	struct fake_graph *graph;
};

struct fake_capture {
	struct fake_capture *next;     /* g_fake.captures */
	uint64_t id;
	CUstreamCaptureMode mode;
	pthread_t thread;
	struct fake_stream *origin;
	struct fake_ctx *ctx;
	struct fake_graph *graph;
	bool invalidated;
};

/* A pointer-keyed hash set: the live handles of one kind. */
struct fake_ptrset {
	void **slots;
	size_t cap, used, tombs;
};
bool fake_ptrset_add(struct fake_ptrset *s, void *p);
bool fake_ptrset_has(const struct fake_ptrset *s, const void *p);
bool fake_ptrset_del(struct fake_ptrset *s, const void *p);
void *fake_ptrset_any(const struct fake_ptrset *s); /* a member, or NULL */
void fake_ptrset_clear(struct fake_ptrset *s);

/* --- global state --- */

struct fake_global {
	pthread_mutex_t lock;
	uint64_t gen;                  /* bumped by fakecuda_reset: stale TLS is dropped */
	bool initialized;
	bool forked;                   /* a child of an initialised process: CUDA is unusable */
	int device_count;
	size_t capacity;
	unsigned event_delay;
	unsigned fail_allocs;
	uint64_t next_id;
	struct fake_ctx *primary[FAKE_MAX_DEVICES];
	struct fake_ctx *contexts;
	struct fake_ptrset ctx_set, stream_set, event_set, graph_set, exec_set;
	struct fake_timeline timelines; /* list head */
	struct fake_capture *captures;
	size_t used[FAKE_MAX_DEVICES];
	struct fakecuda_stats stats;
};

extern struct fake_global g_fake;

void fake_lock(void);
void fake_unlock(void);

/* Reads the environment and the defaults into g_fake (lock held). */
void fake_settings_defaults_locked(void);

/* --- fake_core.c --- */

/* The calling thread's current context, checked: CUDA_ERROR_NOT_INITIALIZED
 * before cuInit, CUDA_ERROR_INVALID_CONTEXT with none,
 * CUDA_ERROR_CONTEXT_IS_DESTROYED for a destroyed one or a primary context
 * that was reset or released since. */
CUresult fake_current_ctx_locked(struct fake_ctx **out);
/* The same for the memory calls of one ABI: a context made by cuCtxCreate
 * (v1) takes only the 32-bit calls (cuMemAlloc, ...), every other context
 * only the _v2 ones; the wrong kind is CUDA_ERROR_INVALID_CONTEXT. */
CUresult fake_current_ctx_abi_locked(struct fake_ctx **out, bool abi_v1);
CUresult fake_check_init_locked(void);
struct fake_ctx *fake_ctx_lookup_locked(CUcontext h); /* NULL if unknown */
bool fake_device_valid(CUdevice dev);
CUstreamCaptureMode *fake_thread_capture_mode(void);
/* The calling thread's per-thread default stream in ctx (created on demand). */
struct fake_stream *fake_per_thread_stream_locked(struct fake_ctx *ctx);

/* --- fake_mem.c --- */

/* Frees every allocation of ctx that dies with the context (synchronous
 * device memory, pitched, managed, pinned host memory, registrations). */
void fake_mem_drop_ctx_locked(struct fake_ctx *ctx);
void fake_mem_reset_locked(void);
/* In a forked child: the inherited device memory is the parent's (shared
 * with it through the arena); forget it without touching the arena. */
void fake_mem_after_fork_child_locked(void);
/* Frees a pointer captured by cuMemFreeAsync when its graph is launched. */
void fake_mem_free_deferred_locked(CUdeviceptr ptr);
/* cuMemAllocAsync (explicit false: from the device's current pool) and
 * cuMemAllocFromPoolAsync (explicit true: from hpool); takes the lock. */
CUresult fake_mem_alloc_async(CUdeviceptr *dptr, size_t size, CUstream hs, bool ptds, bool explicit,
			      CUmemoryPool hpool);

/* cuMemAlloc_v2 and cuMemAllocHost_v2 for the private export table
 * (fake_procaddr.c): the same memory, by no exported entry point. */
CUresult fake_mem_private_alloc(CUdeviceptr *dptr, size_t bytesize);
CUresult fake_mem_private_host_alloc(void **pp, size_t bytesize);

/* [p, p + n) lies inside one allocation the device can reach (any kind). */
bool fake_mem_device_range_locked(uintptr_t p, size_t n);

/* --- fake_peer.c --- */

/* The context is destroyed or reset: its peer links (both ways) end. */
void fake_peer_drop_ctx_locked(struct fake_ctx *ctx);
/* fakecuda_reset: no peer links. */
void fake_peer_reset_locked(void);

/* --- fake_pool.c --- */

struct fake_pool;
/* A live explicit pool or a device's default pool by handle, else
 * CUDA_ERROR_INVALID_VALUE. */
CUresult fake_pool_lookup_locked(CUmemoryPool h, struct fake_pool **out);
/* The explicit pool cuMemAllocAsync uses on dev (cuDeviceSetMemPool), or
 * NULL for the default pool (whose allocations fake_mem.c accounts itself). */
struct fake_pool *fake_pool_current_locked(int dev);
/* The handle of an allocation's pool (NULL: the device's default pool). */
CUmemoryPool fake_pool_handle_locked(struct fake_pool *pool, int dev);
/* An allocation of `bytes` from the pool: reserves device capacity when the
 * pool has too little free (CUDA_ERROR_OUT_OF_MEMORY beyond capacity). The
 * default pool accounts nothing. */
CUresult fake_pool_take_locked(struct fake_pool *pool, size_t bytes);
/* The allocation is freed: the bytes stay reserved up to the release
 * threshold. The last allocation of a destroyed pool frees it. */
void fake_pool_give_locked(struct fake_pool *pool, size_t bytes);
/* fakecuda_reset, after the allocations are gone: no explicit pools. */
void fake_pool_reset_locked(void);

/* --- fake_vmm.c --- */

/* Forget every reservation, mapping and physical allocation (reset). */
void fake_vmm_reset_locked(void);
/* cuPointerGetAttribute of an address inside a VMM mapping (context NULL,
 * as the driver answers); CUDA_ERROR_NOT_FOUND when p is mapped nowhere. */
CUresult fake_vmm_pointer_attribute_locked(uintptr_t p, CUpointer_attribute attr, void *data);
/* [p, p+n) lies inside one VMM mapping. */
bool fake_vmm_mapped_range_locked(uintptr_t p, size_t n);

/* --- fake_stream.c --- */

struct fake_stream *fake_stream_new_locked(struct fake_ctx *ctx, enum fake_stream_kind kind,
					   unsigned flags, int priority);
/* Resolves a stream argument: 0 (the legacy stream, or the per-thread stream
 * for a _ptsz/_ptds entry point), CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or
 * a created stream. */
CUresult fake_stream_resolve_locked(CUstream h, bool ptds, struct fake_stream **out);
/* Stream-capture rules for one call (README.md, "Stream capture"). */
CUresult fake_capture_check_unsafe_locked(void);
/* A fence-like call (event record off capture, event or stream query or
 * synchronize, context synchronize, legacy-stream use): counted in
 * fence_calls_in_global_capture while a GLOBAL capture is active. */
void fake_note_fence_call_locked(void);
CUresult fake_capture_check_stream_use_locked(struct fake_stream *s, bool invalidate);
/* A stream-ordered operation on s: 901 on an invalidated capture, 906 on the
 * legacy stream while a blocking stream captures; sets *captured if s is
 * capturing (the operation becomes a graph node). */
CUresult fake_stream_op_locked(struct fake_stream *s, bool *captured);
struct fake_graph *fake_stream_capture_graph(struct fake_stream *s);
/* Waits (at once) for all work on dev: cuMemFree's implicit device sync. */
void fake_device_sync_locked(int dev);
/* cuCtxSynchronize: capture checks, then completes the context's work. */
CUresult fake_ctx_sync_locked(struct fake_ctx *ctx);
void fake_timeline_complete_locked(struct fake_timeline *tl, uint64_t seq);
void fake_ctx_drop_streams_locked(struct fake_ctx *ctx);
void fake_complete_all_locked(void);
void fake_streams_reset_locked(void);
uint64_t fake_pending_events_locked(void);

#endif
