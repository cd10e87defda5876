/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_options.c - the heap parameters the EMM_* settings ask for
 * (contract in heap_options.h).
 */
#include "allocator/heap_options.h"

void emm_heap_params_from_options(const struct emm_options *o, const enum emm_option_source *sources,
                                  struct emm_heap_params *p)
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
	p->hold_peak = o->hold_peak;
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
	/* EMM_EPOCH_BLOCKS set by the user holds for every heap. */
	if (sources && sources[EMM_OPT_EPOCH_BLOCKS] == EMM_OPTION_ENV)
		p->epoch_max_blocks_paged = o->epoch_blocks;
	p->epoch_max_bytes = o->epoch_bytes;
	p->pending_limit = o->pending_limit;
	p->arenas = o->arenas;
	p->thread_cache = o->thread_cache;
}

/* Half the device, in whole 512-byte granules (at least one). */
static size_t half_device(size_t total)
{
	size_t half = total / 2 / EMM_MIN_BLOCK * EMM_MIN_BLOCK;

	return half ? half : EMM_MIN_BLOCK;
}

unsigned emm_heap_params_fit(struct emm_heap_params *p, size_t total)
{
	unsigned changed = 0;

	if (total == 0)
		return 0;
	if (p->small_segment > total) {
		p->small_segment = half_device(total);
		changed |= EMM_FIT_SMALL_SEGMENT;
	}
	if (p->large_segment > total) {
		p->large_segment = half_device(total);
		changed |= EMM_FIT_LARGE_SEGMENT;
	}
	if (p->large_round > total) {
		p->large_round = half_device(total);
		changed |= EMM_FIT_LARGE_ROUND;
	}
	if (p->small_max > p->small_segment) {
		p->small_max = p->small_segment;
		changed |= EMM_FIT_SMALL_SIZE;
	}
	if (p->large_round > p->large_segment) {
		p->large_round = p->large_segment;
		changed |= EMM_FIT_LARGE_ROUND;
	}
	return changed;
}
