/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-heap-lazy.c - closing an epoch by bytes only when
 * memory is needed (issue 11, item 3): a synchronous free closes the open
 * epoch by count (EMM_EPOCH_BLOCKS) or at the hard bound (16 times
 * EMM_EPOCH_BYTES); below it an allocation that misses while the epoch holds
 * EMM_EPOCH_BYTES closes it and polls it at once.
 *
 *   - a LIFO loop of 64 MiB pairs records no event at any free and reuses
 *     one block (one segment from the source), with and without an idle
 *     non-blocking stream, through the arena and through the thread cache's
 *     path (blocks over 8 MiB take the arena's);
 *   - frees no allocation asks for again record nothing;
 *   - a miss for half EMM_EPOCH_BYTES or more closes an epoch holding any
 *     block of its pool before reserving a segment;
 *   - the bytes close at the miss serves a request no single pending block
 *     fits (the freed neighbours merge), and the hard bound still closes at
 *     the free; so does EMM_EPOCH_BYTES on a heap with a release threshold
 *     (the memory goes back at the free);
 *   - the fence rules stay: a block freed while a non-blocking stream is
 *     busy is not reused until both the legacy and that stream's events
 *     complete;
 *   - the thread cache's own epoch: 4 MiB blocks up to EMM_EPOCH_BYTES close
 *     at the next allocation, not at the free that passed the bytes.
 *
 * The fence double (heap_doubles.h) aborts if called under an allocator
 * lock, so every close here also checks that rule.
 */
#include <errno.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define NB1 ((emm_stream_t)0x3000)

static struct fake_src src;
static struct fake_fence fence;

#define CHECKH(h) expect_int_eq(emm_heap_check(h), 0)

static emm_heap_t *setup(struct emm_heap_params *p, size_t capacity)
{
	emm_heap_t *h = NULL;

	fake_src_init(&src, capacity);
	fake_fence_init(&fence);
	fence.idle_model = true;
	struct emm_segment_source s = fake_src_ops(&src);
	struct emm_fence_ops f = fake_fence_ops(&fence);
	if (emm_heap_create(p, &s, &f, 0, &h))
		return NULL;
	return h;
}

static struct emm_heap_params params(bool tcache)
{
	struct emm_heap_params p;

	emm_heap_params_default(&p); /* 64 frees, 64 MiB */
	p.arenas = 1;
	p.thread_cache = tcache;
	p.oom_retry = false;
	return p;
}

static void teardown(emm_heap_t *h)
{
	fake_complete(&fence, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	fake_heap_destroy_checked(h, &src, &fence);
}

/* PAIRS LIFO pairs of `size`: no event recorded by any free, the same block
 * every time, one segment. */
static void lifo_loop(bool tcache, bool idle_nb, size_t size)
{
	enum { PAIRS = 200 };
	struct emm_heap_params p = params(tcache);
	emm_heap_t *h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);
	if (idle_nb) {
		emm_heap_stream_created(h, NB1, true);
		fence.auto_complete = true; /* the legacy event done at its first query */
	}
	emm_addr_t first = 0;
	unsigned free_records = 0;

	for (int i = 0; i < PAIRS; i++) {
		emm_addr_t a = xalloc(h, size, 0);
		if (i == 0)
			first = a;
		expect_u64_eq(a, first);
		unsigned before = fence.records;
		xfree(a, 0);
		free_records += fence.records - before;
	}
	struct emm_stats st = heap_stats(h);
	expect_int_eq(free_records, 0);
	expect_int_eq(src.allocs, 1);
	expect_u64_eq(st.backend_allocs, 1);
	/* Each allocation after the first closed the epoch its block was in:
	 * one legacy event per pair, recorded by the miss. */
	expect_u64_eq(st.epochs_closed, PAIRS - 1);
	expect_u64_eq(st.events_recorded, PAIRS - 1);
	expect_int_eq(fake_records_on(&fence, NB1), 0);
	/* The fast path: ready at the close, an idle stream waiting for the
	 * legacy event (no query, no host wait). */
	expect_u64_eq(st.event_queries, 0);
	expect_u64_eq(st.host_waits, 0);
	expect_int_eq(fence.nwaits, idle_nb ? PAIRS - 1 : 0);
	CHECKH(h);
	if (idle_nb)
		emm_heap_stream_destroyed(h, NB1);
	teardown(h);
}

TEST_BEGIN(test_lifo_64m)
{
	lifo_loop(false, false, 64 * MIB);
}
TEST_END

TEST_BEGIN(test_lifo_64m_tcache)
{
	lifo_loop(true, false, 64 * MIB);
}
TEST_END

TEST_BEGIN(test_lifo_64m_idle_stream)
{
	lifo_loop(false, true, 64 * MIB);
}
TEST_END

TEST_BEGIN(test_lifo_256m)
{
	lifo_loop(false, false, 256 * MIB);
}
TEST_END

/* Large frees that no allocation asks for again close nothing; an
 * allocation that hits does not close either. */
TEST_BEGIN(test_unneeded_frees_record_nothing)
{
	struct emm_heap_params p = params(false);
	emm_heap_t *h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t big[3];

	for (int i = 0; i < 3; i++)
		big[i] = xalloc(h, 64 * MIB, 0);
	for (int i = 0; i < 3; i++)
		xfree(big[i], 0);
	/* Fewer than the count quota (64) in all. */
	for (int i = 0; i < 20; i++)
		xfree(xalloc(h, 4 * KIB, 0), 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.events_recorded, 0);
	expect_u64_eq(st.epochs_closed, 0);
	expect_u64_eq(st.pending_bytes, 192 * MIB + 20 * 4 * KIB);
	expect_int_eq(fence.records, 0);
	/* The first large miss closes it: all three come back. */
	emm_addr_t a = xalloc(h, 64 * MIB, 0);
	expect_true(a == big[0] || a == big[1] || a == big[2]);
	st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.backend_allocs, 4); /* 3 large segments, 1 small */
	xfree(a, 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* EMM_EPOCH_BYTES reached by blocks none of which fits the miss: the close
 * lets them merge and serve it. The hard bound (16x) still closes at the
 * free. */
TEST_BEGIN(test_bytes_close_at_miss)
{
	struct emm_heap_params p = params(false);
	p.epoch_max_bytes = 1 * MIB;
	emm_heap_t *h = setup(&p, 2 * MIB); /* one small segment, nothing more */
	assert_ptr_not_null(h);
	emm_addr_t blk[4];

	for (int i = 0; i < 4; i++)
		blk[i] = xalloc(h, 512 * KIB, 0);
	xfree(blk[0], 0);
	xfree(blk[1], 0);
	expect_u64_eq(heap_stats(h).epochs_closed, 0); /* 1 MiB freed: no close at the free */
	expect_u64_eq(heap_stats(h).pending_bytes, 1 * MIB);
	emm_addr_t a = xalloc(h, 1 * MIB, 0);
	expect_u64_eq(a, blk[0]);
	expect_u64_eq(heap_stats(h).epochs_closed, 1);
	xfree(a, 0);
	xfree(blk[2], 0);
	xfree(blk[3], 0);
	CHECKH(h);
	teardown(h);

	/* The hard bound: 16 MiB (16 x 1 MiB) closes at the free. */
	p = params(false);
	p.epoch_max_bytes = 1 * MIB;
	h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t x = xalloc(h, 14 * MIB, 0), y = xalloc(h, 2 * MIB, 0);
	xfree(x, 0);
	expect_u64_eq(heap_stats(h).epochs_closed, 0);
	xfree(y, 0);
	expect_u64_eq(heap_stats(h).epochs_closed, 1);
	expect_u64_eq(heap_stats(h).pending_bytes, 0); /* the fast path */
	CHECKH(h);
	teardown(h);
}
TEST_END

/* A heap with a release threshold closes by bytes at the free, as before:
 * the freed 64 MiB segment goes back at once. */
TEST_BEGIN(test_release_threshold_closes_at_free)
{
	struct emm_heap_params p = params(false);
	p.release_threshold = 0;
	emm_heap_t *h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);

	xfree(xalloc(h, 64 * MIB, 0), 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.backend_frees, 1);
	expect_u64_eq(st.reserved_bytes, 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* A miss for half EMM_EPOCH_BYTES or more closes an epoch holding any
 * block of its pool before it reserves a segment (PyTorch's large tensors
 * whose sizes change: each such new segment stays): a freed 48 MiB block
 * serves the next 40 MiB, and a 32 MiB LIFO loop keeps one block. A 16 MiB
 * request still grows (below). */
TEST_BEGIN(test_half_bytes_close_before_segment)
{
	struct emm_heap_params p = params(false);
	emm_heap_t *h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);

	emm_addr_t a = xalloc(h, 48 * MIB, 0);
	xfree(a, 0);
	expect_u64_eq(heap_stats(h).epochs_closed, 0);
	emm_addr_t b = xalloc(h, 40 * MIB, 0);
	expect_u64_eq(b, a);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.backend_allocs, 1);
	xfree(b, 0);
	emm_addr_t c = xalloc(h, 16 * MIB, 0); /* a quarter: grows */
	st = heap_stats(h);
	expect_u64_eq(st.backend_allocs, 2);
	expect_u64_eq(st.epochs_closed, 1);
	xfree(c, 0);
	for (int i = 0; i < 50; i++)
		xfree(xalloc(h, 32 * MIB, 0), 0);
	st = heap_stats(h);
	expect_u64_eq(st.backend_allocs, 2);
	expect_true(st.epochs_closed >= 50);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* Below the bytes, a miss grows as before (the count rule's pressure aside):
 * a 16 MiB LIFO loop keeps four blocks and closes one epoch per four pairs. */
TEST_BEGIN(test_lifo_16m_amortized)
{
	enum { PAIRS = 400 };
	struct emm_heap_params p = params(false);
	emm_heap_t *h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);

	for (int i = 0; i < PAIRS; i++)
		xfree(xalloc(h, 16 * MIB, 0), 0);
	struct emm_stats st = heap_stats(h);
	expect_true(st.backend_allocs <= 5);
	expect_true(st.epochs_closed <= PAIRS / 4 + 1);
	expect_true(st.epochs_closed >= PAIRS / 4 - 2);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* A block freed while a non-blocking stream is busy: the miss closes the
 * epoch (an event on the legacy stream and one on the busy stream) and polls
 * it, and the block stays out of reach until both have completed. */
static void busy_stream_waits(bool tcache)
{
	struct emm_heap_params p = params(tcache);
	emm_heap_t *h = setup(&p, 64 * MIB); /* room for one 64 MiB block */
	assert_ptr_not_null(h);
	emm_addr_t r = 0;

	emm_heap_stream_created(h, NB1, true);
	fake_set_busy(&fence, NB1, true);
	emm_addr_t a = xalloc(h, 64 * MIB, 0);
	xfree(a, 0);
	expect_int_eq(fence.records, 0);
	expect_int_eq(emm_heap_alloc(h, 64 * MIB, 0, &r), -ENOMEM);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_int_eq(fake_records_on(&fence, EMM_STREAM_LEGACY), 1);
	expect_int_eq(fake_records_on(&fence, NB1), 1);
	expect_u64_eq(st.pending_bytes, 64 * MIB);
	fake_complete(&fence, EMM_STREAM_LEGACY);
	expect_int_eq(emm_heap_alloc(h, 64 * MIB, 0, &r), -ENOMEM); /* NB1's still pending */
	fake_set_busy(&fence, NB1, false);
	fake_complete(&fence, NB1);
	emm_addr_t b = xalloc(h, 64 * MIB, 0);
	expect_u64_eq(b, a);
	expect_int_eq(fence.records, 2); /* nothing more recorded meanwhile */
	xfree(b, 0);
	CHECKH(h);
	emm_heap_stream_destroyed(h, NB1);
	teardown(h);
}

TEST_BEGIN(test_busy_stream_waits)
{
	busy_stream_waits(false);
}
TEST_END

TEST_BEGIN(test_busy_stream_waits_tcache)
{
	busy_stream_waits(true);
}
TEST_END

/* The thread cache's epoch: sixteen 4 MiB frees reach EMM_EPOCH_BYTES. The
 * sixteenth does not close it, nor do allocations the arena serves from
 * ready memory (the rest of the fourth 20 MiB segment): bytes close an
 * epoch only when memory is needed, as in the arena. The next allocation,
 * which the arena cannot serve, closes it (in the arena's miss path: the
 * epoch joins the arena's open one, which the pressure rule closes) and
 * takes a block of it, no new segment. Before section 38 the cache closed
 * at the first of those misses; on 16 threads of a working set it closed
 * 41 % more epochs than the arenas (tests/bench/RESULTS.md, run J5). */
TEST_BEGIN(test_tcache_bytes_at_miss)
{
	struct emm_heap_params p = params(true);
	emm_heap_t *h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t blk[16], spare[4];

	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 4 * MIB, 0);
	for (int i = 0; i < 16; i++)
		xfree(blk[i], 0);
	for (int i = 0; i < 4; i++)
		spare[i] = xalloc(h, 4 * MIB, 0);
	expect_int_eq(fence.records, 0);
	unsigned allocs = src.allocs;
	emm_addr_t a = xalloc(h, 4 * MIB, 0);
	expect_int_eq(fence.records, 1);
	expect_int_eq(src.allocs, allocs);
	bool found = false;
	for (int i = 0; i < 16; i++)
		found |= a == blk[i];
	expect_true(found);
	xfree(a, 0);
	for (int i = 0; i < 4; i++)
		xfree(spare[i], 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_lifo_64m, test_lifo_64m_tcache, test_lifo_64m_idle_stream, test_lifo_256m,
	                    test_unneeded_frees_record_nothing, test_bytes_close_at_miss, test_release_threshold_closes_at_free,
	                    test_half_bytes_close_before_segment, test_lifo_16m_amortized,
	                    test_busy_stream_waits, test_busy_stream_waits_tcache, test_tcache_bytes_at_miss,
	                    NULL);
}
