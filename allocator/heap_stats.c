/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_stats.c - the heap's statistics: per-arena byte deltas
 * flushed into the heap-wide counters and peaks, the emm_stats sum over
 * arenas (with the heap-wide peaks' error bounds), and the idle-memory summary (idle bytes, largest free block).
 */
#include "allocator/heap_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Push this arena's byte deltas into the heap-wide counters. */
void emm_heap_stat_flush(struct arena *h)
{
	if (h->d_allocated)
		heap_stat_add(&h->owner->allocated, &h->owner->allocated_peak, h->d_allocated);
	if (h->d_requested)
		heap_stat_add(&h->owner->requested, &h->owner->requested_peak, h->d_requested);
	h->d_allocated = h->d_requested = 0;
}

/* Per-arena figures for a heap-wide peak under several arenas. */
struct peak_parts {
	uint64_t sum;    /* the arenas' own (exact) peaks added: the peak is at most this */
	uint64_t max;    /* the largest of them: the peak is at least this */
	uint64_t now;    /* the current value (exact after the flush): at least this */
	unsigned used;   /* arenas that ever allocated */
};

static void parts_add(struct peak_parts *p, uint64_t peak, uint64_t now, bool used)
{
	p->sum += peak;
	if (peak > p->max)
		p->max = peak;
	p->now += now;
	p->used += used;
}

/*
 * The heap-wide peak under several arenas, and the bound of its error
 * (struct emm_stats' *_peak_error). `flushed` is the peak of the flushed
 * deltas: each used arena holds back less than STAT_FLUSH_UP of growth and
 * less than STAT_FLUSH_DOWN of shrinkage, so the true peak is below
 * flushed + used * STAT_FLUSH_UP and at least flushed - used *
 * STAT_FLUSH_DOWN. The per-arena peaks bound it too (sum above, max below).
 * The upper bound is reported and hi - lo is its error: 0 whenever one
 * arena was used (vectorAdd's three blocks), and when the arenas peaked
 * together the sum is the truth. With thread caches, whose deltas reach
 * the arenas late, only the per-arena peaks are used.
 */
static void peak_bounds(const struct peak_parts *p, int64_t flushed, bool tcache, uint64_t *peak, uint64_t *err)
{
	uint64_t hi = p->sum, lo = p->max > p->now ? p->max : p->now;

	if (!tcache && flushed >= 0) {
		uint64_t f = (uint64_t)flushed;
		uint64_t up = f + (uint64_t)p->used * (uint64_t)(STAT_FLUSH_UP - 1);
		uint64_t down = (uint64_t)p->used * (uint64_t)STAT_FLUSH_DOWN;

		if (up < hi)
			hi = up;
		if (f > down && f - down > lo)
			lo = f - down;
	}
	if (hi < lo)
		hi = lo;
	*peak += hi;
	*err += hi - lo;
}

void emm_heap_add_stats(emm_heap_t *heap, struct emm_stats *out)
{
	struct peak_parts pa = {0}, pr = {0};

	if (!heap || !out)
		return;
	/* Every thread's cache counts (heap_tcache.c): merged on read. */
	emm_tcache_stats_begin();
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		struct heap_counters merged = h->st;
		const struct heap_counters *c = &merged;
		out->pending_bytes += emm_tcache_add_counters(h, &merged);
		out->allocs += c->allocs;
		out->frees += c->frees;
		out->hits += c->hits;
		out->misses += c->misses;
		out->backend_allocs += c->backend_allocs;
		out->backend_frees += c->backend_frees;
		out->oom_retries += c->oom_retries;
		out->ooms += c->ooms;
		out->splits += c->splits;
		out->merges += c->merges;
		out->events_recorded += c->events_recorded;
		out->event_queries += c->event_queries;
		out->stream_waits += c->stream_waits;
		out->host_waits += c->host_waits;
		out->epochs_closed += c->epochs_closed;
		out->allocated_bytes += c->allocated;
		out->allocated_bytes_total += c->allocated_total;
		out->requested_bytes += c->requested;
		out->requested_bytes_total += c->requested_total;
		out->reserved_bytes += c->reserved;
		out->reserved_bytes_total += c->reserved_total;
		if (heap->narenas == 1) {
			out->allocated_bytes_peak += c->allocated_peak;
			out->requested_bytes_peak += c->requested_peak;
		} else {
			emm_heap_stat_flush(h);
			parts_add(&pa, c->allocated_peak, c->allocated, c->allocs != 0);
			parts_add(&pr, c->requested_peak, c->requested, c->allocs != 0);
		}
		out->pending_bytes += c->pending;
		out->segments += c->segments;
		out->live_blocks += c->live_blocks;
		out->page_unmaps += c->page_unmaps;
		out->page_maps += c->page_maps;
		out->unmapped_bytes_total += c->unmapped_total;
		out->remapped_bytes_total += c->remapped_total;
		out->segment_grows += c->grows;
		out->grown_bytes_total += c->grown_total;
		for (struct emm_segment *s = h->segs; s; s = s->next)
			out->unmapped_bytes += s->unmapped * h->pg.granularity;
		arena_unlock(h);
	}
	emm_tcache_stats_end();
	out->reserved_bytes_peak +=
	    (uint64_t)atomic_load_explicit(&heap->reserved_peak, memory_order_relaxed);
	if (heap->narenas > 1) {
		peak_bounds(&pa, atomic_load_explicit(&heap->allocated_peak, memory_order_relaxed), heap->tcache,
		            &out->allocated_bytes_peak, &out->allocated_bytes_peak_error);
		peak_bounds(&pr, atomic_load_explicit(&heap->requested_peak, memory_order_relaxed), heap->tcache,
		            &out->requested_bytes_peak, &out->requested_bytes_peak_error);
	}
}

void emm_heap_idle_info(emm_heap_t *heap, size_t *ret_idle, size_t *ret_largest)
{
	size_t largest = 0, idle = 0;

	if (!heap)
		return;
	emm_tcache_stats_begin();
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		struct heap_counters merged = h->st;
		(void)emm_tcache_add_counters(h, &merged);
		idle += merged.reserved - merged.allocated;
		/* Ready-any: the sfit's largest; ready-stream: the largest block of
		 * each key group is the one before the next group's first. */
		for (unsigned pool = 0; pool < NPOOLS; pool++) {
			const struct emm_tree *t = &h->trees[pool];
			size_t any = emm_sfit_largest(&h->ready[pool]);
			if (any > largest)
				largest = any;
			struct emm_tree_node *n = emm_tree_first(t);
			while (n) {
				emm_stream_t key = n->key[0];
				struct emm_tree_node *nx =
				    key == UINT64_MAX ? NULL : emm_tree_lower_bound(t, key + 1, 0, 0);
				struct emm_tree_node *last = nx ? emm_tree_prev(nx) : emm_tree_last(t);
				if (last->key[1] > largest)
					largest = last->key[1];
				n = nx;
			}
		}
		arena_unlock(h);
	}
	emm_tcache_stats_end();
	if (ret_idle)
		*ret_idle = idle;
	if (ret_largest)
		*ret_largest = largest;
}
