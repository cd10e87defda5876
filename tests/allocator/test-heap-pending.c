/* SPDX-License-Identifier: MIT */
/*
 * test-heap-pending: the pending limit (allocator/heap_oom.c). With a
 * non-blocking stream alive, synchronous frees stay pending until their
 * epoch's events complete. A miss that would reserve more while the arena
 * holds more than pending_limit bytes pending polls the old fences first:
 * it reuses a block as soon as they complete (no new segment), gives up
 * after a bounded wait (a new segment, and the limit doubles so the next
 * miss does not stall), and with the limit 0 never waits.
 */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define MIB ((size_t)1 << 20)
#define NB1 ((emm_stream_t)0x3000)

static struct fake_src src;
static struct fake_fence fence;

static emm_heap_t *setup(size_t limit)
{
	struct emm_heap_params p;
	emm_heap_t *h = NULL;

	emm_heap_params_default(&p);
	p.arenas = 1;
	p.epoch_max_blocks = 1; /* every free closes its epoch: one fence each */
	p.pending_limit = limit;
	if (fake_heap_create(&p, &src, SIZE_MAX, &fence, &h))
		return NULL;
	emm_heap_stream_created(h, NB1, true); /* epochs take the slow path */
	return h;
}

static void teardown(emm_heap_t *h)
{
	expect_int_eq(emm_heap_check(h), 0);
	emm_heap_stream_destroyed(h, NB1);
	emm_heap_destroy(h, true);
	expect_int_eq(src.bad_frees, 0);
	expect_u64_eq(src.used, 0);
	expect_int_eq(fence.misuse, 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Four 4 MiB blocks of one 20 MiB segment allocated and freed: 16 MiB pending. */
static void fill_pending(emm_heap_t *h, emm_addr_t a[4])
{
	for (int i = 0; i < 4; i++)
		a[i] = xalloc(h, 4 * MIB, EMM_STREAM_SYNC);
	for (int i = 0; i < 4; i++)
		xfree(a[i], EMM_STREAM_SYNC);
	expect_u64_eq(heap_stats(h).pending_bytes, 16 * MIB);
}

static void *complete_later(void *arg)
{
	struct timespec d = {0, 30 * 1000 * 1000};

	(void)arg;
	nanosleep(&d, NULL);
	fake_complete(&fence, 0);
	return NULL;
}

/* Over the limit: the miss waits until the fences complete and reuses. */
TEST_BEGIN(test_pending_wait_reuses)
{
	emm_heap_t *h = setup(8 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a[4];
	pthread_t t;

	fill_pending(h, a);
	/* 20 MiB does not fit the segment's 4 MiB tail: a miss. */
	assert_int_eq(pthread_create(&t, NULL, complete_later, NULL), 0);
	double t0 = now_ms();
	emm_addr_t b = xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	double waited = now_ms() - t0;
	pthread_join(t, NULL);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(b, a[0]);                /* the freed segment, whole again */
	expect_u64_eq(st.backend_allocs, 1); /* no new segment */
	expect_u64_eq(st.host_waits, 1);
	expect_true(waited >= 20); /* it waited for the completion (a timeout would have grown) */
	xfree(b, EMM_STREAM_SYNC);
	fake_complete(&fence, 0);
	teardown(h);
}
TEST_END

/* Fences that never complete: the miss gives up after the bounded wait,
 * takes a new segment, and the doubled limit spares the next miss. */
TEST_BEGIN(test_pending_wait_times_out)
{
	emm_heap_t *h = setup(8 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a[4];

	fill_pending(h, a);
	double t0 = now_ms();
	emm_addr_t b = xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	double waited = now_ms() - t0;
	struct emm_stats st = heap_stats(h);
	expect_true(b != a[0]);
	expect_u64_eq(st.backend_allocs, 2);
	expect_u64_eq(st.host_waits, 1);
	expect_true(waited >= 150);
	/* 16 MiB pending is within the doubled limit: no wait. */
	t0 = now_ms();
	emm_addr_t c = xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	expect_true(now_ms() - t0 < 100);
	expect_u64_eq(heap_stats(h).host_waits, 1);
	expect_u64_eq(heap_stats(h).backend_allocs, 3);
	xfree(b, EMM_STREAM_SYNC);
	xfree(c, EMM_STREAM_SYNC);
	fake_complete(&fence, 0);
	teardown(h);
}
TEST_END

/* The limit 0: misses never wait, whatever is pending. */
TEST_BEGIN(test_pending_limit_off)
{
	emm_heap_t *h = setup(0);
	assert_ptr_not_null(h);
	emm_addr_t a[4];

	fill_pending(h, a);
	double t0 = now_ms();
	emm_addr_t b = xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	expect_true(now_ms() - t0 < 100);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.host_waits, 0);
	expect_u64_eq(st.backend_allocs, 2);
	xfree(b, EMM_STREAM_SYNC);
	fake_complete(&fence, 0);
	teardown(h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_pending_wait_reuses, test_pending_wait_times_out, test_pending_limit_off, NULL);
}
