/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/pages_double.h - a page-granular segment source for the
 * heap tests (what the vmm backend is to the real driver): segments are
 * reserved address ranges (growable ones reserve PD_RESERVE), each granule
 * mapped or not, with a capacity counting mapped bytes only. It checks every
 * call: ranges inside the segment, whole granules, never mapping a mapped
 * granule or unmapping an unmapped one, and never called under an allocator
 * lock (debug builds). It logs every unmap so a test can prove a range was
 * never given back, and can fail the next N maps or grows.
 */
#ifndef EMM_TESTS_PAGES_DOUBLE_H
#define EMM_TESTS_PAGES_DOUBLE_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/heap.h"
#include "allocator/heap_debug.h"

#define PD_MIB      ((size_t)1 << 20)
#define PD_GRAN     (2 * PD_MIB)
#define PD_RESERVE  (1024 * PD_MIB) /* growable segments (>= 4 MiB) reserve this */
#define PD_MAX_SEGS 4096
#define PD_LOG      4096

struct pd_seg {
	uint64_t base;
	size_t reserved, size;
	bool live;
	unsigned char *mapped; /* per granule of the reservation */
};

struct pd_range {
	uint64_t addr;
	size_t len;
};

struct pages_double {
	pthread_mutex_t lock;
	size_t capacity, used; /* mapped bytes */
	size_t reserve;        /* reservation of growable segments */
	int fail_map, fail_grow, fail_unmap;
	unsigned allocs, frees, maps, unmaps, grows, misuse;
	struct pd_seg segs[PD_MAX_SEGS];
	unsigned nsegs;
	struct pd_range unmap_log[PD_LOG];
	unsigned nlog;
};

static uint64_t pd_bump = UINT64_C(0x40000000000);

static inline void pd_check_unlocked(const char *op)
{
	if (emm_heap_debug_lock_depth() != 0) {
		fprintf(stderr, "pages double: %s called under %u allocator lock(s)\n", op,
		        emm_heap_debug_lock_depth());
		abort();
	}
}

#define PD_MISUSE(d, ...)                                   \
	do {                                                \
		(d)->misuse++;                              \
		fprintf(stderr, "pages double: " __VA_ARGS__); \
	} while (0)

static inline struct pd_seg *pd_find(struct pages_double *d, uint64_t base)
{
	for (unsigned i = 0; i < d->nsegs; i++)
		if (d->segs[i].live && d->segs[i].base == base)
			return &d->segs[i];
	return NULL;
}

static inline size_t pd_mapped_in(const struct pd_seg *s, size_t from, size_t to)
{
	size_t n = 0;
	for (size_t i = from; i < to; i++)
		n += s->mapped[i];
	return n;
}

static inline int pd_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret)
{
	struct pages_double *d = state;
	pd_check_unlocked("alloc");
	pthread_mutex_lock(&d->lock);
	if (size % PD_GRAN || d->nsegs == PD_MAX_SEGS) {
		if (size % PD_GRAN)
			PD_MISUSE(d, "alloc of %zu\n", size);
		pthread_mutex_unlock(&d->lock);
		return size % PD_GRAN ? -EINVAL : -ENOMEM;
	}
	if (size > d->capacity - d->used) {
		pthread_mutex_unlock(&d->lock);
		return -ENOMEM;
	}
	struct pd_seg *s = &d->segs[d->nsegs++];
	s->reserved = size >= 4 * PD_MIB && d->reserve > size ? d->reserve : size;
	s->base = pd_bump;
	pd_bump += s->reserved + PD_GRAN;
	s->size = size;
	s->live = true;
	s->mapped = calloc(s->reserved / PD_GRAN, 1);
	memset(s->mapped, 1, size / PD_GRAN);
	d->used += size;
	d->allocs++;
	pthread_mutex_unlock(&d->lock);
	*ret = s->base;
	return 0;
}

static inline int pd_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	struct pages_double *d = state;
	pd_check_unlocked("free");
	pthread_mutex_lock(&d->lock);
	struct pd_seg *s = pd_find(d, addr);
	if (!s || s->size != size) {
		PD_MISUSE(d, "free of 0x%llx (+%zu): %s\n", (unsigned long long)addr, size, s ? "wrong size" : "unknown");
		pthread_mutex_unlock(&d->lock);
		return -EINVAL;
	}
	d->used -= pd_mapped_in(s, 0, s->size / PD_GRAN) * PD_GRAN;
	s->live = false;
	free(s->mapped);
	s->mapped = NULL;
	d->frees++;
	pthread_mutex_unlock(&d->lock);
	return 0;
}

/* Check [off, off + len) of segment `seg` (current size seg_size). */
static inline struct pd_seg *pd_range_ok(struct pages_double *d, emm_addr_t seg, size_t seg_size, size_t off,
                                         size_t len)
{
	struct pd_seg *s = pd_find(d, seg);
	if (!s || s->size != seg_size || off % PD_GRAN || len % PD_GRAN || len == 0 || off + len > s->size) {
		PD_MISUSE(d, "range 0x%llx (+%zu) [%zu, +%zu) bad (segment size %zu)\n", (unsigned long long)seg,
		          seg_size, off, len, s ? s->size : 0);
		return NULL;
	}
	return s;
}

static inline int pd_unmap(void *state, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	struct pages_double *d = state;
	pd_check_unlocked("unmap");
	pthread_mutex_lock(&d->lock);
	struct pd_seg *s = pd_range_ok(d, seg, seg_size, off, len);
	int r = s ? 0 : -EINVAL;
	if (s && pd_mapped_in(s, off / PD_GRAN, (off + len) / PD_GRAN) != len / PD_GRAN) {
		PD_MISUSE(d, "unmap of unmapped granules at 0x%llx\n", (unsigned long long)(seg + off));
		r = -EINVAL;
	}
	if (!r && d->fail_unmap > 0) {
		d->fail_unmap--;
		r = -EIO;
	}
	if (!r) {
		memset(s->mapped + off / PD_GRAN, 0, len / PD_GRAN);
		d->used -= len;
		d->unmaps++;
		if (d->nlog < PD_LOG)
			d->unmap_log[d->nlog++] = (struct pd_range){seg + off, len};
	}
	pthread_mutex_unlock(&d->lock);
	return r;
}

static inline int pd_map(void *state, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	struct pages_double *d = state;
	pd_check_unlocked("map");
	pthread_mutex_lock(&d->lock);
	struct pd_seg *s = pd_range_ok(d, seg, seg_size, off, len);
	int r = s ? 0 : -EINVAL;
	if (s && pd_mapped_in(s, off / PD_GRAN, (off + len) / PD_GRAN) != 0) {
		PD_MISUSE(d, "map of mapped granules at 0x%llx\n", (unsigned long long)(seg + off));
		r = -EINVAL;
	}
	if (!r && (d->fail_map > 0 || len > d->capacity - d->used)) {
		if (d->fail_map > 0)
			d->fail_map--;
		r = -ENOMEM;
	}
	if (!r) {
		memset(s->mapped + off / PD_GRAN, 1, len / PD_GRAN);
		d->used += len;
		d->maps++;
	}
	pthread_mutex_unlock(&d->lock);
	return r;
}

static inline int pd_grow(void *state, emm_addr_t seg, size_t old_size, size_t new_size)
{
	struct pages_double *d = state;
	pd_check_unlocked("grow");
	pthread_mutex_lock(&d->lock);
	struct pd_seg *s = pd_find(d, seg);
	int r = 0;
	if (!s || s->size != old_size || new_size <= old_size || new_size % PD_GRAN) {
		PD_MISUSE(d, "grow of 0x%llx from %zu to %zu (size %zu)\n", (unsigned long long)seg, old_size,
		          new_size, s ? s->size : 0);
		r = -EINVAL;
	} else if (new_size > s->reserved) {
		r = -ENOSPC;
	} else if (d->fail_grow > 0 || new_size - old_size > d->capacity - d->used) {
		if (d->fail_grow > 0)
			d->fail_grow--;
		r = -ENOMEM;
	} else {
		memset(s->mapped + old_size / PD_GRAN, 1, (new_size - old_size) / PD_GRAN);
		d->used += new_size - old_size;
		s->size = new_size;
		d->grows++;
	}
	pthread_mutex_unlock(&d->lock);
	return r;
}

/* Is [addr, addr + len) wholly mapped? */
static inline bool pd_is_mapped(struct pages_double *d, uint64_t addr, size_t len)
{
	bool ok = false;
	pthread_mutex_lock(&d->lock);
	for (unsigned i = 0; i < d->nsegs; i++) {
		struct pd_seg *s = &d->segs[i];
		if (s->live && addr >= s->base && addr + len <= s->base + s->size) {
			size_t from = (addr - s->base) / PD_GRAN, to = (addr + len - s->base + PD_GRAN - 1) / PD_GRAN;
			ok = pd_mapped_in(s, from, to) == to - from;
		}
	}
	pthread_mutex_unlock(&d->lock);
	return ok;
}

/* Was any byte of [addr, addr + len) ever unmapped? */
static inline bool pd_ever_unmapped(struct pages_double *d, uint64_t addr, size_t len)
{
	for (unsigned i = 0; i < d->nlog; i++)
		if (d->unmap_log[i].addr < addr + len && addr < d->unmap_log[i].addr + d->unmap_log[i].len)
			return true;
	return false;
}

static inline void pd_init(struct pages_double *d, size_t capacity)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->lock, NULL);
	d->capacity = capacity;
	d->reserve = PD_RESERVE;
}

static inline void pd_fini(struct pages_double *d)
{
	for (unsigned i = 0; i < d->nsegs; i++)
		free(d->segs[i].mapped);
	pthread_mutex_destroy(&d->lock);
}

static inline struct emm_segment_source pd_source(struct pages_double *d)
{
	return (struct emm_segment_source){d, pd_alloc, pd_free};
}

static inline struct emm_segment_pages pd_pages(struct pages_double *d, bool remap, bool grow)
{
	return (struct emm_segment_pages){
	    .state = d,
	    .granularity = PD_GRAN,
	    .unmap = remap ? pd_unmap : NULL,
	    .map = remap ? pd_map : NULL,
	    .grow = grow ? pd_grow : NULL,
	};
}

#endif
