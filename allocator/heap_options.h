/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_options.h - the heap parameters the EMM_* settings ask for
 * (config/options.h's struct emm_options onto allocator/heap.h's struct
 * emm_heap_params): one mapping for libemm itself (process/state.c) and for
 * emm-replay (tools/), and one rule for segment sizes a device cannot hold.
 */
#ifndef EMM_ALLOCATOR_HEAP_OPTIONS_H
#define EMM_ALLOCATOR_HEAP_OPTIONS_H

#include "allocator/heap.h"
#include "config/options.h"

void emm_heap_params_from_options(const struct emm_options *o, const enum emm_option_source *sources,
                                  struct emm_heap_params *p);

/* Bits of emm_heap_params_fit's result: the parameters it changed. */
enum {
	EMM_FIT_SMALL_SEGMENT = 1u << 0, /* EMM_SMALL_SEGMENT */
	EMM_FIT_LARGE_SEGMENT = 1u << 1, /* EMM_LARGE_SEGMENT */
	EMM_FIT_LARGE_ROUND = 1u << 2,	 /* EMM_LARGE_ROUND */
	EMM_FIT_SMALL_SIZE = 1u << 3,	 /* EMM_SMALL_SIZE (follows the small segment) */
};

/*
 * Segment sizes larger than a device of `total` bytes would fail every
 * allocation that needs one: each such size becomes half the device
 * (rounded down to 512 bytes), and the sizes tied to it follow
 * (EMM_SMALL_SIZE <= EMM_SMALL_SEGMENT, EMM_LARGE_ROUND <=
 * EMM_LARGE_SEGMENT). Sizes that fit are kept. Returns the EMM_FIT_* bits
 * of what changed (0: nothing; also when total is 0, unknown).
 */
unsigned emm_heap_params_fit(struct emm_heap_params *p, size_t total);

#endif
