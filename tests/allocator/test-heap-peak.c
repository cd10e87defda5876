/* SPDX-License-Identifier: MIT */
/*
 * test-heap-peak: the heap-wide allocated and requested peaks under several
 * arenas (heap_stats.c). Each thread allocates from its own arena, whose
 * byte deltas reach the heap-wide counters only in steps of 1 MiB, so
 * small blocks kept alive by several threads together never reach them
 * before a read: the reported peak must still be the true one, and where
 * it cannot be, the true one must lie within the reported error bound.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "allocator/heap.h"
#include "common/compiler.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

enum { THREADS = 4, BLOCKS = 8 };
#define BLOCK (16 * KIB)
#define ODD   (195 * KIB + 100) /* vectorAdd's block, not a multiple of the rounding */

static struct fake_src src;
static struct fake_fence fence;

static size_t small_segment; /* 0: the default */

static emm_heap_t *setup(unsigned arenas)
{
	struct emm_heap_params p;
	emm_heap_t *h = NULL;

	emm_heap_params_default(&p);
	p.arenas = arenas;
	if (small_segment)
		p.small_segment = small_segment;
	p.thread_cache = false;
	if (fake_heap_create(&p, &src, 1024 * MIB, &fence, &h))
		return NULL;
	return h;
}

static void teardown(emm_heap_t *h)
{
	expect_int_eq(emm_heap_check(h), 0);
	emm_heap_destroy(h, true);
	expect_int_eq(src.bad_frees, 0);
	expect_u64_eq(src.used, 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

/* The true peak lies within the reported bound. */
static void expect_within(uint64_t truth, uint64_t peak, uint64_t error)
{
	expect_true(truth <= peak);
	expect_true(peak - error <= truth);
}

struct job {
	emm_heap_t *h;
	size_t size;
	pthread_barrier_t *held; /* NULL: free at once */
	pthread_barrier_t *go;
	emm_addr_t blocks[THREADS][BLOCKS]; /* what is live at the barrier */
	_Atomic unsigned next;
};

/* The truth without reading the statistics (a read flushes the arenas'
 * deltas, which would hide what this test is about): the live blocks'
 * rounded and requested sizes. */
static void live_bytes(const emm_addr_t *a, size_t n, uint64_t *allocated, uint64_t *requested)
{
	struct emm_block_range r;

	*allocated = *requested = 0;
	for (size_t i = 0; i < n; i++) {
		if (emm_heap_find_block(a[i], &r) != 0) {
			emm_test_fail_("block 0x%llx not live", (unsigned long long)a[i]);
			continue;
		}
		*allocated += r.size;
		*requested += r.requested;
	}
}

static void *hold_blocks(void *arg)
{
	struct job *j = arg;
	emm_addr_t *a = j->blocks[atomic_fetch_add(&j->next, 1) % THREADS];

	for (int i = 0; i < BLOCKS; i++)
		a[i] = xalloc(j->h, j->size, 0);
	if (j->held) {
		pthread_barrier_wait(j->held); /* every thread holds its blocks */
		pthread_barrier_wait(j->go);   /* the main thread has read the truth */
	}
	for (int i = 0; i < BLOCKS; i++)
		xfree(a[i], 0);
	return NULL;
}


/* THREADS threads, each on its own arena, hold BLOCKS blocks of `size`
 * together, then free them: the reported peaks are the true ones (the
 * arenas peaked together), within their bounds. */
static void hold_together(size_t size)
{
	emm_heap_t *h = setup(THREADS);
	pthread_barrier_t held, go;
	pthread_t t[THREADS];
	static struct job j;
	struct emm_stats st;
	uint64_t alloc_truth, req_truth;

	assert_ptr_not_null(h);
	memset(&j, 0, sizeof(j));
	j.h = h;
	j.size = size;
	j.held = &held;
	j.go = &go;
	pthread_barrier_init(&held, NULL, THREADS + 1);
	pthread_barrier_init(&go, NULL, THREADS + 1);
	for (int i = 0; i < THREADS; i++)
		assert_int_eq(pthread_create(&t[i], NULL, hold_blocks, &j), 0);
	pthread_barrier_wait(&held);
	live_bytes(&j.blocks[0][0], THREADS * BLOCKS, &alloc_truth, &req_truth);
	pthread_barrier_wait(&go);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	st = heap_stats(h);
	expect_u64_eq(req_truth, THREADS * BLOCKS * size);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_u64_eq(st.allocated_bytes_peak, alloc_truth);
	expect_u64_eq(st.requested_bytes_peak, req_truth);
	expect_within(alloc_truth, st.allocated_bytes_peak, st.allocated_bytes_peak_error);
	expect_within(req_truth, st.requested_bytes_peak, st.requested_bytes_peak_error);
	pthread_barrier_destroy(&held);
	pthread_barrier_destroy(&go);
	teardown(h);
}

/* Small blocks: no arena's deltas reach the heap-wide counters. */
TEST_BEGIN(test_threads_hold_together)
{
	hold_together(BLOCK);
}
TEST_END

/* Large blocks: flushed as they grow. */
TEST_BEGIN(test_large_blocks_together)
{
	hold_together(3 * MIB);
}
TEST_END

/* One thread on a heap of several arenas (vectorAdd: three 195 KiB blocks
 * alive at once, all freed before the table): exact, no error. */
TEST_BEGIN(test_one_thread_exact)
{
	emm_heap_t *h = setup(8);
	emm_addr_t a[3];
	struct emm_stats st;
	uint64_t alloc_truth, req_truth;

	assert_ptr_not_null(h);
	for (int i = 0; i < 3; i++)
		a[i] = xalloc(h, ODD, 0);
	live_bytes(a, 3, &alloc_truth, &req_truth);
	for (int i = 0; i < 3; i++)
		xfree(a[i], 0);
	st = heap_stats(h);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_true(alloc_truth >= 3 * ODD);
	expect_u64_eq(st.allocated_bytes_peak, alloc_truth);
	expect_u64_eq(st.requested_bytes_peak, 3 * ODD);
	expect_u64_eq(st.allocated_bytes_peak_error, 0);
	expect_u64_eq(st.requested_bytes_peak_error, 0);
	teardown(h);
}
TEST_END

/* Threads one after another, each on its own arena: the arenas' peaks do
 * not add up and nothing was flushed, so the peak is an upper bound with
 * its error labelled, and the truth lies within it. Each thread's blocks
 * fill a segment and wait for their fence when the next thread runs, so
 * no thread can take another arena's ready block on a miss. */
TEST_BEGIN(test_threads_in_turn_bounded)
{
	small_segment = BLOCKS * BLOCK;
	emm_heap_t *h = setup(THREADS);
	small_segment = 0;
	static struct job j = {.size = BLOCK};
	pthread_t t;
	struct emm_stats st;
	uint64_t truth_requested = BLOCKS * BLOCK;

	assert_ptr_not_null(h);
	j.h = h;
	for (int i = 0; i < THREADS; i++) {
		assert_int_eq(pthread_create(&t, NULL, hold_blocks, &j), 0);
		pthread_join(t, NULL);
	}
	st = heap_stats(h);
	expect_within(truth_requested, st.requested_bytes_peak, st.requested_bytes_peak_error);
	expect_true(st.requested_bytes_peak_error > 0); /* labelled, not passed off as exact */
	expect_true(st.allocated_bytes_peak_error > 0);
	teardown(h);
}
TEST_END


int main(void)
{
	return emm_test_run(test_threads_hold_together, test_one_thread_exact, test_threads_in_turn_bounded,
	                    test_large_blocks_together, NULL);
}
