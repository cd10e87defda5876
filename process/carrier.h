/* SPDX-License-Identifier: MIT */
/*
 * process/carrier.h - work no epoch of a heap records on, carried into one
 * that does (carrier.c): a non-blocking stream destroyed with work in
 * flight, a stream-ordered free on another context's stream. Private to
 * process/.
 */
#ifndef EMM_PROCESS_CARRIER_H
#define EMM_PROCESS_CARRIER_H

#include "process/process_internal.h"

#pragma GCC visibility push(hidden)

/* Carry the work enqueued so far on stream `key` (of context kctx, NULL:
 * the current one) into `heap` of entry e: e's carrier waits for it and
 * joins the heap's non-blocking streams; if that cannot be done, the heap
 * parks what it closes until a device synchronize. */
void st_carry_into(emm_heap_t *heap, struct ctx_entry *e, emm_stream_t key, CUcontext kctx);
/* The key a stream-ordered free of our block addr goes by: `key`, or, on a
 * stream of another context than the block's heap, EMM_STREAM_SYNC after
 * that stream's work was carried into the heap. Inside the heap guard. */
emm_stream_t st_free_key(emm_addr_t addr, emm_stream_t key);
/* Is `key` a stream of another context than the current one? (Such an
 * allocation is the driver's: it comes from the stream's device.) */
bool st_stream_foreign(emm_stream_t key);
/* A context libemm keeps something of (an entry, a registered stream):
 * from the second one on, the two questions above are asked. */
void st_note_context(CUcontext ctx);
void st_carrier_fork_child(void);

#pragma GCC visibility pop

#endif
