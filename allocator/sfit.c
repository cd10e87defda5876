/* SPDX-License-Identifier: MIT */
/*
 * allocator/sfit.c - the segregated-fit index (sfit.h): bins, their
 * bitmaps, best-fit search and the walk from the largest bin down.
 */
#include "allocator/sfit.h"

#include <string.h>

#define SL_MASK ((1u << SFIT_SL) - 1u)

void emm_sfit_init(struct emm_sfit *t)
{
	memset(t, 0, sizeof(*t));
}

static inline bool bin_nonempty(const struct emm_sfit *t, unsigned b)
{
	return (t->sl_map[b / SFIT_SL] >> (b % SFIT_SL)) & 1u;
}

/* The first non-empty bin >= b, or -1. */
static int bin_at_or_above(const struct emm_sfit *t, unsigned b)
{
	if (b >= SFIT_BINS)
		return -1;
	unsigned f = b / SFIT_SL, m = t->sl_map[f] & (SL_MASK << (b % SFIT_SL)) & SL_MASK;

	if (m)
		return (int)(f * SFIT_SL + (unsigned)__builtin_ctz(m));
	if (f == 63)
		return -1;
	uint64_t fm = t->fl_map & (~0ull << (f + 1));
	if (!fm)
		return -1;
	f = (unsigned)__builtin_ctzll(fm);
	return (int)(f * SFIT_SL + (unsigned)__builtin_ctz(t->sl_map[f]));
}

/* The last non-empty bin < b, or -1. */
static int bin_below(const struct emm_sfit *t, unsigned b)
{
	if (b == 0)
		return -1;
	b--;
	unsigned f = b / SFIT_SL, m = t->sl_map[f] & ((2u << (b % SFIT_SL)) - 1u);

	if (m)
		return (int)(f * SFIT_SL + 31u - (unsigned)__builtin_clz(m));
	uint64_t fm = f ? t->fl_map & ((1ull << f) - 1) : 0;
	if (!fm)
		return -1;
	f = 63u - (unsigned)__builtin_clzll(fm);
	return (int)(f * SFIT_SL + 31u - (unsigned)__builtin_clz(t->sl_map[f]));
}

/* The smallest node >= size in bin b (lowest address among equals), looking
 * at SFIT_SCAN nodes at most. */
static struct emm_sfit_node *scan_bin(const struct emm_sfit *t, unsigned b, uint64_t size)
{
	struct emm_sfit_node *best = NULL;
	unsigned seen = 0;

	for (struct emm_sfit_node *n = t->bins[b]; n && seen < SFIT_SCAN; n = n->next, seen++) {
		if (n->size < size)
			continue;
		if (!best || n->size < best->size || (n->size == best->size && n->addr < best->addr))
			best = n;
	}
	return best;
}

struct emm_sfit_node *emm_sfit_best(const struct emm_sfit *t, uint64_t size)
{
	unsigned b = emm_sfit_bin(size);
	struct emm_sfit_node *n;

	if (bin_nonempty(t, b) && (n = scan_bin(t, b, size)))
		return n;
	int above = bin_at_or_above(t, b + 1);
	return above < 0 ? NULL : scan_bin(t, (unsigned)above, size);
}

struct emm_sfit_node *emm_sfit_last(const struct emm_sfit *t)
{
	int b = bin_below(t, SFIT_BINS);

	return b < 0 ? NULL : t->bins[b];
}

struct emm_sfit_node *emm_sfit_prev(const struct emm_sfit *t, const struct emm_sfit_node *n)
{
	if (n->next)
		return n->next;
	int b = bin_below(t, n->bin);
	return b < 0 ? NULL : t->bins[b];
}

uint64_t emm_sfit_largest(const struct emm_sfit *t)
{
	int b = bin_below(t, SFIT_BINS);
	uint64_t best = 0;

	if (b >= 0)
		for (const struct emm_sfit_node *n = t->bins[b]; n; n = n->next)
			if (n->size > best)
				best = n->size;
	return best;
}

#define FAIL(why)                                                                                                      \
	do {                                                                                                           \
		if (ret_why)                                                                                           \
			*ret_why = (why);                                                                              \
		return -1;                                                                                             \
	} while (0)

int emm_sfit_check(const struct emm_sfit *t, const char **ret_why)
{
	size_t count = 0;

	for (unsigned f = 0; f < 64; f++) {
		if (((t->fl_map >> f) & 1u) != (t->sl_map[f] != 0))
			FAIL("power bitmap does not match its bins");
		for (unsigned s = 0; s < SFIT_SL; s++) {
			unsigned b = f * SFIT_SL + s;
			struct emm_sfit_node *const *pprev = &t->bins[b];
			if (((t->sl_map[f] >> s) & 1u) != (t->bins[b] != NULL))
				FAIL("bin bitmap does not match its list");
			for (const struct emm_sfit_node *n = t->bins[b]; n; pprev = &n->next, n = n->next) {
				if (!n->linked || n->bin != b || emm_sfit_bin(n->size) != b)
					FAIL("node in the wrong bin");
				if ((const void *)n->pprev != (const void *)pprev)
					FAIL("broken list link");
				if (++count > t->count)
					FAIL("more nodes than counted");
			}
		}
	}
	if (count != t->count)
		FAIL("count does not match the nodes");
	return 0;
}
