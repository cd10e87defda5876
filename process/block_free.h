/* SPDX-License-Identifier: MIT */
/*
 * process/block_free.h - the free of one of libemm's blocks for a program,
 * inlined into serve.c's: the short way when no pinned heap and no retired
 * heap exist (one flag word says so), block_free.c's for the rest.
 */
#ifndef EMM_PROCESS_BLOCK_FREE_H
#define EMM_PROCESS_BLOCK_FREE_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/compiler.h"
#include "process/annotate.h"
#include "process/process.h"
#include "process/process_internal.h"

/* Why a free may not take the short way: a pinned heap exists (pinned.c:
 * a free must then be of the space it names), a heap was retired
 * (contexts_retire.c: its idle memory goes back after each free). */
#define ST_FREE_PINNED  1u
#define ST_FREE_RETIRED 2u
extern atomic_uint st_free_flags;

int st_free_block_slow(emm_addr_t addr, emm_stream_t key, bool pinned, size_t *ret_requested);

/*
 * Free `addr` for the program, under the heap guard: 0 and the block's
 * requested size when libemm took it (freed, or quarantined for a captured
 * graph); -ENOENT when it is not ours or is of the other space (device vs
 * pinned: the driver refuses it without touching it); -EINVAL when it lies
 * in our memory but is no live block start (double free, interior pointer).
 */
static inline __attribute__((always_inline)) int st_free_block(emm_addr_t addr, emm_stream_t key, bool pinned,
                                                               size_t *ret_requested)
{
	int r;

	st_validate_current();
	r = emm_capture_quarantine_free(addr, pinned, ret_requested);
	if (r > 0)
		return 0; /* a graph may still use it: a memory checker keeps its region */
	if (r < 0)
		return -EINVAL;
	if (EMM_LIKELY(!pinned && atomic_load_explicit(&st_free_flags, memory_order_relaxed) == 0)) {
		st_annotate_block(addr, false, false);
		return emm_heap_free(addr, key, ret_requested);
	}
	return st_free_block_slow(addr, key, pinned, ret_requested);
}

#endif
