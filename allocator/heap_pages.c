/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_pages.c - page-granular segments (heap.h: struct
 * emm_segment_pages): the per-segment granule bitmaps, mapping the granules
 * under a block before it is handed out, giving back the granules wholly
 * inside free ready-any blocks, and growing a large segment in place.
 *
 * Every function expects the arena lock held and drops it around the
 * source's calls: under the lock the blocks concerned are reserved (out of
 * their tree, so nothing merges with or takes them) or, for a map, the live
 * block's granules are marked busy; the call runs unlocked; the result is
 * published under the lock again. A thread that needs a granule another
 * thread is mapping waits in emm_arena_wait (the lock is dropped while it waits).
 * A segment's size changes only by a grow, which never runs while a map or
 * unmap of the same segment is in flight (s->paging) nor they while it
 * runs, so every call names the segment with its current size.
 *
 * The fence rule: only a READY block of key 0 (ready-any) has granules
 * unmapped, and only those lying wholly inside it, so no granule any part
 * of which is live, pending, ready for one stream, orphaned or reserved
 * loses its memory. Ready-any is not yet "complete": a fast-path epoch's
 * blocks are ready-any while its legacy event may still run (their reuse
 * is stream-ordered, an unmap is not), and so is every free in the stream
 * free mode. So every give-back first waits for the arena's last legacy
 * event (once per event: lf_done), or the device in stream mode
 * (emm_pages_wait_*), with the blocks reserved and the lock dropped.
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/ptrmap.h"
#include "common/log.h"

#define RELEASE_BATCH 16u /* blocks reserved per lock drop when giving back */
#define RUNS_MAX      32u /* granule runs per lock drop */

/* --- bitmaps ---------------------------------------------------------------- */

static inline bool bit_get(const uint64_t *m, size_t i)
{
	return (m[i / 64] >> (i % 64)) & 1u;
}

static void bits_set(uint64_t *m, size_t from, size_t to, bool v)
{
	for (size_t i = from; i < to; i++) {
		if (v)
			m[i / 64] |= UINT64_C(1) << (i % 64);
		else
			m[i / 64] &= ~(UINT64_C(1) << (i % 64));
	}
}

/* Room for n granules in both bitmaps; new words zeroed. 0 or -ENOMEM. */
static int bits_reserve(struct emm_segment *s, size_t n)
{
	size_t words = (n + 63) / 64;

	if (words <= s->gwords)
		return 0;
	size_t cap = s->gwords ? s->gwords : 1;
	while (cap < words)
		cap *= 2;
	uint64_t *m = realloc(s->gmap, cap * sizeof(*m));
	if (!m)
		return -ENOMEM;
	s->gmap = m;
	uint64_t *b = realloc(s->gbusy, cap * sizeof(*b));
	if (!b)
		return -ENOMEM; /* gmap is larger than gwords says: harmless */
	s->gbusy = b;
	memset(s->gmap + s->gwords, 0, (cap - s->gwords) * sizeof(*m));
	memset(s->gbusy + s->gwords, 0, (cap - s->gwords) * sizeof(*b));
	s->gwords = cap;
	return 0;
}

void emm_pages_seg_drop(struct emm_segment *s)
{
	free(s->gmap);
	free(s->gbusy);
	s->gmap = s->gbusy = NULL;
	s->gwords = 0;
}

void emm_pages_seg_init(struct arena *h, struct emm_segment *s)
{
	size_t g = h->pg.granularity;

	s->unmapped = 0;
	s->growing = false;
	if (!h->has_remap && !h->has_grow)
		return;
	if (s->base % g || s->size % g || bits_reserve(s, s->size / g)) {
		/* Not page-managed: never unmapped, never grown. */
		emm_pages_seg_drop(s);
		return;
	}
	/* A recycled struct keeps its buffers: clear them. */
	memset(s->gmap, 0, s->gwords * sizeof(*s->gmap));
	memset(s->gbusy, 0, s->gwords * sizeof(*s->gbusy));
	bits_set(s->gmap, 0, s->size / g, true);
}

/* Is the segment page-managed (emm_pages_seg_init gave it bitmaps)? */
static inline bool managed(const struct emm_segment *s)
{
	return s->gmap != NULL;
}

static void publish_stats(struct arena *h, int64_t mapped_delta)
{
	if (mapped_delta > 0)
		stat_add(&h->st.reserved, &h->st.reserved_peak, &h->st.reserved_total, (uint64_t)mapped_delta);
	else
		h->st.reserved -= (uint64_t)-mapped_delta;
	heap_stat_add(&h->owner->reserved, &h->owner->reserved_peak, mapped_delta);
}

/* --- waiting for the device before an unmap ------------------------------ */

int emm_pages_wait_begin(struct arena *h, struct emm_pages_wait *w)
{
	*w = (struct emm_pages_wait){PAGES_WAIT_NONE, 0};
	if (!h->has_fence)
		return 0; /* no fence ops: nothing is known to run */
	if (h->p.free_mode == EMM_FREE_MODE_STREAM) {
		if (!h->fops.device_synchronize || f_capturing(h, EMM_STREAM_SYNC))
			return -EBUSY;
		w->kind = PAGES_WAIT_DEVICE;
		return 0;
	}
	if (!h->has_last_fence || h->lf_done)
		return 0;
	if (!h->fops.synchronize || f_capturing(h, EMM_STREAM_SYNC))
		return -EBUSY;
	/* lf_users keeps the event from being replaced and released, and
	 * every epoch closing meanwhile off the fast path (can_set_last_fence):
	 * no block becomes ready-any unwaited while we wait. */
	w->kind = PAGES_WAIT_EVENT;
	w->ev = h->last_fence;
	h->lf_users++;
	return 0;
}

int emm_pages_wait_run(struct arena *h, const struct emm_pages_wait *w)
{
	if (w->kind == PAGES_WAIT_EVENT)
		return fop_synchronize(h, w->ev);
	if (w->kind == PAGES_WAIT_DEVICE)
		return fop_device_synchronize(h);
	return 0;
}

void emm_pages_wait_end(struct arena *h, const struct emm_pages_wait *w, int r)
{
	if (w->kind == PAGES_WAIT_NONE)
		return;
	h->st.host_waits++;
	if (w->kind == PAGES_WAIT_EVENT) {
		h->lf_users--;
		if (r == 0 && h->has_last_fence && h->last_fence == w->ev)
			h->lf_done = true;
	}
}

/* --- mapping under a block being handed out ------------------------------- */

struct run {
	struct emm_block *b; /* give-back: the reserved block the run lies in */
	size_t from, to;     /* granules [from, to) */
	int r;
};

int emm_pages_map_block(struct arena *h, struct emm_block *b)
{
	struct emm_segment *s = b->seg;
	size_t g = h->pg.granularity;
	struct run runs[RUNS_MAX];

	if (!h->has_remap || !s->unmapped || !managed(s))
		return 0;
	for (;;) {
		size_t first = (b->addr - s->base) / g;
		size_t end = (b->addr + b->size - s->base + g - 1) / g;
		unsigned n = 0;
		bool wait = false;

		for (size_t i = first; i < end && !s->growing; i++) {
			if (bit_get(s->gmap, i))
				continue;
			if (bit_get(s->gbusy, i)) {
				wait = true;
				break;
			}
		}
		wait |= s->growing;
		if (wait) {
			/* Another thread maps a granule this block shares. */
			h->map_waiters++;
			emm_arena_wait(h);
			h->map_waiters--;
			continue;
		}
		for (size_t i = first; i < end && n < RUNS_MAX;) {
			if (bit_get(s->gmap, i)) {
				i++;
				continue;
			}
			size_t j = i;
			while (j < end && !bit_get(s->gmap, j))
				j++;
			runs[n++] = (struct run){NULL, i, j, 0};
			bits_set(s->gbusy, i, j, true);
			i = j;
		}
		if (n == 0)
			return 0;

		emm_addr_t base = s->base;
		size_t size = s->size;
		s->paging++;
		arena_unlock_release(h);
		int err = 0;
		for (unsigned k = 0; k < n; k++) {
			if (err) {
				runs[k].r = err;
				continue;
			}
			runs[k].r = h->pg.map(h->pg.state, base, size, runs[k].from * g, (runs[k].to - runs[k].from) * g);
			if (runs[k].r)
				err = runs[k].r < 0 ? runs[k].r : -ENOMEM;
		}
		arena_lock(h);
		s->paging--;

		for (unsigned k = 0; k < n; k++) {
			bits_set(s->gbusy, runs[k].from, runs[k].to, false);
			if (runs[k].r)
				continue;
			size_t cnt = runs[k].to - runs[k].from;
			bits_set(s->gmap, runs[k].from, runs[k].to, true);
			s->unmapped -= cnt;
			h->st.page_maps++;
			h->st.remapped_total += cnt * g;
			publish_stats(h, (int64_t)(cnt * g));
		}
		if (h->map_waiters)
			emm_arena_wake(h);
		if (err)
			return err;
		/* More runs than one batch: go round again. */
	}
}

/* --- giving back the granules under free blocks --------------------------- */

/* The granules wholly inside block b: [*from, *to), possibly empty. */
static void inner_granules(const struct arena *h, const struct emm_block *b, size_t *from, size_t *to)
{
	size_t g = h->pg.granularity;
	emm_addr_t lo = EMM_ALIGN_UP(b->addr, g), hi = (b->addr + b->size) & ~(emm_addr_t)(g - 1);

	*from = (lo - b->seg->base) / g;
	*to = hi > lo ? (hi - b->seg->base) / g : *from;
}

static bool has_mapped_inner(const struct arena *h, const struct emm_block *b)
{
	size_t from, to;

	if (!managed(b->seg) || b->seg->growing)
		return false;
	inner_granules(h, b, &from, &to);
	for (size_t i = from; i < to; i++)
		if (bit_get(b->seg->gmap, i) && !bit_get(b->seg->gbusy, i))
			return true;
	return false;
}

/* Unmaps that failed (a broken context fails every one): said sparingly,
 * since a heap with a release threshold tries again at every free. */
static atomic_uint unmap_failures;

size_t emm_pages_release(struct arena *h, size_t keep)
{
	size_t g = h->pg.granularity, total = 0;

	if (!h->has_remap)
		return 0;
	while (h->st.reserved - h->st.allocated > keep) {
		struct emm_block *cand[RELEASE_BATCH];
		struct run runs[RUNS_MAX];
		unsigned nc = 0, nr = 0;
		size_t want = h->st.reserved - h->st.allocated - keep, planned = 0;

		/* Largest ready-any blocks first (by bin), large pool first. */
		for (int pool = NPOOLS - 1; pool >= 0 && nc < RELEASE_BATCH; pool--) {
			struct emm_sfit *t = &h->ready[pool];
			for (struct emm_sfit_node *n = emm_sfit_last(t); n && nc < RELEASE_BATCH; n = emm_sfit_prev(t, n))
				if (has_mapped_inner(h, fnode_block(n)))
					cand[nc++] = fnode_block(n);
		}
		if (nc == 0)
			break;

		/* Reserve them and plan the runs, no more than needed. */
		unsigned used = 0;
		for (unsigned c = 0; c < nc && nr < RUNS_MAX && planned < want; c++) {
			struct emm_block *b = cand[c];
			struct emm_segment *s = b->seg;
			size_t from, to;

			emm_pool_reserve(h, b);
			cand[used++] = b;
			inner_granules(h, b, &from, &to);
			for (size_t i = from; i < to && nr < RUNS_MAX && planned < want;) {
				if (!bit_get(s->gmap, i) || bit_get(s->gbusy, i)) {
					i++;
					continue;
				}
				size_t j = i;
				while (j < to && bit_get(s->gmap, j) && !bit_get(s->gbusy, j) && planned < want) {
					j++;
					planned += g;
				}
				runs[nr++] = (struct run){b, i, j, 0};
				i = j;
			}
		}
		nc = used;

		struct emm_pages_wait w = {PAGES_WAIT_NONE, 0};
		if (nr && emm_pages_wait_begin(h, &w) != 0) {
			/* Cannot wait for the device now (capture): keep them. */
			for (unsigned c = 0; c < nc; c++)
				emm_pool_block_ready(h, cand[c], 0);
			break;
		}

		emm_addr_t base[RUNS_MAX];
		size_t size[RUNS_MAX];
		for (unsigned k = 0; k < nr; k++) {
			base[k] = runs[k].b->seg->base;
			size[k] = runs[k].b->seg->size;
			runs[k].b->seg->paging++;
		}
		arena_unlock_release(h);
		int wr = emm_pages_wait_run(h, &w);
		for (unsigned k = 0; k < nr; k++)
			runs[k].r = wr ? wr : h->pg.unmap(h->pg.state, base[k], size[k], runs[k].from * g,
			                                  (runs[k].to - runs[k].from) * g);
		arena_lock(h);
		emm_pages_wait_end(h, &w, wr);
		for (unsigned k = 0; k < nr; k++)
			runs[k].b->seg->paging--;
		if (nr && h->map_waiters)
			emm_arena_wake(h);

		size_t freed = 0;
		int failed = 0;
		for (unsigned k = 0; k < nr; k++) {
			struct emm_segment *s = runs[k].b->seg;
			size_t cnt = runs[k].to - runs[k].from;
			if (runs[k].r) {
				failed = runs[k].r;
				continue;
			}
			bits_set(s->gmap, runs[k].from, runs[k].to, false);
			s->unmapped += cnt;
			h->st.page_unmaps++;
			h->st.unmapped_total += cnt * g;
			publish_stats(h, -(int64_t)(cnt * g));
			freed += cnt * g;
		}
		for (unsigned c = 0; c < nc; c++)
			emm_pool_block_ready(h, cand[c], 0);
		unsigned n;
		if ((wr || failed) && emm_log_sparingly(&unmap_failures, &n)) {
			if (wr)
				emm_warn("waiting for the device before an unmap failed: %d; keeping the pages "
				         "(%u such so far)", wr, n);
			else
				emm_warn("segment source failed to unmap pages: %d; keeping them (%u such so far)", failed, n);
		}
		total += freed;
		if (freed == 0)
			break;
	}
	return total;
}

/* --- holding the mapped bytes at their high-water mark --------------------- */

/* The segment a large request on `stream` grows: the arena's newest
 * page-managed large segment of the stream, or NULL. */
static struct emm_segment *grow_target(const struct arena *h, emm_stream_t stream)
{
	struct emm_segment *s;

	for (s = h->segs; s; s = s->next)
		if (s->pool == POOL_LARGE && s->stream == stream && managed(s))
			break;
	return s;
}

size_t emm_pages_grow_need(const struct arena *h, size_t rounded, emm_stream_t stream, size_t seg_size)
{
	const struct emm_segment *s = h->has_grow ? grow_target(h, stream) : NULL;
	const struct emm_block *t;

	if (!s)
		return seg_size;
	t = s->last;
	if (t->state == BLOCK_READY && t->stream == 0)
		return rounded > t->size ? rounded - t->size : 0;
	return rounded;
}

size_t emm_pages_unmapped_under(const struct arena *h, const struct emm_block *b)
{
	const struct emm_segment *s = b->seg;
	size_t g = h->pg.granularity, n = 0;

	if (!s->unmapped || !managed(s))
		return 0;
	for (size_t i = (b->addr - s->base) / g, end = (b->addr + b->size - s->base + g - 1) / g; i < end; i++)
		n += !bit_get(s->gmap, i);
	return n * g;
}

/* Up to `want` idle bytes of arena a given back; lock held. */
static size_t release_some(struct arena *a, size_t want)
{
	size_t idle = a->st.reserved - a->st.allocated;

	if (!a->has_remap || !idle)
		return 0;
	return emm_pages_release(a, idle > want ? idle - want : 0);
}

void emm_pages_hold_peak(struct arena *h, size_t need)
{
	struct emm_heap *heap = h->owner;
	int64_t now, peak, excess;
	size_t got;

	if (!h->has_remap || !h->p.hold_peak)
		return;
	now = atomic_load_explicit(&heap->reserved, memory_order_relaxed);
	peak = atomic_load_explicit(&heap->reserved_peak, memory_order_relaxed);
	if (need > (size_t)INT64_MAX - (size_t)(now > 0 ? now : 0))
		return;
	excess = now + (int64_t)need - peak;
	if (excess <= 0)
		return;
	/* Our own idle pages first, then the other arenas' (one lock at a
	 * time: ours is dropped meanwhile, as in the OOM retry). */
	got = release_some(h, (size_t)excess);
	if (got >= (size_t)excess || heap->narenas == 1)
		return;
	excess -= (int64_t)got;
	arena_unlock_release(h);
	for (unsigned i = 0; i < heap->narenas && excess > 0; i++) {
		struct arena *a = heap->arenas[i];

		if (a == h)
			continue;
		arena_lock(a);
		got = release_some(a, (size_t)excess);
		arena_unlock_release(a);
		excess -= (int64_t)(got < (size_t)excess ? got : (size_t)excess);
	}
	arena_lock(h);
}

/* --- growing a segment in place ------------------------------------------- */

int emm_pages_grow(struct arena *h, size_t rounded, emm_stream_t stream, struct emm_block **ret)
{
	size_t g = h->pg.granularity;
	struct emm_segment *s;
	struct emm_block *t, *nb = NULL;
	size_t have = 0;

	if (!h->has_grow || !(s = grow_target(h, stream)))
		return -ENOSPC;
	if (s->growing || s->paging) {
		/* Another grow, or maps/unmaps naming its current size, run:
		 * wait for them, then look again. */
		h->map_waiters++;
		while (s->growing || s->paging)
			emm_arena_wait(h);
		h->map_waiters--;
		return -EAGAIN;
	}
	t = s->last;
	if (t->state == BLOCK_READY && t->stream == 0)
		have = t->size;
	if (have >= rounded)
		return -ENOSPC; /* the tail fits but the split rules refused it */

	/* Grow by whole granules; a remainder the large pool would not split
	 * off (<= small_max) gets one granule more, so the next request of the
	 * same size finds the rest instead of a block too big by a little. */
	size_t need = rounded - have;
	if (need > SIZE_MAX - g)
		return -ENOSPC;
	size_t growth = EMM_ALIGN_UP(need, g);
	size_t rem = have + growth - rounded;
	while (rem != 0 && rem <= h->p.small_max) {
		growth += g;
		rem += g;
	}
	size_t old = s->size;
	if (growth > SIZE_MAX - old || bits_reserve(s, (old + growth) / g))
		return -ENOSPC;
	if (!have && !(nb = emm_pool_block_new(h)))
		return -ENOMEM;
	if (have)
		emm_pool_reserve(h, t);
	s->growing = true;
	arena_unlock_release(h);
	int r = h->pg.grow(h->pg.state, s->base, old, old + growth);
	arena_lock(h);
	s->growing = false;
	if (h->map_waiters)
		emm_arena_wake(h);
	if (r) {
		if (have)
			emm_pool_block_ready(h, t, 0);
		if (nb)
			emm_pool_block_recycle(h, nb);
		return r < 0 ? r : -ENOMEM;
	}

	bits_set(s->gmap, old / g, (old + growth) / g, true);
	bits_set(s->gbusy, old / g, (old + growth) / g, false);
	if (emm_segmap_resize(s->base, old + growth) != 0)
		emm_error("segment 0x%llx grown to %zu bytes: the segment map did not follow",
		          (unsigned long long)s->base, old + growth);
	s->size = old + growth;
	h->st.grows++;
	h->st.grown_total += growth;
	publish_stats(h, (int64_t)growth);
	if (have) {
		t->size += growth;
		*ret = emm_pool_block_ready(h, t, 0);
		return 0;
	}
	/* The tail may have changed while the lock was dropped (freed and
	 * merged), but it still ends at the old end. */
	t = s->last;
	nb->seg = s;
	nb->pool = POOL_LARGE;
	nb->addr = s->base + old;
	nb->size = growth;
	nb->prev = t;
	nb->next = NULL;
	t->next = nb;
	s->last = nb;
	*ret = emm_pool_block_ready(h, nb, 0);
	return 0;
}
