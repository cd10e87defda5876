/* SPDX-License-Identifier: MIT */
/* tests/backends/test-ptrmap.c - the block map and the segment map. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "allocator/ptrmap.h"
#include "emm_test.h"

#define BASE   UINT64_C(0x7f0000000000)
#define VAL(k) ((void *)(uintptr_t)((k) ^ UINT64_C(0x5a5a5a5a5a5a5a5a)))

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

TEST_BEGIN(test_blockmap_basic)
{
	int x;

	emm_ptrmap_reset();
	expect_int_eq(emm_blockmap_count(), 0);
	expect_ptr_null(emm_blockmap_get(BASE));
	expect_ptr_null(emm_blockmap_take(BASE));

	expect_int_eq(emm_blockmap_insert(BASE, &x), 0);
	expect_int_eq(emm_blockmap_insert(BASE, &x), -EEXIST);
	expect_int_eq(emm_blockmap_count(), 1);
	expect_ptr_eq(emm_blockmap_get(BASE), &x);
	expect_ptr_null(emm_blockmap_get(BASE + 512)); /* a neighbour */
	expect_ptr_null(emm_blockmap_get(BASE + 1));   /* an interior pointer */
	expect_ptr_eq(emm_blockmap_take(BASE), &x);
	expect_ptr_null(emm_blockmap_take(BASE));
	expect_ptr_null(emm_blockmap_get(BASE));
	expect_int_eq(emm_blockmap_count(), 0);

	expect_int_eq(emm_blockmap_insert(0, &x), -EINVAL);
	expect_int_eq(emm_blockmap_insert(BASE, NULL), -EINVAL);
	expect_ptr_null(emm_blockmap_get(0));
	expect_ptr_null(emm_blockmap_take(0));
}
TEST_END

/* Many keys, then half taken, then reinserted: growth from the static tables,
 * long clusters, backward-shift deletion. Keys with odd strides land in the
 * same shards and home slots often. */
TEST_BEGIN(test_blockmap_growth_and_collisions)
{
	enum { N = 200000 };

	emm_ptrmap_reset();
	for (uint64_t i = 0; i < N; i++)
		assert_int_eq(emm_blockmap_insert(BASE + i * 512, VAL(i)), 0);
	expect_int_eq(emm_blockmap_count(), N);
	for (uint64_t i = 0; i < N; i++) {
		if (emm_blockmap_get(BASE + i * 512) != VAL(i)) {
			expect_ptr_eq(emm_blockmap_get(BASE + i * 512), VAL(i));
			break;
		}
	}
	for (uint64_t i = 0; i < N; i += 2)
		assert_ptr_eq(emm_blockmap_take(BASE + i * 512), VAL(i));
	expect_int_eq(emm_blockmap_count(), N / 2);
	for (uint64_t i = 0; i < N; i++) {
		void *want = (i & 1) ? VAL(i) : NULL;

		if (emm_blockmap_get(BASE + i * 512) != want) {
			expect_ptr_eq(emm_blockmap_get(BASE + i * 512), want);
			break;
		}
	}
	for (uint64_t i = 0; i < N; i += 2)
		assert_int_eq(emm_blockmap_insert(BASE + i * 512, VAL(i)), 0);
	for (uint64_t i = 0; i < N; i++)
		assert_ptr_eq(emm_blockmap_take(BASE + i * 512), VAL(i));
	expect_int_eq(emm_blockmap_count(), 0);
}
TEST_END

/* Random insert/take/get against a plain array model. */
TEST_BEGIN(test_blockmap_random_model)
{
	enum { KEYS = 5000, OPS = 400000 };
	static bool present[KEYS];
	uint64_t rng = 88172645463325252ull;
	size_t live = 0;

	emm_ptrmap_reset();
	memset(present, 0, sizeof(present));
	for (int op = 0; op < OPS; op++) {
		uint64_t k, addr;

		rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
		k = rng % KEYS;
		/* Scattered distinct addresses (odd multiplier: a bijection). */
		addr = BASE + ((k * 40503) & 0xfffff) * 512;
		switch ((rng >> 32) % 3) {
		case 0:
			assert_int_eq(emm_blockmap_insert(addr, VAL(addr)), present[k] ? -EEXIST : 0);
			if (!present[k])
				live++;
			present[k] = true;
			break;
		case 1:
			assert_ptr_eq(emm_blockmap_take(addr), present[k] ? VAL(addr) : NULL);
			if (present[k])
				live--;
			present[k] = false;
			break;
		default:
			assert_ptr_eq(emm_blockmap_get(addr), present[k] ? VAL(addr) : NULL);
		}
	}
	expect_int_eq(emm_blockmap_count(), live);
	emm_ptrmap_reset();
}
TEST_END

struct thread_arg {
	unsigned index;
	int errors;
};

#define THREADS    8
#define PER_THREAD 20000
#define ROUNDS     5

static void *disjoint_worker(void *p)
{
	struct thread_arg *arg = p;
	/* Interleaved keys: thread t owns BASE + (i * THREADS + t) * 512, so
	 * every thread hits every shard. */
	for (int round = 0; round < ROUNDS; round++) {
		for (uint64_t i = 0; i < PER_THREAD; i++) {
			uint64_t a = BASE + (i * THREADS + arg->index) * 512;

			if (emm_blockmap_insert(a, VAL(a)) != 0)
				arg->errors++;
		}
		for (uint64_t i = 0; i < PER_THREAD; i++) {
			uint64_t a = BASE + (i * THREADS + arg->index) * 512;

			if (emm_blockmap_get(a) != VAL(a))
				arg->errors++;
		}
		for (uint64_t i = 0; i < PER_THREAD; i++) {
			uint64_t a = BASE + (i * THREADS + arg->index) * 512;

			if (emm_blockmap_take(a) != VAL(a))
				arg->errors++;
		}
	}
	return NULL;
}

TEST_BEGIN(test_blockmap_threads)
{
	pthread_t threads[THREADS];
	struct thread_arg args[THREADS];

	emm_ptrmap_reset();
	for (unsigned t = 0; t < THREADS; t++) {
		args[t] = (struct thread_arg){.index = t};
		assert_int_eq(pthread_create(&threads[t], NULL, disjoint_worker, &args[t]), 0);
	}
	for (unsigned t = 0; t < THREADS; t++) {
		pthread_join(threads[t], NULL);
		expect_int_eq(args[t].errors, 0);
	}
	expect_int_eq(emm_blockmap_count(), 0);
}
TEST_END

/* Not a pass/fail check (the benchmark is bench-ptrmap): one line so the
 * cost is visible in every test log. */
TEST_BEGIN(test_blockmap_cost)
{
	enum { LIVE = 10000, ITERS = 2000000 };
	double t0, t1;

	emm_ptrmap_reset();
	for (uint64_t i = 0; i < LIVE; i++)
		assert_int_eq(emm_blockmap_insert(BASE + (UINT64_C(1) << 32) + i * 4096, VAL(i)), 0);
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		uint64_t a = BASE + (i & 1023) * 512;

		emm_blockmap_insert(a, VAL(a));
		if (emm_blockmap_take(a) != VAL(a)) {
			expect_true(false);
			break;
		}
	}
	t1 = now_ns();
	fprintf(stderr, "blockmap: %.1f ns per insert+take pair (%d live entries)\n", (t1 - t0) / ITERS,
	        LIVE);
	emm_ptrmap_reset();
}
TEST_END

TEST_BEGIN(test_segmap)
{
	const uint64_t mib = UINT64_C(1) << 20;
	uint64_t base;
	size_t size;
	void *value;
	int a, b, c;

	emm_ptrmap_reset();
	expect_int_eq(emm_segmap_find(BASE, NULL, NULL, NULL), -ENOENT);
	assert_int_eq(emm_segmap_insert(BASE, 2 * mib, &a), 0);
	assert_int_eq(emm_segmap_insert(BASE + 4 * mib, 2 * mib, &b), 0);
	expect_int_eq(emm_segmap_count(), 2);

	/* overlaps: identical, start inside, end inside, containing, contained */
	expect_int_eq(emm_segmap_insert(BASE, 2 * mib, &c), -EEXIST);
	expect_int_eq(emm_segmap_insert(BASE + mib, 2 * mib, &c), -EEXIST);
	expect_int_eq(emm_segmap_insert(BASE + 3 * mib, 2 * mib, &c), -EEXIST);
	expect_int_eq(emm_segmap_insert(BASE - mib, 8 * mib, &c), -EEXIST);
	expect_int_eq(emm_segmap_insert(BASE + 4 * mib + 512, 512, &c), -EEXIST);
	expect_int_eq(emm_segmap_insert(BASE - 512, 1024, &c), -EEXIST);
	expect_int_eq(emm_segmap_insert(BASE + 6 * mib - 1, 2, &c), -EEXIST);
	/* bad arguments */
	expect_int_eq(emm_segmap_insert(BASE + 16 * mib, 0, &c), -EINVAL);
	expect_int_eq(emm_segmap_insert(UINT64_MAX - 10, 100, &c), -EINVAL);
	/* exactly adjacent on both sides is fine */
	assert_int_eq(emm_segmap_insert(BASE + 2 * mib, 2 * mib, &c), 0);
	expect_int_eq(emm_segmap_count(), 3);

	/* base, interior, last byte, one past the end, before the first */
	expect_int_eq(emm_segmap_find(BASE, &base, &size, &value), 0);
	expect_u64_eq(base, BASE);
	expect_u64_eq(size, 2 * mib);
	expect_ptr_eq(value, &a);
	expect_int_eq(emm_segmap_find(BASE + 12345, &base, &size, &value), 0);
	expect_u64_eq(base, BASE);
	expect_int_eq(emm_segmap_find(BASE + 2 * mib - 1, &base, NULL, &value), 0);
	expect_ptr_eq(value, &a);
	expect_int_eq(emm_segmap_find(BASE + 2 * mib, &base, NULL, &value), 0);
	expect_ptr_eq(value, &c);
	expect_int_eq(emm_segmap_find(BASE + 6 * mib - 1, &base, NULL, &value), 0);
	expect_ptr_eq(value, &b);
	expect_u64_eq(base, BASE + 4 * mib);
	expect_int_eq(emm_segmap_find(BASE + 6 * mib, NULL, NULL, NULL), -ENOENT);
	expect_int_eq(emm_segmap_find(BASE - 1, NULL, NULL, NULL), -ENOENT);
	expect_int_eq(emm_segmap_find(0, NULL, NULL, NULL), -ENOENT);

	/* out-parameters untouched on a miss */
	base = 42;
	expect_int_eq(emm_segmap_find(BASE + 7 * mib, &base, NULL, NULL), -ENOENT);
	expect_u64_eq(base, 42);

	/* remove: only by base, then the hole is free again */
	expect_ptr_null(emm_segmap_remove(BASE + 2 * mib + 512));
	expect_ptr_eq(emm_segmap_remove(BASE + 2 * mib), &c);
	expect_ptr_null(emm_segmap_remove(BASE + 2 * mib));
	expect_int_eq(emm_segmap_find(BASE + 3 * mib, NULL, NULL, NULL), -ENOENT);
	expect_int_eq(emm_segmap_find(BASE + 4 * mib, NULL, NULL, &value), 0);
	expect_ptr_eq(value, &b);
	expect_int_eq(emm_segmap_insert(BASE + 2 * mib + 512, mib, &c), 0);
	expect_int_eq(emm_segmap_count(), 3);
	emm_ptrmap_reset();
}
TEST_END

/* Many segments inserted out of order: the array grows and stays sorted. */
TEST_BEGIN(test_segmap_many)
{
	enum { N = 3000 };
	const uint64_t step = UINT64_C(4) << 20;
	void *value;

	emm_ptrmap_reset();
	for (uint64_t i = 0; i < N; i++) {
		uint64_t k = (i * 1237) % N; /* a permutation of 0..N-1 */

		assert_int_eq(emm_segmap_insert(BASE + k * step, step / 2, VAL(k)), 0);
	}
	expect_int_eq(emm_segmap_count(), N);
	for (uint64_t k = 0; k < N; k++) {
		assert_int_eq(emm_segmap_find(BASE + k * step + step / 4, NULL, NULL, &value), 0);
		assert_ptr_eq(value, VAL(k));
		assert_int_eq(emm_segmap_find(BASE + k * step + step / 2, NULL, NULL, NULL), -ENOENT);
	}
	for (uint64_t k = 0; k < N; k += 3)
		assert_ptr_eq(emm_segmap_remove(BASE + k * step), VAL(k));
	for (uint64_t k = 0; k < N; k++)
		assert_int_eq(emm_segmap_find(BASE + k * step, NULL, NULL, NULL), k % 3 ? 0 : -ENOENT);
	emm_ptrmap_reset();
}
TEST_END

TEST_BEGIN(test_reset)
{
	int x;

	emm_ptrmap_reset();
	for (uint64_t i = 1; i <= 5000; i++)
		assert_int_eq(emm_blockmap_insert(BASE + i * 512, &x), 0);
	assert_int_eq(emm_segmap_insert(BASE, 1 << 20, &x), 0);
	emm_ptrmap_reset();
	expect_int_eq(emm_blockmap_count(), 0);
	expect_int_eq(emm_segmap_count(), 0);
	expect_ptr_null(emm_blockmap_get(BASE + 512));
	expect_int_eq(emm_segmap_find(BASE, NULL, NULL, NULL), -ENOENT);
	/* usable again */
	expect_int_eq(emm_blockmap_insert(BASE + 512, &x), 0);
	expect_ptr_eq(emm_blockmap_take(BASE + 512), &x);
	expect_int_eq(emm_segmap_insert(BASE, 1 << 20, &x), 0);
	emm_ptrmap_reset();
}
TEST_END

static bool accept_value(const void *value, const void *arg)
{
	return value == arg;
}

/* take_if: taken only when accepted; a refusal leaves the entry. */
TEST_BEGIN(test_blockmap_take_if)
{
	int x, y;
	void *v = NULL;

	emm_ptrmap_reset();
	assert_int_eq(emm_blockmap_insert(BASE + 512, &x), 0);
	expect_int_eq(emm_blockmap_take_if(BASE + 512, accept_value, &y, &v), -EXDEV);
	expect_ptr_null(v);
	expect_ptr_eq(emm_blockmap_get(BASE + 512), &x);
	expect_int_eq(emm_blockmap_count(), 1);
	expect_int_eq(emm_blockmap_take_if(BASE + 1024, accept_value, &x, &v), -ENOENT);
	expect_int_eq(emm_blockmap_take_if(0, accept_value, &x, &v), -ENOENT);
	expect_ptr_null(v);
	expect_int_eq(emm_blockmap_take_if(BASE + 512, accept_value, &x, &v), 0);
	expect_ptr_eq(v, &x);
	expect_int_eq(emm_blockmap_count(), 0);
	expect_int_eq(emm_blockmap_take_if(BASE + 512, accept_value, &x, &v), -ENOENT);
	emm_ptrmap_reset();
}
TEST_END

static atomic_bool churn_stop;
static atomic_int churn_warm; /* workers done with their first round */

/*
 * Under ASan the forks wait until every worker has finished one round: its
 * tables have then grown for good, and it calls neither calloc nor free
 * again. GCC 12's ASan allocator is not fork-safe: a child forked while a
 * worker was inside calloc waits on the allocator's lock forever (seen in
 * CI). The shard locks are still taken at every fork.
 */
#if defined(__SANITIZE_ADDRESS__)
#define FORK_AFTER_WARM 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FORK_AFTER_WARM 1
#endif
#endif
#ifndef FORK_AFTER_WARM
#define FORK_AFTER_WARM 0
#endif

static void *churn_worker(void *p)
{
	uint64_t base = BASE + (uint64_t)(uintptr_t)p * (UINT64_C(1) << 36);
	bool warm = false;
	int x;

	while (!atomic_load(&churn_stop)) {
		for (uint64_t i = 0; i < 2000; i++)
			emm_blockmap_insert(base + i * 512, &x);
		emm_segmap_insert(base, 1 << 20, &x);
		for (uint64_t i = 0; i < 2000; i++)
			emm_blockmap_take(base + i * 512);
		emm_segmap_remove(base);
		if (!warm) {
			warm = true;
			atomic_fetch_add(&churn_warm, 1);
		}
	}
	return NULL;
}

/* fork() while other threads hold the locks (or are growing a table): the
 * child resets and the maps work there, without deadlocking. */
TEST_BEGIN(test_reset_after_fork)
{
	pthread_t threads[3];
	int forks_ok = 0;

	emm_ptrmap_reset();
	atomic_store(&churn_stop, false);
	atomic_store(&churn_warm, 0);
	for (uintptr_t t = 0; t < 3; t++)
		assert_int_eq(pthread_create(&threads[t], NULL, churn_worker, (void *)(t + 1)), 0);
	while (FORK_AFTER_WARM && atomic_load(&churn_warm) < 3)
		usleep(1000);
	for (int i = 0; i < 20; i++) {
		int status = 0;
		pid_t pid;

		usleep(2000);
		pid = fork();
		if (pid == 0) {
			int y;

			alarm(10);
			emm_ptrmap_reset();
			if (emm_blockmap_count() != 0 || emm_segmap_count() != 0)
				_exit(2);
			for (uint64_t k = 1; k <= 3000; k++)
				if (emm_blockmap_insert(k * 512, &y) != 0)
					_exit(3);
			for (uint64_t k = 1; k <= 3000; k++)
				if (emm_blockmap_take(k * 512) != &y)
					_exit(4);
			if (emm_segmap_insert(BASE, 4096, &y) != 0 ||
			    emm_segmap_find(BASE + 1, NULL, NULL, NULL) != 0)
				_exit(5);
			_exit(0);
		}
		assert_true(pid > 0);
		waitpid(pid, &status, 0);
		if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
			forks_ok++;
		else
			fprintf(stderr, "child %d: status 0x%x\n", i, status);
	}
	atomic_store(&churn_stop, true);
	for (int t = 0; t < 3; t++)
		pthread_join(threads[t], NULL);
	expect_int_eq(forks_ok, 20);
	emm_ptrmap_reset();
}
TEST_END

int main(void)
{
	return emm_test_run(test_blockmap_basic, test_blockmap_growth_and_collisions,
	                    test_blockmap_random_model, test_blockmap_threads, test_blockmap_cost,
	                    test_blockmap_take_if, test_segmap, test_segmap_many, test_reset, test_reset_after_fork, NULL);
}
