/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_pool.c - the blocks of one arena: metadata recycling
 * (block slabs), the ready-block indexes (the ready-any sfit, the
 * ready-stream tree) and the idle list, coalescing free blocks
 * (emm_pool_block_ready, and a whole epoch's at once: emm_pool_ready_list)
 * and splitting the one handed out (emm_pool_take_block), the stream keys
 * present in the trees. Segments are heap_segs.c's. Callers hold the arena
 * lock unless a function says otherwise.
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

/* A new slab of block structs on the recycle list: its first, or NULL. */
static __attribute__((noinline)) struct emm_block *block_slab_new(struct arena *h)
{
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
	return arr;
}

static inline struct emm_block *block_new(struct arena *h)
{
	struct emm_block *b = h->block_free;

	if (EMM_UNLIKELY(!b) && !(b = block_slab_new(h)))
		return NULL;
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

void emm_pool_unready(struct arena *h, struct emm_block *b)
{
	index_take(h, b);
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

/* Block n merged into a neighbour: marked unused and chained through prev on
 * *dead, recycled once the list is walked (its link may still be read). */
static inline void merged_away(struct arena *h, struct emm_block *n, struct emm_block **dead)
{
	n->state = BLOCK_UNUSED;
	n->prev = *dead;
	*dead = n;
	h->st.merges++;
}

/* The run of blocks being made ready around b, [first, last], absorbed into
 * one: a ready-any neighbour before it keeps its struct and its sfit node,
 * else first does; a ready-any neighbour after it joins. The absorbed
 * blocks go to *dead (merged_away). */
static void ready_run(struct arena *h, struct emm_block *b, struct emm_block **dead)
{
	struct emm_block *first = b, *last = b, *keep, *n, *after;

	while (first->prev && first->prev->state == BLOCK_MERGING)
		first = first->prev;
	while (last->next && last->next->state == BLOCK_MERGING)
		last = last->next;
	keep = first->prev;
	bool linked = keep && keep->state == BLOCK_READY && keep->stream == 0;
	if (!linked) {
		keep = first;
		keep->state = BLOCK_READY;
		keep->stream = 0;
	}
	after = last->next;
	emm_addr_t end = last->addr + last->size;
	for (n = keep->next; n != after; n = n->next)
		merged_away(h, n, dead);
	if (after && after->state == BLOCK_READY && after->stream == 0) {
		index_take(h, after);
		end += after->size;
		n = after;
		after = after->next;
		merged_away(h, n, dead);
	}
	keep->size = end - keep->addr;
	keep->next = after;
	if (after)
		after->prev = keep;
	else
		keep->seg->last = keep;
	if (!linked) {
		index_put(h, keep);
		return;
	}
	emm_sfit_update(&h->ready[keep->pool], &keep->fnode, keep->size, keep->addr);
	if (!keep->prev && !keep->next)
		idle_add(h, keep->seg);
}

void emm_pool_ready_list(struct arena *h, struct emm_block *list)
{
	struct emm_block *b, *next, *dead = NULL;

	for (b = list; b; b = b->link) {
		b->state = BLOCK_MERGING;
		b->fence = NULL;
	}
	for (b = list; b; b = b->link)
		if (b->state == BLOCK_MERGING)
			ready_run(h, b, &dead);
	for (b = list; b; b = next) {
		next = b->link;
		b->link = NULL;
	}
	for (b = dead; b; b = next) {
		next = b->prev;
		block_recycle(h, b);
	}
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

/* Mark a block live for a request of `size` on `stream`, and count it. */
static inline void take_live(struct arena *h, struct emm_block *b, size_t size, emm_stream_t stream)
{
	b->state = BLOCK_LIVE;
	b->requested = size;
	b->stream = stream;
	h->st.allocs++;
	h->st.live_blocks++;
	stat_add(&h->st.allocated, &h->st.allocated_peak, &h->st.allocated_total, b->size);
	stat_add(&h->st.requested, &h->st.requested_peak, &h->st.requested_total, size);
	stat_delta(h, (int64_t)b->size, (int64_t)size);
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
	take_live(h, b, size, stream);
}

/* Hand out a ready block: split off the remainder (which stays ready under
 * the same key), mark it live. A ready-any block that splits stays where it
 * is in the sfit, as the remainder (relinked only if its bin changes: not
 * for a small piece of a large block), and the live part gets a new struct:
 * the block returned. */
struct emm_block *emm_pool_take_block(struct arena *h, struct emm_block *b, size_t rounded, size_t size,
                                      emm_stream_t stream)
{
	struct emm_block *a;

	if (b->stream == 0 && b->size > rounded && should_split(h, b, rounded) && (a = block_new(h))) {
		struct emm_segment *s = b->seg;
		if (s->idle)
			idle_del(h, s);
		a->seg = s;
		a->pool = b->pool;
		a->addr = b->addr;
		a->size = rounded;
		a->prev = b->prev;
		a->next = b;
		if (a->prev)
			a->prev->next = a;
		else
			s->first = a;
		b->prev = a;
		b->addr += rounded;
		b->size -= rounded;
		/* b was maximal, so its other neighbour is not mergeable. */
		emm_sfit_update(&h->ready[b->pool], &b->fnode, b->size, b->addr);
		h->st.splits++;
		take_live(h, a, size, stream);
		return a;
	}
	index_take(h, b);
	take_common(h, b, rounded, size, stream, false);
	return b;
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
