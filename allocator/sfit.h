/* SPDX-License-Identifier: MIT */
/*
 * allocator/sfit.h - a segregated-fit index of free blocks by size (TLSF's
 * two-level bitmap, Masmano et al. 2004): the arena's ready-any blocks,
 * which every allocation searches (the red-black tree keeps the few blocks
 * ready under a stream key).
 *
 * Sizes fall in bins of 1/8 of a power of two; a bitmap of non-empty bins
 * per power of two and one of non-empty powers find the first bin at or
 * above a size in a few instructions. Insert and remove are list
 * operations: no search, no rebalancing. A best-fit search scans the
 * request's own bin and, if nothing there fits, the first non-empty bin
 * above, each for the smallest block (lowest address among equals), at most
 * SFIT_SCAN nodes per bin: exact best fit while bins are short, a fit
 * within 1/8 of a power of two of the best otherwise.
 *
 * Intrusive (nodes live in the caller's objects, nothing allocates), not
 * thread-safe: the owner's lock covers it. A bin's first node points back
 * at the bin (pprev), so an index holding nodes must not be copied or
 * moved.
 */
#ifndef EMM_ALLOCATOR_SFIT_H
#define EMM_ALLOCATOR_SFIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SFIT_SL_BITS 3u
#define SFIT_SL      (1u << SFIT_SL_BITS)
#define SFIT_BINS    (64u * SFIT_SL)
#define SFIT_SCAN    32u

struct emm_sfit_node {
	struct emm_sfit_node *next;   /* the bin's list */
	struct emm_sfit_node **pprev; /* what points at this node: the bin's head or the previous node's next */
	uint64_t size, addr;          /* set by the caller before insert, unchanged while linked */
	uint16_t bin;
	bool linked;
};

struct emm_sfit {
	uint64_t fl_map;          /* bit f: some bin of power f is non-empty */
	uint8_t sl_map[64];       /* bit s of sl_map[f]: bin f * SFIT_SL + s is non-empty */
	struct emm_sfit_node *bins[SFIT_BINS];
	size_t count;
};

void emm_sfit_init(struct emm_sfit *t);

static inline bool emm_sfit_node_linked(const struct emm_sfit_node *n)
{
	return n->linked;
}

/* The bin of a size: sizes below SFIT_SL get one bin each, then SFIT_SL bins
 * per power of two. Bins are ordered as sizes are. */
static inline unsigned emm_sfit_bin(uint64_t size)
{
	if (size < SFIT_SL)
		return (unsigned)size;
	unsigned f = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
	return f * SFIT_SL + (unsigned)((size >> (f - SFIT_SL_BITS)) & (SFIT_SL - 1));
}

/* Link n (size and addr set). */
static inline void emm_sfit_insert(struct emm_sfit *t, struct emm_sfit_node *n)
{
	unsigned b = emm_sfit_bin(n->size);
	struct emm_sfit_node *head = t->bins[b];

	n->bin = (uint16_t)b;
	n->next = head;
	n->pprev = &t->bins[b];
	if (head)
		head->pprev = &n->next;
	t->bins[b] = n;
	t->sl_map[b / SFIT_SL] |= (uint8_t)(1u << (b % SFIT_SL));
	t->fl_map |= 1ull << (b / SFIT_SL);
	n->linked = true;
	t->count++;
}

/* Unlink a linked node. */
static inline void emm_sfit_remove(struct emm_sfit *t, struct emm_sfit_node *n)
{
	unsigned b = n->bin, f = b / SFIT_SL;
	struct emm_sfit_node *next = n->next;

	*n->pprev = next;
	if (next)
		next->pprev = n->pprev;
	/* The bin's bit off if it emptied, and the power's if that was its
	 * last bin: computed, not branched on. */
	t->sl_map[f] &= (uint8_t)~((unsigned)(t->bins[b] == NULL) << (b % SFIT_SL));
	t->fl_map &= ~((uint64_t)(t->sl_map[f] == 0) << f);
	n->next = NULL;
	n->pprev = NULL;
	n->linked = false;
	t->count--;
}

/* A linked node's block grew or moved (a merge kept its node): relinked
 * only if its bin changed. */
static inline void emm_sfit_update(struct emm_sfit *t, struct emm_sfit_node *n, uint64_t size, uint64_t addr)
{
	bool move = emm_sfit_bin(size) != n->bin;

	if (move)
		emm_sfit_remove(t, n);
	n->size = size;
	n->addr = addr;
	if (move)
		emm_sfit_insert(t, n);
}

/* The smallest node of size >= size (lowest address among equals), within
 * the scan bound above; NULL if none. */
struct emm_sfit_node *emm_sfit_best(const struct emm_sfit *t, uint64_t size);

/* Walk from the largest bin down: the first node of the highest non-empty
 * bin, then the rest of that bin (in no order), then the next bin below.
 * NULL at the end. */
struct emm_sfit_node *emm_sfit_last(const struct emm_sfit *t);
struct emm_sfit_node *emm_sfit_prev(const struct emm_sfit *t, const struct emm_sfit_node *n);

/* The size of the largest node (0 if empty). */
uint64_t emm_sfit_largest(const struct emm_sfit *t);

/* Verify the index: every node in the bin of its size with its bin number,
 * list links both ways, bitmaps that match the bins, the count. 0, or -1 and
 * a reason in *ret_why (static string) if given. */
int emm_sfit_check(const struct emm_sfit *t, const char **ret_why);

#endif
