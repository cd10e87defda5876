/* SPDX-License-Identifier: MIT */
/*
 * test-heap-fill: a program that allocates equal blocks until the device is
 * full must get about as much as without the cache (issue 9). A fixed
 * capacity filled through the heap: 7 MiB blocks use nearly all of it (not
 * 14 of every 20 MiB), and no large request below large_segment/2 gets
 * fewer blocks than cudaMalloc rounding each one to a 2 MiB page would,
 * but for the last segment, which may not fit where single blocks would.
 */
#include <errno.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static const size_t CAP = 4096 * MIB;

/* Blocks of `size` the heap hands out from CAP bytes before -ENOMEM. */
static size_t fill(size_t size, size_t *ret_reserved)
{
	struct fake_src src;
	struct emm_heap_params p;
	emm_heap_t *h = NULL;
	size_t n = 0, max = CAP / size + 1;
	emm_addr_t *a = calloc(max, sizeof(*a));

	emm_heap_params_default(&p);
	p.arenas = 1;
	fake_src_init(&src, CAP);
	struct emm_segment_source s = fake_src_ops(&src);
	if (!a || emm_heap_create(&p, &s, NULL, 0, &h)) { /* no fences: frees are ready at once */
		emm_test_fail_("setup for %zu", size);
		free(a);
		fake_src_fini(&src);
		return 0;
	}
	int r = 0;
	while (n < max && (r = emm_heap_alloc(h, size, EMM_STREAM_SYNC, &a[n])) == 0)
		n++;
	expect_int_eq(r, -ENOMEM);
	*ret_reserved = heap_stats(h).reserved_bytes;
	expect_int_eq(emm_heap_check(h), 0);
	for (size_t i = 0; i < n; i++)
		xfree(a[i], EMM_STREAM_SYNC);
	emm_heap_destroy(h, true);
	expect_u64_eq(src.used, 0);
	expect_int_eq(src.bad_frees, 0);
	fake_src_fini(&src);
	free(a);
	return n;
}

/* The H200 case: 14 MiB segments of two blocks each fill 4088 of 4096 MiB
 * (20 MiB segments: 2856, 70 %; cudaMalloc's 8 MiB per block: 3584). */
TEST_BEGIN(test_fill_7mib)
{
	size_t reserved = 0;
	size_t n = fill(7 * MIB, &reserved);
	expect_u64_eq(n, CAP / (14 * MIB) * 2);
	expect_true(n * 7 * MIB >= CAP / 100 * 99);
	expect_u64_eq(reserved, n * 7 * MIB); /* nothing stranded */
}
TEST_END

/* Every large request below 10 MiB: never fewer blocks than page-rounded
 * cudaMallocs get from the capacity less one segment, and so at least 7/8
 * of that used (7 MiB + 512 B: two in 16 MiB, one in 8 MiB). */
TEST_BEGIN(test_fill_sweep)
{
	struct emm_heap_params p;
	unsigned sizes = 0;

	emm_heap_params_default(&p);
	for (size_t s = 1 * MIB + 512; s < 10 * MIB; s += 97 * KIB + 512) {
		size_t rounded = emm_heap_round_size(&p, s);
		size_t seg = emm_heap_segment_size(&p, rounded);
		size_t page = (rounded + 2 * MIB - 1) / (2 * MIB) * (2 * MIB);
		size_t reserved = 0;
		size_t n = fill(s, &reserved);
		if (n < (CAP - seg) / page || n * rounded < (CAP - seg) / 8 * 7)
			emm_test_fail_("%zu B blocks: %zu in %zu B (segments of %zu B; cudaMalloc: %zu)", s,
			               n, CAP, seg, CAP / page);
		expect_true(reserved - n * rounded <= CAP / 8);
		sizes++;
	}
	expect_true(sizes > 80);
}
TEST_END

int main(void)
{
	return emm_test_run(test_fill_7mib, test_fill_sweep, NULL);
}
