/* SPDX-License-Identifier: MIT */
/* tests/backends/test-ptrmap.c - the segment map: lookups, growth, its
 * lock-free readers against writers, reset and fork. (The block tables are
 * the arenas': tests/allocator/test-blocktab.c.) */
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
	assert_int_eq(emm_segmap_insert(BASE, 1 << 20, &x), 0);
	emm_ptrmap_reset();
	expect_int_eq(emm_segmap_count(), 0);
	expect_int_eq(emm_segmap_find(BASE, NULL, NULL, NULL), -ENOENT);
	/* usable again */
	expect_int_eq(emm_segmap_insert(BASE, 1 << 20, &x), 0);
	emm_ptrmap_reset();
}
TEST_END


static atomic_bool churn_stop;
static atomic_int churn_warm; /* workers done with their first round */

/*
 * Under ASan the forks wait until every worker has finished one round: the
 * array has then grown for good, and no worker calls malloc or free
 * again. GCC 12's ASan allocator is not fork-safe: a child forked while a
 * worker was inside calloc waits on the allocator's lock forever (seen in
 * CI). The map's lock is still taken at every fork.
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
		for (uint64_t i = 0; i < 200; i++)
			emm_segmap_insert(base + i * (1 << 20), 1 << 20, &x);
		for (uint64_t i = 0; i < 200; i++)
			emm_segmap_remove(base + i * (1 << 20));
		if (!warm) {
			warm = true;
			atomic_fetch_add(&churn_warm, 1);
		}
	}
	return NULL;
}

/* fork() while other threads hold the lock (or are growing the array): the
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
			if (emm_segmap_count() != 0)
				_exit(2);
			for (uint64_t k = 1; k <= 300; k++)
				if (emm_segmap_insert(k << 20, 1 << 20, &y) != 0)
					_exit(3);
			for (uint64_t k = 1; k <= 300; k++)
				if (emm_segmap_remove(k << 20) != &y)
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

/* Random segments of random sizes and alignments (4 KiB to 80 MiB, some
 * sharing 2 MiB granules two and three at a time, one past 64 GiB) come and
 * go; every lookup, emm_segmap_find's and emm_segmap_value's, agrees with a
 * plain list. */
TEST_BEGIN(test_segmap_random_model)
{
	enum { SLOTS = 64, OPS = 20000 };
	static struct { uint64_t base, size; bool live; } m[SLOTS];
	uint64_t rng = 0x9E3779B97F4A7C15ull;

	emm_ptrmap_reset();
	memset(m, 0, sizeof(m));
	for (int op = 0; op < OPS; op++) {
		rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
		unsigned k = (unsigned)(rng % SLOTS);
		/* Slot k owns [BASE + k * 128 GiB, + 128 GiB): no overlaps. */
		uint64_t region = BASE + (uint64_t)k * (UINT64_C(128) << 30);
		if (!m[k].live) {
			uint64_t r = rng >> 8;
			m[k].size = (r % 4 == 0) ? (4096 + (r >> 4) % (80u << 20)) & ~UINT64_C(4095)
			            : (r % 4 == 1) ? UINT64_C(2) << 20
			            : (r % 4 == 2) ? UINT64_C(20) << 20
			                           : UINT64_C(4096) * (1 + (r >> 4) % 300);
			if (k == 7)
				m[k].size = UINT64_C(65) << 30; /* past the directory's largest */
			m[k].base = region + ((r >> 20) % 4096) * 4096;
			assert_int_eq(emm_segmap_insert(m[k].base, m[k].size, VAL(k)), 0);
			m[k].live = true;
			/* A neighbour slot's segment ends where this one starts, in
			 * the same granule, now and then: */
			if (k + 1 < SLOTS && !m[k + 1].live && (r & 16)) {
				m[k + 1].base = m[k].base + m[k].size;
				m[k + 1].size = 8192;
				if (m[k + 1].base + m[k + 1].size <= region + (UINT64_C(128) << 30) &&
				    emm_segmap_insert(m[k + 1].base, m[k + 1].size, VAL(k + 1)) == 0)
					m[k + 1].live = true;
			}
		} else {
			assert_ptr_eq(emm_segmap_remove(m[k].base), VAL(k));
			m[k].live = false;
			/* Its neighbour in its region goes with it. */
			if (k + 1 < SLOTS && m[k + 1].live && m[k + 1].base < region + (UINT64_C(128) << 30)) {
				assert_ptr_eq(emm_segmap_remove(m[k + 1].base), VAL(k + 1));
				m[k + 1].live = false;
			}
		}
		for (int q = 0; q < 8; q++) {
			rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
			unsigned j = (unsigned)(rng % SLOTS);
			uint64_t off = (rng >> 16) % (m[j].size ? m[j].size + (4u << 20) : (8u << 20));
			uint64_t a = (m[j].base ? m[j].base : BASE + (uint64_t)j * (UINT64_C(128) << 30)) + off;
			int want = -ENOENT;
			void *want_v = NULL, *v = NULL;
			for (unsigned i = 0; i < SLOTS; i++)
				if (m[i].live && a >= m[i].base && a - m[i].base < m[i].size) {
					want = 0;
					want_v = VAL(i);
				}
			if (emm_segmap_find(a, NULL, NULL, &v) != want || (want == 0 && v != want_v) ||
			    emm_segmap_value(a) != want_v) {
				expect_int_eq(emm_segmap_find(a, NULL, NULL, &v), want);
				expect_ptr_eq(emm_segmap_value(a), want_v);
				emm_ptrmap_reset();
				return;
			}
		}
	}
	emm_ptrmap_reset();
}
TEST_END

/* One 2 MiB granule met by one, two, then three segments, and back: each
 * lookup finds its own segment, the gaps none. */
TEST_BEGIN(test_segmap_shared_granule)
{
	uint64_t g = BASE + (UINT64_C(6) << 21); /* a granule's start */
	uint64_t a = g + 4096, b = g + (512 << 10), c = g + (1536 << 10);

	emm_ptrmap_reset();
	assert_int_eq(emm_segmap_insert(a, 64 << 10, VAL(1)), 0);
	expect_ptr_eq(emm_segmap_value(a + 100), VAL(1));
	expect_ptr_null(emm_segmap_value(b));
	assert_int_eq(emm_segmap_insert(b, 64 << 10, VAL(2)), 0);
	expect_ptr_eq(emm_segmap_value(a), VAL(1));
	expect_ptr_eq(emm_segmap_value(b + 100), VAL(2));
	expect_ptr_null(emm_segmap_value(g));
	assert_int_eq(emm_segmap_insert(c, 4 << 20, VAL(3)), 0); /* into the next granule */
	expect_ptr_eq(emm_segmap_value(a), VAL(1));
	expect_ptr_eq(emm_segmap_value(b), VAL(2));
	expect_ptr_eq(emm_segmap_value(c + (3 << 20)), VAL(3));
	expect_ptr_null(emm_segmap_value(b + (64 << 10)));
	expect_ptr_eq(emm_segmap_remove(b), VAL(2));
	expect_ptr_null(emm_segmap_value(b));
	expect_ptr_eq(emm_segmap_value(a), VAL(1));
	expect_ptr_eq(emm_segmap_value(c), VAL(3));
	expect_int_eq(emm_segmap_resize(a, 128 << 10), 0);
	expect_ptr_eq(emm_segmap_value(a + (100 << 10)), VAL(1));
	expect_ptr_eq(emm_segmap_remove(a), VAL(1));
	expect_ptr_null(emm_segmap_value(a));
	expect_ptr_eq(emm_segmap_value(c + 1), VAL(3));
	emm_ptrmap_reset();
}
TEST_END

/* Lock-free readers against writers: segments that never go away are always
 * found with their own value, and an address in no segment is never found,
 * while other threads insert and remove segments around them and the array
 * grows (every 64 entries) and moves. */
static atomic_bool rw_stop;
static atomic_long rw_errors, rw_finds;

static void *rw_writer(void *p)
{
	uint64_t base = BASE + (UINT64_C(1) << 40) + (uint64_t)(uintptr_t)p * (UINT64_C(1) << 36);
	int x;

	while (!atomic_load(&rw_stop)) {
		for (uint64_t i = 0; i < 300; i++)
			emm_segmap_insert(base + i * (4 << 20), 2 << 20, &x);
		for (uint64_t i = 0; i < 300; i++)
			emm_segmap_remove(base + i * (4 << 20));
	}
	return NULL;
}

static void *rw_reader(void *p)
{
	(void)p;
	for (uint64_t n = 0; !atomic_load(&rw_stop); n++) {
		uint64_t k = n % 100, base, a = BASE + k * (4 << 20) + (n * 4096) % (2 << 20);
		size_t size;
		void *value;

		if (emm_segmap_find(a, &base, &size, &value) != 0 || base != BASE + k * (4 << 20) ||
		    size != (2 << 20) || value != VAL(k))
			atomic_fetch_add(&rw_errors, 1);
		if (emm_segmap_find(a + (2 << 20), NULL, NULL, NULL) != -ENOENT) /* the gap after it */
			atomic_fetch_add(&rw_errors, 1);
		atomic_fetch_add_explicit(&rw_finds, 1, memory_order_relaxed);
	}
	return NULL;
}

TEST_BEGIN(test_segmap_readers_and_writers)
{
	pthread_t w[2], r[3];

	emm_ptrmap_reset();
	for (uint64_t k = 0; k < 100; k++)
		assert_int_eq(emm_segmap_insert(BASE + k * (4 << 20), 2 << 20, VAL(k)), 0);
	atomic_store(&rw_stop, false);
	atomic_store(&rw_errors, 0);
	atomic_store(&rw_finds, 0);
	for (uintptr_t t = 0; t < 2; t++)
		assert_int_eq(pthread_create(&w[t], NULL, rw_writer, (void *)t), 0);
	for (uintptr_t t = 0; t < 3; t++)
		assert_int_eq(pthread_create(&r[t], NULL, rw_reader, NULL), 0);
	/* At least 300 ms, until the readers have made 3000 lookups (writers
	 * that never pause, as here, make readers search again and again: on
	 * two slow CPUs under ThreadSanitizer 300 ms gave fewer than 1000),
	 * at most 20 s. */
	for (int ms = 0; ms < 20000 && (ms < 300 || atomic_load(&rw_finds) < 3000); ms += 10)
		usleep(10000);
	atomic_store(&rw_stop, true);
	for (int t = 0; t < 2; t++)
		pthread_join(w[t], NULL);
	for (int t = 0; t < 3; t++)
		pthread_join(r[t], NULL);
	expect_int_eq(atomic_load(&rw_errors), 0);
	expect_true(atomic_load(&rw_finds) > 1000);
	emm_ptrmap_reset();
}
TEST_END

int main(void)
{
	return emm_test_run(test_segmap, test_segmap_many, test_segmap_random_model, test_segmap_shared_granule,
	                    test_segmap_readers_and_writers, test_reset,
	                    test_reset_after_fork, NULL);
}
