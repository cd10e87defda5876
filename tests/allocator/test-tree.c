/* SPDX-License-Identifier: MIT */
/*
 * test-tree: the intrusive red-black tree alone, against a sorted array.
 * Random inserts and removes, lower_bound at random probes, in-order
 * iteration both ways, and the balance invariant after every step.
 */
#include <errno.h>
#include <math.h>

#include "allocator/tree.h"
#include "emm_test.h"

struct item {
	struct emm_tree_node node;
	bool in;
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	return emm_test_rand(&rng_state);
}

static int key_cmp3(const uint64_t *a, const uint64_t *b)
{
	return emm_tree_key_cmp(a, b[0], b[1], b[2]);
}

/* Reference: sorted array of item pointers. */
static struct item **ref;
static size_t ref_n;

static size_t ref_lower(uint64_t k0, uint64_t k1, uint64_t k2)
{
	size_t lo = 0, hi = ref_n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (emm_tree_key_cmp(ref[mid]->node.key, k0, k1, k2) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void ref_insert(struct item *it)
{
	size_t i = ref_lower(it->node.key[0], it->node.key[1], it->node.key[2]);
	memmove(&ref[i + 1], &ref[i], (ref_n - i) * sizeof(*ref));
	ref[i] = it;
	ref_n++;
}

static void ref_remove(struct item *it)
{
	size_t i = ref_lower(it->node.key[0], it->node.key[1], it->node.key[2]);
	memmove(&ref[i], &ref[i + 1], (ref_n - i - 1) * sizeof(*ref));
	ref_n--;
}

TEST_BEGIN(test_empty)
{
	struct emm_tree t;
	emm_tree_init(&t);
	expect_ptr_null(emm_tree_first(&t));
	expect_ptr_null(emm_tree_last(&t));
	expect_ptr_null(emm_tree_lower_bound(&t, 0, 0, 0));
	expect_int_eq(emm_tree_check(&t, NULL), 0);

	struct item a = {0};
	a.node.key[0] = 1;
	emm_tree_node_clear(&a.node);
	expect_false(emm_tree_node_linked(&a.node));
	expect_int_eq(emm_tree_insert(&t, &a.node), 0);
	expect_true(emm_tree_node_linked(&a.node));
	struct item dup = a;
	expect_int_eq(emm_tree_insert(&t, &dup.node), -EEXIST);
	expect_false(emm_tree_node_linked(&dup.node));
	expect_int_eq(t.count, 1);
	expect_ptr_eq(emm_tree_lower_bound(&t, 0, 5, 5), &a.node);
	expect_ptr_eq(emm_tree_lower_bound(&t, 1, 0, 0), &a.node);
	expect_ptr_null(emm_tree_lower_bound(&t, 1, 0, 1));
	emm_tree_remove(&t, &a.node);
	expect_false(emm_tree_node_linked(&a.node));
	expect_int_eq(t.count, 0);
	expect_ptr_null(t.root);
}
TEST_END

/* Ascending and descending insertion (worst cases for a naive BST), then
 * removal in order: the height must stay logarithmic. */
TEST_BEGIN(test_sequential)
{
	enum { N = 4096 };
	struct item *items = calloc(N, sizeof(*items));
	struct emm_tree t;
	assert_ptr_not_null(items);

	for (int pass = 0; pass < 2; pass++) {
		emm_tree_init(&t);
		for (int i = 0; i < N; i++) {
			int k = pass ? N - 1 - i : i;
			items[k].node.key[0] = 0;
			items[k].node.key[1] = (uint64_t)k;
			items[k].node.key[2] = 0;
			expect_int_eq(emm_tree_insert(&t, &items[k].node), 0);
		}
		int bh = emm_tree_check(&t, NULL);
		expect_true(bh > 0);
		/* Black height bounds the height: 2*bh >= height >= log2(N). */
		expect_true(bh <= 2 * (int)log2(N + 1) && bh >= (int)log2(N + 1) / 2);
		uint64_t want = 0;
		for (struct emm_tree_node *n = emm_tree_first(&t); n; n = emm_tree_next(n))
			expect_u64_eq(n->key[1], want++);
		expect_u64_eq(want, N);
		for (struct emm_tree_node *n = emm_tree_last(&t); n; n = emm_tree_prev(n))
			expect_u64_eq(n->key[1], --want);
		for (int i = 0; i < N; i++) {
			emm_tree_remove(&t, &items[pass ? i : N - 1 - i].node);
			if (i % 97 == 0)
				expect_true(emm_tree_check(&t, NULL) >= 0);
		}
		expect_int_eq(t.count, 0);
		expect_ptr_null(t.root);
	}
	free(items);
}
TEST_END

/* Random inserts/removes against the sorted array, lower_bound probes,
 * iteration, the invariant after every operation. */
TEST_BEGIN(test_random)
{
	enum { N = 3000, OPS = 60000 };
	struct item *items = calloc(N, sizeof(*items));
	struct emm_tree t;
	const char *why = NULL;
	assert_ptr_not_null(items);
	ref = calloc(N, sizeof(*ref));
	assert_ptr_not_null(ref);
	ref_n = 0;
	emm_tree_init(&t);

	/* Keys: few streams, sizes from a small range (many ties on size),
	 * unique addresses: the allocator's shape. */
	for (int i = 0; i < N; i++) {
		items[i].node.key[0] = rnd() % 4;
		items[i].node.key[1] = (rnd() % 64) * 512;
		items[i].node.key[2] = (uint64_t)i * 4096;
		emm_tree_node_clear(&items[i].node);
	}
	int failures_before = emm_test_current.failures;
	for (int op = 0; op < OPS && emm_test_current.failures == failures_before; op++) {
		struct item *it = &items[rnd() % N];
		if (it->in) {
			emm_tree_remove(&t, &it->node);
			ref_remove(it);
			it->in = false;
			expect_false(emm_tree_node_linked(&it->node));
		} else {
			expect_int_eq(emm_tree_insert(&t, &it->node), 0);
			ref_insert(it);
			it->in = true;
		}
		int bh = emm_tree_check(&t, &why);
		if (bh < 0)
			emm_test_fail_("op %d: tree invalid: %s", op, why);
		expect_int_eq(t.count, ref_n);

		/* Probes: lower_bound on a random key, and on exact keys. */
		uint64_t k0 = rnd() % 5, k1 = (rnd() % 66) * 512, k2 = rnd() % 2 ? 0 : rnd() % (N * 4096ull);
		size_t i = ref_lower(k0, k1, k2);
		struct emm_tree_node *lb = emm_tree_lower_bound(&t, k0, k1, k2);
		if (i == ref_n)
			expect_ptr_null(lb);
		else
			expect_ptr_eq(lb, &ref[i]->node);
		if (ref_n) {
			struct item *r = ref[rnd() % ref_n];
			expect_ptr_eq(emm_tree_find(&t, r->node.key[0], r->node.key[1], r->node.key[2]),
			              &r->node);
			expect_ptr_eq(
			    emm_tree_lower_bound(&t, r->node.key[0], r->node.key[1], r->node.key[2]),
			    &r->node);
		}
		if (op % 1000 == 0) {
			size_t j = 0;
			for (struct emm_tree_node *n = emm_tree_first(&t); n; n = emm_tree_next(n), j++) {
				if (j >= ref_n || n != &ref[j]->node) {
					emm_test_fail_("op %d: in-order walk differs at %zu", op, j);
					break;
				}
			}
			expect_int_eq(j, ref_n);
			struct emm_tree_node *last = emm_tree_last(&t);
			if (ref_n)
				expect_ptr_eq(last, &ref[ref_n - 1]->node);
			for (j = 1; j < ref_n; j++)
				expect_true(key_cmp3(ref[j - 1]->node.key, ref[j]->node.key) < 0);
		}
	}
	/* Drain. */
	for (int i = 0; i < N; i++)
		if (items[i].in)
			emm_tree_remove(&t, &items[i].node);
	expect_int_eq(t.count, 0);
	expect_int_eq(emm_tree_check(&t, NULL), 0);
	free(ref);
	free(items);
}
TEST_END

/* The checker itself notices damage. */
TEST_BEGIN(test_check_detects)
{
	struct item items[8];
	struct emm_tree t;
	const char *why = NULL;
	memset(items, 0, sizeof(items));
	emm_tree_init(&t);
	for (int i = 0; i < 8; i++) {
		items[i].node.key[1] = (uint64_t)i;
		emm_tree_insert(&t, &items[i].node);
	}
	expect_true(emm_tree_check(&t, NULL) > 0);
	uint64_t saved = t.root->key[1];
	t.root->key[1] = 1000; /* breaks the order */
	expect_int_eq(emm_tree_check(&t, &why), -1);
	expect_ptr_not_null(why);
	t.root->key[1] = saved;
	t.count++;
	expect_int_eq(emm_tree_check(&t, &why), -1);
	t.count--;
	t.root->red = true;
	expect_int_eq(emm_tree_check(&t, &why), -1);
	t.root->red = false;
	expect_true(emm_tree_check(&t, NULL) > 0);
}
TEST_END

int main(void)
{
	return emm_test_run(test_empty, test_sequential, test_random, test_check_detects, NULL);
}
