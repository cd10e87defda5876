/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_size.c - the heap's size policy: default parameters,
 * request rounding (512 B or power-of-two divisions) and the segment size
 * asked of the source for a rounded request (a whole number of requests
 * below large_segment/2). Pure functions of the params.
 */
#include "allocator/heap.h"

#include <stdint.h>
#include <string.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

void emm_heap_params_default(struct emm_heap_params *p)
{
	/* Every field, including ones added later, starts zeroed. */
	memset(p, 0, sizeof(*p));
	p->small_max = 1 * MIB;
	p->small_segment = 2 * MIB;
	p->large_segment = 20 * MIB;
	p->large_round = 2 * MIB;
	p->max_split = SIZE_MAX;
	p->max_nosplit_slack = 20 * MIB;
	p->roundup_divisions = 0;
	p->release_threshold = SIZE_MAX;
	p->oom_retry = true;
	p->free_mode = EMM_FREE_MODE_FENCE;
	p->epoch_max_blocks = 64;
	p->epoch_max_blocks_paged = 8;
	p->epoch_max_bytes = 64 * MIB;
	p->host_accessible = false;
	p->pending_limit = 1024 * MIB;
	p->arenas = 0;
}

/* x rounded up to a multiple of align (a power of two), or 0 on overflow. */
static inline size_t align_up_checked(size_t x, size_t align)
{
	if (x > SIZE_MAX - (align - 1))
		return 0;
	return (x + align - 1) & ~(align - 1);
}

/* x rounded up to a multiple of m (any m > 0), or 0 on overflow. */
static inline size_t round_up_checked(size_t x, size_t m)
{
	size_t r = x % m;
	if (r == 0)
		return x;
	if (x > SIZE_MAX - (m - r))
		return 0;
	return x + (m - r);
}

static inline size_t pow2_floor(size_t x)
{
	return (size_t)1 << (63 - __builtin_clzll((unsigned long long)x));
}

size_t emm_heap_round_size(const struct emm_heap_params *p, size_t size)
{
	size_t step = EMM_MIN_BLOCK;

	if (size == 0)
		return 0;
	if (size <= EMM_MIN_BLOCK)
		return EMM_MIN_BLOCK;
	if (p->roundup_divisions) {
		/* N steps per power-of-two interval (N rounded down to a power
		 * of two), never finer than 512 B: PyTorch's
		 * roundup_power2_divisions. */
		size_t div_step = pow2_floor(size) / pow2_floor(p->roundup_divisions);
		if (div_step > step)
			step = div_step;
	}
	return align_up_checked(size, step);
}

/*
 * The segment for a large request below large_segment/2: as many of these
 * requests as fit large_segment, end to end, rounded up to large_round
 * (large_segment itself where that would reach max_split, which only an
 * odd large_round can do, or overflow).
 *
 * PyTorch gives all of them one large_segment (20 MiB), which strands the
 * tail that a fill of equal requests cannot use: 6 MiB of every 20 for
 * 7 MiB blocks, 70 % of the device, where cudaMalloc's 2 MiB pages give
 * 87.5 %. Here the tail stays below one large_round and is never more than
 * k cudaMallocs rounded to large_round pages would waste (the tail of
 * k * rounded is k times the tail of one, modulo large_round): a fill is
 * never worse than without the cache (but for the last segment, which may
 * not fit where single blocks would). Defaults: 3 MiB -> 18 (six), 4 -> 20,
 * 4.5 -> 18, 5 -> 20, 5.5 -> 18 (three), 7 -> 14, 7.5 -> 16, 9 -> 18;
 * segments from 14 to 20 MiB, 18.6 on average over 1 to 10 MiB requests;
 * the worst fill 7/8 (7 MiB + 512: two in 16 MiB), as cudaMalloc's.
 *
 * Taking one request more when that leaves the smaller tail (7 MiB + 512:
 * three in 22 MiB) would fill better (at least 10/11, 96.8 % against
 * 95.2 % on average) but asks for up to 28 MiB: near a full device a
 * request that a 20 MiB segment served could then fail, as the heap tries
 * no smaller segment. On the shipped traces both rules need the same
 * memory (emm-replay), so the segment stays within large_segment: never
 * more than PyTorch's rule asks for.
 */
static size_t shared_segment_size(const struct emm_heap_params *p, size_t rounded)
{
	size_t k = p->large_segment / rounded; /* >= 2 */
	size_t seg = round_up_checked(k * rounded, p->large_round);

	return seg && seg < p->max_split ? seg : p->large_segment;
}

size_t emm_heap_segment_size(const struct emm_heap_params *p, size_t rounded)
{
	if (rounded == 0)
		return 0;
	if (rounded <= p->small_max)
		return rounded <= p->small_segment ? p->small_segment
		                                   : round_up_checked(rounded, p->small_segment);
	if (rounded < p->large_segment / 2)
		return shared_segment_size(p, rounded);
	return round_up_checked(rounded, p->large_round);
}
