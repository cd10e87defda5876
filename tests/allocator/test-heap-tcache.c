/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-heap-tcache.c - the per-thread front cache
 * (allocator/heap_tcache.c) with the fence double: a block freed into the
 * cache is reused only once the shared heap would reuse it (after its
 * epoch closed, at once with no non-blocking stream; after the events
 * complete with one), double frees of cached blocks are refused, the
 * counters stay exact for one thread, an allocation that finds half the
 * thread's quota pending closes the thread's own epoch and then takes no
 * lock until its blocks run out, and the cache is flushed on thread exit,
 * release_idle, flush and the OOM retry and forgotten on destroy.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "allocator/heap.h"
#include "allocator/heap_internal.h"
#include "allocator/ptrmap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define NB1 ((emm_stream_t)0x3000)
#define N   16 /* EMM_EPOCH_BLOCKS here: a thread's epoch closes after N frees */

static struct fake_src src;
static struct fake_fence fence;

#define CHECKH(h) expect_int_eq(emm_heap_check(h), 0)

static emm_heap_t *setup(bool with_fence, size_t capacity, enum emm_free_mode mode)
{
	struct emm_heap_params p;
	emm_heap_t *h = NULL;

	emm_heap_params_default(&p);
	p.arenas = 1;
	p.thread_cache = true;
	p.free_mode = mode;
	p.epoch_max_blocks = N;
	fake_src_init(&src, capacity);
	fake_fence_init(&fence);
	struct emm_segment_source s = fake_src_ops(&src);
	struct emm_fence_ops f = fake_fence_ops(&fence);
	if (emm_heap_create(&p, &s, with_fence ? &f : NULL, 0, &h))
		return NULL;
	return h;
}

static void teardown(emm_heap_t *h)
{
	expect_int_eq(emm_heap_flush(h), 0);
	CHECKH(h);
	emm_heap_destroy(h, true);
	expect_int_eq(src.bad_frees, 0);
	expect_u64_eq(src.used, 0);
	expect_int_eq(fence.misuse, 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

static bool contains(const emm_addr_t *v, unsigned n, emm_addr_t a)
{
	for (unsigned i = 0; i < n; i++)
		if (v[i] == a)
			return true;
	return false;
}

TEST_BEGIN(test_reuse_after_the_thread_epoch_closes)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_FENCE);
	emm_addr_t a[N], b;
	assert_ptr_not_null(h);

	for (unsigned i = 0; i < N; i++)
		a[i] = xalloc(h, 64 * KIB, 0);
	/* One freed block is pending in the thread's epoch: not reused. */
	xfree(a[0], 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 64 * KIB);
	b = xalloc(h, 64 * KIB, 0);
	expect_false(contains(a, N, b));
	expect_u64_eq(fence.records, 0);
	xfree(b, 0);
	for (unsigned i = 1; i < N; i++)
		xfree(a[i], 0);
	expect_int_eq(emm_heap_flush(h), 0);

	/* N frees close the epoch: one event on the legacy stream, and with
	 * no non-blocking stream the blocks are reusable at once (the event
	 * incomplete), from the cache. */
	for (unsigned i = 0; i < N; i++)
		a[i] = xalloc(h, 64 * KIB, 0);
	struct emm_stats st0 = heap_stats(h);
	unsigned rec0 = fence.records;
	for (unsigned i = 0; i < N; i++)
		xfree(a[i], 0);
	expect_u64_eq(fence.records - rec0, 1);
	struct emm_stats st1 = heap_stats(h);
	expect_u64_eq(st1.epochs_closed - st0.epochs_closed, 1);
	expect_u64_eq(st1.pending_bytes, 0);
	expect_u64_eq(st1.live_blocks, 0);
	expect_u64_eq(st1.allocated_bytes, 0);
	for (unsigned i = 0; i < N; i++) {
		b = xalloc(h, 64 * KIB, 0);
		expect_true(contains(a, N, b));
	}
	expect_u64_eq(fence.records - rec0, 1);
	struct emm_stats st2 = heap_stats(h);
	expect_u64_eq(st2.hits - st1.hits, N);
	expect_u64_eq(st2.allocs - st1.allocs, N);
	expect_u64_eq(st2.live_blocks, N);
	expect_u64_eq(st2.allocated_bytes, N * 64 * KIB);
	expect_u64_eq(st2.requested_bytes, N * 64 * KIB);
	expect_u64_eq(st2.allocated_bytes_peak, N * 64 * KIB);
	for (unsigned i = 0; i < N; i++)
		xfree(a[i], 0);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_nonblocking_stream_waits_for_the_events)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_FENCE);
	emm_addr_t a[N], b[N];
	assert_ptr_not_null(h);

	emm_heap_stream_created(h, NB1, true);
	for (unsigned i = 0; i < N; i++)
		a[i] = xalloc(h, 64 * KIB, 0);
	for (unsigned i = 0; i < N; i++)
		xfree(a[i], 0);
	/* Closed with an event on the legacy stream and one on NB1; until they
	 * complete no block of it is handed out, from the cache or the arena. */
	for (unsigned i = 0; i < N; i++) {
		b[i] = xalloc(h, 64 * KIB, 0);
		expect_false(contains(a, N, b[i]));
	}
	expect_u64_eq(fence.records, 2);
	for (unsigned i = 0; i < N; i++)
		xfree(b[i], 0);
	fake_complete(&fence, 0);
	/* Complete: the arena's poll hands them out again. */
	emm_addr_t c = xalloc(h, 64 * KIB, 0);
	expect_true(contains(a, N, c) || contains(b, N, c));
	xfree(c, 0);
	emm_heap_stream_destroyed(h, NB1);
	fake_complete(&fence, 0);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_pressure_closes_the_thread_epoch)
{
	/* One 2 MiB small segment and no room for another. */
	emm_heap_t *h = setup(true, 2 * MIB, EMM_FREE_MODE_FENCE);
	emm_addr_t a[32];
	assert_ptr_not_null(h);

	for (unsigned i = 0; i < 32; i++)
		a[i] = xalloc(h, 64 * KIB, 0);
	for (unsigned i = 0; i < N / 2; i++)
		xfree(a[i], 0); /* half the quota, pending in the thread's epoch */
	expect_u64_eq(fence.records, 0);
	/* The cache misses with half the quota pending, a block among them
	 * that fits: the pressure rule closes the thread's epoch; no new
	 * segment, no OOM retry. */
	emm_addr_t b = xalloc(h, 64 * KIB, 0);
	expect_true(contains(a, N / 2, b));
	expect_u64_eq(fence.records, 1);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.backend_allocs, 1);
	expect_u64_eq(st.oom_retries, 0);
	xfree(b, 0);
	for (unsigned i = N / 2; i < 32; i++)
		xfree(a[i], 0);
	teardown(h);
}
TEST_END

/* A miss beside bins that together hold enough (a working set of other
 * sizes) goes to the arena: the thread's epoch keeps filling up to its
 * quota instead of closing at half of it, which doubled the epochs (and
 * the event records) of a working set of random sizes. */
TEST_BEGIN(test_miss_beside_full_bins_keeps_the_epoch)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_FENCE);
	emm_addr_t small[N], big[N];
	assert_ptr_not_null(h);

	/* N blocks of 64 KiB into the bins (a full epoch, closed at once). */
	for (unsigned i = 0; i < N; i++)
		small[i] = xalloc(h, 64 * KIB, 0);
	for (unsigned i = 0; i < N; i++)
		xfree(small[i], 0);
	expect_u64_eq(fence.records, 1);
	/* Half the quota of 1 MiB blocks pending. */
	for (unsigned i = 0; i < N / 2; i++)
		big[i] = xalloc(h, 1 * MIB, 0);
	for (unsigned i = 0; i < N / 2; i++)
		xfree(big[i], 0);
	expect_u64_eq(fence.records, 1);
	/* 256 KiB: no bin of its class, 1 MiB of 64 KiB blocks in the bins. */
	emm_addr_t b = xalloc(h, 256 * KIB, 0);
	expect_u64_eq(fence.records, 1);
	expect_false(contains(big, N / 2, b));
	xfree(b, 0);
	teardown(h);
}
TEST_END

/* The two-thread tests' handshake: a phase word each side moves on. */
static void phase_wait(atomic_int *phase, int v)
{
	while (atomic_load(phase) != v)
		sched_yield();
}

/* Start fn(h) on a thread and wait until it reaches phase 1. */
static void start_at_phase_1(pthread_t *t, void *(*fn)(void *), emm_heap_t *h, atomic_int *phase)
{
	atomic_store(phase, 0);
	assert_int_eq(pthread_create(t, NULL, fn, h), 0);
	phase_wait(phase, 1);
}

/* test_peak_of_blocks_freed_by_another_thread: this thread allocates N
 * blocks from its cache (its counters hold them, not yet the arena's) and
 * keeps them there while the main thread frees them. */
static emm_addr_t handed[N];
static atomic_int hand_phase;

static void *thread_cached_allocs(void *arg)
{
	emm_heap_t *h = arg;

	for (unsigned i = 0; i < N; i++)
		handed[i] = xalloc(h, 64 * KIB, 0);
	for (unsigned i = 0; i < N; i++)
		xfree(handed[i], 0); /* N frees: the epoch closes, the blocks go to the bins */
	for (unsigned i = 0; i < N; i++)
		handed[i] = xalloc(h, 64 * KIB, 0); /* cache hits: counted in this thread's delta */
	atomic_store(&hand_phase, 1);
	phase_wait(&hand_phase, 2);
	return NULL;
}

/* Another thread's frees reach the arena's counters before the allocations
 * they free (still in the allocating thread's cache): the arena's allocated
 * bytes are below zero for a while. The peaks must not read that as a huge
 * unsigned number (they did: 2^64 - 1 MiB in test-stress's thread-cache
 * runs, 6 of 8). */
TEST_BEGIN(test_peak_of_blocks_freed_by_another_thread)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_FENCE);
	pthread_t t;
	assert_ptr_not_null(h);

	start_at_phase_1(&t, thread_cached_allocs, h, &hand_phase);
	/* Into this thread's cache (same arena): N frees close its epoch,
	 * which adds its counters (-N blocks) to the arena's. */
	for (unsigned i = 0; i < N; i++)
		xfree(handed[i], 0);
	/* Another size class: the arena's own path, which raises its peak. */
	emm_addr_t b = xalloc(h, 4 * KIB, 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.live_blocks, 1);
	expect_u64_eq(st.allocated_bytes, 4 * KIB);
	expect_true(st.allocated_bytes_peak <= st.reserved_bytes_peak);
	expect_true(st.requested_bytes_peak <= st.reserved_bytes_peak);
	xfree(b, 0);
	atomic_store(&hand_phase, 2);
	pthread_join(t, NULL);
	st = heap_stats(h);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_true(st.allocated_bytes_peak <= st.reserved_bytes_peak);
	teardown(h);
}
TEST_END

/* The thread of test_pressure_refills_the_cache: N/2 pairs' frees pending,
 * then an allocation that finds them (the close), then, once the main
 * thread has read the arena's hits, the rest of them. */
static atomic_int lifo_phase;

static void *thread_lifo(void *arg)
{
	emm_heap_t *h = arg;
	emm_addr_t a[N];

	for (unsigned i = 0; i < N / 2; i++)
		a[i] = xalloc(h, 64 * KIB, 0);
	for (unsigned i = 0; i < N / 2; i++)
		xfree(a[i], 0);
	a[0] = xalloc(h, 64 * KIB, 0); /* closes the thread's epoch */
	atomic_store(&lifo_phase, 1);
	phase_wait(&lifo_phase, 2);
	for (unsigned i = 1; i < N / 2; i++)
		a[i] = xalloc(h, 64 * KIB, 0); /* from the cache */
	atomic_store(&lifo_phase, 3);
	phase_wait(&lifo_phase, 4);
	for (unsigned i = 0; i < N / 2; i++)
		xfree(a[i], 0);
	return NULL;
}

static uint64_t arena_hits(struct arena *a)
{
	arena_lock(a);
	uint64_t hits = a->st.hits;
	arena_unlock(a);
	return hits;
}

TEST_BEGIN(test_pressure_refills_the_cache)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_FENCE);
	pthread_t t;
	assert_ptr_not_null(h);

	start_at_phase_1(&t, thread_lifo, h, &lifo_phase);
	expect_u64_eq(fence.records, 1);
	/* The thread's next N/2 - 1 allocations are the cache's hits, none
	 * the arena's: the close gave its blocks back to the thread's cache,
	 * not to the arena (where they went before, through its open epoch).
	 * The cache's counters reach the arena only at its next close or
	 * flush. */
	struct arena *a = h->arenas[0];
	uint64_t hits = arena_hits(a);
	atomic_store(&lifo_phase, 2);
	phase_wait(&lifo_phase, 3);
	expect_u64_eq(arena_hits(a), hits);
	atomic_store(&lifo_phase, 4);
	pthread_join(t, NULL);
	expect_u64_eq(fence.records, 1);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_capture_keeps_the_epoch_open)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_FENCE);
	emm_addr_t a[N], b;
	assert_ptr_not_null(h);

	for (unsigned i = 0; i < N; i++)
		a[i] = xalloc(h, 64 * KIB, 0);
	fence.capture_sync = true;
	for (unsigned i = 0; i < N; i++)
		xfree(a[i], 0);
	expect_u64_eq(fence.records, 0); /* the close failed: -EBUSY */
	b = xalloc(h, 64 * KIB, 0);
	expect_false(contains(a, N, b));
	expect_u64_eq(heap_stats(h).pending_bytes, N * 64 * KIB);
	fence.capture_sync = false;
	expect_int_eq(emm_heap_flush(h), 0);
	xfree(b, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 0);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_double_free_of_a_cached_block)
{
	emm_heap_t *h = setup(false, SIZE_MAX, EMM_FREE_MODE_FENCE);
	assert_ptr_not_null(h);

	/* No fence ops: a free is ready at once, into the cache. */
	emm_addr_t a = xalloc(h, 4 * KIB, 0);
	xfree(a, 0);
	expect_int_eq(emm_heap_free(a, 0, NULL), -EINVAL);
	struct emm_block_range r;
	expect_int_eq(emm_heap_find_block(a, &r), -ENOENT);
	expect_u64_eq(xalloc(h, 4 * KIB, 0), a); /* the cache's block */
	xfree(a, 0);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_stream_mode_reuses_at_once)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_STREAM);
	assert_ptr_not_null(h);

	emm_addr_t a = xalloc(h, 100 * KIB, 0);
	xfree(a, 0);
	expect_u64_eq(xalloc(h, 100 * KIB, 0), a);
	/* A smaller request of the same size class is served unsplit... */
	xfree(a, 0);
	emm_addr_t b = xalloc(h, 98 * KIB, 0);
	expect_u64_eq(b, a);
	struct emm_block_range r;
	expect_int_eq(emm_heap_find_block(b, &r), 0);
	expect_u64_eq(r.size, 100 * KIB);
	expect_u64_eq(r.requested, 98 * KIB);
	xfree(b, 0);
	/* ... but never from a smaller block. */
	b = xalloc(h, 110 * KIB, 0);
	expect_true(b != a);
	xfree(b, 0);
	expect_u64_eq(fence.records, 0);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_release_idle_flushes_the_cache)
{
	emm_heap_t *h = setup(false, SIZE_MAX, EMM_FREE_MODE_FENCE);
	assert_ptr_not_null(h);

	emm_addr_t a = xalloc(h, 64 * KIB, 0);
	emm_addr_t big = xalloc(h, 4 * MIB, 0);
	xfree(a, 0);
	xfree(big, 0);
	/* Both sit in the cache; release_idle gives every segment back. */
	expect_int_eq(emm_heap_release_idle(h, 0), 22 * MIB);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.segments, 0);
	expect_u64_eq(st.reserved_bytes, 0);
	teardown(h);
}
TEST_END

/* release_idle of another heap with a cache (emm_release_idle visits every
 * heap in turn) moves the flush generation; this thread's own cache, still
 * bound to h, is flushed at h's release_idle all the same. */
TEST_BEGIN(test_release_idle_after_another_heaps)
{
	struct emm_heap_params p;
	struct fake_src src0;
	emm_heap_t *h0 = NULL, *h = setup(false, SIZE_MAX, EMM_FREE_MODE_FENCE);
	assert_ptr_not_null(h);

	emm_heap_params_default(&p);
	p.arenas = 1;
	p.thread_cache = true;
	fake_src_init(&src0, SIZE_MAX);
	struct emm_segment_source s0 = fake_src_ops(&src0);
	assert_int_eq(emm_heap_create(&p, &s0, NULL, 0, &h0), 0);

	emm_addr_t a = xalloc(h, 512 * KIB, 0);
	xfree(a, 0); /* in this thread's cache */
	expect_int_eq(emm_heap_release_idle(h0, 0), 0);
	expect_int_eq(emm_heap_release_idle(h, 0), 2 * MIB);
	expect_u64_eq(heap_stats(h).reserved_bytes, 0);
	emm_heap_destroy(h0, true);
	fake_src_fini(&src0);
	teardown(h);
}
TEST_END

static void *thread_pairs(void *arg)
{
	emm_heap_t *h = arg;
	emm_addr_t a[N];

	for (int round = 0; round < 3; round++) {
		for (unsigned i = 0; i < N; i++)
			a[i] = xalloc(h, 32 * KIB, 0);
		for (unsigned i = 0; i < N; i++)
			xfree(a[i], 0);
	}
	a[0] = xalloc(h, 32 * KIB, 0);
	xfree(a[0], 0); /* one pending block left in the thread's epoch */
	return NULL;
}

TEST_BEGIN(test_thread_exit_flushes)
{
	emm_heap_t *h = setup(true, SIZE_MAX, EMM_FREE_MODE_FENCE);
	pthread_t t;
	assert_ptr_not_null(h);

	assert_int_eq(pthread_create(&t, NULL, thread_pairs, h), 0);
	pthread_join(t, NULL);
	/* Its counters and blocks came back at exit. */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.allocs, 3 * N + 1);
	expect_u64_eq(st.frees, 3 * N + 1);
	expect_u64_eq(st.live_blocks, 0);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_u64_eq(st.pending_bytes, 32 * KIB);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_int_eq(emm_heap_release_idle(h, 0), 2 * MIB);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_oom_retry_flushes_the_cache)
{
	/* Room for two 2 MiB small segments and nothing else. */
	emm_heap_t *h = setup(false, 4 * MIB, EMM_FREE_MODE_FENCE);
	assert_ptr_not_null(h);

	emm_addr_t a = xalloc(h, 1 * MIB, 0);
	emm_addr_t b = xalloc(h, 1 * MIB, 0);
	emm_addr_t c = xalloc(h, 1 * MIB, 0);
	xfree(a, 0);
	xfree(b, 0); /* one whole segment idle, in the cache */
	expect_u64_eq(heap_stats(h).reserved_bytes, 4 * MIB);
	/* An 18 MiB segment cannot come; the OOM retry gave back the cache's
	 * idle segment on the way. */
	emm_addr_t big;
	expect_int_eq(emm_heap_alloc(h, 3 * MIB, 0, &big), -ENOMEM);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 1);
	expect_u64_eq(st.reserved_bytes, 2 * MIB);
	xfree(c, 0);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_destroy_forgets_the_cache)
{
	emm_heap_t *h = setup(false, SIZE_MAX, EMM_FREE_MODE_FENCE);
	assert_ptr_not_null(h);

	emm_addr_t a = xalloc(h, 8 * KIB, 0);
	xfree(a, 0); /* in the cache */
	emm_heap_destroy(h, true);
	expect_u64_eq(src.used, 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
	/* A new heap (maybe at the same address): the old blocks are gone. */
	h = setup(false, SIZE_MAX, EMM_FREE_MODE_FENCE);
	assert_ptr_not_null(h);
	emm_addr_t b = xalloc(h, 8 * KIB, 0);
	struct emm_block_range r;
	expect_int_eq(emm_heap_find_block(b, &r), 0);
	expect_ptr_eq(r.heap, h);
	xfree(b, 0);
	expect_u64_eq(heap_stats(h).live_blocks, 0);
	teardown(h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_reuse_after_the_thread_epoch_closes, test_nonblocking_stream_waits_for_the_events,
	                    test_pressure_closes_the_thread_epoch, test_miss_beside_full_bins_keeps_the_epoch,
	                    test_peak_of_blocks_freed_by_another_thread,
	                    test_pressure_refills_the_cache, test_capture_keeps_the_epoch_open,
	                    test_double_free_of_a_cached_block, test_release_idle_after_another_heaps,
	                    test_stream_mode_reuses_at_once, test_release_idle_flushes_the_cache,
	                    test_thread_exit_flushes, test_oom_retry_flushes_the_cache,
	                    test_destroy_forgets_the_cache, NULL);
}
