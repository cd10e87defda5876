/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_pool.c - the blocks and segments of one arena: metadata
 * recycling (block slabs, segment structs), the ready-block indexes (the
 * ready-any sfit, the ready-stream tree) and the idle list, coalescing free
 * blocks (emm_pool_block_ready) and splitting the one handed out
 * (emm_pool_take_block), the stream keys present in the trees,
 * growing from and releasing to the segment source, and which arenas hold
 * memory (eight of them widen every arena's epochs). Callers hold the
 * arena lock unless a function says otherwise.
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "allocator/ptrmap.h"
#include "common/log.h"

#define BLOCK_SLAB 128u /* blocks per metadata slab */

/* --- metadata recycling --------------------------------------------------- */

static struct emm_block *block_new(struct arena *h)
{
	struct emm_block *b = h->block_free;

	if (EMM_UNLIKELY(!b)) {
		/* One slab: a pointer-sized header chaining the slabs, then blocks. */
		size_t hdr = EMM_ALIGN_UP(sizeof(void *), _Alignof(struct emm_block));
		char *slab = heap_zalloc_lines(hdr + BLOCK_SLAB * sizeof(struct emm_block));
		if (!slab)
			return NULL;
		*(void **)slab = h->slabs;
		h->slabs = slab;
		struct emm_block *arr = (struct emm_block *)(slab + hdr);
		for (unsigned i = 0; i < BLOCK_SLAB; i++) {
			arr[i].state = BLOCK_UNUSED;
			arr[i].link = i + 1 < BLOCK_SLAB ? &arr[i + 1] : NULL;
		}
		b = arr;
	}
	h->block_free = b->link;
	b->prev = b->next = NULL;
	b->link = NULL;
	b->fence = NULL;
	b->requested = 0;
	b->stream = 0;
	atomic_store_explicit(&b->tcached, 0, memory_order_relaxed);
	block_unindex(b);
	return b;
}

static inline void block_recycle(struct arena *h, struct emm_block *b)
{
	b->state = BLOCK_UNUSED;
	b->seg = NULL;
	b->link = h->block_free;
	h->block_free = b;
}

struct emm_block *emm_pool_block_new(struct arena *h)
{
	return block_new(h);
}

void emm_pool_block_recycle(struct arena *h, struct emm_block *b)
{
	block_recycle(h, b);
}

static struct emm_segment *segment_new(struct arena *h)
{
	struct emm_segment *s = h->seg_free;

	if (s) {
		h->seg_free = s->next;
	} else {
		s = heap_zalloc_lines(sizeof(*s));
		if (!s)
			return NULL;
		s->arena = h;
		s->all_next = h->seg_all;
		h->seg_all = s;
	}
	s->prev = s->next = NULL;
	s->idle_prev = s->idle_next = NULL;
	s->first = s->last = NULL;
	s->live = false;
	s->idle = false;
	s->unmapped = 0;
	s->paging = 0;
	s->growing = false;
	return s;
}

/* --- trees, idle list, ready blocks --------------------------------------- */

static void idle_add(struct arena *h, struct emm_segment *s)
{
	s->idle = true;
	s->idle_next = NULL;
	s->idle_prev = h->idle_tail;
	if (h->idle_tail)
		h->idle_tail->idle_next = s;
	else
		h->idle_head = s;
	h->idle_tail = s;
}

static void idle_del(struct arena *h, struct emm_segment *s)
{
	if (s->idle_prev)
		s->idle_prev->idle_next = s->idle_next;
	else
		h->idle_head = s->idle_next;
	if (s->idle_next)
		s->idle_next->idle_prev = s->idle_prev;
	else
		h->idle_tail = s->idle_prev;
	s->idle = false;
	s->idle_prev = s->idle_next = NULL;
}

/* Index a ready block under its key b->stream: ready-any in the sfit,
 * ready-stream in the tree. */
static inline void index_put(struct arena *h, struct emm_block *b)
{
	if (b->stream == 0) {
		b->fnode.size = b->size;
		b->fnode.addr = b->addr;
		emm_sfit_insert(&h->ready[b->pool], &b->fnode);
		if (!b->prev && !b->next)
			idle_add(h, b->seg);
		return;
	}
	b->node.key[0] = b->stream;
	b->node.key[1] = b->size;
	b->node.key[2] = b->addr;
	emm_tree_insert(&h->trees[b->pool], &b->node);
}

static inline void index_take(struct arena *h, struct emm_block *b)
{
	if (b->seg->idle)
		idle_del(h, b->seg);
	if (b->stream == 0)
		emm_sfit_remove(&h->ready[b->pool], &b->fnode);
	else
		emm_tree_remove(&h->trees[b->pool], &b->node);
	block_unindex(b);
}

/* Make a free block ready under `key` (0: any), merging with neighbours that
 * are ready under the same key. Never merges live or pending blocks. */
struct emm_block *emm_pool_block_ready(struct arena *h, struct emm_block *b, emm_stream_t key)
{
	struct emm_block *n;

	b->state = BLOCK_READY;
	b->stream = key;
	b->fence = NULL;
	b->link = NULL;

	n = b->prev;
	if (n && n->state == BLOCK_READY && n->stream == key) {
		index_take(h, n);
		b->addr = n->addr;
		b->size += n->size;
		b->prev = n->prev;
		if (b->prev)
			b->prev->next = b;
		else
			b->seg->first = b;
		block_recycle(h, n);
		h->st.merges++;
	}
	n = b->next;
	if (n && n->state == BLOCK_READY && n->stream == key) {
		index_take(h, n);
		b->size += n->size;
		b->next = n->next;
		if (b->next)
			b->next->prev = b;
		else
			b->seg->last = b;
		block_recycle(h, n);
		h->st.merges++;
	}
	index_put(h, b);
	return b;
}

/* --- splitting: handing a block out --------------------------------------- */

static inline bool should_split(const struct arena *h, const struct emm_block *b, size_t rounded)
{
	size_t rem = b->size - rounded;

	if (b->pool == POOL_SMALL)
		return rem >= EMM_MIN_BLOCK;
	/* Large pool: remainders must be worth a large block (> small_max, 1 MiB
	 * by default), and oversize requests never split. */
	return rounded < h->p.max_split && rem > h->p.small_max;
}

static inline void take_common(struct arena *h, struct emm_block *b, size_t rounded, size_t size,
                               emm_stream_t stream, bool reserved)
{
	if (b->size > rounded && should_split(h, b, rounded)) {
		struct emm_block *r = block_new(h);
		if (r) { /* without metadata the whole block goes out: still correct */
			r->seg = b->seg;
			r->pool = b->pool;
			r->addr = b->addr + rounded;
			r->size = b->size - rounded;
			r->stream = b->stream;
			r->state = BLOCK_READY;
			r->prev = b;
			r->next = b->next;
			if (b->next)
				b->next->prev = r;
			else
				b->seg->last = r;
			b->next = r;
			b->size = rounded;
			h->st.splits++;
			if (EMM_UNLIKELY(reserved)) {
				/* r's other neighbour may have been freed under the
				 * same key while b was reserved: merge with it. */
				b->state = BLOCK_LIVE;
				emm_pool_block_ready(h, r, r->stream);
			} else {
				/* b was maximal, so r's other neighbour is not mergeable. */
				index_put(h, r);
			}
		}
	}
	b->state = BLOCK_LIVE;
	b->requested = size;
	b->stream = stream;
	h->st.allocs++;
	h->st.live_blocks++;
	stat_add(&h->st.allocated, &h->st.allocated_peak, &h->st.allocated_total, b->size);
	stat_add(&h->st.requested, &h->st.requested_peak, &h->st.requested_total, size);
	stat_delta(h, (int64_t)b->size, (int64_t)size);
}

/* Hand out a ready block: take it out of its tree, split off the remainder
 * (which stays ready under the same key), mark it live. */
void emm_pool_take_block(struct arena *h, struct emm_block *b, size_t rounded, size_t size,
                         emm_stream_t stream)
{
	index_take(h, b);
	take_common(h, b, rounded, size, stream, false);
}

void emm_pool_take_reserved(struct arena *h, struct emm_block *b, size_t rounded, size_t size,
                            emm_stream_t stream)
{
	take_common(h, b, rounded, size, stream, true);
}

void emm_pool_reserve(struct arena *h, struct emm_block *b)
{
	index_take(h, b);
	b->state = BLOCK_RESERVED;
}

/* --- stream keys ---------------------------------------------------------- */

/* The first block ready under key in a pool's index, or NULL. */
static struct emm_block *first_of_key(struct arena *h, unsigned pool, emm_stream_t key)
{
	if (key == 0) {
		struct emm_sfit_node *f = emm_sfit_last(&h->ready[pool]);
		return f ? fnode_block(f) : NULL;
	}
	struct emm_tree_node *n = emm_tree_lower_bound(&h->trees[pool], key, 0, 0);
	return n && n->key[0] == key ? node_block(n) : NULL;
}

/* Gather the blocks ready under `key` (both pools) into a list, taking them
 * out of their index and marking them pending so they do not merge. */
struct emm_block *emm_pool_collect_key(struct arena *h, emm_stream_t key)
{
	struct emm_block *list = NULL, *b;

	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		while ((b = first_of_key(h, pool, key))) {
			index_take(h, b);
			b->state = BLOCK_PENDING;
			b->link = list;
			list = b;
		}
	}
	return list;
}

bool emm_pool_has_key(struct arena *h, emm_stream_t key)
{
	for (unsigned pool = 0; pool < NPOOLS; pool++)
		if (first_of_key(h, pool, key))
			return true;
	return false;
}

/* The smallest stream key > after present in either tree, or 0 if none. */
emm_stream_t emm_pool_next_key(struct arena *h, emm_stream_t after)
{
	emm_stream_t best = 0;

	if (after == UINT64_MAX)
		return 0;
	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		struct emm_tree_node *n = emm_tree_lower_bound(&h->trees[pool], after + 1, 0, 0);
		if (n && (best == 0 || n->key[0] < best))
			best = n->key[0];
	}
	return best;
}

/* --- segments ------------------------------------------------------------- */

static void seg_link(struct arena *h, struct emm_segment *s)
{
	s->live = true;
	s->prev = NULL;
	s->next = h->segs;
	if (h->segs)
		h->segs->prev = s;
	h->segs = s;
}

static void seg_unlink(struct arena *h, struct emm_segment *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		h->segs = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->prev = s->next = NULL;
	s->live = false;
}

static void seg_recycle(struct arena *h, struct emm_segment *s)
{
	s->first = NULL;
	s->next = h->seg_free;
	h->seg_free = s;
}

/* A segment the source returned over one the segment map still knows: a
 * context reset seen by one thread while the old heap's segments are
 * still registered (they go when it is dropped), so every retry meets
 * it again. Said at the first and then at every power of two, never with
 * an arena lock held: eight threads that logged each one under the lock
 * held a unit-suite child past its 30 s limit (tests/bench/RESULTS.md
 * section 33). */
static atomic_uint overlaps;

static void report_overlap(emm_addr_t addr, size_t size)
{
	unsigned n;

	if (emm_log_sparingly(&overlaps, &n))
		emm_error("segment source returned 0x%llx (+%zu), overlapping a known segment (%u such so far)",
		          (unsigned long long)addr, size, n);
}

void emm_pool_note_holding(struct arena *h)
{
	struct emm_heap *heap = h->owner;

	if (atomic_load_explicit(&heap->holding, memory_order_relaxed) & h->bit)
		return; /* not the first segment: no write to the shared word */
	uint64_t was = atomic_fetch_or_explicit(&heap->holding, h->bit, memory_order_relaxed);

	/* Bits are never cleared: one thread sees the count reach the
	 * threshold, and widens every arena's epochs once. */
	if ((was & h->bit) || (unsigned)__builtin_popcountll(was | h->bit) != EPOCH_WIDE_ARENAS)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *a = heap->arenas[i];
		if (!a->has_remap)
			atomic_store_explicit(&a->epoch_blocks, a->p.epoch_max_blocks * 2, memory_order_relaxed);
	}
}

/*
 * Get a segment of seg_size from the source (lock dropped around the call)
 * and make its whole block ready-any. 0 and the block, or the source's
 * error (-ENOMEM: out of memory).
 */
int emm_pool_grow(struct arena *h, unsigned pool, size_t seg_size, emm_stream_t stream,
                  struct emm_block **ret)
{
	emm_addr_t addr = 0;
	int r;

	arena_unlock(h);
	r = h->src.alloc(h->src.state, seg_size, stream, &addr);
	arena_lock(h);
	if (r)
		return r < 0 ? r : -ENOMEM;

	struct emm_segment *s = segment_new(h);
	struct emm_block *b = s ? block_new(h) : NULL;
	if (b)
		r = emm_segmap_insert(addr, seg_size, s);
	if (!b || r) {
		bool overlap = r == -EEXIST;
		if (b)
			block_recycle(h, b);
		if (s)
			seg_recycle(h, s);
		arena_unlock(h);
		if (overlap)
			report_overlap(addr, seg_size);
		h->src.free(h->src.state, addr, seg_size, EMM_STREAM_SYNC);
		arena_lock(h);
		return -ENOMEM;
	}
	s->base = addr;
	s->size = seg_size;
	s->pool = (uint8_t)pool;
	s->stream = stream;
	s->first = s->last = b;
	emm_pages_seg_init(h, s);
	seg_link(h, s);
	b->seg = s;
	b->pool = (uint8_t)pool;
	b->addr = addr;
	b->size = seg_size;
	h->st.backend_allocs++;
	h->st.segments++;
	emm_pool_note_holding(h);
	stat_add(&h->st.reserved, &h->st.reserved_peak, &h->st.reserved_total, seg_size);
	heap_stat_add(&h->owner->reserved, &h->owner->reserved_peak, (int64_t)seg_size);
	*ret = emm_pool_block_ready(h, b, 0);
	return 0;
}

/* Take whole idle segments off the heap until at most `keep` idle bytes
 * (reserved - allocated) remain. Returns them chained through next, each
 * still holding its one block (out of the tree) and still in the segment
 * map; the caller gives them back with emm_pool_release_finish once the
 * lock is dropped. */
struct emm_segment *emm_pool_release_collect(struct arena *h, size_t keep)
{
	struct emm_segment *list = NULL, **tail = &list;

	while (h->idle_head && h->st.reserved - h->st.allocated > keep) {
		struct emm_segment *s = h->idle_head;

		index_take(h, s->first);
		seg_unlink(h, s);
		h->st.reserved -= seg_mapped_bytes(h, s);
		heap_stat_add(&h->owner->reserved, &h->owner->reserved_peak, -(int64_t)seg_mapped_bytes(h, s));
		h->st.segments--;
		/* Oldest first, as they were idle. */
		s->next = NULL;
		*tail = s;
		tail = &s->next;
	}
	return list;
}

/* A collected segment the source did not take back: the heap's again,
 * whole, idle and counted. Lock held. */
static void release_undo(struct arena *h, struct emm_segment *s)
{
	seg_link(h, s);
	h->st.reserved += seg_mapped_bytes(h, s);
	heap_stat_add(&h->owner->reserved, &h->owner->reserved_peak, (int64_t)seg_mapped_bytes(h, s));
	h->st.segments++;
	emm_pool_block_ready(h, s->first, 0);
}

/*
 * Give collected segments back, lock not held. Each leaves the segment map
 * just before its free. If the source fails one, that segment and every
 * later one go back to the heap intact (the failed one re-enters the map:
 * its removal just freed a slot, so only a racing insert could take it)
 * and the error is returned; else the bytes given back.
 */
long long emm_pool_release_finish(struct arena *h, struct emm_segment *list)
{
	long long bytes = 0;
	uint64_t freed = 0;
	struct emm_segment *s, *next, *failed = NULL;
	int r = 0;

	if (!list)
		return 0;
	if (h->has_remap) {
		/* A page-granular source unmaps at the free, unordered: the
		 * blocks' last work first (heap_pages.c, the fence rule). */
		struct emm_pages_wait w;
		arena_lock(h);
		r = emm_pages_wait_begin(h, &w);
		arena_unlock_release(h);
		if (r == 0)
			r = emm_pages_wait_run(h, &w);
		arena_lock(h);
		emm_pages_wait_end(h, &w, r);
		arena_unlock_release(h);
		if (r)
			failed = list;
	}
	for (s = failed ? NULL : list; s; s = s->next) {
		emm_segmap_remove(s->base);
		r = h->src.free(h->src.state, s->base, s->size, EMM_STREAM_SYNC);
		if (r) {
			emm_warn("segment source failed to free 0x%llx (+%zu): %d; keeping it",
			         (unsigned long long)s->base, s->size, r);
			if (emm_segmap_insert(s->base, s->size, s) != 0)
				emm_error("segment 0x%llx lost from the segment map", (unsigned long long)s->base);
			failed = s;
			break;
		}
		bytes += (long long)seg_mapped_bytes(h, s);
		freed++;
	}
	arena_lock(h);
	h->st.backend_frees += freed;
	for (s = list; s != failed; s = next) {
		next = s->next;
		block_recycle(h, s->first);
		seg_recycle(h, s);
	}
	for (s = failed; s; s = next) {
		next = s->next;
		release_undo(h, s);
	}
	arena_unlock(h);
	if (failed)
		return r < 0 ? r : -EIO;
	return bytes;
}
