/* SPDX-License-Identifier: MIT */
/*
 * test-heap: the caching allocator's rules one at a time, with
 * emm_heap_check after every step. Splitting and coalescing, best fit and
 * exact reuse, stream-keyed reuse and stealing, epochs (count, bytes at
 * the hard bound, pressure, the no-non-blocking-stream fast path,
 * capture), fences that complete only when the test says so, stream destroy, the strict and
 * stream free modes, the OOM retry, release, and the error codes.
 */
#include <errno.h>

#include "allocator/heap.h"
#include "allocator/heap_internal.h" /* emm_heap_thread_arena */
#include "allocator/ptrmap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

#define S1  ((emm_stream_t)0x1000)
#define S2  ((emm_stream_t)0x2000)
#define NB1 ((emm_stream_t)0x3000)

static struct fake_src src;
static struct fake_fence fence;

#define CHECKH(h) expect_int_eq(emm_heap_check(h), 0)

static emm_heap_t *setup(const struct emm_heap_params *p, bool with_fence, size_t capacity)
{
	emm_heap_t *h = NULL;
	fake_src_init(&src, capacity);
	fake_fence_init(&fence);
	struct emm_segment_source s = fake_src_ops(&src);
	struct emm_fence_ops f = fake_fence_ops(&fence);
	if (emm_heap_create(p, &s, with_fence ? &f : NULL, 0, &h))
		return NULL;
	return h;
}

/* Destroy and verify nothing leaked: every segment back, every event
 * released once, no misuse. */
static void teardown(emm_heap_t *h)
{
	CHECKH(h);
	emm_heap_destroy(h, true);
	expect_int_eq(src.bad_frees, 0);
	expect_u64_eq(src.used, 0);
	expect_int_eq(src.frees, src.allocs);
	expect_int_eq(fence.misuse, 0);
	expect_int_eq(fake_live_events(&fence), 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

static struct emm_heap_params defaults(void)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	/* The epoch tests count frees against a quota of 16. */
	p.epoch_max_blocks = 16;
	return p;
}

TEST_BEGIN(test_create_args)
{
	struct emm_heap_params p = defaults();
	struct fake_src s0;
	fake_src_init(&s0, 1);
	struct emm_segment_source s = fake_src_ops(&s0);
	emm_heap_t *h = NULL;
	expect_int_eq(emm_heap_create(NULL, &s, NULL, 0, &h), -EINVAL);
	expect_int_eq(emm_heap_create(&p, NULL, NULL, 0, &h), -EINVAL);
	p.small_segment = 1000;
	expect_int_eq(emm_heap_create(&p, &s, NULL, 0, &h), -EINVAL);
	p = defaults();
	p.large_round = 0;
	expect_int_eq(emm_heap_create(&p, &s, NULL, 0, &h), -EINVAL);
	p = defaults();
	struct emm_fence_ops bad = {0};
	expect_int_eq(emm_heap_create(&p, &s, &bad, 0, &h), -EINVAL);
	expect_ptr_null(h);
	assert_int_eq(emm_heap_create(&p, &s, NULL, 7, &h), 0);
	expect_int_eq(emm_heap_device(h), 7);
	emm_heap_destroy(h, true);
	fake_src_fini(&s0);
}
TEST_END

/* Split a small segment into many blocks, free them in a scrambled order:
 * neighbours coalesce back into one whole segment. */
TEST_BEGIN(test_split_merge)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);
	enum { N = 40 };
	emm_addr_t a[N];
	size_t sz[N], total = 0;

	for (int i = 0; i < N; i++) {
		sz[i] = 512 * (size_t)(1 + (i * 7) % 13);
		a[i] = xalloc(h, sz[i] - (i % 3), EMM_STREAM_SYNC);
		if (i > 0)
			expect_u64_eq(a[i], a[i - 1] + sz[i - 1]); /* carved in order */
		total += sz[i];
		CHECKH(h);
	}
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.segments, 1);
	expect_u64_eq(st.allocated_bytes, total);
	expect_u64_eq(st.live_blocks, N);
	expect_u64_eq(st.splits, N);
	expect_u64_eq(st.misses, 1);
	expect_u64_eq(st.hits, N - 1);

	for (int k = 0; k < N; k++) {
		int i = (k * 17) % N; /* 17 is coprime with 40: a permutation */
		size_t req = 0;
		expect_int_eq(emm_heap_free(a[i], EMM_STREAM_SYNC, &req), 0);
		expect_u64_eq(req, sz[i] - (i % 3));
		CHECKH(h);
	}
	st = heap_stats(h);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_u64_eq(st.requested_bytes, 0);
	expect_u64_eq(st.live_blocks, 0);
	expect_u64_eq(st.frees, N);
	expect_u64_eq(st.merges, N); /* N+1 pieces became 1 */
	size_t idle = 0, largest = 0;
	emm_heap_idle_info(h, &idle, &largest);
	expect_u64_eq(idle, 2 * MIB);
	expect_u64_eq(largest, 2 * MIB);

	/* The same first request gets the same address again. */
	expect_u64_eq(xalloc(h, sz[0], EMM_STREAM_SYNC), a[0]);
	teardown(h);
}
TEST_END

/* Best fit: the smallest hole that fits, lowest address among equals. */
TEST_BEGIN(test_best_fit)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t h4 = xalloc(h, 4 * KIB, 0);
	emm_addr_t l1 = xalloc(h, 512, 0);
	emm_addr_t h8 = xalloc(h, 8 * KIB, 0);
	emm_addr_t l2 = xalloc(h, 512, 0);
	emm_addr_t h16 = xalloc(h, 16 * KIB, 0);
	emm_addr_t l3 = xalloc(h, 512, 0);
	emm_addr_t h8b = xalloc(h, 8 * KIB, 0);
	emm_addr_t l4 = xalloc(h, 512, 0);
	xfree(h16, 0);
	xfree(h8b, 0);
	xfree(h4, 0);
	xfree(h8, 0);
	CHECKH(h);
	expect_u64_eq(xalloc(h, 6 * KIB, 0), h8);  /* 8K holes: lowest address */
	expect_u64_eq(xalloc(h, 6 * KIB, 0), h8b); /* the other 8K hole */
	expect_u64_eq(xalloc(h, 3 * KIB, 0), h4);
	expect_u64_eq(xalloc(h, 12 * KIB, 0), h16);
	expect_u64_eq(xalloc(h, 2 * KIB, 0), h8 + 6 * KIB); /* the 2K left of the first 8K hole */
	CHECKH(h);
	(void)l1;
	(void)l2;
	(void)l3;
	(void)l4;
	teardown(h);
}
TEST_END

/* Large pool: split only with a remainder above 1 MiB. */
TEST_BEGIN(test_large_split_rules)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);

	emm_addr_t a = xalloc(h, 18 * MIB + 512 * KIB, 0); /* 20 MiB segment, 1.5 MiB remainder: split */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.reserved_bytes, 20 * MIB);
	expect_u64_eq(st.allocated_bytes, 18 * MIB + 512 * KIB);
	expect_u64_eq(st.splits, 1);

	emm_addr_t b = xalloc(h, 19 * MIB + 512 * KIB, 0); /* 0.5 MiB remainder: whole 20 MiB block */
	st = heap_stats(h);
	expect_u64_eq(st.reserved_bytes, 40 * MIB);
	expect_u64_eq(st.allocated_bytes, 18 * MIB + 512 * KIB + 20 * MIB);
	expect_u64_eq(st.splits, 1);

	/* Exactly 1 MiB left: not split either (must be > 1 MiB). */
	emm_addr_t c = xalloc(h, 19 * MIB, 0);
	st = heap_stats(h);
	expect_u64_eq(st.splits, 1);
	expect_u64_eq(st.allocated_bytes, 18 * MIB + 512 * KIB + 40 * MIB);

	/* A 2 MiB request shares a 20 MiB segment and leaves 18 MiB. */
	emm_addr_t d = xalloc(h, 2 * MIB, 0);
	emm_addr_t e = xalloc(h, 3 * MIB, 0);
	expect_u64_eq(e, d + 2 * MIB);
	CHECKH(h);
	/* The 1.5 MiB remainder of a's segment is the best fit for a large
	 * 1.25 MiB request; small requests never come from the large pool. */
	emm_addr_t g = xalloc(h, 1 * MIB + 256 * KIB, 0);
	expect_u64_eq(g, a + 18 * MIB + 512 * KIB);
	emm_addr_t f = xalloc(h, 512 * KIB, 0);
	st = heap_stats(h);
	expect_u64_eq(st.reserved_bytes, 82 * MIB); /* 4x20 large + 2 small */
	xfree(g, 0);
	xfree(a, 0);
	xfree(b, 0);
	xfree(c, 0);
	xfree(d, 0);
	xfree(e, 0);
	xfree(f, 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* Blocks >= max_split are never split and serve only requests >= max_split
 * within max_nosplit_slack of their size. */
TEST_BEGIN(test_max_split)
{
	struct emm_heap_params p = defaults();
	p.max_split = 32 * MIB;
	emm_heap_t *h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);

	emm_addr_t big = xalloc(h, 40 * MIB, 0);
	xfree(big, 0);
	emm_addr_t small = xalloc(h, 16 * MIB, 0); /* not from the 40 MiB block */
	expect_true(small != big);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.segments, 2);

	emm_addr_t a = xalloc(h, 36 * MIB, 0); /* within 20 MiB: the whole 40 MiB block */
	expect_u64_eq(a, big);
	st = heap_stats(h);
	expect_u64_eq(st.segments, 2);
	expect_u64_eq(st.allocated_bytes, 56 * MIB);
	expect_u64_eq(st.splits, 0);
	xfree(a, 0);

	emm_addr_t c = xalloc(h, 64 * MIB, 0);
	xfree(c, 0);
	/* 42 MiB: the 64 MiB block is 22 MiB too big, the 40 MiB one too
	 * small: a new segment. */
	emm_addr_t d = xalloc(h, 42 * MIB, 0);
	expect_true(d != c && d != big);
	st = heap_stats(h);
	expect_u64_eq(st.segments, 4);
	emm_addr_t e = xalloc(h, 50 * MIB, 0); /* 14 MiB slack: the 64 MiB block */
	expect_u64_eq(e, c);
	xfree(small, 0);
	xfree(d, 0);
	xfree(e, 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* Stream-ordered frees: reusable at once on the same stream, preferred
 * there over ready-any blocks, not handed to synchronous allocations while
 * ready-any memory exists. */
TEST_BEGIN(test_stream_reuse)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);

	emm_addr_t a = xalloc(h, 256 * KIB, S1);
	emm_addr_t b = xalloc(h, 256 * KIB, S1);
	xfree(a, S1);
	CHECKH(h);
	expect_u64_eq(xalloc(h, 256 * KIB, S1), a);
	xfree(a, S1);
	emm_addr_t c = xalloc(h, 256 * KIB, EMM_STREAM_SYNC); /* ready-any remainder, not a */
	expect_u64_eq(c, b + 256 * KIB);
	emm_addr_t d = xalloc(h, 256 * KIB, S2); /* S2 has nothing: ready-any */
	expect_u64_eq(d, c + 256 * KIB);
	/* a (ready on S1) and the remainder (ready-any) are neighbours but
	 * differ in key: not merged. */
	CHECKH(h);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.events_recorded, 0);
	expect_u64_eq(st.stream_waits, 0);
	/* Adjacent frees on the same stream merge. */
	xfree(b, S1);
	st = heap_stats(h);
	expect_u64_eq(st.merges, 1); /* a+b merged; a's frees merged nothing */
	expect_u64_eq(xalloc(h, 512 * KIB, S1), a);
	xfree(a, S1);
	xfree(c, 0);
	xfree(d, 0);
	teardown(h);
}
TEST_END

/* Fill one 2 MiB small segment on stream S1 with two 1 MiB blocks. */
static void fill_on(emm_heap_t *h, emm_stream_t s, emm_addr_t *x, emm_addr_t *y)
{
	*x = xalloc(h, 1 * MIB, s);
	*y = xalloc(h, 1 * MIB, s);
}

/* The miss path steals another stream's ready block: event on the legacy
 * stream (blocking-class owner) or on the owner itself (non-blocking), and
 * a GPU-side wait on the allocating stream. */
TEST_BEGIN(test_steal)
{
	struct emm_heap_params p = defaults();
	p.oom_retry = false;
	emm_heap_t *h = setup(&p, true, 2 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a, b;

	fill_on(h, S1, &a, &b);
	xfree(a, S1);
	expect_u64_eq(xalloc(h, 1 * MIB, S2), a); /* stolen */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.stream_waits, 1);
	expect_u64_eq(st.events_recorded, 1);
	expect_u64_eq(st.backend_allocs, 1);
	expect_int_eq(fence.nwaits, 1);
	expect_u64_eq(fence.waits[0].stream, S2);
	expect_u64_eq(fence.ev[fence.waits[0].event - 1].stream, EMM_STREAM_LEGACY);
	CHECKH(h);

	/* Non-blocking owner: the event goes on that stream. */
	emm_heap_stream_created(h, NB1, true);
	xfree(a, S2);
	expect_u64_eq(xalloc(h, 1 * MIB, NB1), a); /* NB1 steals from S2 (blocking): legacy */
	expect_u64_eq(fence.ev[fence.waits[1].event - 1].stream, EMM_STREAM_LEGACY);
	xfree(a, NB1);
	expect_u64_eq(xalloc(h, 1 * MIB, S1), a); /* S1 steals from NB1: event on NB1 */
	expect_u64_eq(fence.waits[2].stream, S1);
	expect_u64_eq(fence.ev[fence.waits[2].event - 1].stream, NB1);

	/* A synchronous allocation may steal only a completed fence. */
	xfree(a, S1);
	emm_addr_t r = 0;
	expect_int_eq(emm_heap_alloc(h, 1 * MIB, EMM_STREAM_SYNC, &r), -ENOMEM);
	expect_u64_eq(r, 0);
	fence.auto_complete = true;
	expect_u64_eq(xalloc(h, 1 * MIB, EMM_STREAM_SYNC), a);
	st = heap_stats(h);
	expect_u64_eq(st.stream_waits, 3); /* NB1 came before any epoch: no creation wait */
	expect_u64_eq(st.ooms, 1);
	xfree(a, 0);
	xfree(b, S1);
	expect_int_eq(emm_heap_flush(h), 0); /* events complete at once now */
	expect_u64_eq(heap_stats(h).pending_bytes, 0);

	/* A capturing allocating stream does not steal. */
	fill_on(h, S1, &a, &b);
	xfree(a, S1);
	fence.capture_stream = S2;
	expect_int_eq(emm_heap_alloc(h, 1 * MIB, S2, &r), -ENOMEM);
	fence.capture_stream = 0;
	expect_u64_eq(xalloc(h, 1 * MIB, S2), a);
	xfree(a, S2);
	xfree(b, S1);
	emm_heap_stream_destroyed(h, NB1);
	teardown(h);
}
TEST_END

/* FENCE mode: a synchronous free puts the block in the open epoch, where no
 * allocation can reach it; with no non-blocking stream the epoch's close
 * makes its blocks ready at once. */
TEST_BEGIN(test_epoch_fast_path)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t blk[16];
	uint64_t ev1 = 0, ev2 = 0;

	expect_int_eq(emm_heap_last_fence(h, &ev1), -ENOENT);
	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 4 * KIB, 0);
	xfree(blk[0], 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 4 * KIB);
	expect_u64_eq(st.allocated_bytes, 15 * 4 * KIB);
	emm_addr_t x = xalloc(h, 4 * KIB, 0);
	expect_true(x != blk[0]); /* pending: out of reach */
	CHECKH(h);
	for (int i = 1; i < 15; i++) {
		xfree(blk[i], 0);
		CHECKH(h);
	}
	st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 0);
	expect_u64_eq(st.pending_bytes, 15 * 4 * KIB);
	xfree(blk[15], 0); /* the 16th: closes */
	st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.events_recorded, 1);
	expect_u64_eq(st.pending_bytes, 0);
	expect_u64_eq(st.event_queries, 0);
	expect_int_eq(emm_heap_last_fence(h, &ev1), 0);
	expect_u64_eq(fence.ev[ev1 - 1].stream, EMM_STREAM_LEGACY);
	expect_false(fence.ev[ev1 - 1].done); /* ready without waiting for it */
	CHECKH(h);
	expect_u64_eq(xalloc(h, 4 * KIB, 0), blk[0]);

	/* A second close replaces (and releases) the last fence. */
	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 4 * KIB, 0);
	for (int i = 0; i < 16; i++)
		xfree(blk[i], 0);
	expect_int_eq(emm_heap_last_fence(h, &ev2), 0);
	expect_true(ev2 != ev1);
	expect_true(fence.ev[ev1 - 1].released);
	expect_false(fence.ev[ev2 - 1].released);

	/* A new non-blocking stream waits on it, once. */
	emm_heap_stream_created(h, NB1, true);
	emm_heap_stream_created(h, NB1, true);
	emm_heap_stream_created(h, S1, false);
	expect_int_eq(fence.nwaits, 1);
	expect_u64_eq(fence.waits[0].stream, NB1);
	expect_u64_eq(fence.waits[0].event, ev2);
	emm_heap_stream_destroyed(h, NB1);
	xfree(x, 0);
	xfree(blk[0] == x ? 0 : xalloc(h, 4 * KIB, 0), 0);
	teardown(h);
}
TEST_END

/* Host-accessible memory (pinned): even with no non-blocking stream the
 * closed epoch's blocks wait for the legacy event to complete, because the
 * host writes a reused block at once, outside every stream. The H200 race
 * test caught the fast path handing out a pinned block under a copy. */
TEST_BEGIN(test_epoch_host_accessible)
{
	struct emm_heap_params p = defaults();
	p.oom_retry = false;
	p.host_accessible = true;
	emm_heap_t *h = setup(&p, true, 2 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t blk[16], r = 0;

	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 128 * KIB, 0);
	for (int i = 0; i < 16; i++)
		xfree(blk[i], 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.events_recorded, 1);
	expect_u64_eq(st.pending_bytes, 2 * MIB); /* not ready at close */
	CHECKH(h);
	expect_int_eq(emm_heap_alloc(h, 128 * KIB, 0, &r), -ENOMEM);
	fake_complete(&fence, EMM_STREAM_LEGACY);
	emm_addr_t a = xalloc(h, 128 * KIB, 0);
	expect_u64_eq(a, blk[0]);
	expect_u64_eq(heap_stats(h).pending_bytes, 0);
	expect_u64_eq(heap_stats(h).host_waits, 0);
	xfree(a, 0);
	teardown(h);
}
TEST_END

/* With a live non-blocking stream, a closed epoch's blocks wait for every
 * one of its events (queried on the miss path). */
TEST_BEGIN(test_epoch_nonblocking)
{
	struct emm_heap_params p = defaults();
	p.oom_retry = false;
	emm_heap_t *h = setup(&p, true, 2 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t blk[16];

	emm_heap_stream_created(h, NB1, true);
	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 128 * KIB, 0);
	for (int i = 0; i < 16; i++)
		xfree(blk[i], 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.events_recorded, 2);
	expect_u64_eq(st.pending_bytes, 2 * MIB);
	CHECKH(h);

	emm_addr_t r = 0;
	expect_int_eq(emm_heap_alloc(h, 128 * KIB, 0, &r), -ENOMEM);
	st = heap_stats(h);
	expect_u64_eq(st.event_queries, 1);
	expect_u64_eq(st.ooms, 1);

	fake_complete(&fence, EMM_STREAM_LEGACY);
	expect_int_eq(emm_heap_alloc(h, 128 * KIB, 0, &r), -ENOMEM); /* NB1's event still pending */
	st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 2 * MIB);

	fake_complete(&fence, NB1);
	emm_addr_t a = xalloc(h, 128 * KIB, 0);
	expect_u64_eq(a, blk[0]);
	st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 0);
	expect_u64_eq(st.backend_allocs, 1);
	expect_u64_eq(st.merges, 15); /* the 16 pieces coalesced, then split again */
	CHECKH(h);
	xfree(a, 0);
	emm_heap_stream_destroyed(h, NB1);
	expect_int_eq(emm_heap_flush(h), 0);
	teardown(h);
}
TEST_END

/* Closing by bytes at the free: only at the hard bound (16 x
 * epoch_max_bytes); below it a miss closes by bytes (test-heap-lazy). */
TEST_BEGIN(test_epoch_bytes)
{
	struct emm_heap_params p = defaults();
	p.epoch_max_bytes = 1 * MIB;
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 512 * KIB, 0);
	emm_addr_t b = xalloc(h, 512 * KIB, 0);
	emm_addr_t c = xalloc(h, 4 * MIB, 0);
	emm_addr_t d = xalloc(h, 12 * MIB, 0);
	xfree(a, 0);
	xfree(b, 0);
	xfree(c, 0);
	expect_u64_eq(heap_stats(h).epochs_closed, 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 5 * MIB);
	xfree(d, 0); /* 17 MiB: past the hard bound */
	expect_u64_eq(heap_stats(h).epochs_closed, 1);
	expect_u64_eq(heap_stats(h).pending_bytes, 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* Closing under pressure: a miss while the open epoch holds a block that
 * could serve it and has seen at least half its quota of frees. */
TEST_BEGIN(test_epoch_pressure)
{
	struct emm_heap_params p = defaults();
	p.oom_retry = false;
	p.epoch_max_blocks = 8; /* pressure from 4 frees */
	emm_heap_t *h = setup(&p, true, 2 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t blk[16], r = 0;

	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 128 * KIB, 0);
	xfree(blk[0], 0);
	xfree(blk[2], 0);
	xfree(blk[4], 0);
	expect_int_eq(emm_heap_alloc(h, 128 * KIB, 0, &r), -ENOMEM); /* 3 < 8/2 */
	expect_u64_eq(heap_stats(h).epochs_closed, 0);
	xfree(blk[6], 0);
	/* 4 frees, but none could serve 256 KiB (pending blocks never merge). */
	expect_int_eq(emm_heap_alloc(h, 256 * KIB, 0, &r), -ENOMEM);
	expect_u64_eq(heap_stats(h).epochs_closed, 0);
	r = xalloc(h, 128 * KIB, 0);
	expect_u64_eq(r, blk[0]);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.backend_allocs, 1);
	expect_u64_eq(st.hits, 16);
	CHECKH(h);
	for (int i = 1; i < 16; i++)
		if (i != 2 && i != 4 && i != 6)
			xfree(blk[i], 0);
	xfree(r, 0);
	teardown(h);
}
TEST_END

/* A global capture keeps the epoch open; flush after it closes it. A failed
 * record keeps it open too, and the next free tries again. */
TEST_BEGIN(test_epoch_capture)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t blk[20];
	for (int i = 0; i < 20; i++)
		blk[i] = xalloc(h, 4 * KIB, 0);
	fence.capture_sync = true;
	for (int i = 0; i < 18; i++)
		xfree(blk[i], 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 0);
	expect_u64_eq(st.events_recorded, 0);
	expect_u64_eq(st.pending_bytes, 18 * 4 * KIB);
	expect_int_eq(emm_heap_flush(h), -EBUSY);
	CHECKH(h);
	fence.capture_sync = false;
	fence.fail_record = 1;
	xfree(blk[18], 0); /* record fails: stays open */
	st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 0);
	expect_u64_eq(st.pending_bytes, 19 * 4 * KIB);
	xfree(blk[19], 0);
	st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.pending_bytes, 0);
	expect_int_eq(emm_heap_flush(h), 0); /* nothing left to close */
	CHECKH(h);
	teardown(h);
}
TEST_END

/* Stream destroy: the stream's ready blocks are fenced by an event on it;
 * without a possible record (capture) they stay pending, orphaned, until
 * recording is allowed again. */
TEST_BEGIN(test_stream_destroy)
{
	struct emm_heap_params p = defaults();
	p.oom_retry = false;
	emm_heap_t *h = setup(&p, true, 2 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a, b, r = 0;

	fill_on(h, S1, &a, &b);
	xfree(a, S1);
	xfree(b, S1);
	emm_heap_stream_destroyed(h, S1);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 2 * MIB);
	expect_u64_eq(st.events_recorded, 1);
	expect_u64_eq(fence.ev[fence.nev - 1].stream, S1);
	CHECKH(h);
	expect_int_eq(emm_heap_alloc(h, 1 * MIB, S2, &r), -ENOMEM); /* not even by stealing */
	fake_complete(&fence, S1);
	expect_u64_eq(xalloc(h, 1 * MIB, S2), a);
	st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 0);
	expect_u64_eq(st.stream_waits, 0);
	CHECKH(h);

	/* Capture on the dying stream: nothing can be recorded, and its work
	 * may still run after the destroy. The block stays out of reach of
	 * every allocation until a marker can order it (test-heap-orphan). */
	xfree(a, S2);
	fence.capture_stream = S2;
	emm_heap_stream_destroyed(h, S2);
	st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 1 * MIB);
	expect_u64_eq(xalloc(h, 1 * MIB, 0), b); /* the only ready memory */
	expect_int_eq(emm_heap_alloc(h, 1 * MIB, S1, &r), -ENOMEM);
	CHECKH(h);
	xfree(b, 0);
	fence.capture_stream = 0;
	expect_int_eq(emm_heap_flush(h), 0); /* the next epoch's legacy event */
	st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 0);
	size_t idle = 0, largest = 0;
	emm_heap_idle_info(h, &idle, &largest);
	expect_u64_eq(largest, 2 * MIB); /* ready-any, merged whole again */
	expect_u64_eq(xalloc(h, 1 * MIB, 0), a);
	xfree(a, EMM_STREAM_SYNC);
	emm_heap_flush(h);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_strict_mode)
{
	struct emm_heap_params p = defaults();
	p.free_mode = EMM_FREE_MODE_STRICT;
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 64 * KIB, 0);
	xfree(a, 0);
	expect_int_eq(fence.device_syncs, 1);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.host_waits, 1);
	expect_u64_eq(st.pending_bytes, 0);
	expect_u64_eq(st.events_recorded, 0);
	expect_u64_eq(xalloc(h, 64 * KIB, 0), a);
	/* Stream-ordered frees stay stream-ordered. */
	xfree(a, S1);
	expect_int_eq(fence.device_syncs, 1);
	expect_u64_eq(xalloc(h, 64 * KIB, S1), a);
	xfree(a, S1);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_stream_mode)
{
	struct emm_heap_params p = defaults();
	p.free_mode = EMM_FREE_MODE_STREAM;
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB1, true);
	emm_addr_t a = xalloc(h, 64 * KIB, 0);
	xfree(a, 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.host_waits, 0);
	expect_u64_eq(st.pending_bytes, 0);
	expect_u64_eq(st.events_recorded, 0);
	expect_u64_eq(xalloc(h, 64 * KIB, NB1), a);
	xfree(a, 0);
	emm_heap_stream_destroyed(h, NB1);
	teardown(h);
}
TEST_END

/* NULL fence ops: every fence is complete at once. */
TEST_BEGIN(test_no_fence_ops)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB1, true);
	emm_addr_t a = xalloc(h, 64 * KIB, 0);
	xfree(a, 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 0);
	expect_u64_eq(xalloc(h, 64 * KIB, NB1), a);
	xfree(a, NB1);
	emm_heap_stream_destroyed(h, NB1);
	expect_u64_eq(xalloc(h, 64 * KIB, 0), a); /* ready-any after destroy */
	xfree(a, 0);
	uint64_t ev;
	expect_int_eq(emm_heap_last_fence(h, &ev), -ENOENT);
	expect_int_eq(emm_heap_flush(h), 0);
	teardown(h);
}
TEST_END

/* OOM: close the epoch, synchronize fences (host waits), release idle
 * segments, retry once. */
TEST_BEGIN(test_oom_retry)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, true, 50 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t q[4], r = 0;

	emm_heap_stream_created(h, NB1, true);
	for (int i = 0; i < 4; i++)
		q[i] = xalloc(h, 5 * MIB, 0); /* four quarters of one 20 MiB segment */
	emm_addr_t big = xalloc(h, 20 * MIB, 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.segments, 2);
	for (int i = 0; i < 4; i++)
		xfree(q[i], 0); /* open epoch: 4 blocks */
	CHECKH(h);
	emm_addr_t c = xalloc(h, 30 * MIB, 0); /* fails, recovers, succeeds */
	st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 1);
	expect_u64_eq(st.ooms, 0);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.host_waits, 2); /* legacy + NB1 */
	expect_u64_eq(st.backend_frees, 1);
	expect_u64_eq(st.segments, 2);
	expect_u64_eq(st.pending_bytes, 0);
	expect_int_eq(fence.syncs, 2);
	CHECKH(h);

	/* Nothing left to release: -ENOMEM after the retry. */
	expect_int_eq(emm_heap_alloc(h, 30 * MIB, 0, &r), -ENOMEM);
	st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 2);
	expect_u64_eq(st.ooms, 1);

	/* The open epoch and ready-stream blocks (too small to steal) get
	 * fenced, synchronized and released too. */
	xfree(c, 0);
	xfree(big, S1);
	emm_addr_t d = xalloc(h, 40 * MIB, S2);
	st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 3);
	expect_u64_eq(st.backend_frees, 3);
	expect_u64_eq(st.host_waits, 5);
	expect_u64_eq(st.segments, 1);
	expect_u64_eq(st.reserved_bytes, 40 * MIB);
	expect_int_eq(fence.syncs, 5);
	CHECKH(h);

	/* A source that fails once on demand. */
	src.fail_next = 1;
	emm_addr_t e = xalloc(h, 10 * MIB, 0);
	st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 4);
	expect_u64_eq(st.ooms, 1);
	xfree(d, S2);
	xfree(e, 0);
	emm_heap_stream_destroyed(h, NB1);
	CHECKH(h);
	teardown(h);

	/* oom_retry off: fail at once, release nothing. */
	p.oom_retry = false;
	h = setup(&p, true, 40 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t x = xalloc(h, 20 * MIB, 0);
	emm_addr_t y = xalloc(h, 20 * MIB, 0);
	xfree(x, 0);
	emm_heap_flush(h); /* x ready-any, idle */
	expect_int_eq(emm_heap_alloc(h, 22 * MIB, 0, &r), -ENOMEM);
	st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 0);
	expect_u64_eq(st.ooms, 1);
	expect_u64_eq(st.backend_frees, 0);
	xfree(y, 0);
	teardown(h);
}
TEST_END

/* Idle reserved bytes above the threshold go back after frees. */
TEST_BEGIN(test_release_threshold)
{
	struct emm_heap_params p = defaults();
	p.release_threshold = 0;
	emm_heap_t *h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 100 * MIB, 0);
	xfree(a, 0);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.backend_frees, 1);
	expect_u64_eq(st.reserved_bytes, 0);
	expect_u64_eq(st.segments, 0);
	/* A split segment is not released until whole again. */
	a = xalloc(h, 512, 0);
	emm_addr_t b = xalloc(h, 512, 0);
	xfree(a, 0);
	expect_u64_eq(heap_stats(h).segments, 1);
	xfree(b, 0);
	expect_u64_eq(heap_stats(h).segments, 0);
	CHECKH(h);
	teardown(h);

	p.release_threshold = 25 * MIB;
	h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);
	a = xalloc(h, 20 * MIB, 0);
	b = xalloc(h, 20 * MIB, 0);
	xfree(a, 0);
	expect_u64_eq(heap_stats(h).segments, 2); /* 20 MiB idle <= 25 */
	xfree(b, 0);
	st = heap_stats(h);
	expect_u64_eq(st.segments, 1); /* 40 > 25: the oldest idle one goes */
	expect_u64_eq(st.reserved_bytes, 20 * MIB);
	expect_u64_eq(xalloc(h, 20 * MIB, 0), b);
	xfree(b, 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_release_idle)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 20 * MIB, 0);
	emm_addr_t b = xalloc(h, 20 * MIB, 0);
	emm_addr_t c = xalloc(h, 512, 0);
	xfree(a, 0);
	xfree(b, 0); /* both pending in the open epoch */
	expect_int_eq(emm_heap_release_idle(h, 20 * MIB + 2 * MIB), 20 * MIB);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.segments, 2);
	expect_u64_eq(st.epochs_closed, 1);
	expect_int_eq(emm_heap_release_idle(h, 0), 20 * MIB); /* the split small segment stays */
	st = heap_stats(h);
	expect_u64_eq(st.segments, 1);
	expect_u64_eq(st.backend_frees, 2);
	xfree(c, 0);
	expect_int_eq(emm_heap_release_idle(h, 0), 2 * MIB);
	expect_int_eq(emm_heap_release_idle(h, 0), 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* Error codes of free and alloc. */
TEST_BEGIN(test_bad_frees)
{
	struct emm_heap_params p = defaults();
	p.release_threshold = 0;
	emm_heap_t *h = setup(&p, false, 1ull << 40);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 4 * KIB, 0);
	emm_addr_t keep = xalloc(h, 4 * KIB, 0);
	size_t req = 0;

	expect_int_eq(emm_heap_free(a + 512, 0, &req), -EINVAL); /* interior */
	expect_int_eq(emm_heap_free(a + 1, 0, &req), -EINVAL);
	expect_int_eq(emm_heap_free(a, 0, &req), 0);
	expect_u64_eq(req, 4 * KIB);
	expect_int_eq(emm_heap_free(a, 0, &req), -EINVAL);           /* double */
	expect_int_eq(emm_heap_free(a + 1 * MIB, 0, NULL), -EINVAL); /* free space in our segment */
	expect_int_eq(emm_heap_free(0, 0, NULL), -ENOENT);
	expect_int_eq(emm_heap_free(0xdead0000ull, 0, NULL), -ENOENT);
	CHECKH(h);

	/* A block in a released segment: not ours any more. */
	emm_addr_t big = xalloc(h, 30 * MIB, 0);
	xfree(big, 0);
	expect_u64_eq(heap_stats(h).backend_frees, 1);
	expect_int_eq(emm_heap_free(big, 0, NULL), -ENOENT);

	/* Sizes. */
	emm_addr_t r = 7;
	expect_int_eq(emm_heap_alloc(h, 0, 0, &r), -EINVAL);
	expect_int_eq(emm_heap_alloc(h, SIZE_MAX, 0, &r), -EOVERFLOW);
	expect_int_eq(emm_heap_alloc(h, SIZE_MAX - 100, 0, &r), -EOVERFLOW);
	expect_int_eq(emm_heap_alloc(h, (size_t)1 << 62, 0, &r), -ENOMEM);
	expect_int_eq(emm_heap_alloc(h, 100, 0, NULL), -EINVAL);
	expect_u64_eq(r, 7);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.ooms, 1);
	expect_u64_eq(st.live_blocks, 1);
	p.roundup_divisions = 4;
	xfree(keep, 0);
	CHECKH(h);
	teardown(h);

	h = setup(&p, false, 1ull << 40);
	assert_ptr_not_null(h);
	expect_int_eq(emm_heap_alloc(h, ((size_t)1 << 63) + ((size_t)1 << 62) + ((size_t)1 << 61) + 1, 0, &r),
	              -EOVERFLOW);
	emm_addr_t d = xalloc(h, 1 * MIB + 1, 0); /* rounded to 1.25 MiB */
	expect_u64_eq(heap_stats(h).allocated_bytes, 1 * MIB + 256 * KIB);
	xfree(d, 0);
	teardown(h);
}
TEST_END

/* emm_heap_free_if: a refused heap keeps its block, untouched. */
static bool accept_if(const emm_heap_t *heap, const void *arg)
{
	return heap == *(emm_heap_t *const *)arg;
}

TEST_BEGIN(test_free_if)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, false, 1ull << 40);
	assert_ptr_not_null(h);
	emm_heap_t *other = (emm_heap_t *)&p, *self = h;
	emm_addr_t a = xalloc(h, 4 * KIB, 0);
	size_t req = 0;

	expect_int_eq(emm_heap_free_if(a, 0, accept_if, &other, &req), -EXDEV);
	expect_int_eq(emm_heap_free_if(a + 512, 0, accept_if, &other, &req), -EXDEV); /* interior */
	expect_u64_eq(req, 0);
	expect_u64_eq(heap_stats(h).live_blocks, 1);
	expect_ptr_eq(emm_heap_of_block(a), h);
	expect_int_eq(emm_heap_free_if(a + 512, 0, accept_if, &self, &req), -EINVAL);
	expect_int_eq(emm_heap_free_if(0xdead0000ull, 0, accept_if, &self, NULL), -ENOENT);
	expect_int_eq(emm_heap_free_if(0xdead0000ull, 0, accept_if, &other, NULL), -ENOENT);
	CHECKH(h);
	expect_int_eq(emm_heap_free_if(a, 0, accept_if, &self, &req), 0);
	expect_u64_eq(req, 4 * KIB);
	expect_u64_eq(heap_stats(h).live_blocks, 0);
	/* Freed: no live block of either heap is there any more. */
	expect_int_eq(emm_heap_free_if(a, 0, accept_if, &self, NULL), -EINVAL);
	expect_int_eq(emm_heap_free_if(a, 0, accept_if, &other, NULL), -EINVAL);
	CHECKH(h);
	teardown(h);
}
TEST_END

TEST_BEGIN(test_find_block)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, false, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 3000, 0);
	emm_addr_t b = xalloc(h, 5000, 0);
	struct emm_block_range r;
	memset(&r, 0, sizeof(r));
	assert_int_eq(emm_heap_find_block(a + 100, &r), 0);
	expect_u64_eq(r.base, a);
	expect_u64_eq(r.size, 3072);
	expect_u64_eq(r.requested, 3000);
	expect_u64_eq(r.segment_base, a);
	expect_u64_eq(r.segment_size, 2 * MIB);
	expect_ptr_eq(r.heap, h);
	assert_int_eq(emm_heap_find_block(b, &r), 0);
	expect_u64_eq(r.base, b);
	expect_u64_eq(r.requested, 5000);
	assert_int_eq(emm_heap_find_block(b + 5119, &r), 0);
	expect_u64_eq(r.base, b);
	expect_int_eq(emm_heap_find_block(b + 5120, &r), -ENOENT); /* free space */
	expect_int_eq(emm_heap_find_block(0x1234, &r), -ENOENT);
	/* Whose block: a live block's start only. */
	expect_ptr_eq(emm_heap_of_block(a), h);
	expect_ptr_eq(emm_heap_of_block(b), h);
	expect_ptr_null(emm_heap_of_block(a + 100));
	expect_ptr_null(emm_heap_of_block(0x1234));
	xfree(a, 0);
	expect_int_eq(emm_heap_find_block(a, &r), -ENOENT);
	expect_ptr_null(emm_heap_of_block(a));
	xfree(b, 0);
	teardown(h);
}
TEST_END

/* Destroy without releasing: nothing is called, addresses are forgotten. */
TEST_BEGIN(test_destroy_forget)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB1, true);
	emm_addr_t a = xalloc(h, 4 * KIB, 0);
	emm_addr_t blk[16];
	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 8 * KIB, 0);
	for (int i = 0; i < 16; i++)
		xfree(blk[i], 0); /* a pending closed epoch */
	unsigned records = fence.records, releases = fence.releases;
	size_t segs = emm_segmap_count();
	emm_heap_destroy(h, false);
	expect_int_eq(src.frees, 0);
	expect_int_eq(fence.records, records);
	expect_int_eq(fence.releases, releases);
	expect_int_eq(emm_segmap_count(), segs - 1);
	expect_int_eq(emm_heap_free(a, 0, NULL), -ENOENT);
	fake_src_fini(&src);
	fake_fence_fini(&fence);

	/* With release: pending fences are synchronized first. */
	h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB1, true);
	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 8 * KIB, 0);
	for (int i = 0; i < 16; i++)
		xfree(blk[i], 0);
	a = xalloc(h, 4 * KIB, 0); /* live at destroy */
	emm_heap_destroy(h, true);
	expect_int_eq(fence.syncs, 2);
	expect_int_eq(src.frees, src.allocs);
	expect_int_eq(fake_live_events(&fence), 0);
	expect_int_eq(fence.misuse, 0);
	expect_int_eq(emm_heap_free(a, 0, NULL), -ENOENT);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}
TEST_END

/* Arenas: each thread's requests come from its own arena's segments (the
 * first arena's are full here, so nothing can be borrowed from it); a block
 * freed by another thread goes home; flush, release, stream announcements
 * and statistics cover every arena. */
struct arena_job {
	emm_heap_t *h;
	emm_addr_t small, large, freed_by_other;
	int rc;
};

static void *arena_thread(void *arg)
{
	struct arena_job *j = arg;
	j->rc = emm_heap_alloc(j->h, 4 * KIB, 0, &j->small);
	if (!j->rc)
		j->rc = emm_heap_alloc(j->h, 4 * MIB, 0, &j->large);
	if (!j->rc)
		j->rc = emm_heap_free(j->freed_by_other, 0, NULL);
	return NULL;
}

TEST_BEGIN(test_arenas)
{
	struct emm_heap_params p = defaults();
	p.arenas = 2;
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	/* Arena 0 full: its small segment by a and a2, its large one by big. */
	emm_addr_t a = xalloc(h, 1 * MIB, 0);
	emm_addr_t a2 = xalloc(h, 1 * MIB, 0);
	emm_addr_t big = xalloc(h, 20 * MIB, 0);
	struct arena_job j = {.h = h, .freed_by_other = a};
	pthread_t t;
	assert_int_eq(pthread_create(&t, NULL, arena_thread, &j), 0);
	pthread_join(t, NULL);
	assert_int_eq(j.rc, 0);

	struct emm_block_range ra, rb, rl, rbig;
	assert_int_eq(emm_heap_find_block(j.small, &rb), 0);
	assert_int_eq(emm_heap_find_block(j.large, &rl), 0);
	assert_int_eq(emm_heap_find_block(big, &rbig), 0);
	expect_true(rb.segment_base != a);                 /* the other arena's small segment */
	/* Large requests too go to the thread's own arena (project issue 11). */
	expect_true(rl.segment_base != rbig.segment_base);
	expect_ptr_eq(rb.heap, h);
	expect_int_eq(emm_heap_find_block(a, &ra), -ENOENT); /* freed by the other thread */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.segments, 4); /* a small and a large segment per arena */
	expect_u64_eq(st.live_blocks, 4);
	expect_u64_eq(st.pending_bytes, 1 * MIB); /* a, in its own arena's open epoch */
	expect_u64_eq(st.reserved_bytes_peak, 2 * (2 * MIB + 20 * MIB));
	/* Heap-wide allocated peak: within 1 MiB per arena of the truth. */
	size_t truth = 22 * MIB + 4 * KIB + 4 * MIB;
	expect_true(st.allocated_bytes_peak <= truth && st.allocated_bytes_peak + 2 * MIB >= truth);
	CHECKH(h);

	/* An announced non-blocking stream is known to every arena. */
	emm_heap_stream_created(h, NB1, true);
	xfree(j.small, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 2);   /* one per arena */
	expect_u64_eq(st.events_recorded, 4); /* legacy + NB1 in each */
	fake_complete(&fence, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 0);
	xfree(j.large, 0);
	xfree(big, 0);
	xfree(a2, 0);
	emm_heap_stream_destroyed(h, NB1);
	expect_int_eq(emm_heap_release_idle(h, 0), 44 * MIB); /* every arena's idle segments */
	st = heap_stats(h);
	expect_u64_eq(st.segments, 0);
	expect_u64_eq(st.reserved_bytes, 0);
	teardown(h);
}
TEST_END

/* A miss that would reserve more takes another arena's ready block first
 * (PyTorch's autograd thread allocates the backward pass while its main
 * thread waits: one pool between them, as PyTorch's allocator has); the
 * block stays its arena's. A block of the thread's own arena still comes
 * first (project issue 11). */
struct borrow_job {
	emm_heap_t *h;
	struct arena *not_this; /* the main thread's arena */
	bool other_arena;       /* this thread's arena is another */
	emm_addr_t small, large, own, own_small;
	struct emm_stats after_borrow;
	int rc;
};

static void *borrow_thread(void *arg)
{
	struct borrow_job *j = arg;
	emm_addr_t x = 0;

	/* Threads take arenas round-robin: the caller retries until one is
	 * another's than its own. */
	j->other_arena = emm_heap_thread_arena(j->h) != j->not_this;
	if (!j->other_arena)
		return NULL;
	j->rc = emm_heap_alloc(j->h, 4 * KIB, 0, &j->small);
	/* 12 MiB fits only once arena 0 polls its completed fence. */
	if (!j->rc)
		j->rc = emm_heap_alloc(j->h, 12 * MIB, 0, &j->large);
	j->after_borrow = heap_stats(j->h);
	/* Nothing in arena 0 fits 30 MiB: a segment of this thread's arena,
	 * freed on a stream (ready at once under its key), then served again
	 * from it although arena 0 has room for 4 MiB too. */
	if (!j->rc)
		j->rc = emm_heap_alloc(j->h, 30 * MIB, S1, &x);
	if (!j->rc)
		j->rc = emm_heap_free(x, S1, NULL);
	if (!j->rc)
		j->rc = emm_heap_alloc(j->h, 4 * MIB, S1, &j->own);
	return NULL;
}

TEST_BEGIN(test_arenas_borrow)
{
	struct emm_heap_params p = defaults();
	p.arenas = 2;
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t s = xalloc(h, 4 * KIB, 0);
	emm_addr_t l = xalloc(h, 4 * MIB, 0); /* a 20 MiB segment: 16 MiB ready */
	emm_addr_t f = xalloc(h, 8 * MIB, 0); /* then 8 MiB ready */
	/* f's free waits for its fence (a non-blocking stream exists: no
	 * fast path), complete but not yet polled by arena 0 when the other
	 * thread misses. */
	emm_heap_stream_created(h, NB1, true);
	xfree(f, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 8 * MIB);
	fake_complete(&fence, 0);
	struct borrow_job j = {.h = h, .not_this = emm_heap_thread_arena(h)};
	for (int i = 0; i < 4 && !j.other_arena; i++) {
		pthread_t t;
		assert_int_eq(pthread_create(&t, NULL, borrow_thread, &j), 0);
		pthread_join(t, NULL);
	}
	assert_true(j.other_arena);
	assert_int_eq(j.rc, 0);

	struct emm_block_range rs, rl, rjs, rjl, rown;
	assert_int_eq(emm_heap_find_block(s, &rs), 0);
	assert_int_eq(emm_heap_find_block(l, &rl), 0);
	assert_int_eq(emm_heap_find_block(j.small, &rjs), 0);
	assert_int_eq(emm_heap_find_block(j.large, &rjl), 0);
	assert_int_eq(emm_heap_find_block(j.own, &rown), 0);
	/* Borrowed: arena 0's segments, nothing more reserved. */
	expect_u64_eq(rjs.segment_base, rs.segment_base);
	expect_u64_eq(rjl.segment_base, rl.segment_base);
	expect_u64_eq(j.after_borrow.segments, 2);
	expect_u64_eq(j.after_borrow.reserved_bytes, 22 * MIB);
	expect_u64_eq(j.after_borrow.misses, 2);
	/* The thread's own arena first: its 30 MiB segment, not arena 0's room. */
	expect_true(rown.segment_base != rl.segment_base);
	expect_u64_eq(rown.segment_size, 30 * MIB);
	CHECKH(h);

	/* Frees go home, to arena 0 (fenced there: pending until flushed). */
	xfree(j.small, 0);
	xfree(j.large, 0);
	xfree(j.own, S1);
	xfree(s, 0);
	xfree(l, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	fake_complete(&fence, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 0);
	emm_heap_stream_destroyed(h, NB1);
	CHECKH(h);
	/* Arena 0's two idle segments; the 30 MiB one stays ready for S1. */
	expect_int_eq(emm_heap_release_idle(h, 0), 22 * MIB);
	expect_u64_eq(heap_stats(h).reserved_bytes, 30 * MIB);
	teardown(h);
}
TEST_END

/* The other arena's open epoch under pressure (half its quota of frees,
 * a block that fits) is closed for the miss, as the thread's own would be. */
static void *borrow_pressed(void *arg)
{
	struct borrow_job *j = arg;

	j->other_arena = emm_heap_thread_arena(j->h) != j->not_this;
	if (!j->other_arena)
		return NULL;
	j->rc = emm_heap_alloc(j->h, 12 * MIB, 0, &j->large);
	j->after_borrow = heap_stats(j->h);
	return NULL;
}

TEST_BEGIN(test_arenas_borrow_epoch)
{
	struct emm_heap_params p = defaults(); /* quota 16: pressure at 8 */
	p.arenas = 2;
	p.epoch_max_bytes = 1024 * MIB;
	emm_heap_t *h = setup(&p, true, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t x[8];
	for (int i = 0; i < 8; i++)
		x[i] = xalloc(h, 12 * MIB, 0); /* a 12 MiB segment each, nothing left over */
	for (int i = 0; i < 8; i++)
		xfree(x[i], 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 96 * MIB); /* arena 0's open epoch */
	struct borrow_job j = {.h = h, .not_this = emm_heap_thread_arena(h)};
	for (int i = 0; i < 4 && !j.other_arena; i++) {
		pthread_t t;
		assert_int_eq(pthread_create(&t, NULL, borrow_pressed, &j), 0);
		pthread_join(t, NULL);
	}
	assert_true(j.other_arena);
	assert_int_eq(j.rc, 0);
	expect_u64_eq(j.after_borrow.segments, 8);
	expect_u64_eq(j.after_borrow.reserved_bytes, 96 * MIB);
	expect_u64_eq(j.after_borrow.epochs_closed, 1);
	expect_u64_eq(j.after_borrow.pending_bytes, 0); /* the fast path: ready at once */
	struct emm_block_range r;
	assert_int_eq(emm_heap_find_block(j.large, &r), 0);
	expect_u64_eq(r.segment_size, 12 * MIB);
	xfree(j.large, 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_create_args, test_split_merge, test_best_fit, test_large_split_rules,
	                    test_max_split, test_stream_reuse, test_steal, test_epoch_fast_path, test_epoch_host_accessible,
	                    test_epoch_nonblocking, test_epoch_bytes, test_epoch_pressure, test_epoch_capture,
	                    test_stream_destroy, test_strict_mode, test_stream_mode, test_no_fence_ops,
	                    test_oom_retry, test_release_threshold, test_release_idle, test_bad_frees, test_free_if,
	                    test_find_block, test_destroy_forget, test_arenas, test_arenas_borrow,
	                    test_arenas_borrow_epoch, NULL);
}
