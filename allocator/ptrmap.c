/* SPDX-License-Identifier: MIT */
/*
 * allocator/ptrmap.c - the process-wide address maps' common reset. The
 * block map that lived here (65536 spinlocked shards, one lock more each
 * way of a cached pair) gave way to a table per arena under the arena's
 * own lock (blocktab.h), found through the segment map (segmap.c).
 */
#include "allocator/ptrmap.h"

void emm_ptrmap_reset(void)
{
	emm_segmap_reset();
}
