/* SPDX-License-Identifier: MIT */
/*
 * test-rounding: request rounding (512 B granularity, power-of-two
 * divisions), segment sizing and pool selection, as PyTorch's
 * CUDACachingAllocator does them (round_size, get_allocation_size).
 */
#include <errno.h>

#include "allocator/heap.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

TEST_BEGIN(test_defaults)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	expect_u64_eq(p.small_max, 1 * MIB);
	expect_u64_eq(p.small_segment, 2 * MIB);
	expect_u64_eq(p.large_segment, 20 * MIB);
	expect_u64_eq(p.large_round, 2 * MIB);
	expect_u64_eq(p.max_split, SIZE_MAX);
	expect_u64_eq(p.max_nosplit_slack, 20 * MIB);
	expect_int_eq(p.roundup_divisions, 0);
	expect_u64_eq(p.release_threshold, SIZE_MAX);
	expect_true(p.oom_retry);
	expect_int_eq(p.free_mode, EMM_FREE_MODE_FENCE);
	expect_int_eq(p.epoch_max_blocks, 64);
	expect_u64_eq(p.epoch_max_bytes, 64 * MIB);
}
TEST_END

TEST_BEGIN(test_round_512)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	expect_u64_eq(emm_heap_round_size(&p, 0), 0);
	expect_u64_eq(emm_heap_round_size(&p, 1), 512);
	expect_u64_eq(emm_heap_round_size(&p, 511), 512);
	expect_u64_eq(emm_heap_round_size(&p, 512), 512);
	expect_u64_eq(emm_heap_round_size(&p, 513), 1024);
	expect_u64_eq(emm_heap_round_size(&p, 1000 * KIB + 1), 1000 * KIB + 512);
	expect_u64_eq(emm_heap_round_size(&p, 3 * MIB - 5), 3 * MIB);
	expect_u64_eq(emm_heap_round_size(&p, (size_t)1 << 62), (size_t)1 << 62);
	expect_u64_eq(emm_heap_round_size(&p, SIZE_MAX - 511), SIZE_MAX - 511);
	/* Too large to round: 0. */
	expect_u64_eq(emm_heap_round_size(&p, SIZE_MAX), 0);
	expect_u64_eq(emm_heap_round_size(&p, SIZE_MAX - 510), 0);
	/* Every result: >= size, multiple of 512, < size + 512. */
	for (size_t s = 1; s < 64 * KIB; s += 37) {
		size_t r = emm_heap_round_size(&p, s);
		expect_true(r >= s && r % 512 == 0 && r - s < 512);
	}
}
TEST_END

TEST_BEGIN(test_round_divisions)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);

	p.roundup_divisions = 4;
	/* [1 MiB, 2 MiB) in 4 steps of 256 KiB. */
	expect_u64_eq(emm_heap_round_size(&p, 1 * MIB), 1 * MIB);
	expect_u64_eq(emm_heap_round_size(&p, 1 * MIB + 1), 1 * MIB + 256 * KIB);
	expect_u64_eq(emm_heap_round_size(&p, 1 * MIB + 256 * KIB), 1 * MIB + 256 * KIB);
	expect_u64_eq(emm_heap_round_size(&p, 1 * MIB + 300 * KIB), 1 * MIB + 512 * KIB);
	expect_u64_eq(emm_heap_round_size(&p, 2 * MIB - 1), 2 * MIB);
	/* [1 GiB, 2 GiB) in steps of 256 MiB. */
	expect_u64_eq(emm_heap_round_size(&p, 1 * GIB + 1), 1 * GIB + 256 * MIB);
	/* Below 512*4 = 2 KiB the steps would be finer than 512 B: 512 B. */
	expect_u64_eq(emm_heap_round_size(&p, 513), 1024);
	expect_u64_eq(emm_heap_round_size(&p, 1025), 1536);
	expect_u64_eq(emm_heap_round_size(&p, 2049), 2560); /* [2K,4K): step 512 */
	expect_u64_eq(emm_heap_round_size(&p, 4097), 5120); /* [4K,8K): step 1K */
	expect_u64_eq(emm_heap_round_size(&p, 100), 512);

	/* One division: round to the next power of two. */
	p.roundup_divisions = 1;
	expect_u64_eq(emm_heap_round_size(&p, 3000), 4096);
	expect_u64_eq(emm_heap_round_size(&p, 4096), 4096);
	expect_u64_eq(emm_heap_round_size(&p, 5 * MIB), 8 * MIB);

	/* Not a power of two: rounded down to one (6 -> 4). */
	p.roundup_divisions = 6;
	expect_u64_eq(emm_heap_round_size(&p, 1 * MIB + 1), 1 * MIB + 256 * KIB);

	/* Overflow at the top interval. */
	p.roundup_divisions = 2;
	expect_u64_eq(emm_heap_round_size(&p, ((size_t)1 << 63) + 1), ((size_t)1 << 63) + ((size_t)1 << 62));
	expect_u64_eq(emm_heap_round_size(&p, ((size_t)1 << 63) + ((size_t)1 << 62) + 1), 0);
	expect_u64_eq(emm_heap_round_size(&p, ((size_t)1 << 62) + 1), ((size_t)1 << 62) + ((size_t)1 << 61));

	/* Properties over a sweep, for each division count: result >= size,
	 * multiple of 512, on the division grid, and monotonic. */
	for (unsigned d = 1; d <= 64; d *= 2) {
		p.roundup_divisions = d;
		size_t prev = 0;
		for (size_t s = 1; s < 64 * MIB; s += s / 7 + 1) {
			size_t r = emm_heap_round_size(&p, s);
			expect_true(r >= s && r % 512 == 0 && r >= prev);
			if (s > 512) {
				size_t floor2 = (size_t)1 << (63 - __builtin_clzll(s));
				size_t step = floor2 / d < 512 ? 512 : floor2 / d;
				expect_true(r % step == 0);
				expect_true(r - s < step);
			}
			prev = r;
		}
	}
}
TEST_END

TEST_BEGIN(test_segment_size)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	expect_u64_eq(emm_heap_segment_size(&p, 0), 0);
	/* Small pool: 2 MiB segments. */
	expect_u64_eq(emm_heap_segment_size(&p, 512), 2 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 1 * MIB), 2 * MIB);
	/* Large requests below 10 MiB share segments of as many of them as
	 * fit 20 MiB, rounded up to 2 MiB. */
	expect_u64_eq(emm_heap_segment_size(&p, 1 * MIB + 512), 20 * MIB);  /* 19 */
	expect_u64_eq(emm_heap_segment_size(&p, 10 * MIB - 512), 20 * MIB); /* 2 */
	expect_u64_eq(emm_heap_segment_size(&p, 2 * MIB), 20 * MIB);        /* 10 */
	expect_u64_eq(emm_heap_segment_size(&p, 3 * MIB), 18 * MIB);        /* 6 */
	expect_u64_eq(emm_heap_segment_size(&p, 4 * MIB), 20 * MIB);        /* 5 */
	expect_u64_eq(emm_heap_segment_size(&p, 9 * MIB / 2), 18 * MIB);    /* 4 */
	expect_u64_eq(emm_heap_segment_size(&p, 5 * MIB), 20 * MIB);        /* 4 */
	expect_u64_eq(emm_heap_segment_size(&p, 11 * MIB / 2), 18 * MIB);   /* 3, 16.5 rounded */
	expect_u64_eq(emm_heap_segment_size(&p, 13 * MIB / 2), 20 * MIB);   /* 3, 19.5 rounded */
	expect_u64_eq(emm_heap_segment_size(&p, 7 * MIB), 14 * MIB);        /* 2: issue 9's fill */
	expect_u64_eq(emm_heap_segment_size(&p, 7 * MIB + 512), 16 * MIB);  /* 2, the worst: 7/8 used */
	expect_u64_eq(emm_heap_segment_size(&p, 15 * MIB / 2), 16 * MIB);   /* 2 */
	expect_u64_eq(emm_heap_segment_size(&p, 9 * MIB), 18 * MIB);        /* 2 */
	/* From 10 MiB: rounded up to 2 MiB. */
	expect_u64_eq(emm_heap_segment_size(&p, 10 * MIB), 10 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 10 * MIB + 512), 12 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 101 * MIB), 102 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, (size_t)1 << 62), (size_t)1 << 62);
	expect_u64_eq(emm_heap_segment_size(&p, SIZE_MAX - 511), 0); /* overflow */

	/* Custom: 1 MiB large segment -> threshold 512 KiB; small pool up to
	 * 4 MiB with 2 MiB segments -> segments grow in 2 MiB steps. */
	p.large_segment = 8 * MIB;
	p.large_round = 4 * MIB;
	expect_u64_eq(emm_heap_segment_size(&p, 2 * MIB), 8 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 4 * MIB), 4 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 5 * MIB), 8 * MIB);
	p.small_max = 4 * MIB;
	expect_u64_eq(emm_heap_segment_size(&p, 3 * MIB), 4 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 2 * MIB), 2 * MIB);

	/* Every segment holds its request. */
	emm_heap_params_default(&p);
	for (size_t s = 512; s < 256 * MIB; s += s / 3 + 512) {
		size_t seg = emm_heap_segment_size(&p, s);
		expect_true(seg >= s);
	}
}
TEST_END

/* The shared large segments over every request from 1 MiB to 10 MiB: as
 * many requests as fit 20 MiB and a tail under one large_round (so never
 * more than that many page-rounded cudaMallocs would waste), at most 1/8
 * of the segment, the segment never above large_segment. */
TEST_BEGIN(test_segment_size_shared)
{
	struct emm_heap_params p;
	size_t lo = SIZE_MAX, hi = 0;

	emm_heap_params_default(&p);
	for (size_t r = 1 * MIB + 512; r < 10 * MIB; r += 512) {
		size_t seg = emm_heap_segment_size(&p, r);
		size_t k = seg / r, tail = seg - k * r;
		size_t page_tail = (2 * MIB - r % (2 * MIB)) % (2 * MIB);
		if (seg % (2 * MIB) || seg > 20 * MIB || k != 20 * MIB / r || tail >= 2 * MIB ||
		    tail > k * page_tail || tail * 8 > seg)
			emm_test_fail_("request %zu: segment %zu (%zu blocks, tail %zu)", r, seg, k, tail);
		lo = seg < lo ? seg : lo;
		hi = seg > hi ? seg : hi;
	}
	expect_u64_eq(lo, 14 * MIB);
	expect_u64_eq(hi, 20 * MIB);

	/* large_round not dividing large_segment: 6 MiB in 8 MiB steps is
	 * three in 24; with max_split 22 MiB that is refused (its remainder
	 * would serve no smaller request) and large_segment comes as before. */
	p.large_round = 8 * MIB;
	expect_u64_eq(emm_heap_segment_size(&p, 6 * MIB), 24 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 7 * MIB), 16 * MIB);
	p.max_split = 22 * MIB;
	expect_u64_eq(emm_heap_segment_size(&p, 6 * MIB), 20 * MIB);
	expect_u64_eq(emm_heap_segment_size(&p, 7 * MIB), 16 * MIB);

	/* large_round as large as large_segment: every shared segment is
	 * large_segment, as before. */
	emm_heap_params_default(&p);
	p.large_round = 20 * MIB;
	for (size_t r = 1 * MIB + 512; r < 10 * MIB; r += 65 * 1024)
		expect_u64_eq(emm_heap_segment_size(&p, r), 20 * MIB);

	/* Near the top of size_t: 2 * rounded rounded up to large_round
	 * overflows, and large_segment comes, never 0. At 3/4 of it, it still
	 * rounds. */
	emm_heap_params_default(&p);
	p.large_segment = SIZE_MAX & ~(size_t)511;
	size_t r = p.large_segment / 2 - 512;
	expect_u64_eq(emm_heap_segment_size(&p, r), p.large_segment);
	p.large_segment = (SIZE_MAX / 4 * 3) & ~(size_t)511;
	r = p.large_segment / 2 - 512;
	expect_u64_eq(emm_heap_segment_size(&p, r), (size_t)3 << 62);
}
TEST_END

/* Pool selection through a heap: a small request lands in a 2 MiB segment,
 * a large one (19 of them in 20 MiB) in a 20 MiB segment; reserved bytes
 * tell which. */
static uint64_t bump = 0x100000000ull;

static int src_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret)
{
	(void)state;
	(void)stream;
	*ret = bump;
	bump += (size + (2 * MIB - 1)) & ~(2 * MIB - 1);
	return 0;
}

static int src_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	(void)state;
	(void)addr;
	(void)size;
	(void)stream;
	return 0;
}

TEST_BEGIN(test_pool_selection)
{
	struct emm_heap_params p;
	struct emm_segment_source src = {NULL, src_alloc, src_free};
	emm_heap_t *h = NULL;
	emm_addr_t a, b, c;
	struct emm_stats st;

	emm_heap_params_default(&p);
	assert_int_eq(emm_heap_create(&p, &src, NULL, 0, &h), 0);

	assert_int_eq(emm_heap_alloc(h, 1 * MIB, EMM_STREAM_SYNC, &a), 0); /* small: 2 MiB segment */
	memset(&st, 0, sizeof(st));
	emm_heap_add_stats(h, &st);
	expect_u64_eq(st.reserved_bytes, 2 * MIB);

	assert_int_eq(emm_heap_alloc(h, 1 * MIB + 1, EMM_STREAM_SYNC, &b), 0); /* large: 20 MiB */
	memset(&st, 0, sizeof(st));
	emm_heap_add_stats(h, &st);
	expect_u64_eq(st.reserved_bytes, 22 * MIB);
	expect_u64_eq(st.allocated_bytes, 2 * MIB + 512);

	/* A second small request fits the small segment's remainder; the
	 * large segment's 19 MiB is not used for small requests. */
	assert_int_eq(emm_heap_alloc(h, 512 * KIB, EMM_STREAM_SYNC, &c), 0);
	expect_u64_eq(c, a + 1 * MIB);
	memset(&st, 0, sizeof(st));
	emm_heap_add_stats(h, &st);
	expect_u64_eq(st.segments, 2);
	expect_int_eq(emm_heap_check(h), 0);

	emm_heap_destroy(h, true);
}
TEST_END

int main(void)
{
	return emm_test_run(test_defaults, test_round_512, test_round_divisions, test_segment_size,
	                    test_segment_size_shared, test_pool_selection, NULL);
}
