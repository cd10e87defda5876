/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_walk.h - every segment of a heap and the blocks that tile
 * it, as they are now: for memory snapshots (PyTorch's memory_viz format,
 * process/snapshot.c and emm-replay --snapshot).
 */
#ifndef EMM_ALLOCATOR_HEAP_WALK_H
#define EMM_ALLOCATOR_HEAP_WALK_H

#include <stdbool.h>
#include <stddef.h>

#include "allocator/heap.h"

enum emm_walk_state {
	EMM_WALK_FREE,	  /* cached, reusable */
	EMM_WALK_LIVE,	  /* handed to the program */
	EMM_WALK_PENDING, /* freed, waiting for a fence */
};

struct emm_walk_segment {
	emm_addr_t base;
	size_t size;
	emm_stream_t stream; /* the key of the allocation that opened it */
	bool small;	     /* the small pool's */
};

struct emm_walk_block {
	emm_addr_t addr;
	size_t size;	  /* as carved (rounded) */
	size_t requested; /* LIVE: what the program asked for; else 0 */
	enum emm_walk_state state;
};

/*
 * Call seg(arg, segment) for each live segment of the heap, then blk(arg,
 * block) for each of its blocks in address order; the blocks tile the
 * segment. Each arena is walked under its lock: the callbacks only copy
 * (no allocator call, no driver call, no wait). A callback returning
 * non-zero stops the walk, and emm_heap_walk returns that value; else 0.
 */
int emm_heap_walk(emm_heap_t *heap, int (*seg)(void *arg, const struct emm_walk_segment *s),
		  int (*blk)(void *arg, const struct emm_walk_block *b), void *arg);

#endif
