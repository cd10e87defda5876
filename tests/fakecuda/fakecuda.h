/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fakecuda.h - the control API of the test-double driver.
 *
 * libcuda.so.1 built from this folder behaves like the CUDA 13.0 driver for
 * the entry points libemm and its tests use, over host memory (README.md
 * lists them and the error codes). Besides the driver's own names it exports
 * these fakecuda_* functions so that a test can steer it: delay event
 * completion, shrink the simulated device, inject failures, read counters.
 *
 * A program linked against the fake (link_with: fakecuda_lib) calls them
 * directly; a program that must not link libcuda (libemm's own tests) finds
 * them with dlsym(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), name) and
 * can tell the fake from the real driver that way (the real one has none).
 *
 * Every function is thread-safe and may be called before cuInit.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#define FAKECUDA_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C" {
#endif

/* Back to a fresh process: not initialised, no contexts, streams, events or
 * allocations (all memory is released), counters zero, settings from the
 * environment (FAKECUDA_DEVICES, FAKECUDA_MEM_CAPACITY, FAKECUDA_EVENT_DELAY)
 * or their defaults. Handles from before the reset are invalid afterwards;
 * other threads' current contexts are dropped. */
FAKECUDA_API void fakecuda_reset(void);

/* Each event recorded from now on (on a stream that is not capturing)
 * completes only after `queries` further cuEventQuery calls on it (the
 * first `queries` calls return CUDA_ERROR_NOT_READY), or when something
 * waits for it: cuEventSynchronize, cuStreamSynchronize or cuCtxSynchronize
 * of its stream or context, a cuMemFree_v2 of synchronous memory (which
 * waits for the whole device, as the real one does), fakecuda_complete_all.
 * Completion is in stream order: an event completes no earlier than the
 * events recorded before it on the same stream and the events its stream
 * waited for (cuStreamWaitEvent, and the legacy-stream barrier between the
 * legacy stream and blocking streams). 0 (the default) completes at once. */
FAKECUDA_API void fakecuda_set_event_delay(unsigned int queries);

/* Completes every recorded event and all pending stream work, everywhere. */
FAKECUDA_API void fakecuda_complete_all(void);

/* Simulated memory of every device, in bytes (default 80 GiB, or
 * FAKECUDA_MEM_CAPACITY with an optional K/M/G/T suffix). Device
 * allocations beyond it fail with CUDA_ERROR_OUT_OF_MEMORY; cuMemGetInfo
 * reports total = capacity, free = capacity - bytes in use. Memory is
 * mapped lazily (MAP_NORESERVE), so a large capacity costs nothing. */
FAKECUDA_API void fakecuda_set_mem_capacity(size_t bytes);

/* Bytes of device memory in use on `device` (each allocation counts its size
 * rounded up to 256 bytes). */
FAKECUDA_API size_t fakecuda_mem_used(int device);

/* The next `count` device allocations (cuMemAlloc, cuMemAlloc_v2,
 * cuMemAllocPitch*, cuMemAllocAsync*, cuMemAllocManaged) fail with
 * CUDA_ERROR_OUT_OF_MEMORY after their argument checks, as if the device were
 * full. */
FAKECUDA_API void fakecuda_fail_next_alloc(unsigned int count);

/* The next `count` calls of the entry point exported as `name` (e.g.
 * "cuEventRecord", "cuMemAlloc_v2") return `error` at once, doing nothing.
 * Returns 0, or -1 if the fake exports no such entry point. */
FAKECUDA_API int fakecuda_fail_next_call(const char *name, CUresult error, unsigned int count);

/* The next call of the entry point exported as `name` parks its thread
 * (before doing anything, holding no lock of the fake) until
 * fakecuda_release_held(); fakecuda_held_waiting() is 1 while a thread is
 * parked. Returns 0, or -1 if the fake exports no such entry point. */
FAKECUDA_API int fakecuda_hold_next_call(const char *name);
FAKECUDA_API int fakecuda_held_waiting(void);
FAKECUDA_API void fakecuda_release_held(void);
/* Disarm every hold not yet taken (a call the test expected might not come). */
FAKECUDA_API void fakecuda_hold_clear(void);

/* Number of calls of the entry point exported as `name` since the last
 * reset (injected failures included), or 0 for a name the fake does not
 * export. Use fakecuda_known_function to tell the two apart. */
FAKECUDA_API uint64_t fakecuda_calls(const char *name);
FAKECUDA_API int fakecuda_known_function(const char *name);
/* Calls of every entry point since the last reset, summed; *ret_top (if
 * not NULL, and any call was made) names the most called one. */
FAKECUDA_API uint64_t fakecuda_calls_total(const char **ret_top);

/* Counters of what the calls did. */
struct fakecuda_stats {
	uint64_t event_records;          /* events recorded into a stream (not capturing) */
	uint64_t event_records_captured; /* events recorded into a capturing stream (graph nodes) */
	uint64_t event_queries;          /* cuEventQuery calls that reached the event */
	uint64_t event_queries_not_ready; /* ... of which answered CUDA_ERROR_NOT_READY */
	uint64_t event_syncs;            /* cuEventSynchronize */
	uint64_t stream_syncs;           /* cuStreamSynchronize* */
	uint64_t stream_queries;         /* cuStreamQuery* */
	uint64_t ctx_syncs;              /* cuCtxSynchronize* */
	uint64_t stream_waits;           /* cuStreamWaitEvent* that added a dependency or joined a capture */
	uint64_t device_syncs;           /* implicit whole-device waits (cuMemFree*, cuMemFreeHost) */
	uint64_t device_allocs;          /* successful device allocations, every kind */
	uint64_t device_frees;           /* successful device frees, every kind */
	uint64_t async_allocs;           /* cuMemAllocAsync* successes (also in device_allocs) */
	uint64_t async_frees;            /* cuMemFreeAsync* successes (also in device_frees) */
	uint64_t host_allocs;            /* cuMemAllocHost*, cuMemHostAlloc */
	uint64_t host_frees;             /* cuMemFreeHost */
	uint64_t host_registers;         /* cuMemHostRegister* */
	uint64_t host_unregisters;       /* cuMemHostUnregister */
	uint64_t live_device_allocations; /* now */
	uint64_t live_host_allocations;  /* now: pinned allocations and registrations */
	uint64_t device_bytes_in_use;    /* now, all devices, as fakecuda_mem_used */
	uint64_t pending_events;         /* now: recorded events not yet complete */
	uint64_t captures_begun;
	uint64_t captures_invalidated;
	uint64_t capture_violations;     /* calls refused with a stream-capture error (900-907) */
	uint64_t failures_injected;      /* calls answered by fakecuda_fail_next_call / _alloc */
	/* Potentially unsafe calls (cuMemAlloc*, cuMemFree*, cuEventQuery, ...)
	 * let through only because the calling thread was in RELAXED mode:
	 * in GLOBAL mode they would have been refused (900). */
	uint64_t relaxed_unsafe_calls;
	/* Calls of the kinds a caching allocator makes to fence its frees -
	 * cuEventRecord on a stream that is not capturing, cuEventQuery,
	 * cuEventSynchronize, cuStreamQuery, cuStreamSynchronize,
	 * cuCtxSynchronize, any operation on the legacy stream - made by any
	 * thread, in any mode, while a GLOBAL-mode capture is active (counted
	 * whether or not the driver refuses them). */
	uint64_t fence_calls_in_global_capture;
};
FAKECUDA_API void fakecuda_get_stats(struct fakecuda_stats *out);

/* Zeroes the call counters and the cumulative fields of fakecuda_stats,
 * leaving all driver state alone. */
FAKECUDA_API void fakecuda_reset_counters(void);

/* What cudaDeviceReset does, without calling any exported entry point (so a
 * preloaded library sees no call): resets the primary context of `device`
 * (its memory, streams and events are gone) and, if `retain`, brings it
 * back at once the way the runtime's next call does (one retain; the handle
 * stays the same, cuCtxGetId gives a new id). Returns 0, or -1 for a bad
 * device or a context that was never retained. */
FAKECUDA_API int fakecuda_device_reset(int device, int retain);

/*
 * The private export table: cuGetExportTable(&t, &id) with
 * id = FAKECUDA_PRIVATE_TABLE_ID answers this table. Its functions hand out
 * device memory (as cuMemAlloc_v2's) and pinned host memory (as
 * cuMemAllocHost_v2's) through no exported entry point, so a preloaded
 * library cannot see the allocation: the stand-in for the real driver's
 * private tables, through which driver components (libnvcuvid) allocate
 * and then free with the public cuMemFree_v2.
 */
#define FAKECUDA_PRIVATE_TABLE_ID                                                                            \
	{{'f', 'a', 'k', 'e', 'c', 'u', 'd', 'a', '-', 'p', 'r', 'i', 'v', 'a', 't', 'e'}}
struct fakecuda_private_table {
	size_t size; /* sizeof(struct fakecuda_private_table) */
	CUresult (*alloc)(CUdeviceptr *dptr, size_t bytesize);
	CUresult (*host_alloc)(void **pp, size_t bytesize);
};

#ifdef __cplusplus
}
#endif

#endif
