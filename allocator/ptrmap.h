/* SPDX-License-Identifier: MIT */
/*
 * allocator/ptrmap.h - process-wide maps from addresses to allocator objects.
 *
 * The block map answers "is this exact pointer the start of a live block of
 * ours?" on every free: a sharded open-addressing hash table, one lock per
 * shard, so threads freeing different pointers rarely meet.
 *
 * The segment map answers "does this address lie inside any segment of
 * ours?" for interior pointers and double frees (which must be refused, not
 * forwarded to the driver, because the driver would free our whole segment
 * or report a different error), and for address-range queries. Reads take a
 * shared lock; segments change rarely.
 */
#ifndef EMM_ALLOCATOR_PTRMAP_H
#define EMM_ALLOCATOR_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Block map: addr -> opaque value (a struct emm_block *). */
int emm_blockmap_insert(uint64_t addr, void *value);	 /* -EEXIST, -ENOMEM, -EINVAL (0/NULL) */
void *emm_blockmap_take(uint64_t addr);			 /* remove and return, or NULL */
/* Remove and return (*ret_value) only if accept(value, arg), called under
 * the entry's lock (it must not block or call back into the map): 0,
 * -ENOENT (absent), -EXDEV (refused: left in place). */
int emm_blockmap_take_if(uint64_t addr, bool (*accept)(const void *value, const void *arg), const void *arg,
                         void **ret_value);
void *emm_blockmap_get(uint64_t addr);			 /* lookup, or NULL */
size_t emm_blockmap_count(void);
/* Forget every entry without taking a lock (part of emm_ptrmap_reset). */
void emm_blockmap_reset(void);

/* Segment map: [base, base+size) -> opaque value (a struct emm_segment *). */
int emm_segmap_insert(uint64_t base, size_t size, void *value); /* -EEXIST on overlap, -ENOMEM */
void *emm_segmap_remove(uint64_t base);				/* NULL if absent */
/* Move the end of the segment at `base` (grown in place): -ENOENT, -EEXIST
 * if it would overlap the next one, -EINVAL. */
int emm_segmap_resize(uint64_t base, size_t new_size);
/* The segment containing addr: 0 and base/size/value, or -ENOENT. */
int emm_segmap_find(uint64_t addr, uint64_t *ret_base, size_t *ret_size, void **ret_value);
size_t emm_segmap_count(void);
/* Forget every segment and re-create the lock (part of emm_ptrmap_reset). */
void emm_segmap_reset(void);

/* Forget everything without freeing values (fork child). */
void emm_ptrmap_reset(void);

#endif
