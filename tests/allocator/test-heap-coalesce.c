/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-heap-coalesce.c - an epoch's blocks becoming ready
 * together (emm_pool_ready_list): each run of adjacent freed blocks merges
 * into one ready block with the ready neighbours on either side, whatever
 * the order of the frees, exactly as freeing them one by one would.
 *
 *   - runs alone between live blocks, runs joining a ready block on the
 *     left, on the right and on both sides, the segment's remainder;
 *   - the merge count equals the pieces that disappeared;
 *   - the same when the epoch completes later (a live non-blocking stream
 *     keeps the fence in the FIFO until its event completes);
 *   - a whole segment freed in one epoch is idle and released.
 *
 * emm_heap_check runs after every close; the blocks are then found again by
 * allocating their exact sizes (best fit returns each run's first address).
 */
#include <errno.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define NB1 ((emm_stream_t)0x3000)
#define BLK (4 * KIB)
#define N   40

static struct fake_src src;
static struct fake_fence fence;

#define CHECKH(h) expect_int_eq(emm_heap_check(h), 0)

static emm_heap_t *setup(void)
{
	emm_heap_t *h = NULL;

	return fake_heap_create_one_arena(&src, SIZE_MAX, true, &fence, &h) ? NULL : h;
}

static void teardown(emm_heap_t *h)
{
	fake_heap_destroy_checked(h, &src, &fence);
}

/* Free the blocks a[idx[0..n)] in a scrambled order (7 is coprime with
 * every n used here). */
static void free_scrambled(const emm_addr_t *a, const int *idx, int n)
{
	for (int k = 0; k < n; k++)
		xfree(a[idx[(k * 7) % n]], 0);
}

/* 40 blocks of 4 KiB carved in order from one 2 MiB segment; two epochs of
 * 16 frees each. */
static void run_epochs(emm_heap_t *h, emm_addr_t *a, bool late)
{
	static const int e1[16] = {0, 1, 2, 3, 4, 5, 6, 7, 30, 31, 32, 33, 34, 35, 36, 37};
	/* 8, 9 join [0, 7] on the left; 12-14 and 20-24 stand alone between
	 * live blocks; 26-29 join [30, 37] on the right; 38, 39 join it on
	 * the left and the segment's remainder on the right. */
	static const int e2[16] = {8, 9, 12, 13, 14, 20, 21, 22, 23, 24, 26, 27, 28, 29, 38, 39};
	struct emm_stats st;

	for (int i = 0; i < N; i++) {
		a[i] = xalloc(h, BLK, 0); /* a piece of the remainder, which keeps its sfit node */
		if (i > 0)
			expect_u64_eq(a[i], a[i - 1] + BLK);
		CHECKH(h);
	}
	free_scrambled(a, e1, 16);
	CHECKH(h);
	if (late) {
		/* The fence waits in the FIFO until its events complete. */
		expect_u64_eq(heap_stats(h).pending_bytes, 16 * BLK);
		fake_complete(&fence, 0);
		expect_int_eq(emm_heap_flush(h), 0);
	}
	st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 0);
	expect_u64_eq(st.merges, 14); /* 16 pieces became 2 */
	CHECKH(h);

	free_scrambled(a, e2, 16);
	CHECKH(h);
	if (late) {
		fake_complete(&fence, 0);
		expect_int_eq(emm_heap_flush(h), 0);
	}
	st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 0);
	/* 16 pieces, the 2 ready runs and the remainder became 4 blocks. */
	expect_u64_eq(st.merges, 14 + 15);
	expect_u64_eq(st.allocated_bytes, 8 * BLK);
	CHECKH(h);
	size_t idle = 0, largest = 0;
	emm_heap_idle_info(h, &idle, &largest);
	expect_u64_eq(largest, 2 * MIB - 26 * BLK);
}

/* Each merged block is found by its exact size at its run's first address. */
static void expect_runs(emm_heap_t *h, const emm_addr_t *a)
{
	expect_u64_eq(xalloc(h, 10 * BLK, 0), a[0]);
	expect_u64_eq(xalloc(h, 3 * BLK, 0), a[12]);
	expect_u64_eq(xalloc(h, 5 * BLK, 0), a[20]);
	expect_u64_eq(xalloc(h, 14 * BLK, 0), a[26]); /* the largest left */
	CHECKH(h);
}

TEST_BEGIN(test_runs_fast_path)
{
	emm_heap_t *h = setup();
	assert_ptr_not_null(h);
	emm_addr_t a[N];

	run_epochs(h, a, false);
	expect_u64_eq(heap_stats(h).epochs_closed, 2);
	expect_runs(h, a);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_runs_late_fence)
{
	emm_heap_t *h = setup();
	assert_ptr_not_null(h);
	emm_addr_t a[N];

	emm_heap_stream_created(h, NB1, true);
	run_epochs(h, a, true);
	expect_runs(h, a);
	emm_heap_stream_destroyed(h, NB1);
	teardown(h);
}
TEST_END

/* Every block of a segment freed in one epoch: the segment is whole again,
 * idle, and released. */
TEST_BEGIN(test_whole_segment)
{
	emm_heap_t *h = setup();
	assert_ptr_not_null(h);
	emm_addr_t a[16];
	int idx[16];

	for (int i = 0; i < 16; i++) {
		a[i] = xalloc(h, 2 * MIB / 16, 0);
		idx[i] = i;
	}
	expect_u64_eq(heap_stats(h).segments, 1);
	free_scrambled(a, idx, 16);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.merges, 15);
	CHECKH(h);
	size_t idle = 0, largest = 0;
	emm_heap_idle_info(h, &idle, &largest);
	expect_u64_eq(idle, 2 * MIB);
	expect_u64_eq(largest, 2 * MIB);
	expect_int_eq(emm_heap_release_idle(h, 0), (long long)(2 * MIB));
	expect_u64_eq(heap_stats(h).segments, 0);
	teardown(h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_runs_fast_path, test_runs_late_fence, test_whole_segment, NULL);
}
