/* SPDX-License-Identifier: MIT */
/*
 * process/block_free.c - how a program's free of one of libemm's blocks is
 * carried out, the same for the driver shims (cuMemFree*, cuMemFreeHost) and
 * the runtime fast path (cudaFree*, cudaFreeHost): a context reset that
 * bypassed our shims is noticed first (the stale block then belongs to the
 * driver), the block must be of the space the call frees (device or pinned
 * host), a block a captured graph may still touch is quarantined
 * (capture.c) and keeps its region for a memory checker, and only then does
 * it leave the checker's books and go back to its heap.
 */
#include <errno.h>

#include "process/annotate.h"
#include "process/process_internal.h"
#include "process/process.h"

int emm_state_free_block(emm_addr_t addr, emm_stream_t key, bool pinned, size_t *ret_requested)
{
	struct emm_block_range range;
	emm_heap_t *owner;
	int r;

	emm_state_validate_current();
	/* A free naming the other space (device or pinned host) is the
	 * driver's to refuse. With no pinned heap every block is device
	 * memory: no question. A block's start answers from the block map;
	 * anything else (an interior pointer) from the segments. */
	if (pinned || emm_state_have_pinned()) {
		owner = emm_heap_of_block(addr);
		if (!owner && emm_heap_find_block(addr, &range) == 0)
			owner = range.heap;
		if (owner && emm_state_heap_is_pinned(owner) != pinned)
			return -ENOENT;
	}
	r = emm_capture_quarantine_free(addr, pinned, ret_requested);
	if (r > 0)
		return 0; /* a graph may still use it: a memory checker keeps its region */
	if (r < 0)
		return -EINVAL;
	/* A retired heap's block (contexts_retire.c): its idle memory goes
	 * back after the free. */
	emm_heap_t *retired = st_retired_heap_of(addr);
	/* Before the heap may hand it out again: no new owner's region first. */
	st_annotate_block(addr, false, pinned);
	r = emm_heap_free(addr, key, ret_requested);
	if (r == 0 && retired)
		(void)emm_heap_release_idle(retired, 0);
	return r;
}
