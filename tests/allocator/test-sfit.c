/* SPDX-License-Identifier: MIT */
/*
 * test-sfit: the segregated-fit index alone, against a plain array. Bin
 * order, random inserts and removes with best-fit probes (exact while the
 * bins are short, within one bin of the best when a bin is longer than the
 * scan bound), the walk from the largest bin down, and the checker.
 */
#include <stdlib.h>
#include <string.h>

#include "allocator/sfit.h"
#include "emm_test.h"

struct item {
	struct emm_sfit_node node;
	bool in;
};

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rnd(void)
{
	return emm_test_rand(&rng_state);
}

/* Is n linked in t (its bin's list holds it)? */
static bool contains(const struct emm_sfit *t, const struct emm_sfit_node *n)
{
	if (!n->linked || n->bin >= SFIT_BINS)
		return false;
	for (const struct emm_sfit_node *x = t->bins[n->bin]; x; x = x->next)
		if (x == n)
			return true;
	return false;
}

TEST_BEGIN(test_bins)
{
	unsigned prev = 0;

	for (uint64_t s = 0; s < 1u << 16; s++) {
		unsigned b = emm_sfit_bin(s);
		expect_true(b >= prev);
		expect_true(b < SFIT_BINS);
		prev = b;
	}
	for (unsigned f = 3; f < 64; f++) {
		uint64_t lo = 1ull << f, hi = lo + (lo - 1);
		expect_u64_eq(emm_sfit_bin(lo), f * SFIT_SL);
		expect_u64_eq(emm_sfit_bin(hi), f * SFIT_SL + SFIT_SL - 1);
	}
	expect_u64_eq(emm_sfit_bin(UINT64_MAX), SFIT_BINS - 1);
}
TEST_END

TEST_BEGIN(test_empty)
{
	struct emm_sfit t;
	struct item a;

	emm_sfit_init(&t);
	expect_ptr_null(emm_sfit_best(&t, 512));
	expect_ptr_null(emm_sfit_last(&t));
	expect_u64_eq(emm_sfit_largest(&t), 0);
	expect_int_eq(emm_sfit_check(&t, NULL), 0);
	memset(&a, 0, sizeof(a));
	a.node.size = 4096;
	a.node.addr = 1 << 20;
	emm_sfit_insert(&t, &a.node);
	expect_true(emm_sfit_node_linked(&a.node));
	expect_true(contains(&t, &a.node));
	expect_ptr_eq(emm_sfit_best(&t, 1), &a.node);
	expect_ptr_eq(emm_sfit_best(&t, 4096), &a.node);
	expect_ptr_null(emm_sfit_best(&t, 4097));
	expect_u64_eq(emm_sfit_largest(&t), 4096);
	emm_sfit_remove(&t, &a.node);
	expect_false(emm_sfit_node_linked(&a.node));
	expect_false(contains(&t, &a.node));
	expect_u64_eq(t.count, 0);
	expect_u64_eq(t.fl_map, 0);
	expect_int_eq(emm_sfit_check(&t, NULL), 0);
}
TEST_END

/* The reference best fit: smallest size >= want, lowest address among
 * equals. */
static struct item *ref_best(struct item *items, unsigned n, uint64_t want)
{
	struct item *best = NULL;

	for (unsigned i = 0; i < n; i++) {
		struct item *it = &items[i];
		if (!it->in || it->node.size < want)
			continue;
		if (!best || it->node.size < best->node.size ||
		    (it->node.size == best->node.size && it->node.addr < best->node.addr))
			best = it;
	}
	return best;
}

static unsigned bin_len(const struct emm_sfit *t, unsigned b)
{
	unsigned len = 0;

	for (const struct emm_sfit_node *n = t->bins[b]; n; n = n->next)
		len++;
	return len;
}

/* Probe best fits; exact where the bins it looks at are short. */
static void probe(struct emm_sfit *t, struct item *items, unsigned n, uint64_t want, unsigned *found,
                  unsigned *exact)
{
	struct item *r = ref_best(items, n, want);
	struct emm_sfit_node *got = emm_sfit_best(t, want);

	if (!r) {
		expect_ptr_null(got);
		return;
	}
	(*found)++;
	if (!got) {
		/* Possible only when the request's own bin holds a fit past the
		 * scan bound and no bin above holds anything. */
		expect_true(bin_len(t, emm_sfit_bin(want)) > SFIT_SCAN);
		return;
	}
	expect_true(got->size >= want);
	expect_true(contains(t, got));
	unsigned wb = emm_sfit_bin(want), rb = r->node.bin;
	if (bin_len(t, wb) <= SFIT_SCAN && bin_len(t, rb) <= SFIT_SCAN) {
		expect_ptr_eq(got, &r->node);
		(*exact)++;
	} else {
		/* Within the request's bin or the first non-empty one above. */
		unsigned above = wb + 1;
		while (above < SFIT_BINS && !t->bins[above])
			above++;
		expect_true(got->bin == wb || got->bin == above);
	}
}

static void random_run(unsigned n, unsigned ops, uint64_t size_classes, unsigned *found, unsigned *exact)
{
	struct item *items = calloc(n, sizeof(*items));
	struct emm_sfit t;
	const char *why = NULL;
	assert_ptr_not_null(items);
	emm_sfit_init(&t);

	for (unsigned i = 0; i < n; i++) {
		/* 512 B multiples over a few powers of two, with ties. */
		uint64_t c = rnd() % size_classes;
		items[i].node.size = (c + 1) * 512 * (1u << (rnd() % 8));
		items[i].node.addr = (uint64_t)(i + 1) << 32;
	}
	for (unsigned op = 0; op < ops; op++) {
		struct item *it = &items[rnd() % n];
		if (it->in)
			emm_sfit_remove(&t, &it->node);
		else
			emm_sfit_insert(&t, &it->node);
		it->in = !it->in;
		if (op % 64 == 0) {
			expect_int_eq(emm_sfit_check(&t, &why), 0);
			if (why)
				fprintf(stderr, "check: %s\n", why);
		}
		probe(&t, items, n, (rnd() % (size_classes * 256)) * 512 + 1 + rnd() % 512, found, exact);

		if (op % 97 == 0) {
			/* The walk sees every node once, bins not increasing;
			 * the largest matches. */
			unsigned seen = 0, last_bin = SFIT_BINS;
			uint64_t max = 0;
			for (struct emm_sfit_node *x = emm_sfit_last(&t); x; x = emm_sfit_prev(&t, x)) {
				expect_true(x->bin <= last_bin);
				last_bin = x->bin;
				seen++;
				if (x->size > max)
					max = x->size;
			}
			expect_u64_eq(seen, t.count);
			expect_u64_eq(emm_sfit_largest(&t), max);
		}
	}
	for (unsigned i = 0; i < n; i++)
		if (items[i].in)
			emm_sfit_remove(&t, &items[i].node);
	expect_u64_eq(t.count, 0);
	expect_int_eq(emm_sfit_check(&t, NULL), 0);
	free(items);
}

TEST_BEGIN(test_random_short_bins)
{
	unsigned found = 0, exact = 0;

	random_run(120, 20000, 64, &found, &exact);
	/* No bin past the scan bound here: every answer is the exact best. */
	expect_u64_eq(exact, found);
	expect_true(found > 5000);
}
TEST_END

TEST_BEGIN(test_random_long_bins)
{
	unsigned found = 0, exact = 0;

	random_run(3000, 40000, 4, &found, &exact); /* few sizes: bins far past the scan bound */
	expect_true(found > exact);
}
TEST_END

/* The checker notices damage. */
TEST_BEGIN(test_check_detects)
{
	struct item items[8];
	struct emm_sfit t;
	const char *why = NULL;

	memset(items, 0, sizeof(items));
	emm_sfit_init(&t);
	for (int i = 0; i < 8; i++) {
		items[i].node.size = 512u << i;
		items[i].node.addr = (uint64_t)i << 20;
		emm_sfit_insert(&t, &items[i].node);
	}
	expect_int_eq(emm_sfit_check(&t, NULL), 0);
	items[3].node.size = 512u << 6; /* in the wrong bin now */
	expect_int_eq(emm_sfit_check(&t, &why), -1);
	expect_ptr_not_null(why);
	items[3].node.size = 512u << 3;
	t.count++;
	expect_int_eq(emm_sfit_check(&t, NULL), -1);
	t.count--;
	t.fl_map |= 1ull << 40;
	expect_int_eq(emm_sfit_check(&t, NULL), -1);
	t.fl_map &= ~(1ull << 40);
	expect_int_eq(emm_sfit_check(&t, NULL), 0);
	/* A node's back link (pprev) that does not point at what points at
	 * it: a second node of items[2]'s bin, its back link bent. */
	struct item twin;
	memset(&twin, 0, sizeof(twin));
	twin.node.size = items[2].node.size;
	twin.node.addr = (uint64_t)9 << 20;
	emm_sfit_insert(&t, &twin.node);
	expect_int_eq(emm_sfit_check(&t, NULL), 0);
	struct emm_sfit_node **saved = items[2].node.pprev;
	items[2].node.pprev = &items[5].node.next;
	expect_int_eq(emm_sfit_check(&t, &why), -1);
	expect_str_eq(why, "broken list link");
	items[2].node.pprev = saved;
	emm_sfit_remove(&t, &twin.node);
	expect_int_eq(emm_sfit_check(&t, NULL), 0);
}
TEST_END

int main(void)
{
	return emm_test_run(test_bins, test_empty, test_random_short_bins, test_random_long_bins, test_check_detects,
	                    NULL);
}
