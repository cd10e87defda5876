/* SPDX-License-Identifier: MIT */
/*
 * interpose/state.h - libemm's process state as the shims see it: lazy
 * initialisation (options, backend, trace), one heap per CUDA context,
 * pinned-host heaps per flag set, stream keys and the live-stream registry,
 * capture tracking, the fence ops over real CUDA events, fork and exit.
 */
#ifndef EMM_INTERPOSE_STATE_H
#define EMM_INTERPOSE_STATE_H

#include <cuda.h>
#include <stdbool.h>

#include "allocator/heap.h"

/* False under EMM_DISABLE=1 or when initialisation failed (then every shim
 * is a pure pass-through). Initialises on first call. */
bool emm_state_enabled(void);

/*
 * The heap of the context current on this thread, created on first use.
 * 0 and the heap; -ENODEV if no context is current or the driver is not
 * initialised (the shim then calls the real function so the program gets
 * the driver's own error); -ENOSYS if libemm is disabled.
 */
int emm_state_current_heap(emm_heap_t **ret_heap);

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

#endif
