/* SPDX-License-Identifier: MIT */
/*
 * allocator/blocktab.h - one arena's block table: exact block start
 * address -> its live block (struct emm_block *). Every live block of an
 * arena that is not in a thread cache is in the arena's table, under the
 * arena's lock: an allocation enters its block in the same critical section
 * that takes it from the pool, and a free finds the arena from the segment
 * map (lock-free) and then takes the block out under the arena lock it
 * needs anyway. So a cached pair takes one lock each way and no other
 * (tests/bench/RESULTS.md section 36: the process-wide sharded map it
 * replaces took a shard spinlock more each way).
 *
 * Linear probing with backward-shift deletion (no tombstones: probe lengths
 * stay short however many inserts and takes have happened); key 0 marks an
 * empty slot (address 0 is never a block). Fibonacci hashing of addr >> 9
 * (blocks are at least 512 B apart) picks the home slot. The table doubles
 * above 1/8 load (emm_blocktab_grow, blocktab.c) and never shrinks. The
 * caller provides the locking; nothing here blocks or calls the driver.
 */
#ifndef EMM_ALLOCATOR_BLOCKTAB_H
#define EMM_ALLOCATOR_BLOCKTAB_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "common/compiler.h"

struct emm_blocktab_slot {
	uint64_t key; /* 0: empty */
	void *value;
};

struct emm_blocktab {
	struct emm_blocktab_slot *slots; /* NULL until emm_blocktab_init */
	uint32_t mask;                   /* slots - 1 */
	uint32_t count;
	unsigned shift; /* 64 - log2(slots) */
};

#define EMM_BLOCKTAB_INITIAL 64u

/* 0 or -ENOMEM; a table that failed to start stays empty and unusable. */
int emm_blocktab_init(struct emm_blocktab *t);
void emm_blocktab_fini(struct emm_blocktab *t);
/* Double the table: 0 or -ENOMEM (the table is unchanged). */
int emm_blocktab_grow(struct emm_blocktab *t);

static inline size_t emm_blocktab_home(const struct emm_blocktab *t, uint64_t addr)
{
	return (size_t)(((addr >> 9) * UINT64_C(0x9E3779B97F4A7C15)) >> t->shift);
}

/* The slot holding addr, or the empty slot where it would go. */
static inline size_t emm_blocktab_probe(const struct emm_blocktab *t, uint64_t addr)
{
	size_t i = emm_blocktab_home(t, addr);

	while (t->slots[i].key != 0 && t->slots[i].key != addr)
		i = (i + 1) & t->mask;
	return i;
}

/* 0; -EEXIST (addr is in the table already); -ENOMEM (the table could not
 * grow); -EINVAL (address 0 or no value). */
static inline int emm_blocktab_insert(struct emm_blocktab *t, uint64_t addr, void *value)
{
	size_t i;

	if (EMM_UNLIKELY(addr == 0 || value == NULL || !t->slots))
		return addr && value ? -ENOMEM : -EINVAL;
	i = emm_blocktab_probe(t, addr);
	if (EMM_UNLIKELY(t->slots[i].key == addr))
		return -EEXIST;
	/* Keep the load at or below 1/8 after this insert: a probe then
	 * mostly ends at its home slot, and the branches that end the probe
	 * and the deletion's shift mispredict less (1/4 to 1/8: 1.4 to 0.6
	 * mispredicts a pair in callgrind's model and 9 % off the core's
	 * working-set pair on the CPU host, tests/bench/RESULTS.md section
	 * 39). 16 bytes a slot: 128 KiB for 1000 blocks. */
	if (EMM_UNLIKELY(((size_t)t->count + 1) * 8 > (size_t)t->mask + 1)) {
		int r = emm_blocktab_grow(t);
		if (r < 0)
			return r;
		i = emm_blocktab_probe(t, addr);
	}
	t->slots[i].key = addr;
	t->slots[i].value = value;
	t->count++;
	return 0;
}

static inline void *emm_blocktab_get(const struct emm_blocktab *t, uint64_t addr)
{
	size_t i;

	if (EMM_UNLIKELY(addr == 0 || !t->slots))
		return NULL;
	i = emm_blocktab_probe(t, addr);
	return t->slots[i].key == addr ? t->slots[i].value : NULL;
}

/* Remove addr and return its value, or NULL. Later members of its cluster
 * shift back into the hole unless their home lies cyclically in (hole, j]. */
static inline void *emm_blocktab_take(struct emm_blocktab *t, uint64_t addr)
{
	size_t i, j;
	void *value;

	if (EMM_UNLIKELY(addr == 0 || !t->slots))
		return NULL;
	i = emm_blocktab_probe(t, addr);
	if (t->slots[i].key != addr)
		return NULL;
	value = t->slots[i].value;
	for (j = i;;) {
		size_t home;

		j = (j + 1) & t->mask;
		if (t->slots[j].key == 0)
			break;
		home = emm_blocktab_home(t, t->slots[j].key);
		if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
			t->slots[i] = t->slots[j];
			i = j;
		}
	}
	t->slots[i].key = 0;
	t->slots[i].value = NULL;
	t->count--;
	return value;
}

#endif
