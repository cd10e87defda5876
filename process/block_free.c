/* SPDX-License-Identifier: MIT */
/*
 * process/block_free.c - how a program's free of one of libemm's blocks is
 * carried out, the same for the driver shims (cuMemFree*, cuMemFreeHost) and
 * the runtime fast path (cudaFree*, cudaFreeHost): a context reset that
 * bypassed our shims is noticed first (the stale block then belongs to the
 * driver), a block a captured graph may still touch is quarantined
 * (capture.c) and keeps its region for a memory checker, and only then does
 * it leave the checker's books and go back to its heap - if it is of the
 * space the call frees (device or pinned host), checked as the heap takes
 * it. Each step leaves a block of the other space alone. block_free.h
 * inlines the short way (no pinned heap, no retired one) into serve.c's
 * free; here are the long way and the flag word that chooses.
 */
#include "process/block_free.h"

atomic_uint st_free_flags;

/* emm_heap_free_if's question: the block's heap is of the space the free
 * names. */
static bool space_is(const emm_heap_t *heap, const void *pinned)
{
	return emm_state_heap_is_pinned(heap) == *(const bool *)pinned;
}

/* st_free_block's long way: a retired heap's block, or a pinned heap
 * alive (or a pinned free). */
int st_free_block_slow(emm_addr_t addr, emm_stream_t key, bool pinned, size_t *ret_requested)
{
	int r;

	/* A retired heap's block (contexts_retire.c): its idle memory goes
	 * back after the free. */
	emm_heap_t *retired = st_retired_heap_of(addr);
	/* Before the heap may hand it out again: no new owner's region first
	 * (a block of the other space keeps its region: st_annotate_block). */
	st_annotate_block(addr, false, pinned);
	/* A free naming the other space (device or pinned host) is the
	 * driver's to refuse. With no pinned heap every block is device
	 * memory: no question. The space is checked in the same call that
	 * takes the block. */
	if (pinned || (atomic_load_explicit(&st_free_flags, memory_order_relaxed) & ST_FREE_PINNED)) {
		r = emm_heap_free_if(addr, key, space_is, &pinned, ret_requested);
		if (r == -EXDEV)
			return -ENOENT;
	} else {
		r = emm_heap_free(addr, key, ret_requested);
	}
	if (r == 0 && retired)
		(void)emm_heap_release_idle(retired, 0);
	return r;
}
