/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_tcache.c - the per-thread front cache (jemalloc's tcache,
 * mimalloc's thread-local free lists): blocks a thread freed with a
 * synchronous free, reused by its next allocations without a search of
 * the arena's pools. The cache itself takes no lock and writes no shared
 * atomic; the block still enters (and leaves) its arena's table under the
 * arena lock (heap.c), as every allocation's does. Only for heaps created
 * with params.thread_cache.
 *
 * Each thread has one cache, bound to one heap (and its arena of that heap)
 * at a time; it holds only blocks of that arena (a block freed by another
 * thread than its allocator's goes the shared way). Two lists:
 *
 *   - pending: freed, not yet reusable (fence mode): the thread's own epoch.
 *     After EMM_EPOCH_BLOCKS frees (or 16 times EMM_EPOCH_BYTES, the hard
 *     bound), or at an allocation that misses with a pending block that
 *     would serve it while half its quota is pending and the bins hold too
 *     little (emm_tcache_alloc), it is closed in
 *     one arena lock (emm_heap_close_blocks): one event on the legacy
 *     stream, exactly as the shared open epoch closes, whose blocks join it (so
 *     every synchronous free still counts towards an epoch close). When the
 *     arena misses too (it has nothing ready that serves the request) and
 *     the epoch holds EMM_EPOCH_BYTES, or half the quota is pending with a
 *     block that could serve the miss, the blocks join the shared open
 *     epoch, which the arena's pressure rule then closes
 *     (emm_tcache_pressure_locked): bytes close an epoch only when memory
 *     is needed, as in the arena. With no live non-blocking
 *     stream the blocks come straight back, ready-any; otherwise the fence
 *     stays in the arena and they are reached through it like every other
 *     epoch's blocks. So a block in a cache is reused only when it would be
 *     reusable from the shared heap (DESIGN.md section 4): the fence rules
 *     are the shared heap's, only the lock is gone.
 *   - ready: ready-any blocks in bins by size class (4 per power of two,
 *     512 B - 8 MiB), at most TC_BIN_MAX (64, the default epoch) per bin and TC_READY_MAX bytes in
 *     all; an allocation takes a block of its class and pool at least its
 *     size (so at most a quarter larger), live and unsplit. Blocks freed
 *     with no fence ops or in stream mode are ready at once.
 *
 * Counters (allocations, frees, hits, bytes) are the thread's own and are
 * added to the arena under its lock whenever the cache takes it (epoch
 * close, flush) and when the thread reads statistics; the peaks carry the
 * highest point reached in between, so one thread's peaks stay exact.
 *
 * Heaps with a release threshold (EMM_RELEASE_THRESHOLD) free the shared
 * way, where the threshold is checked at every free, and so do pinned heaps
 * (host_accessible). A thread that frees into heaps of two devices in turn
 * flushes its cache at every change of heap.
 *
 * This file is the cache's hot path: allocation and free through the cache
 * and the close of the thread's epoch. Binding a thread's cache to a heap,
 * the heap registry, flushes, statistics, thread exit and fork are
 * heap_tcache_registry.c's; heap_tcache.h holds what the two share.
 */
#include "allocator/heap_tcache.h"

#include <stdatomic.h>
#include <stdint.h>

/* 4 classes per power of two from 512 B. */
static inline unsigned size_class(size_t size)
{
	unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
	return (k - 9u) * 4u + (unsigned)((size >> (k - 2u)) & 3u);
}

static void close_pending(struct tcache *tc);

/* Does the thread's epoch hold the bytes for a miss of `rounded` to close
 * it (as epoch_pressure for the arena's open epoch, heap_alloc.c)? */
static inline bool tc_pressure_bytes(const struct tcache *tc, size_t rounded)
{
	size_t bytes = LD(tc->d.pend_bytes);

	return tc->pend && bytes >= tc->arena->p.epoch_max_bytes && bytes >= rounded;
}

bool emm_tcache_alloc(struct emm_heap *heap, unsigned pool, size_t rounded, size_t size,
                      emm_stream_t stream, struct emm_block **ret)
{
	struct tcache *tc = emm_tc_tls;

	if (EMM_UNLIKELY(rounded > TC_MAX_SIZE))
		return false;
	if (EMM_UNLIKELY(!tc_bound(tc, heap))) {
		if (tc && tc->heap)
			emm_tc_unbind(tc); /* bound again at the thread's next free */
		return false;
	}
	unsigned c = size_class(rounded);
	struct emm_block **pp = &tc->bins[c], *b;
	for (; (b = *pp); pp = &b->link)
		if (b->size >= rounded && b->pool == pool)
			break;
	if (!b) {
		/* The thread's epoch closes here, its blocks back to the bins, when
		 * one of them would serve this (they come back unmerged) while
		 * half its quota is pending and the bins together hold too little
		 * for this request (a same-size loop: left to the arena's miss
		 * path, the blocks would join the shared open epoch and come back
		 * through the arena). A miss beside full bins of other classes
		 * goes to the arena: closing at half the quota there doubled the
		 * epochs of a working set of random sizes (1 per 33.5 frees
		 * against the shared way's 1 per 64, RESULTS.md section 31). Not
		 * for the epoch's bytes alone: the arena may serve the miss from
		 * ready memory, and it closes by bytes only when it cannot
		 * (emm_tcache_pressure_locked, epoch_pressure in heap_alloc.c).
		 * Closing here at EMM_EPOCH_BYTES made 16 threads of a working set
		 * close 41 % more epochs than the arenas (section 38, run J5). */
		if (tc->pend_max < rounded || tc->ready_bytes >= rounded ||
		    tc->npend < (arena_epoch_blocks(tc->arena) + 1) / 2)
			return false;
		close_pending(tc);
		for (pp = &tc->bins[c]; (b = *pp); pp = &b->link)
			if (b->size >= rounded && b->pool == pool)
				break;
		if (!b)
			return false;
	}
	*pp = b->link;
	tc->nbin[c]--;
	tc->ready_bytes -= b->size;
	b->link = NULL;
	b->requested = size;
	b->stream = stream;
	atomic_store_explicit(&b->tcached, 0, memory_order_release);

	struct tc_delta *d = &tc->d;
	int64_t allocated = LD(d->allocated) + (int64_t)b->size, requested = LD(d->requested) + (int64_t)size;
	BUMP(d->allocs, 1);
	BUMP(d->hits, 1);
	BUMP(d->live, 1);
	ST(d->allocated, allocated);
	ST(d->requested, requested);
	if (allocated > d->allocated_max)
		d->allocated_max = allocated;
	if (requested > d->requested_max)
		d->requested_max = requested;
	BUMP(d->allocated_total, b->size);
	BUMP(d->requested_total, size);
	*ret = b;
	return true;
}

/* Put ready-any block b (live, tcached) in its bin: false if full. */
static inline bool bin_put(struct tcache *tc, struct emm_block *b)
{
	if (b->size > TC_MAX_SIZE)
		return false;
	unsigned c = size_class(b->size);

	if (tc->nbin[c] >= TC_BIN_MAX || tc->ready_bytes + b->size > TC_READY_MAX)
		return false;
	atomic_store_explicit(&b->tcached, TC_READY, memory_order_relaxed);
	b->link = tc->bins[c];
	tc->bins[c] = b;
	tc->nbin[c]++;
	tc->ready_bytes += b->size;
	return true;
}

/* Close the thread's epoch; its blocks come back to the bins if they can. */
static void close_pending(struct tcache *tc)
{
	struct arena *h = tc->arena;
	struct emm_block *ready = NULL, *b, *next;
	struct emm_block *list = tc->pend;

	tc->pend = NULL;
	tc->npend = 0;
	tc->pend_max = 0;
	ST(tc->d.pend_bytes, 0);
	arena_lock(h);
	emm_tc_apply_delta(tc);
	for (b = list; b; b = b->link)
		untc(b);
	emm_heap_close_blocks(h, list, &ready);
	/* Not the fast path (a non-blocking stream is alive, a capture): the
	 * blocks wait in the arena as before and the cache only costs; let
	 * the next few epochs go the shared way. */
	if (!ready)
		tc->skip = 4 * arena_epoch_blocks(h);
	for (b = ready; b; b = next) {
		next = b->link;
		if (!bin_put(tc, b)) {
			untc(b);
			emm_pool_block_ready(h, b, 0);
		}
	}
	arena_unlock_release(h);
}

bool emm_tcache_free(struct emm_block *b)
{
	struct arena *h = b->seg->arena;
	struct emm_heap *heap = h->owner;
	struct tcache *tc = emm_tc_tls;

	/* A release threshold is checked at every free of the shared way;
	 * host-accessible (pinned) blocks never come back from an epoch at
	 * once, and a thread moving between a pinned and a device heap would
	 * flush its cache at every move. */
	if (EMM_UNLIKELY(b->size > TC_MAX_SIZE || h->p.release_threshold != SIZE_MAX ||
	                 h->p.host_accessible))
		return false;
	if (EMM_UNLIKELY(!tc_bound(tc, heap) || tc->arena != h)) {
		if (h != emm_heap_thread_arena(heap))
			return false; /* another thread's arena: the shared way */
		tc = emm_tc_get(heap, h);
		if (!tc)
			return false;
	}
	bool fenced = h->has_fence && h->p.free_mode == EMM_FREE_MODE_FENCE;
	struct tc_delta *d = &tc->d;
	size_t size = b->size, requested = b->requested;

	if (!fenced) {
		if (!bin_put(tc, b))
			return false;
	} else if (tc->skip) {
		tc->skip--;
		return false;
	} else {
		atomic_store_explicit(&b->tcached, TC_PENDING, memory_order_relaxed);
		b->link = tc->pend;
		tc->pend = b;
		tc->npend++;
		BUMP(tc->d.pend_bytes, size);
		if (size > tc->pend_max)
			tc->pend_max = size;
	}
	BUMP(d->frees, 1);
	BUMP(d->live, -1);
	BUMP(d->allocated, -(int64_t)size);
	BUMP(d->requested, -(int64_t)requested);
	/* By bytes only at the hard bound: below it a miss that needs the
	 * memory closes the epoch (emm_tcache_alloc, emm_tcache_pressure_locked). */
	if (fenced && (tc->npend >= arena_epoch_blocks(h) || LD(tc->d.pend_bytes) >= h->epoch_free_bytes))
		close_pending(tc);
	return true;
}

void emm_tcache_pressure_locked(struct arena *h, size_t rounded)
{
	struct tcache *tc = emm_tc_tls;

	if (!tc_owned(tc, h->owner) || tc->arena != h)
		return;
	if (!tc_pressure_bytes(tc, rounded) &&
	    (tc->pend_max < rounded || tc->npend < (arena_epoch_blocks(h) + 1) / 2))
		return;
	emm_tc_pending_to_open(tc);
}
