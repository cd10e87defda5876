/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_debug.h - a debugging hook of the allocator core for the
 * tests' doubles: how many allocator (arena) locks the calling thread holds.
 * Counted in debug builds only (!NDEBUG); always 0 otherwise. Fence ops
 * must see 0 (heap_internal.h: lock order).
 */
#ifndef EMM_ALLOCATOR_HEAP_DEBUG_H
#define EMM_ALLOCATOR_HEAP_DEBUG_H

unsigned emm_heap_debug_lock_depth(void);

#endif
