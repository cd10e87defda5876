/* SPDX-License-Identifier: MIT */
/*
 * allocator/blocktab.c - an arena's block table: its start, its end and its
 * doubling (the lookups are inline in blocktab.h, which describes it).
 */
#include "allocator/blocktab.h"

#include <stdlib.h>

int emm_blocktab_init(struct emm_blocktab *t)
{
	struct emm_blocktab_slot *slots = calloc(EMM_BLOCKTAB_INITIAL, sizeof(*slots));

	if (!slots)
		return -ENOMEM;
	t->slots = slots;
	t->mask = EMM_BLOCKTAB_INITIAL - 1;
	t->count = 0;
	t->shift = 64u - (unsigned)__builtin_ctz(EMM_BLOCKTAB_INITIAL);
	return 0;
}

void emm_blocktab_fini(struct emm_blocktab *t)
{
	free(t->slots);
	t->slots = NULL;
	t->mask = 0;
	t->count = 0;
}

int emm_blocktab_grow(struct emm_blocktab *t)
{
	size_t old_slots = (size_t)t->mask + 1, new_slots = old_slots * 2;
	struct emm_blocktab_slot *old = t->slots, *slots;
	struct emm_blocktab bigger;

	if (new_slots > UINT32_MAX)
		return -ENOMEM;
	slots = calloc(new_slots, sizeof(*slots));
	if (!slots)
		return -ENOMEM;
	bigger.slots = slots;
	bigger.mask = (uint32_t)(new_slots - 1);
	bigger.count = t->count;
	bigger.shift = t->shift - 1;
	for (size_t i = 0; i < old_slots; i++) {
		if (old[i].key != 0)
			slots[emm_blocktab_probe(&bigger, old[i].key)] = old[i];
	}
	*t = bigger;
	free(old);
	return 0;
}
