/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-heap-idle.c - closing an epoch with live non-blocking
 * streams asks each one whether it is idle (the stream_idle fence op, a
 * cuStreamQuery in production) and records an event only on the busy ones:
 *
 *   - idle streams get no event, the legacy one always does; when all are
 *     idle each waits for it (stream_wait) and the blocks are ready at once;
 *   - a busy stream gets its event and the blocks wait for it as well;
 *   - a query that fails, or fence ops without the question, record as
 *     before;
 *   - during a capture that forbids it no stream is asked at all;
 *   - the same through a thread's own epoch (the per-thread cache).
 *
 * The fence double (heap_doubles.h) answers from its model: idle when no
 * event recorded on the stream is pending and the test has not marked the
 * stream busy. It aborts if asked under an allocator lock.
 */
#include <errno.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define NB1 ((emm_stream_t)0x3000)
#define NB2 ((emm_stream_t)0x4000)
#define NB3 ((emm_stream_t)0x5000)
#define NB4 ((emm_stream_t)0x6000)
#define N   16 /* EMM_EPOCH_BLOCKS here */

static struct fake_src src;
static struct fake_fence fence;

#define CHECKH(h) expect_int_eq(emm_heap_check(h), 0)

/* A heap of one arena over 2 MiB, so an epoch's blocks are the only memory;
 * no OOM retry (it would wait for the events). */
static emm_heap_t *setup(bool tcache, bool ask)
{
	struct emm_heap_params p;
	emm_heap_t *h = NULL;

	emm_heap_params_default(&p);
	p.arenas = 1;
	p.thread_cache = tcache;
	p.epoch_max_blocks = N;
	p.oom_retry = false;
	fake_src_init(&src, 2 * MIB);
	fake_fence_init(&fence);
	fence.idle_model = true;
	struct emm_segment_source s = fake_src_ops(&src);
	struct emm_fence_ops f = fake_fence_ops(&fence);
	if (!ask)
		f.stream_idle = NULL;
	if (emm_heap_create(&p, &s, &f, 0, &h))
		return NULL;
	return h;
}

static void teardown(emm_heap_t *h, const emm_stream_t *nb, unsigned nnb)
{
	for (unsigned i = 0; i < nnb; i++)
		emm_heap_stream_destroyed(h, nb[i]);
	fake_complete(&fence, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	fake_heap_destroy_checked(h, &src, &fence);
}

/* N blocks of 128 KiB (the whole 2 MiB), freed synchronously: one epoch. */
static void fill_and_free(emm_heap_t *h, emm_addr_t *blk)
{
	for (unsigned i = 0; i < N; i++)
		blk[i] = xalloc(h, 128 * KIB, 0);
	for (unsigned i = 0; i < N; i++)
		xfree(blk[i], 0);
}

static bool can_alloc(emm_heap_t *h)
{
	emm_addr_t a = 0;
	int r = emm_heap_alloc(h, 128 * KIB, 0, &a);

	if (r == 0)
		xfree(a, 0);
	else
		expect_int_eq(r, -ENOMEM);
	return r == 0;
}

static void idle_streams_get_no_event(bool tcache)
{
	const emm_stream_t nb[] = {NB1, NB2, NB3, NB4};
	emm_heap_t *h = setup(tcache, true);
	emm_addr_t blk[N];
	assert_ptr_not_null(h);

	for (unsigned i = 0; i < 4; i++)
		emm_heap_stream_created(h, nb[i], true);
	fill_and_free(h, blk);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.events_recorded, 1);
	expect_int_eq(fence.idle_queries, 4);
	expect_int_eq(fake_records_on(&fence, EMM_STREAM_LEGACY), 1);
	for (unsigned i = 0; i < 4; i++)
		expect_int_eq(fake_records_on(&fence, nb[i]), 0);
	/* Each idle stream now waits for the legacy event (its later work
	 * runs after the blocking-stream work that used the blocks), so the
	 * blocks are ready at once, the event still incomplete. */
	expect_int_eq(fence.nwaits, 4);
	for (unsigned i = 0; i < 4 && i < fence.nwaits; i++) {
		expect_u64_eq(fence.waits[i].stream, nb[i]);
		expect_u64_eq(fence.ev[fence.waits[i].event - 1].stream, EMM_STREAM_LEGACY);
	}
	expect_u64_eq(st.stream_waits, 4);
	expect_u64_eq(st.pending_bytes, 0);
	expect_true(can_alloc(h));
	CHECKH(h);
	teardown(h, nb, 4);
}

TEST_BEGIN(test_idle_streams_get_no_event)
{
	idle_streams_get_no_event(false);
}
TEST_END

TEST_BEGIN(test_idle_streams_get_no_event_tcache)
{
	idle_streams_get_no_event(true);
}
TEST_END

/* NB1 runs work (marked busy), NB2 is idle: NB1 gets an event, and the
 * blocks wait for it after the legacy one has completed. */
TEST_BEGIN(test_busy_stream_gets_event)
{
	const emm_stream_t nb[] = {NB1, NB2};
	emm_heap_t *h = setup(false, true);
	emm_addr_t blk[N];
	assert_ptr_not_null(h);

	emm_heap_stream_created(h, NB1, true);
	emm_heap_stream_created(h, NB2, true);
	fake_set_busy(&fence, NB1, true);
	fill_and_free(h, blk);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.events_recorded, 2);
	expect_int_eq(fake_records_on(&fence, EMM_STREAM_LEGACY), 1);
	expect_int_eq(fake_records_on(&fence, NB1), 1);
	expect_int_eq(fake_records_on(&fence, NB2), 0);
	fake_complete(&fence, EMM_STREAM_LEGACY);
	expect_false(can_alloc(h)); /* NB1's event still pending */
	expect_u64_eq(heap_stats(h).pending_bytes, 2 * MIB);
	fake_set_busy(&fence, NB1, false);
	expect_false(can_alloc(h)); /* idle now, but the event is what counts */
	fake_complete(&fence, NB1);
	expect_true(can_alloc(h));

	/* NB1's earlier event is complete and nothing else runs there: the
	 * next epoch (the block can_alloc freed) records on the legacy stream
	 * alone. */
	unsigned rec = fence.records;
	expect_int_eq(emm_heap_flush(h), 0);
	expect_int_eq(fence.records - rec, 1);
	expect_int_eq(fake_records_on(&fence, NB1), 1);
	CHECKH(h);
	teardown(h, nb, 2);
}
TEST_END

/* A stream whose earlier epoch event is still pending is busy: it gets a
 * new one (the double answers from its events, as cuStreamQuery would). */
TEST_BEGIN(test_pending_event_keeps_stream_busy)
{
	const emm_stream_t nb[] = {NB1};
	emm_heap_t *h = setup(false, true);
	emm_addr_t blk[N];
	assert_ptr_not_null(h);

	emm_heap_stream_created(h, NB1, true);
	fake_set_busy(&fence, NB1, true);
	fill_and_free(h, blk);
	expect_int_eq(fake_records_on(&fence, NB1), 1);
	fake_set_busy(&fence, NB1, false);
	fake_complete(&fence, EMM_STREAM_LEGACY);
	/* The first epoch still waits for NB1; close a second one by hand. */
	expect_false(can_alloc(h));
	fake_complete(&fence, NB1);
	fill_and_free(h, blk);
	expect_int_eq(fake_records_on(&fence, NB1), 1); /* idle again: none */
	teardown(h, nb, 1);
}
TEST_END

/* A failed question records, as does a heap whose fence ops cannot ask. */
TEST_BEGIN(test_unknown_answer_records)
{
	const emm_stream_t nb[] = {NB1, NB2};
	emm_heap_t *h = setup(false, true);
	emm_addr_t blk[N];
	assert_ptr_not_null(h);

	emm_heap_stream_created(h, NB1, true);
	emm_heap_stream_created(h, NB2, true);
	fence.fail_idle = 1; /* the first stream asked */
	fill_and_free(h, blk);
	expect_u64_eq(heap_stats(h).events_recorded, 2);
	expect_int_eq(fake_records_on(&fence, NB1) + fake_records_on(&fence, NB2), 1);
	expect_int_eq(fence.idle_queries, 2);
	teardown(h, nb, 2);

	h = setup(false, false);
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB1, true);
	emm_heap_stream_created(h, NB2, true);
	fill_and_free(h, blk);
	expect_u64_eq(heap_stats(h).events_recorded, 3);
	expect_int_eq(fake_records_on(&fence, NB1), 1);
	expect_int_eq(fake_records_on(&fence, NB2), 1);
	expect_int_eq(fence.idle_queries, 0);
	teardown(h, nb, 2);
}
TEST_END

/* No non-blocking stream: the fast path as before, nobody asked. */
TEST_BEGIN(test_no_streams_no_question)
{
	emm_heap_t *h = setup(false, true);
	emm_addr_t blk[N];
	assert_ptr_not_null(h);

	fill_and_free(h, blk);
	expect_u64_eq(heap_stats(h).events_recorded, 1);
	expect_u64_eq(heap_stats(h).pending_bytes, 0); /* ready at once */
	expect_int_eq(fence.idle_queries, 0);
	expect_true(can_alloc(h));
	teardown(h, NULL, 0);
}
TEST_END

/* During a global capture (or one on a non-blocking stream) the epoch stays
 * open and no stream is asked; after it, the close asks and records. */
TEST_BEGIN(test_capture_asks_nothing)
{
	const emm_stream_t nb[] = {NB1, NB2};
	emm_heap_t *h = setup(false, true);
	emm_addr_t blk[N];
	assert_ptr_not_null(h);

	emm_heap_stream_created(h, NB1, true);
	emm_heap_stream_created(h, NB2, true);
	fence.capture_sync = true;
	fill_and_free(h, blk);
	expect_u64_eq(heap_stats(h).epochs_closed, 0);
	expect_int_eq(fence.idle_queries, 0);
	expect_int_eq(fence.records, 0);
	expect_int_eq(emm_heap_flush(h), -EBUSY);
	expect_int_eq(fence.idle_queries, 0);
	fence.capture_sync = false;

	fence.capture_stream = NB2;
	expect_int_eq(emm_heap_flush(h), -EBUSY);
	expect_int_eq(fence.idle_queries, 0);
	fence.capture_stream = 0;

	expect_int_eq(emm_heap_flush(h), 0);
	expect_u64_eq(heap_stats(h).epochs_closed, 1);
	expect_int_eq(fence.idle_queries, 2);
	expect_int_eq(fence.records, 1);
	teardown(h, nb, 2);
}
TEST_END

int main(void)
{
	return emm_test_run(test_idle_streams_get_no_event, test_idle_streams_get_no_event_tcache,
	                    test_busy_stream_gets_event, test_pending_event_keeps_stream_busy,
	                    test_unknown_answer_records, test_no_streams_no_question, test_capture_asks_nothing, NULL);
}
