/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_fence.h - emm-replay's simulated GPU fences (--fences LAG):
 * the event ops libemm gives a heap on a real device, over a clock that
 * counts replayed events. An event completes LAG events after it was
 * recorded (0: at once, an idle GPU), so synchronous frees wait in epochs
 * as they do under libemm, and EMM_EPOCH_BLOCKS / EMM_EPOCH_BYTES show in
 * the peaks. Streams are idle when asked, waits cost nothing, no capture.
 * One replay thread runs at a time (replay_run.c), so no locking.
 */
#ifndef EMM_TOOLS_REPLAY_FENCE_H
#define EMM_TOOLS_REPLAY_FENCE_H

#include <stdint.h>

#include "allocator/heap.h"

struct replay_fence {
	uint64_t clock; /* events replayed so far */
	uint64_t lag;   /* events from a record to its completion */
};

/* The ops over f (which must outlive the heap). */
struct emm_fence_ops replay_fence_ops(struct replay_fence *f, uint64_t lag);

/* One more event replayed. */
static inline void replay_fence_tick(struct replay_fence *f)
{
	f->clock++;
}

#endif
