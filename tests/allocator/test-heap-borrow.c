/* SPDX-License-Identifier: MIT */
/*
 * test-heap-borrow: which other arenas a miss that would reach the source
 * may take a block from (take_other_arena, heap_alloc.c). Threads run by
 * turns (one at a time, in a fixed order), so the fence doubles' counters
 * tell what each thread's allocation did:
 *
 *   - PyTorch's pattern: a forward thread allocates and frees a batch, then
 *     waits while a backward thread allocates the same sizes, step after
 *     step; the backward's blocks come from the forward's segments, no new
 *     segment (also when the forward needs new memory once in a step);
 *   - threads that all allocate and miss at the same time: a miss polls no
 *     other arena's fences and closes no other arena's epoch (project
 *     issue 11); once the others stop, the miss takes their memory again.
 */
#include <errno.h>
#include <pthread.h>

#include "allocator/heap.h"
#include "allocator/heap_internal.h" /* emm_heap_thread_arena */
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

#define NB1 ((emm_stream_t)0x3000)

static struct fake_src src;
static struct fake_fence fence;

/* Threads run one at a time, in the order the test passes the turn. */
static pthread_mutex_t turn_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t turn_cv = PTHREAD_COND_INITIALIZER;
static unsigned turn;

static void turn_wait(unsigned me)
{
	pthread_mutex_lock(&turn_lock);
	while (turn != me)
		pthread_cond_wait(&turn_cv, &turn_lock);
	pthread_mutex_unlock(&turn_lock);
}

static void turn_pass(unsigned next)
{
	pthread_mutex_lock(&turn_lock);
	turn = next;
	pthread_cond_broadcast(&turn_cv);
	pthread_mutex_unlock(&turn_lock);
}

/* Counted fence ops so far (the double's lock: other threads wait their
 * turn, but the counters are its). */
static unsigned fence_ops(void)
{
	pthread_mutex_lock(&fence.lock);
	unsigned n = fence.queries + fence.records;
	pthread_mutex_unlock(&fence.lock);
	return n;
}

/* --- PyTorch's turns -------------------------------------------------- */

#define STEPS  3
#define NSIZES 9

/* One small segment for the first four; a segment each for the others
 * (>= 10 MiB: exact sizes), so best fit finds the same blocks again. */
static const size_t batch[NSIZES] = {4 * KIB,  64 * KIB, 512 * KIB, 1 * MIB, 12 * MIB,
                                     12 * MIB, 30 * MIB, 30 * MIB,  50 * MIB};

struct pass_job {
	emm_heap_t *h;
	unsigned id; /* 0: forward, 1: backward */
	struct arena *arena;
	uint64_t fwd_segs[64]; /* the forward's segment bases */
	unsigned nfwd;
	uint64_t segments_after_first; /* after the forward's first batch */
	uint64_t new_segments;         /* made during the backward's turns */
	unsigned borrowed, not_borrowed;
	int rc;
};

static struct pass_job fwd, bwd;

static bool in_forward_segments(uint64_t base)
{
	for (unsigned i = 0; i < fwd.nfwd; i++)
		if (fwd.fwd_segs[i] == base)
			return true;
	return false;
}

static void note_segment(uint64_t base)
{
	if (!in_forward_segments(base) && fwd.nfwd < 64)
		fwd.fwd_segs[fwd.nfwd++] = base;
}

static void *pass_thread(void *arg)
{
	struct pass_job *j = arg;
	emm_addr_t a[NSIZES];
	struct emm_block_range r;

	turn_wait(j->id);
	j->arena = emm_heap_thread_arena(j->h);
	turn_pass(1 - j->id);
	for (int step = 0; step < STEPS && !j->rc; step++) {
		turn_wait(j->id);
		uint64_t segs = heap_stats(j->h).segments;
		for (int i = 0; i < NSIZES && !j->rc; i++)
			j->rc = emm_heap_alloc(j->h, batch[i], 0, &a[i]);
		if (j->id == 0 && step == 1 && !j->rc) {
			/* The forward needs new memory once in a step. */
			emm_addr_t extra;
			j->rc = emm_heap_alloc(j->h, 80 * MIB, 0, &extra);
			if (!j->rc && emm_heap_find_block(extra, &r) == 0)
				note_segment(r.segment_base);
			if (!j->rc)
				j->rc = emm_heap_free(extra, 0, NULL);
		}
		for (int i = 0; i < NSIZES && !j->rc; i++) {
			if (emm_heap_find_block(a[i], &r)) {
				j->rc = -ENOENT;
				break;
			}
			if (j->id == 0)
				note_segment(r.segment_base);
			else if (in_forward_segments(r.segment_base))
				j->borrowed++;
			else
				j->not_borrowed++;
		}
		if (j->id == 0 && step == 0)
			j->segments_after_first = heap_stats(j->h).segments;
		if (j->id == 1)
			j->new_segments += heap_stats(j->h).segments - segs;
		for (int i = 0; i < NSIZES && !j->rc; i++)
			j->rc = emm_heap_free(a[i], 0, NULL);
		turn_pass(1 - j->id);
	}
	return NULL;
}

TEST_BEGIN(test_turns_share_one_pool)
{
	struct emm_heap_params p;
	emm_heap_t *h = NULL;

	emm_heap_params_default(&p);
	p.arenas = 2;
	p.epoch_max_blocks = 16; /* pressure at 8: the batch's frees */
	assert_int_eq(fake_heap_create(&p, &src, SIZE_MAX, &fence, &h), 0);
	fwd = (struct pass_job){.h = h, .id = 0};
	bwd = (struct pass_job){.h = h, .id = 1};
	turn = 0;
	pthread_t tf, tb;
	assert_int_eq(pthread_create(&tf, NULL, pass_thread, &fwd), 0);
	assert_int_eq(pthread_create(&tb, NULL, pass_thread, &bwd), 0);
	pthread_join(tf, NULL);
	pthread_join(tb, NULL);
	assert_int_eq(fwd.rc, 0);
	assert_int_eq(bwd.rc, 0);
	assert_true(fwd.arena != bwd.arena);
	/* Every backward block from the forward's segments, none made for it;
	 * the forward's extra 80 MiB at step 1 is the only growth. */
	expect_int_eq(bwd.borrowed, STEPS * NSIZES);
	expect_int_eq(bwd.not_borrowed, 0);
	expect_u64_eq(bwd.new_segments, 0);
	expect_u64_eq(heap_stats(h).segments, fwd.segments_after_first + 1);
	fake_complete(&fence, 0);
	fake_heap_destroy_checked(h, &src, &fence);
}
TEST_END

/* --- threads missing at the same time --------------------------------- */

#define NTHREADS    4
#define ROUNDS      24
#define QUIET_LOOKS 16 /* BORROW_QUIET_MIN: at least NTHREADS */

struct busy_job {
	emm_heap_t *h;
	unsigned id;
	struct arena *arena;
	emm_addr_t live[ROUNDS + 2 * QUIET_LOOKS + 2];
	unsigned nlive;
	unsigned others_ops;  /* thread 0: fence ops during its misses, after warm-up */
	unsigned borrowed_at; /* thread 0: its look that first took an idle arena's block (0: none) */
	int rc;
};

static struct busy_job busy[NTHREADS];
static bool served; /* the others' arenas serve them: they never look */

static void *busy_thread(void *arg)
{
	struct busy_job *j = arg;
	unsigned next = (j->id + 1) % NTHREADS;
	emm_addr_t a = 0;

	turn_wait(j->id);
	j->arena = emm_heap_thread_arena(j->h);
	turn_pass(next);
	for (int round = 0; round < ROUNDS && !j->rc; round++) {
		turn_wait(j->id);
		if (j->id == 0) {
			/* Never frees: its own arena has no fence to poll and no
			 * epoch to close; 30 MiB always misses there. */
			unsigned before = fence_ops();
			j->rc = emm_heap_alloc(j->h, 30 * MIB, 0, &a);
			if (round >= 2)
				j->others_ops += fence_ops() - before;
			j->live[j->nlive++] = a;
		} else if (served) {
			/* 4 KiB from their own small segment (a miss only the
			 * first time); each free closes an epoch whose fence
			 * waits in the FIFO. */
			j->rc = emm_heap_alloc(j->h, 4 * KIB, 0, &a);
			if (!j->rc && j->nlive)
				j->rc = emm_heap_free(j->live[--j->nlive], 0, NULL);
			j->live[j->nlive++] = a;
		} else {
			/* A new 40 MiB block (a miss: the older ones wait for
			 * their fences), then the previous one freed: it waits in
			 * the open epoch, under pressure for thread 0's 30 MiB;
			 * the FIFO holds the earlier ones' fences to poll. */
			j->rc = emm_heap_alloc(j->h, 40 * MIB, 0, &a);
			if (!j->rc && j->nlive)
				j->rc = emm_heap_free(j->live[--j->nlive], 0, NULL);
			j->live[j->nlive++] = a;
		}
		turn_pass(next);
	}
	if (j->id != 0 || j->rc || served)
		return NULL;

	/* The others stop; their fences complete. Within QUIET_LOOKS + 1 of
	 * its looks thread 0 takes their memory (a 40 MiB block ready there). */
	turn_wait(0);
	fake_complete(&fence, 0);
	for (unsigned look = 1; look <= 2 * QUIET_LOOKS && !j->borrowed_at && !j->rc; look++) {
		struct emm_block_range r;
		j->rc = emm_heap_alloc(j->h, 30 * MIB, 0, &a);
		if (!j->rc)
			j->live[j->nlive++] = a;
		if (!j->rc)
			j->rc = emm_heap_find_block(a, &r);
		if (!j->rc && r.segment_size == 40 * MIB)
			j->borrowed_at = look;
	}
	return NULL;
}

static emm_heap_t *run_busy(struct emm_heap_params *p)
{
	emm_heap_t *h = NULL;

	p->arenas = NTHREADS;
	if (fake_heap_create(p, &src, SIZE_MAX, &fence, &h))
		return NULL;
	emm_heap_stream_created(h, NB1, true); /* no fast path: fences queue */
	turn = 0;
	pthread_t t[NTHREADS];
	for (unsigned i = 0; i < NTHREADS; i++) {
		busy[i] = (struct busy_job){.h = h, .id = i};
		if (pthread_create(&t[i], NULL, busy_thread, &busy[i]))
			abort();
	}
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(t[i], NULL);
	for (unsigned i = 0; i < NTHREADS; i++) {
		expect_int_eq(busy[i].rc, 0);
		for (unsigned k = 0; k < i; k++)
			expect_true(busy[i].arena != busy[k].arena);
	}
	return h;
}

static void busy_teardown(emm_heap_t *h)
{
	for (unsigned i = 0; i < NTHREADS; i++)
		for (unsigned k = 0; k < busy[i].nlive; k++)
			xfree(busy[i].live[k], 0);
	emm_heap_stream_destroyed(h, NB1);
	expect_int_eq(emm_heap_flush(h), 0);
	fake_complete(&fence, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	fake_heap_destroy_checked(h, &src, &fence);
}

TEST_BEGIN(test_busy_arenas_left_alone)
{
	struct emm_heap_params p;

	emm_heap_params_default(&p);
	p.epoch_max_bytes = 32 * MIB; /* a miss of 30 MiB closes a 40 MiB epoch */
	served = false;
	emm_heap_t *h = run_busy(&p);
	assert_ptr_not_null(h);
	/* While every thread misses, thread 0's misses leave the other arenas
	 * alone: before, each polled their fences and closed their epochs. */
	expect_int_eq(busy[0].others_ops, 0);
	/* Then, the others stopped, it took their memory again. */
	expect_true(busy[0].borrowed_at >= 1 && busy[0].borrowed_at <= QUIET_LOOKS + 1);
	busy_teardown(h);
}
TEST_END

/* Threads that allocate all the time from their own arenas never look
 * elsewhere; they are busy all the same: thread 0's misses leave them
 * alone (with looks alone to go by, from its 16th look on it polled their
 * fences). */
TEST_BEGIN(test_served_arenas_left_alone)
{
	struct emm_heap_params p;

	emm_heap_params_default(&p);
	p.epoch_max_blocks = 1;
	served = true;
	emm_heap_t *h = run_busy(&p);
	assert_ptr_not_null(h);
	expect_int_eq(busy[0].others_ops, 0);
	busy_teardown(h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_turns_share_one_pool, test_busy_arenas_left_alone,
	                    test_served_arenas_left_alone, NULL);
}
