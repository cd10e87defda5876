/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_segs.c - the segments of one arena: their structs (made
 * once, recycled, freed with the heap), the live list, growing from and
 * releasing to the segment source, and which arenas hold memory (eight of
 * them widen every arena's epochs). Callers hold the arena lock unless a
 * function says otherwise.
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <stdatomic.h>

#include "allocator/ptrmap.h"
#include "common/log.h"

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
	struct emm_block *b = s ? emm_pool_block_new(h) : NULL;
	if (b)
		r = emm_segmap_insert(addr, seg_size, s);
	if (!b || r) {
		bool overlap = r == -EEXIST;
		if (b)
			emm_pool_block_recycle(h, b);
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

		emm_pool_unready(h, s->first);
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
		emm_pool_block_recycle(h, s->first);
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
