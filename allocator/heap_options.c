/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_options.c - the heap parameters the EMM_* settings ask for
 * (contract in heap_options.h).
 */
#include "allocator/heap_options.h"

void emm_heap_params_from_options(const struct emm_options *o, struct emm_heap_params *p)
{
	emm_heap_params_default(p);
	p->small_max = o->small_size;
	p->small_segment = o->small_segment;
	p->large_segment = o->large_segment;
	p->large_round = o->large_round;
	p->max_split = o->max_split;
	p->roundup_divisions = o->roundup_divisions;
	p->release_threshold = o->release_threshold;
	p->oom_retry = o->oom_retry;
	switch (o->free_mode) {
	case EMM_OPT_FREE_STRICT:
		p->free_mode = EMM_FREE_MODE_STRICT;
		break;
	case EMM_OPT_FREE_STREAM:
		p->free_mode = EMM_FREE_MODE_STREAM;
		break;
	case EMM_OPT_FREE_FENCE:
	default:
		p->free_mode = EMM_FREE_MODE_FENCE;
		break;
	}
	p->epoch_max_blocks = o->epoch_blocks;
	p->epoch_max_bytes = o->epoch_bytes;
	p->pending_limit = o->pending_limit;
	p->arenas = o->arenas;
}
