/* SPDX-License-Identifier: MIT */
/*
 * tests/common/emm_test.h - the unit-test harness (jemalloc's shape):
 *
 *   TEST_BEGIN(test_name) { ... expect_*(...); assert_*(...); } TEST_END
 *   int main(void) { return emm_test_run(test_a, test_b, NULL); }
 *
 * expect_* records a failure and continues; assert_* records it and leaves
 * the test. A test may call emm_test_skip("why") (counts as skipped). Each
 * program ends with one line "N passed, N failed, N skipped" and exits 0 if
 * nothing failed, 77 if everything was skipped, 1 otherwise. When some tests
 * passed and some were skipped it also prints the partial-skip line
 * (emm_partial.h, tests/common/README.md):
 *
 *   EMM-PARTIAL: ran P, skipped S (test_x: why; test_y: why)
 */
#ifndef EMM_TEST_H
#define EMM_TEST_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emm_partial.h"

typedef void (*emm_test_fn)(void);

struct emm_test_state {
	const char *name;
	int failures;
	bool skipped;
	char skip_why[160];
};

extern struct emm_test_state emm_test_current;

#define TEST_BEGIN(fn)                               \
	static void fn(void)                         \
	{                                            \
		emm_test_current.name = #fn;         \
		do
#define TEST_END                                     \
		while (0);                           \
	}

#define emm_test_fail_(...)                                                            \
	do {                                                                           \
		fprintf(stderr, "%s:%d: %s: ", __FILE__, __LINE__, emm_test_current.name); \
		fprintf(stderr, __VA_ARGS__);                                          \
		fputc('\n', stderr);                                                   \
		emm_test_current.failures++;                                           \
	} while (0)

#define expect_true(c, ...)                                       \
	do {                                                      \
		if (!(c)) {                                       \
			emm_test_fail_("expected true: %s", #c); \
		}                                                 \
	} while (0)
#define expect_false(c, ...) expect_true(!(c))
#define expect_int_eq(a, b)                                                                    \
	do {                                                                                   \
		long long a_ = (long long)(a), b_ = (long long)(b);                            \
		if (a_ != b_)                                                                  \
			emm_test_fail_("%s == %s: %lld != %lld", #a, #b, a_, b_);              \
	} while (0)
#define expect_int_ne(a, b)                                                                    \
	do {                                                                                   \
		long long a_ = (long long)(a), b_ = (long long)(b);                            \
		if (a_ == b_)                                                                  \
			emm_test_fail_("%s != %s: both %lld", #a, #b, a_);                     \
	} while (0)
#define expect_u64_eq(a, b)                                                                    \
	do {                                                                                   \
		uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                               \
		if (a_ != b_)                                                                  \
			emm_test_fail_("%s == %s: 0x%" PRIx64 " != 0x%" PRIx64, #a, #b, a_, b_); \
	} while (0)
#define expect_ptr_eq(a, b) expect_u64_eq((uintptr_t)(a), (uintptr_t)(b))
#define expect_ptr_null(a) expect_u64_eq((uintptr_t)(a), 0)
#define expect_ptr_not_null(a) expect_true((a) != NULL)
#define expect_str_eq(a, b)                                                         \
	do {                                                                        \
		const char *a_ = (a), *b_ = (b);                                    \
		if (strcmp(a_, b_) != 0)                                            \
			emm_test_fail_("%s == %s: \"%s\" != \"%s\"", #a, #b, a_, b_); \
	} while (0)

/* assert_*: same checks, but leave the test on failure. */
#define assert_(check)                                                         \
	do {                                                                   \
		int before_ = emm_test_current.failures;                       \
		check;                                                         \
		if (emm_test_current.failures != before_)                      \
			return;                                                \
	} while (0)
#define assert_true(c) assert_(expect_true(c))
#define assert_false(c) assert_(expect_false(c))
#define assert_int_eq(a, b) assert_(expect_int_eq(a, b))
#define assert_int_ne(a, b) assert_(expect_int_ne(a, b))
#define assert_u64_eq(a, b) assert_(expect_u64_eq(a, b))
#define assert_ptr_eq(a, b) assert_(expect_ptr_eq(a, b))
#define assert_ptr_not_null(a) assert_(expect_ptr_not_null(a))
#define assert_str_eq(a, b) assert_(expect_str_eq(a, b))

/* xorshift64*: the tests' reproducible pseudo-random numbers (state != 0). */
static inline uint64_t emm_test_rand(uint64_t *state)
{
	*state ^= *state >> 12;
	*state ^= *state << 25;
	*state ^= *state >> 27;
	return *state * 0x2545f4914f6cdd1dull;
}

/* Lines of f (read from its start) that contain `what`: for output a test
 * captured in a temporary file. */
static inline unsigned emm_test_count_lines(FILE *f, const char *what)
{
	char line[512];
	unsigned n = 0;

	rewind(f);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, what) != NULL;
	return n;
}

static inline void emm_test_skip(const char *why)
{
	fprintf(stderr, "%s: skipped: %s\n", emm_test_current.name, why);
	emm_test_current.skipped = true;
	snprintf(emm_test_current.skip_why, sizeof(emm_test_current.skip_why), "%s", why ? why : "?");
	for (char *c = emm_test_current.skip_why; *c; c++)
		if (*c == '\n' || *c == '\r')
			*c = ' '; /* the marker is one line */
}

struct emm_test_state emm_test_current;

static inline int emm_test_run_list(emm_test_fn *tests)
{
	int passed = 0, failed = 0, skipped = 0;
	char why[1024] = "";
	for (emm_test_fn *t = tests; *t; t++) {
		emm_test_current.failures = 0;
		emm_test_current.skipped = false;
		emm_test_current.skip_why[0] = '\0';
		emm_test_current.name = "?";
		(*t)();
		if (emm_test_current.failures) {
			failed++;
			fprintf(stderr, "FAIL %s\n", emm_test_current.name);
		} else if (emm_test_current.skipped) {
			size_t len = strlen(why);
			skipped++;
			fprintf(stderr, "SKIP %s\n", emm_test_current.name);
			snprintf(why + len, sizeof(why) - len, "%s%s: %s", len ? "; " : "", emm_test_current.name,
			         emm_test_current.skip_why);
		} else {
			passed++;
			fprintf(stderr, "ok   %s\n", emm_test_current.name);
		}
	}
	printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
	fflush(stdout);
	if (!failed && passed > 0)
		emm_partial_print((unsigned)passed, (unsigned)skipped, why);
	if (failed)
		return 1;
	if (passed == 0 && skipped > 0)
		return 77;
	return 0;
}

#define emm_test_run(...) emm_test_run_list((emm_test_fn[]){__VA_ARGS__})

#endif
