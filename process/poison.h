/* SPDX-License-Identifier: MIT */
/*
 * process/poison.h - EMM_POISON (poison.c): fill a freed device block with
 * the poison byte, stream-ordered, before it goes back to its heap.
 * Private to process/. Off (the default) costs a load and a branch.
 */
#ifndef EMM_PROCESS_POISON_H
#define EMM_PROCESS_POISON_H

#include "process/process_internal.h"

#pragma GCC visibility push(hidden)

void st_poison_block_slow(emm_addr_t addr, emm_stream_t key);

/* The program frees the block at addr on stream key (EMM_STREAM_SYNC for
 * a synchronous free); call before the heap's free, with no lock held. */
static inline void st_poison_block(emm_addr_t addr, emm_stream_t key)
{
	if (EMM_UNLIKELY(st_opts->poison <= 255))
		st_poison_block_slow(addr, key);
}

#pragma GCC visibility pop

#endif
