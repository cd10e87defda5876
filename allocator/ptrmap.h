/* SPDX-License-Identifier: MIT */
/*
 * allocator/ptrmap.h - the process-wide address map: address -> segment.
 *
 * The segment map answers "does this address lie inside any segment of
 * ours, and which?": for every free (the segment's arena holds the block in
 * its table, blocktab.h), for interior pointers and double frees (which
 * must be refused, not forwarded to the driver, because the driver would
 * free our whole segment or report a different error), and for
 * address-range queries. Lookups take no lock and write nothing; segments
 * change rarely.
 */
#ifndef EMM_ALLOCATOR_PTRMAP_H
#define EMM_ALLOCATOR_PTRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Segment map: [base, base+size) -> opaque value (a struct emm_segment *). */
int emm_segmap_insert(uint64_t base, size_t size, void *value); /* -EEXIST on overlap, -ENOMEM */
void *emm_segmap_remove(uint64_t base);				/* NULL if absent */
/* Move the end of the segment at `base` (grown in place): -ENOENT, -EEXIST
 * if it would overlap the next one, -EINVAL. */
int emm_segmap_resize(uint64_t base, size_t new_size);
/* The segment containing addr: 0 and base/size/value, or -ENOENT. */
int emm_segmap_find(uint64_t addr, uint64_t *ret_base, size_t *ret_size, void **ret_value);
/* The value of the segment containing addr, or NULL: emm_segmap_find
 * for a caller that wants only that, shorter (every free asks). */
void *emm_segmap_value(uint64_t addr);
size_t emm_segmap_count(void);
/* Forget every segment and re-create the lock (part of emm_ptrmap_reset). */
void emm_segmap_reset(void);

/* Forget everything without freeing values (fork child). */
void emm_ptrmap_reset(void);

#endif
