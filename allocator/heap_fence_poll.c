/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_fence_poll.c - polling the closed fences of one arena: the
 * FIFO's completed fences retired oldest first (their blocks ready-any,
 * their structs recycled once no thread holds them), and the event queries
 * behind it, a batch per lock drop. The fences themselves, how they are
 * closed and queued, are heap_fence.c's. Every function here expects the
 * arena lock held; the queries run with it dropped (heap_internal.h: lock
 * order).
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <stdbool.h>

#include "common/log.h"

#define POLL_BATCH 16u /* events queried per lock drop */

/* Retire completed fences from the head of the FIFO (no queries): their
 * blocks become ready-any; structs no thread holds are recycled. */
static bool poll_retire(struct arena *h)
{
	struct emm_fence *prev = NULL, *f = h->fq_head, *next;
	bool moved = false;

	for (; f; f = next) {
		next = f->next;
		if (!f->retired) {
			if (!f->synced && f->done < f->nevents)
				break;
			if (f->nblocks)
				moved = true;
			fence_release_blocks(h, f);
			f->retired = true;
		}
		if (f->holds == 0) {
			if (prev)
				prev->next = next;
			else
				h->fq_head = next;
			if (h->fq_tail == f)
				h->fq_tail = prev;
			emm_heap_fence_recycle(h, f);
		} else {
			prev = f;
		}
	}
	return moved;
}

/* Query up to POLL_BATCH events of the FIFO, oldest first, lock dropped
 * (the fences held so their events stay alive); *more: all completed and
 * there may be others. */
static bool poll_batch(struct arena *h, bool *more)
{
	struct emm_fence *held[POLL_BATCH], *evf[POLL_BATCH];
	unsigned from[POLL_BATCH], nheld = 0, nev = 0, ok, failed = 0;
	uint64_t evs[POLL_BATCH];

	for (struct emm_fence *f = h->fq_head; f && nev < POLL_BATCH; f = f->next) {
		if (f->retired || f->synced || f->done >= f->nevents)
			continue;
		f->holds++;
		from[nheld] = f->done;
		held[nheld++] = f;
		for (unsigned i = f->done; i < f->nevents && nev < POLL_BATCH; i++) {
			evs[nev] = f->events[i];
			evf[nev++] = f;
		}
	}
	*more = false;
	if (nev == 0)
		return false;
	arena_unlock_release(h);
	for (ok = 0; ok < nev; ok++) {
		int r = fop_query(h, evs[ok]);
		if (r == -EBUSY)
			break;
		/* A failed query means a broken context: no more work will run
		 * on it, so the fence counts as passed. */
		if (r != 0)
			failed++;
	}
	arena_lock(h);
	h->st.event_queries += ok < nev ? ok + 1 : nev;
	if (failed && !h->warned_query) {
		emm_warn("event query failed: treating the fence as complete");
		h->warned_query = true;
	}
	for (unsigned j = 0; j < nheld; j++) {
		unsigned done = from[j];
		for (unsigned k = 0; k < ok; k++)
			done += evf[k] == held[j];
		if (done > held[j]->done)
			held[j]->done = done;
		held[j]->holds--;
	}
	*more = ok == nev && nev == POLL_BATCH;
	return poll_retire(h);
}

/*
 * Move completed fences' blocks to ready-any, oldest first, stopping at the
 * first incomplete one. Events are queried with the lock dropped, never
 * while a global capture is active. True if any block became ready.
 */
bool emm_heap_poll_fences(struct arena *h)
{
	bool moved = poll_retire(h), more = true;

	while (more && h->fq_head && !f_capturing(h, EMM_STREAM_SYNC))
		moved |= poll_batch(h, &more);
	return moved;
}
