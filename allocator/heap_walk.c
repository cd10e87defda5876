/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_walk.c - the walk over a heap's segments and blocks that
 * memory snapshots read (heap_walk.h).
 */
#include "allocator/heap_walk.h"

#include "allocator/heap_internal.h"

static int walk_locked(struct arena *h, int (*seg)(void *, const struct emm_walk_segment *),
                       int (*blk)(void *, const struct emm_walk_block *), void *arg)
{
	for (struct emm_segment *s = h->segs; s; s = s->next) {
		struct emm_walk_segment ws = {
		    .base = s->base, .size = s->size, .stream = s->stream, .small = s->pool == POOL_SMALL};
		int r = seg(arg, &ws);

		if (r)
			return r;
		for (struct emm_block *b = s->first; b; b = b->next) {
			struct emm_walk_block wb = {.addr = b->addr, .size = b->size};

			wb.state = b->state == BLOCK_LIVE      ? EMM_WALK_LIVE
			           : b->state == BLOCK_PENDING ? EMM_WALK_PENDING
			                                       : EMM_WALK_FREE;
			wb.requested = b->state == BLOCK_LIVE ? b->requested : 0;
			if ((r = blk(arg, &wb)))
				return r;
		}
	}
	return 0;
}

int emm_heap_walk(emm_heap_t *heap, int (*seg)(void *arg, const struct emm_walk_segment *s),
                  int (*blk)(void *arg, const struct emm_walk_block *b), void *arg)
{
	int r = 0;

	for (unsigned i = 0; i < heap->narenas && r == 0; i++) {
		struct arena *h = heap->arenas[i];

		arena_lock(h);
		r = walk_locked(h, seg, blk, arg);
		arena_unlock(h);
	}
	return r;
}
