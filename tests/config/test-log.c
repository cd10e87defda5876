/* SPDX-License-Identifier: MIT */
/*
 * tests/config/test-log.c - common/log.c: every line goes to the fd set
 * with emm_log_set_fd, with its level's prefix; debug lines only when
 * enabled; emm_log_sparingly says yes at the 1st, 2nd, 4th, 8th ... call
 * of one counter (from several threads too) and reports the count.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "common/log.h"
#include "emm_test.h"

TEST_BEGIN(test_prefixes_and_debug)
{
	FILE *f = tmpfile();

	assert_ptr_not_null(f);
	emm_log_set_fd(fileno(f));
	emm_info("plain %d", 1);
	emm_warn("careful %d", 2);
	emm_error("broken %d", 3);
	emm_log_set_debug(false);
	emm_debug("hidden");
	emm_log_set_debug(true);
	emm_debug("shown");
	emm_log_set_debug(false);
	emm_log_set_fd(-1);
	expect_int_eq(emm_test_count_lines(f, "emm: plain 1"), 1);
	expect_int_eq(emm_test_count_lines(f, "emm: warning: careful 2"), 1);
	expect_int_eq(emm_test_count_lines(f, "emm: error: broken 3"), 1);
	expect_int_eq(emm_test_count_lines(f, "hidden"), 0);
	expect_int_eq(emm_test_count_lines(f, "shown"), 1);
	fclose(f);
}
TEST_END

TEST_BEGIN(test_sparingly_powers_of_two)
{
	atomic_uint c = 0;
	unsigned said = 0, n = 0, last = 0;

	for (unsigned i = 1; i <= 1000; i++) {
		if (emm_log_sparingly(&c, &n)) {
			said++;
			last = n;
			expect_int_eq(n & (n - 1), 0);
		}
		expect_int_eq(n, i);
	}
	expect_int_eq(said, 10); /* 1 2 4 ... 512 */
	expect_int_eq(last, 512);
}
TEST_END

static atomic_uint shared_count;
static atomic_uint shared_said;

static void *sparing_thread(void *arg)
{
	unsigned n;

	(void)arg;
	for (int i = 0; i < 4096; i++)
		if (emm_log_sparingly(&shared_count, &n))
			atomic_fetch_add(&shared_said, 1);
	return NULL;
}

/* Eight threads, 32 768 calls: each count is seen once, so exactly the 16
 * powers of two up to 32 768 say yes. */
TEST_BEGIN(test_sparingly_threads)
{
	pthread_t t[8];

	for (int i = 0; i < 8; i++)
		assert_int_eq(pthread_create(&t[i], NULL, sparing_thread, NULL), 0);
	for (int i = 0; i < 8; i++)
		pthread_join(t[i], NULL);
	expect_int_eq(atomic_load(&shared_count), 32768);
	expect_int_eq(atomic_load(&shared_said), 16);
}
TEST_END

int main(void)
{
	return emm_test_run(test_prefixes_and_debug, test_sparingly_powers_of_two, test_sparingly_threads, NULL);
}
