/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_oom.c - memory pressure on the allocation miss path: the
 * pending limit (before reserving more, wait a bounded time for old fences
 * when many freed bytes still wait for theirs), and out-of-memory recovery
 * (fence and synchronize everything pending in an arena, give its idle
 * segments and the pages under free blocks back, then the same for the
 * other arenas, before the one retry).
 */
#include "allocator/heap_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "common/log.h"

#define PENDING_WAIT_NS   (200u * 1000u * 1000u) /* the longest one miss waits */
#define PENDING_POLL_NS   (20u * 1000u)	         /* between two polls */

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * The pending limit. A program that frees without a stream while its
 * non-blocking streams are alive (DDP: NCCL's streams) leaves every freed
 * block pending until the device reaches the free, and a host that runs
 * ahead of the device then reserves a new block for each request: measured
 * at 3.8x PyTorch's peak in a two-GPU data-parallel loop. So a miss that
 * would reserve more while the arena holds more than pending_limit bytes
 * in pending blocks polls the oldest fences (lock dropped between polls)
 * until one frees a block that serves it, or pending falls to half the
 * limit, or PENDING_WAIT_NS pass (a fence that does not complete must not
 * stall every miss: after a timeout the arena's limit doubles). True with
 * *ret set: a block was found. Lock held on entry and on return.
 */
bool emm_heap_pending_wait(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream,
                           struct emm_block **ret)
{
	size_t limit = h->pending_limit;
	uint64_t deadline = 0;
	struct timespec pause = {0, PENDING_POLL_NS};

	/* During a capture no fence can be polled: waiting would only stall. */
	if (!limit || h->st.pending <= limit || !h->has_fence || !h->fq_head || f_capturing(h, EMM_STREAM_SYNC))
		return false;
	h->st.host_waits++;
	while (h->st.pending > limit / 2 && h->fq_head) {
		if (emm_heap_poll_fences(h) && (*ret = find_block(h, pool, rounded, stream)))
			return true;
		uint64_t t = now_ns();
		if (!deadline) {
			deadline = t + PENDING_WAIT_NS;
		} else if (t >= deadline) {
			if (h->pending_limit <= SIZE_MAX / 2)
				h->pending_limit *= 2;
			emm_debug("arena %p: old fences did not complete in %u ms; pending limit now %zu MiB",
			          (void *)h, PENDING_WAIT_NS / 1000000u, h->pending_limit >> 20);
			break;
		}
		arena_unlock_release(h);
		nanosleep(&pause, NULL);
		arena_lock(h);
	}
	return (*ret = find_block(h, pool, rounded, stream)) != NULL;
}

/*
 * Out of memory: close the open epoch, resolve orphans, fence every
 * ready-stream block, synchronize every pending fence (host waits, lock
 * dropped), then give all idle segments back. Lock held on entry and on
 * return; dropped around every fence op.
 */
void emm_heap_oom_recover(struct arena *h)
{
	struct emm_fence **held = NULL;
	uint64_t *events = NULL;
	size_t nheld = 0, nevents = 0;

	emm_heap_close_epoch(h);
	if (h->has_fence) {
		emm_heap_resolve_orphans(h);
		for (emm_stream_t key = emm_pool_next_key(h, 0); key; key = emm_pool_next_key(h, key))
			emm_heap_fence_key(h, key, emm_heap_fence_target(h, key), NULL);

		bool can_sync = h->fops.synchronize && !f_capturing(h, EMM_STREAM_SYNC);
		size_t nf = 0, ne = 0;
		for (struct emm_fence *f = h->fq_head; f; f = f->next) {
			if (!f->retired && !f->synced) {
				nf++;
				ne += f->nevents - f->done;
			}
		}
		if (can_sync && nf) {
			held = malloc(nf * sizeof(*held));
			events = malloc((ne ? ne : 1) * sizeof(*events));
		}
		if (held && events) {
			for (struct emm_fence *f = h->fq_head; f; f = f->next) {
				if (f->retired || f->synced)
					continue;
				f->holds++; /* its events stay alive while we wait */
				held[nheld++] = f;
				for (unsigned i = f->done; i < f->nevents; i++)
					events[nevents++] = f->events[i];
			}
			arena_unlock_release(h);
			size_t failed = 0;
			for (size_t i = 0; i < nevents; i++)
				if (fop_synchronize(h, events[i]))
					failed++;
			arena_lock(h);
			h->st.host_waits += nevents;
			for (size_t i = 0; i < nheld; i++) {
				held[i]->holds--;
				if (!failed)
					held[i]->synced = true;
			}
		}
		free(held);
		free(events);
	}
	emm_heap_poll_fences(h);
	struct emm_segment *list = emm_pool_release_collect(h, 0);
	if (list) {
		arena_unlock_release(h);
		emm_pool_release_finish(h, list);
		arena_lock(h);
	}
	/* Page-granular heaps: the pages under every free ready-any block
	 * too (whole idle segments went back first: that frees their
	 * address range as well). */
	emm_pages_release(h, 0);
}

/* The other arenas' idle memory goes back too (one arena locked at a time:
 * ours is dropped meanwhile). Lock held on entry and on return. */
void emm_heap_oom_recover_others(struct arena *h)
{
	struct emm_heap *heap = h->owner;

	if (heap->narenas == 1)
		return;
	arena_unlock_release(h);
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *a = heap->arenas[i];
		if (a == h)
			continue;
		arena_lock(a);
		emm_heap_oom_recover(a);
		arena_unlock_release(a);
	}
	arena_lock(h);
}
