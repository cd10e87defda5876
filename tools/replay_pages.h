/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_pages.h - a simulated page-granular device for emm-replay
 * (what the vmm backend is to the real driver, as bookkeeping only): the
 * segment source and page operations a replay with EMM_BACKEND=vmm runs
 * its heap on, counting mapped bytes against a capacity and checking that
 * every block the replay holds lies on mapped pages. No memory is reserved
 * or touched.
 */
#ifndef EMM_TOOLS_REPLAY_PAGES_H
#define EMM_TOOLS_REPLAY_PAGES_H

#include <stddef.h>
#include <stdint.h>

#include "allocator/heap.h"

struct replay_pages;

/* Mapped bytes count against `capacity`; pages of `page` bytes (a power of
 * two); segments of at least `grow_min` bytes reserve `capacity` bytes of
 * address space and can grow in place (the vmm backend's defaults: 2 MiB
 * pages, grow_min 4 MiB). 0 or -errno. */
int replay_pages_create(uint64_t capacity, size_t page, size_t grow_min, struct replay_pages **ret);
void replay_pages_destroy(struct replay_pages *p);

/* The source and page operations for emm_heap_create_paged. */
void replay_pages_bind(struct replay_pages *p, struct emm_segment_source *src, struct emm_segment_pages *pages);

/* Most bytes mapped at once so far, and now. */
uint64_t replay_pages_peak(const struct replay_pages *p);
uint64_t replay_pages_mapped(const struct replay_pages *p);

/* The replay holds block [addr, addr+size) from now on (after its
 * allocation): 0, or -EFAULT when it lies over an unmapped page, outside a
 * segment or over another held block (the violation kept), -ENOMEM. */
int replay_pages_handed_out(struct replay_pages *p, emm_addr_t addr, size_t size);
/* ... and no longer (before its free). */
void replay_pages_taken_back(struct replay_pages *p, emm_addr_t addr);

/* The first violation of the page rules (replay_pages.c), or NULL. */
const char *replay_pages_violation(const struct replay_pages *p);

#endif
