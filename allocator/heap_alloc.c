/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_alloc.c - the allocation miss path of an arena: completed
 * fences, epoch pressure, stealing another stream's block, the pending
 * limit, more memory from the source (a segment grown in place, else a new
 * one; before either, a fitting ready block of another arena), the OOM
 * retry, and mapping the pages under a block before it is handed out
 * (page-granular heaps). The hit path stays in heap.c. Lock held throughout, dropped
 * around fence ops and source calls (heap_internal.h).
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>

/* More memory for a miss: the large pool first grows its newest segment of
 * the stream in place (page-granular heaps with grow), else a new segment.
 * A ready-any block that can serve `rounded` in *ret. Lock held. */
static int grow_segment(struct arena *h, unsigned pool, size_t seg_size, size_t rounded, emm_stream_t stream,
                        struct emm_block **ret)
{
	int r = -ENOSPC;
	bool grows = pool == POOL_LARGE && h->has_grow;

	if (h->has_remap && h->p.hold_peak)
		emm_pages_hold_peak(h, grows ? emm_pages_grow_need(h, rounded, stream, seg_size) : seg_size);
	if (grows) {
		while ((r = emm_pages_grow(h, rounded, stream, ret)) == -EAGAIN) {
			/* Another thread grew it meanwhile: its tail may serve us. */
			if ((*ret = find_block(h, pool, rounded, stream)))
				return 0;
		}
		if (r == 0 && (*ret)->size < rounded)
			r = -ENOSPC; /* cannot happen: the tail grew to fit */
	}
	if (r == -ENOSPC)
		r = emm_pool_grow(h, pool, seg_size, stream, ret);
	return r;
}

/* Should a miss close the open epoch (see emm_heap_alloc_slow)? When it
 * holds a block that could serve `rounded` and has seen half its quota of
 * frees, or when it holds p.epoch_max_bytes (and at least `rounded`) with
 * blocks of the miss's pool among them: the close by bytes, which a
 * synchronous free no longer does below the hard bound (emm_heap_free).
 * Lock held. */
static inline bool epoch_pressure(struct arena *h, unsigned pool, size_t rounded)
{
	const struct emm_fence *ep = h->open;

	if (ep->bytes >= h->p.epoch_max_bytes && ep->bytes >= rounded && ep->max_size[pool])
		return true;
	return ep->max_size[pool] >= rounded && ep->nblocks >= (arena_epoch_blocks(h) + 1) / 2;
}

/* And last, before reserving a segment: a miss for half p.epoch_max_bytes
 * or more closes an open epoch holding any block of its pool, which merged
 * with its ready neighbours may serve it. Parking such blocks would share
 * one close among two misses at most: not worth a new segment. PyTorch's
 * 40-step training trace: 18 070 MiB at the peak against 18 278 (PyTorch's
 * own allocator: 18 128), 6 % more closes (RESULTS.md section 37). Below
 * it a LIFO loop still parks blocks to share closes (heap-lazy). */
static inline bool epoch_worth_closing(struct arena *h, unsigned pool, size_t rounded)
{
	return rounded >= h->p.epoch_max_bytes / 2 && h->open->max_size[pool];
}

/* Close the open epoch and look again, at once and after a poll: with every
 * non-blocking stream idle its one legacy event may have completed already
 * (and with none alive the blocks are ready without a poll). The block, or
 * NULL (also when the close failed). Lock held. */
static struct emm_block *close_and_find(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream)
{
	struct emm_block *b;

	if (emm_heap_close_epoch(h) != 0)
		return NULL;
	if ((b = find_block(h, pool, rounded, stream)))
		return b;
	if (h->fq_head && emm_heap_poll_fences(h))
		return find_block(h, pool, rounded, stream);
	return NULL;
}

/*
 * Before reserving more: a ready block of another arena that serves the
 * request. PyTorch's caching allocator keeps one pool per device, and a
 * program whose threads allocate by turns (PyTorch's autograd thread runs
 * the backward pass, its main thread the forward) would otherwise reserve
 * each thread's peak on its own: 7924 MiB against 6744 MiB for one pool on
 * tests/data/pytorch-train.csv. The block stays its arena's (its free goes
 * back there); only a miss that would reach the source pays for the look.
 * An arena another thread holds is passed over (trylock): threads that
 * allocate at the same time keep to their own arenas (project issue 11's
 * scaling), and a miss never waits for a lock it did not need before.
 * Only arenas that have had a segment are looked into (heap->holding): on a
 * host with 64 CPUs and 16 threads, trylocking the other 48 empty ones on
 * every such miss was pure cost. One arena locked at a time: ours is
 * dropped meanwhile. Lock held on entry and on return; the block, taken,
 * in *ret.
 */
static bool take_other_arena(struct arena *h, unsigned pool, size_t rounded, size_t size, emm_stream_t stream,
                             struct emm_block **ret)
{
	struct emm_heap *heap = h->owner;
	struct emm_block *b = NULL;
	uint64_t others = atomic_load_explicit(&heap->holding, memory_order_relaxed) & ~h->bit;
	unsigned self = 0;

	if (!others)
		return false;
	while (heap->arenas[self] != h)
		self++;
	arena_unlock_release(h);
	for (unsigned k = 1; k < heap->narenas && !b; k++) {
		unsigned i = (self + k) & (heap->narenas - 1);
		struct arena *a = heap->arenas[i];
		if (!(others & ((uint64_t)1 << i)))
			continue;
		if (!arena_trylock(a))
			continue;
		/* Its completed fences and its open epoch under pressure too,
		 * as for our own: an arena does both only on its own misses,
		 * and the thread that freed may not allocate for a while (the
		 * forward pass's frees, wanted by the backward's allocations). */
		if (a->fq_head)
			emm_heap_poll_fences(a);
		b = find_block(a, pool, rounded, stream);
		if (!b && (epoch_pressure(a, pool, rounded) || epoch_worth_closing(a, pool, rounded)) &&
		    emm_heap_close_epoch(a) == 0) {
			if (a->fq_head)
				emm_heap_poll_fences(a);
			b = find_block(a, pool, rounded, stream);
		}
		if (b && !b->seg->unmapped) { /* pages to map: that arena's own business */
			a->st.hits++;
			b = emm_pool_take_block(a, b, rounded, size, stream);
		} else {
			b = NULL;
		}
		arena_unlock_release(a);
	}
	arena_lock(h);
	*ret = b;
	return b != NULL;
}

/* The miss path: completed fences, epoch pressure, stealing, the source,
 * and the OOM retry; hands the block out. Lock held, dropped around fence
 * ops and the source (every lookup after one is fresh). */
int emm_heap_alloc_slow(struct arena *h, unsigned pool, size_t rounded, size_t size, emm_stream_t stream,
                      struct emm_block **ret)
{
	struct emm_block *b;
	int r;

	if (h->fq_head && emm_heap_poll_fences(h) && (b = find_block(h, pool, rounded, stream)))
		goto hit;

	/* Pressure: the open epoch holds a block that could serve this and has
	 * seen half its quota of frees. Half, not less: a loop of alloc/kernel/
	 * free then records one event per epoch_max_blocks/2 pairs (0.0625 at
	 * the default 32, measured on the H200), while the memory parked in an
	 * open epoch stays bounded by half the quota. Or it holds
	 * epoch_max_bytes: the close by bytes happens here, when memory is
	 * needed, not at the free that passed them (a 64 MiB block freed and
	 * allocated again closes one epoch per pair either way, but frees
	 * that no allocation asks for again close none). The close is polled
	 * at once (close_and_find). */
	emm_tcache_pressure_locked(h, rounded);
	if (epoch_pressure(h, pool, rounded) && (b = close_and_find(h, pool, rounded, stream)))
		goto hit;

	if ((b = emm_heap_try_steal(h, pool, rounded, stream))) {
		h->st.hits++;
		emm_pool_take_reserved(h, b, rounded, size, stream);
		*ret = b;
		return 0;
	}

	if (take_other_arena(h, pool, rounded, size, stream, &b)) {
		*ret = b;
		return 0;
	}

	if (emm_heap_pending_wait(h, pool, rounded, stream, &b))
		goto hit;

	if (epoch_worth_closing(h, pool, rounded) && (b = close_and_find(h, pool, rounded, stream)))
		goto hit;

	size_t seg_size = emm_heap_segment_size(&h->p, rounded);
	if (!seg_size)
		return -EOVERFLOW;
	r = grow_segment(h, pool, seg_size, rounded, stream, &b);
	if (r == -ENOMEM && h->p.oom_retry) {
		emm_tcache_flush_locked(h);
		emm_tcache_flush_all(); /* the other threads' at their next use */
		emm_heap_oom_recover(h);
		emm_heap_oom_recover_others(h);
		h->st.oom_retries++;
		if ((b = find_block(h, pool, rounded, stream)))
			goto hit;
		r = grow_segment(h, pool, seg_size, rounded, stream, &b);
	}
	if (r) {
		if (r == -ENOMEM)
			h->st.ooms++;
		return r;
	}
	h->st.misses++;
	b = emm_pool_take_block(h, b, rounded, size, stream);
	*ret = b;
	return 0;
hit:
	h->st.hits++;
	b = emm_pool_take_block(h, b, rounded, size, stream);
	*ret = b;
	return 0;
}

/* Take a block for the request: the hit path, else the miss path. Lock
 * held (dropped inside the miss path). */
static inline int take_any(struct arena *h, unsigned pool, size_t rounded, size_t size, emm_stream_t stream,
                           struct emm_block **ret)
{
	struct emm_block *b = find_block(h, pool, rounded, stream);

	if (EMM_LIKELY(b)) {
		h->st.hits++;
		b = emm_pool_take_block(h, b, rounded, size, stream);
		*ret = b;
		return 0;
	}
	return emm_heap_alloc_slow(h, pool, rounded, size, stream, ret);
}

/* A block that was never handed out is free again at once. Lock held. */
static void untake(struct arena *h, struct emm_block *b)
{
	untake_accounting(h, b);
	h->st.allocs--;
	h->st.frees--;
	emm_pool_block_ready(h, b, 0);
}

/* The block taken lies over unmapped granules (page-granular heaps): map
 * them, and on out-of-memory give back other free pages and idle segments
 * and try the whole allocation once more. Lock held. */
int emm_heap_alloc_map(struct arena *h, unsigned pool, size_t rounded, size_t size, emm_stream_t stream,
                     struct emm_block **ret)
{
	int r;

	emm_pages_hold_peak(h, emm_pages_unmapped_under(h, *ret));
	r = emm_pages_map_block(h, *ret);
	if (r == 0)
		return 0;
	untake(h, *ret);
	if (r == -ENOMEM && h->p.oom_retry) {
		emm_tcache_flush_locked(h);
		emm_tcache_flush_all(); /* the other threads' at their next use */
		emm_heap_oom_recover(h);
		emm_heap_oom_recover_others(h);
		h->st.oom_retries++;
		r = take_any(h, pool, rounded, size, stream, ret);
		if (r == 0 && (*ret)->seg->arena == h && (*ret)->seg->unmapped) {
			r = emm_pages_map_block(h, *ret);
			if (r)
				untake(h, *ret);
		}
	}
	if (r == -ENOMEM)
		h->st.ooms++;
	return r;
}

