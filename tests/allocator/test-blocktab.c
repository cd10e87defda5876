/* SPDX-License-Identifier: MIT */
/* tests/allocator/test-blocktab.c - an arena's block table (blocktab.h):
 * insert, get and take against a model, growth, backward-shift deletion,
 * and what a table that could not start or grow answers. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "allocator/blocktab.h"
#include "emm_test.h"

#define BASE   UINT64_C(0x7f0000000000)
#define VAL(k) ((void *)(uintptr_t)((k) ^ UINT64_C(0x5a5a5a5a5a5a5a5a)))

TEST_BEGIN(test_blocktab_basic)
{
	struct emm_blocktab t;
	int x;

	assert_int_eq(emm_blocktab_init(&t), 0);
	expect_int_eq(t.count, 0);
	expect_ptr_null(emm_blocktab_get(&t, BASE));
	expect_ptr_null(emm_blocktab_take(&t, BASE));

	expect_int_eq(emm_blocktab_insert(&t, BASE, &x), 0);
	expect_int_eq(emm_blocktab_insert(&t, BASE, &x), -EEXIST);
	expect_int_eq(t.count, 1);
	expect_ptr_eq(emm_blocktab_get(&t, BASE), &x);
	expect_ptr_null(emm_blocktab_get(&t, BASE + 512)); /* a neighbour */
	expect_ptr_null(emm_blocktab_get(&t, BASE + 1));   /* an interior pointer */
	expect_ptr_eq(emm_blocktab_take(&t, BASE), &x);
	expect_ptr_null(emm_blocktab_take(&t, BASE));
	expect_ptr_null(emm_blocktab_get(&t, BASE));
	expect_int_eq(t.count, 0);

	expect_int_eq(emm_blocktab_insert(&t, 0, &x), -EINVAL);
	expect_int_eq(emm_blocktab_insert(&t, BASE, NULL), -EINVAL);
	expect_ptr_null(emm_blocktab_get(&t, 0));
	expect_ptr_null(emm_blocktab_take(&t, 0));
	emm_blocktab_fini(&t);
}
TEST_END

/* Many keys, then half taken, then reinserted: growth from the first table,
 * long clusters, backward-shift deletion. */
TEST_BEGIN(test_blocktab_growth_and_collisions)
{
	enum { N = 200000 };
	struct emm_blocktab t;

	assert_int_eq(emm_blocktab_init(&t), 0);
	for (uint64_t i = 0; i < N; i++)
		assert_int_eq(emm_blocktab_insert(&t, BASE + i * 512, VAL(i)), 0);
	expect_int_eq(t.count, N);
	for (uint64_t i = 0; i < N; i++) {
		if (emm_blocktab_get(&t, BASE + i * 512) != VAL(i)) {
			expect_ptr_eq(emm_blocktab_get(&t, BASE + i * 512), VAL(i));
			break;
		}
	}
	for (uint64_t i = 0; i < N; i += 2)
		assert_ptr_eq(emm_blocktab_take(&t, BASE + i * 512), VAL(i));
	expect_int_eq(t.count, N / 2);
	for (uint64_t i = 0; i < N; i++) {
		void *want = (i & 1) ? VAL(i) : NULL;

		if (emm_blocktab_get(&t, BASE + i * 512) != want) {
			expect_ptr_eq(emm_blocktab_get(&t, BASE + i * 512), want);
			break;
		}
	}
	for (uint64_t i = 0; i < N; i += 2)
		assert_int_eq(emm_blocktab_insert(&t, BASE + i * 512, VAL(i)), 0);
	for (uint64_t i = 0; i < N; i++)
		assert_ptr_eq(emm_blocktab_take(&t, BASE + i * 512), VAL(i));
	expect_int_eq(t.count, 0);
	emm_blocktab_fini(&t);
}
TEST_END

/* Random insert/take/get against a plain array model. */
TEST_BEGIN(test_blocktab_random_model)
{
	enum { KEYS = 5000, OPS = 400000 };
	static bool present[KEYS];
	struct emm_blocktab t;
	uint64_t rng = 88172645463325252ull;
	size_t live = 0;

	assert_int_eq(emm_blocktab_init(&t), 0);
	memset(present, 0, sizeof(present));
	for (int op = 0; op < OPS; op++) {
		uint64_t k, addr;

		rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
		k = rng % KEYS;
		/* Scattered distinct addresses (odd multiplier: a bijection). */
		addr = BASE + ((k * 40503) & 0xfffff) * 512;
		switch ((rng >> 32) % 3) {
		case 0:
			assert_int_eq(emm_blocktab_insert(&t, addr, VAL(addr)), present[k] ? -EEXIST : 0);
			if (!present[k])
				live++;
			present[k] = true;
			break;
		case 1:
			assert_ptr_eq(emm_blocktab_take(&t, addr), present[k] ? VAL(addr) : NULL);
			if (present[k])
				live--;
			present[k] = false;
			break;
		default:
			assert_ptr_eq(emm_blocktab_get(&t, addr), present[k] ? VAL(addr) : NULL);
		}
	}
	expect_int_eq(t.count, live);
	emm_blocktab_fini(&t);
}
TEST_END

/* Keys that share a home slot (same bits above the hash's cut) form one
 * cluster; taking from its middle must keep every later member reachable,
 * including across the table's end. */
TEST_BEGIN(test_blocktab_wrapping_cluster)
{
	struct emm_blocktab t;
	uint64_t keys[40];
	unsigned n = 0;

	assert_int_eq(emm_blocktab_init(&t), 0);
	/* Find 40 addresses whose home is one of the last two slots. */
	for (uint64_t a = BASE; n < 40; a += 512)
		if (emm_blocktab_home(&t, a) >= t.mask - 1)
			keys[n++] = a;
	for (unsigned i = 0; i < 40; i++)
		assert_int_eq(emm_blocktab_insert(&t, keys[i], VAL(keys[i])), 0);
	for (unsigned i = 0; i < 40; i += 3)
		assert_ptr_eq(emm_blocktab_take(&t, keys[i]), VAL(keys[i]));
	for (unsigned i = 0; i < 40; i++)
		expect_ptr_eq(emm_blocktab_get(&t, keys[i]), i % 3 ? VAL(keys[i]) : NULL);
	emm_blocktab_fini(&t);
}
TEST_END

/* A table that never started (emm_blocktab_init failed, or after fini)
 * holds nothing and refuses inserts with -ENOMEM. */
TEST_BEGIN(test_blocktab_unstarted)
{
	struct emm_blocktab t;
	int x;

	memset(&t, 0, sizeof(t));
	expect_int_eq(emm_blocktab_insert(&t, BASE, &x), -ENOMEM);
	expect_int_eq(emm_blocktab_insert(&t, 0, &x), -EINVAL);
	expect_ptr_null(emm_blocktab_get(&t, BASE));
	expect_ptr_null(emm_blocktab_take(&t, BASE));
	assert_int_eq(emm_blocktab_init(&t), 0);
	emm_blocktab_fini(&t);
	expect_int_eq(emm_blocktab_insert(&t, BASE, &x), -ENOMEM);
}
TEST_END

int main(void)
{
	return emm_test_run(test_blocktab_basic, test_blocktab_growth_and_collisions, test_blocktab_random_model,
	                    test_blocktab_wrapping_cluster, test_blocktab_unstarted, NULL);
}
