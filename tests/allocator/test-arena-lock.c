/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-arena-lock.c - the arena lock (heap_internal.h:
 * arena_lock, arena_trylock, arena_unlock; heap.c: emm_arena_lock_slow,
 * emm_arena_wait, emm_arena_wake) on a bare struct arena: mutual exclusion
 * under contention (exact counts; 8 threads on however many CPUs, so
 * waiters sleep on the futex and are woken), a waiter that outlasts the
 * spins and sleeps (a holder keeps it 20 ms), trylock, and waits that never
 * miss a wake between the check and the wait.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "allocator/heap_internal.h"
#include "emm_test.h"

#define THREADS 8
#define ROUNDS  50000

static struct arena *arena_new(void)
{
	struct arena *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	atomic_init(&h->lock, 0);
	atomic_init(&h->wake_gen, 0);
	pthread_mutex_init(&h->wait_lock, NULL);
	pthread_cond_init(&h->wait_cv, NULL);
	return h;
}

static void arena_free(struct arena *h)
{
	pthread_cond_destroy(&h->wait_cv);
	pthread_mutex_destroy(&h->wait_lock);
	free(h);
}

static void sleep_us(long us)
{
	struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&ts, NULL);
}

struct shared {
	struct arena *h;
	unsigned long counter; /* only under the lock: a plain variable */
	unsigned long inside;  /* threads inside the section: must stay 1 */
	unsigned long overlaps;
	atomic_int go;
};

static void *contender(void *arg)
{
	struct shared *s = arg;

	while (!atomic_load(&s->go))
		;
	for (int i = 0; i < ROUNDS; i++) {
		arena_lock(s->h);
		if (++s->inside != 1)
			s->overlaps++;
		s->counter++;
		s->inside--;
		if (i % 10000 == 0)
			sleep_us(500); /* now and then a long section: waiters nap */
		arena_unlock(s->h);
	}
	return NULL;
}

TEST_BEGIN(test_mutual_exclusion)
{
	struct shared s = {.h = arena_new()};
	pthread_t t[THREADS];
	assert_ptr_not_null(s.h);

	for (int i = 0; i < THREADS; i++)
		assert_int_eq(pthread_create(&t[i], NULL, contender, &s), 0);
	atomic_store(&s.go, 1);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	expect_u64_eq(s.counter, (unsigned long)THREADS * ROUNDS);
	expect_u64_eq(s.overlaps, 0);
	expect_int_eq(atomic_load(&s.h->lock), 0);
	arena_free(s.h);
}
TEST_END

static void *try_while_held(void *arg)
{
	struct arena *h = arg;
	bool got = arena_trylock(h);

	if (got)
		arena_unlock(h);
	return (void *)(uintptr_t)got;
}

TEST_BEGIN(test_trylock)
{
	struct arena *h = arena_new();
	pthread_t t;
	void *got;
	assert_ptr_not_null(h);

	arena_lock(h);
	assert_int_eq(pthread_create(&t, NULL, try_while_held, h), 0);
	pthread_join(t, &got);
	expect_false((bool)(uintptr_t)got);
	arena_unlock(h);
	assert_int_eq(pthread_create(&t, NULL, try_while_held, h), 0);
	pthread_join(t, &got);
	expect_true((bool)(uintptr_t)got);
	expect_true(arena_trylock(h));
	arena_unlock(h);
	arena_free(h);
}
TEST_END

/* A holder that keeps the lock 20 ms: the waiter goes through its spins,
 * sleeps, and gets it once it is free. */
struct holder {
	struct arena *h;
	atomic_int holding;
};

static void *hold_long(void *arg)
{
	struct holder *x = arg;

	arena_lock(x->h);
	atomic_store(&x->holding, 1);
	sleep_us(20000);
	atomic_store(&x->holding, 2);
	arena_unlock(x->h);
	return NULL;
}

TEST_BEGIN(test_long_holder)
{
	struct holder x = {.h = arena_new()};
	pthread_t t;
	assert_ptr_not_null(x.h);

	assert_int_eq(pthread_create(&t, NULL, hold_long, &x), 0);
	while (atomic_load(&x.holding) == 0)
		sleep_us(100);
	arena_lock(x.h);
	expect_int_eq(atomic_load(&x.holding), 2); /* not before its unlock */
	arena_unlock(x.h);
	pthread_join(t, NULL);
	arena_free(x.h);
}
TEST_END

/* Ping-pong through emm_arena_wait/emm_arena_wake: each side waits for the
 * other's turn under the lock. A lost wake would hang; the watchdog below
 * turns that into a failure. */
struct pingpong {
	struct arena *h;
	int turn; /* under the lock */
	atomic_int done;
};

#define VOLLEYS 20000

/* One side: waits for its turn (`me`), then hands the turn over. */
struct player {
	struct pingpong *p;
	int me;
};

static void *play(void *arg)
{
	struct player *pl = arg;
	struct pingpong *p = pl->p;

	arena_lock(p->h);
	for (int i = 0; i < VOLLEYS; i++) {
		while (p->turn != pl->me)
			emm_arena_wait(p->h);
		p->turn = !pl->me;
		emm_arena_wake(p->h);
	}
	arena_unlock(p->h);
	if (pl->me == 0)
		atomic_store(&p->done, 1);
	return NULL;
}

TEST_BEGIN(test_wait_and_wake)
{
	struct pingpong p = {.h = arena_new()};
	pthread_t a, b;
	assert_ptr_not_null(p.h);

	struct player pa = {&p, 0}, pb = {&p, 1};
	assert_int_eq(pthread_create(&a, NULL, play, &pa), 0);
	assert_int_eq(pthread_create(&b, NULL, play, &pb), 0);
	for (int i = 0; i < 20000 && !atomic_load(&p.done); i++)
		sleep_us(1000);
	assert_int_eq(atomic_load(&p.done), 1); /* else a wake was lost: hung */
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	expect_int_eq(p.turn, 0); /* pong answered the last volley */
	arena_free(p.h);
}
TEST_END

/* A waker that grabs the lock the moment a waiter drops it in
 * emm_arena_wait (a trylock spin), and wakes it at once: the wake lands
 * between the waiter's unlock and its wait, the window a waiter that read
 * the generation too late would miss (then both hang: the watchdog fails
 * the test). */
struct quick {
	struct arena *h;
	int flag; /* under the lock */
	atomic_int rounds_done;
	atomic_int stop;
};

#define QUICK_ROUNDS 20000

static void *quick_waiter(void *arg)
{
	struct quick *q = arg;

	for (int i = 0; i < QUICK_ROUNDS && !atomic_load(&q->stop); i++) {
		arena_lock(q->h);
		while (!q->flag && !atomic_load(&q->stop))
			emm_arena_wait(q->h);
		q->flag = 0;
		arena_unlock(q->h);
		atomic_store(&q->rounds_done, i + 1);
	}
	return NULL;
}

static void *quick_waker(void *arg)
{
	struct quick *q = arg;

	for (int i = 0; i < QUICK_ROUNDS && !atomic_load(&q->stop); i++) {
		while (!arena_trylock(q->h))
			;
		q->flag = 1;
		emm_arena_wake(q->h);
		arena_unlock(q->h);
		while (atomic_load(&q->rounds_done) <= i && !atomic_load(&q->stop))
			;
	}
	return NULL;
}

TEST_BEGIN(test_wake_right_after_the_drop)
{
	struct quick q = {.h = arena_new()};
	pthread_t w, k;
	assert_ptr_not_null(q.h);

	assert_int_eq(pthread_create(&w, NULL, quick_waiter, &q), 0);
	assert_int_eq(pthread_create(&k, NULL, quick_waker, &q), 0);
	for (int i = 0; i < 20000 && atomic_load(&q.rounds_done) < QUICK_ROUNDS; i++)
		sleep_us(1000);
	expect_int_eq(atomic_load(&q.rounds_done), QUICK_ROUNDS);
	atomic_store(&q.stop, 1);
	arena_lock(q.h);
	emm_arena_wake(q.h); /* a waiter left hanging by a lost wake */
	arena_unlock(q.h);
	pthread_join(w, NULL);
	pthread_join(k, NULL);
	arena_free(q.h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_mutual_exclusion, test_trylock, test_long_holder, test_wait_and_wake,
	                    test_wake_right_after_the_drop, NULL);
}
