/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_pages.c - the simulated page-granular device of
 * replay_pages.h. Segments get addresses from a counter (never touched;
 * each segment's reservation is followed by a gap of one page), are mapped
 * whole when made (as vmm's segment_alloc maps every page), and the heap
 * unmaps, maps and grows them by whole pages. Every call is checked
 * (inside the segment, whole pages, growth inside the reservation): a
 * misuse is -EINVAL, past the capacity -ENOMEM. One mutex: the replay's
 * threads take turns, but the heap may call from any of them.
 *
 * Pages are tracked one by one (a bitmap over each segment's reservation),
 * and so are the blocks the replay holds (replay_pages_handed_out/
 * replay_pages_taken_back): a block handed out over an unmapped page, a
 * page unmapped (or a segment freed) under a held block, a map of a mapped
 * page or an unmap of an unmapped one is a violation, the first one kept
 * with its context (replay_pages_violation): on the device each is an
 * illegal address or a failed driver call.
 */
#include "tools/replay_pages.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sim_seg {
	emm_addr_t base;
	size_t size, reserved;
	size_t mapped; /* bytes */
	uint64_t *pages; /* one bit per page of the reservation: mapped */
};

struct held {
	emm_addr_t addr;
	size_t size;
};

struct replay_pages {
	pthread_mutex_t lock;
	uint64_t capacity, mapped, peak;
	size_t page, grow_min;
	emm_addr_t next;
	struct sim_seg *segs;
	size_t nsegs, cap;
	struct held *held; /* blocks the replay holds, unordered */
	size_t nheld, held_cap;
	char violation[512]; /* the first, or "" */
};

int replay_pages_create(uint64_t capacity, size_t page, size_t grow_min, struct replay_pages **ret)
{
	struct replay_pages *p;

	if (!capacity || !page || (page & (page - 1)))
		return -EINVAL;
	p = calloc(1, sizeof(*p));
	if (!p)
		return -ENOMEM;
	pthread_mutex_init(&p->lock, NULL);
	p->capacity = capacity;
	p->page = page;
	p->grow_min = grow_min;
	p->next = UINT64_C(1) << 44; /* far from anything the host maps */
	*ret = p;
	return 0;
}

void replay_pages_destroy(struct replay_pages *p)
{
	if (!p)
		return;
	pthread_mutex_destroy(&p->lock);
	for (size_t i = 0; i < p->nsegs; i++)
		free(p->segs[i].pages);
	free(p->segs);
	free(p->held);
	free(p);
}

uint64_t replay_pages_peak(const struct replay_pages *p)
{
	return p->peak;
}

uint64_t replay_pages_mapped(const struct replay_pages *p)
{
	return p->mapped;
}

static struct sim_seg *find_locked(struct replay_pages *p, emm_addr_t base)
{
	for (size_t i = 0; i < p->nsegs; i++)
		if (p->segs[i].base == base)
			return &p->segs[i];
	return NULL;
}

/* The segment whose reservation holds addr, or NULL. Lock held. */
static struct sim_seg *containing_locked(struct replay_pages *p, emm_addr_t addr)
{
	for (size_t i = 0; i < p->nsegs; i++)
		if (addr >= p->segs[i].base && addr - p->segs[i].base < p->segs[i].reserved)
			return &p->segs[i];
	return NULL;
}

/* Keep the first violation. Lock held. */
__attribute__((format(printf, 2, 3))) static void violate_locked(struct replay_pages *p, const char *fmt, ...)
{
	va_list ap;

	if (p->violation[0])
		return;
	va_start(ap, fmt);
	vsnprintf(p->violation, sizeof(p->violation), fmt, ap);
	va_end(ap);
}

static inline bool page_get(const struct sim_seg *s, size_t i)
{
	return (s->pages[i / 64] >> (i % 64)) & 1u;
}

static void pages_set(struct sim_seg *s, size_t from, size_t to, bool v)
{
	for (size_t i = from; i < to; i++) {
		if (v)
			s->pages[i / 64] |= UINT64_C(1) << (i % 64);
		else
			s->pages[i / 64] &= ~(UINT64_C(1) << (i % 64));
	}
}

/* The first held block overlapping [lo, hi), or NULL. Lock held. */
static const struct held *held_in_locked(const struct replay_pages *p, emm_addr_t lo, emm_addr_t hi)
{
	for (size_t i = 0; i < p->nheld; i++)
		if (p->held[i].addr < hi && lo < p->held[i].addr + p->held[i].size)
			return &p->held[i];
	return NULL;
}

/* Map `bytes` more: -ENOMEM past the capacity. Lock held. */
static int charge_locked(struct replay_pages *p, size_t bytes)
{
	if (bytes > p->capacity - p->mapped)
		return -ENOMEM;
	p->mapped += bytes;
	if (p->mapped > p->peak)
		p->peak = p->mapped;
	return 0;
}

static int sim_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret)
{
	struct replay_pages *p = state;
	int r = 0;

	(void)stream;
	if (!size || size > SIZE_MAX - p->page)
		return -EINVAL;
	size = (size + p->page - 1) & ~(p->page - 1);
	pthread_mutex_lock(&p->lock);
	if (p->nsegs == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 64;
		struct sim_seg *n = realloc(p->segs, cap * sizeof(*n));

		if (n) {
			p->segs = n;
			p->cap = cap;
		} else {
			r = -ENOMEM;
		}
	}
	if (r == 0)
		r = charge_locked(p, size);
	if (r == 0) {
		struct sim_seg *s = &p->segs[p->nsegs];
		size_t reserved = size >= p->grow_min && p->capacity > size ? p->capacity : size;

		reserved = (reserved + p->page - 1) & ~(p->page - 1);
		s->pages = calloc((reserved / p->page + 63) / 64, sizeof(uint64_t));
		if (!s->pages) {
			p->mapped -= size;
			pthread_mutex_unlock(&p->lock);
			return -ENOMEM;
		}
		p->nsegs++;
		s->base = p->next;
		s->size = size;
		s->reserved = reserved;
		s->mapped = size;
		pages_set(s, 0, size / p->page, true);
		p->next += s->reserved + p->page;
		*ret = s->base;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

static int sim_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	struct replay_pages *p = state;
	struct sim_seg *s;
	int r = -EINVAL;

	(void)size;
	(void)stream;
	pthread_mutex_lock(&p->lock);
	s = find_locked(p, addr);
	if (s) {
		const struct held *b = held_in_locked(p, s->base, s->base + s->size);

		if (b)
			violate_locked(p, "segment 0x%llx (%zu bytes) freed under held block 0x%llx+%zu",
			               (unsigned long long)s->base, s->size, (unsigned long long)b->addr, b->size);
		p->mapped -= s->mapped;
		free(s->pages);
		*s = p->segs[--p->nsegs];
		r = 0;
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

/* A whole-page range inside the segment `seg` of `seg_size` bytes. */
static struct sim_seg *range_locked(struct replay_pages *p, emm_addr_t seg, size_t seg_size, size_t off,
                                    size_t len)
{
	struct sim_seg *s = find_locked(p, seg);

	if (!s || s->size != seg_size || !len || off % p->page || len % p->page || off > s->size ||
	    len > s->size - off)
		return NULL;
	return s;
}

/* Unmap (map false) or map `len` bytes at `off` of a segment. */
static int sim_page(struct replay_pages *p, emm_addr_t seg, size_t seg_size, size_t off, size_t len, bool map)
{
	struct sim_seg *s;
	int r = -EINVAL;

	pthread_mutex_lock(&p->lock);
	s = range_locked(p, seg, seg_size, off, len);
	if (s) {
		size_t from = off / p->page, to = (off + len) / p->page;
		const struct held *b = map ? NULL : held_in_locked(p, seg + off, seg + off + len);

		for (size_t i = from; i < to; i++)
			if (page_get(s, i) == map) {
				violate_locked(p, "%s of page %zu of segment 0x%llx (%zu bytes), already %s",
				               map ? "map" : "unmap", i, (unsigned long long)seg, seg_size,
				               map ? "mapped" : "unmapped");
				break;
			}
		if (b)
			violate_locked(p, "unmap of [0x%llx, 0x%llx) in segment 0x%llx under held block 0x%llx+%zu",
			               (unsigned long long)(seg + off), (unsigned long long)(seg + off + len),
			               (unsigned long long)seg, (unsigned long long)b->addr, b->size);
		if (!map && s->mapped >= len) {
			s->mapped -= len;
			p->mapped -= len;
			pages_set(s, from, to, false);
			r = 0;
		} else if (map && s->size - s->mapped >= len && (r = charge_locked(p, len)) == 0) {
			s->mapped += len;
			pages_set(s, from, to, true);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

static int sim_unmap(void *state, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	return sim_page(state, seg, seg_size, off, len, false);
}

static int sim_map(void *state, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	return sim_page(state, seg, seg_size, off, len, true);
}

static int sim_grow(void *state, emm_addr_t seg, size_t old_size, size_t new_size)
{
	struct replay_pages *p = state;
	struct sim_seg *s;
	int r = -EINVAL;

	pthread_mutex_lock(&p->lock);
	s = find_locked(p, seg);
	if (s && s->size == old_size && new_size > old_size && new_size % p->page == 0) {
		if (new_size > s->reserved)
			r = -ENOSPC;
		else if ((r = charge_locked(p, new_size - old_size)) == 0) {
			s->mapped += new_size - old_size;
			s->size = new_size;
			pages_set(s, old_size / p->page, new_size / p->page, true);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return r;
}

void replay_pages_bind(struct replay_pages *p, struct emm_segment_source *src, struct emm_segment_pages *pages)
{
	*src = (struct emm_segment_source){.state = p, .alloc = sim_alloc, .free = sim_free};
	*pages = (struct emm_segment_pages){
	    .state = p,
	    .granularity = p->page,
	    .unmap = sim_unmap,
	    .map = sim_map,
	    .grow = sim_grow,
	};
}

int replay_pages_handed_out(struct replay_pages *p, emm_addr_t addr, size_t size)
{
	struct sim_seg *s;
	int r = 0;

	pthread_mutex_lock(&p->lock);
	s = containing_locked(p, addr);
	const struct held *b = held_in_locked(p, addr, addr + size);
	if (!s || size > s->size || addr - s->base > s->size - size) {
		violate_locked(p, "block 0x%llx+%zu handed out outside every segment's size",
		               (unsigned long long)addr, size);
		r = -EFAULT;
	} else if (b) {
		violate_locked(p, "block 0x%llx+%zu handed out over held block 0x%llx+%zu", (unsigned long long)addr,
		               size, (unsigned long long)b->addr, b->size);
		r = -EFAULT;
	} else {
		size_t first = (addr - s->base) / p->page, end = (addr + size - s->base + p->page - 1) / p->page;

		for (size_t i = first; i < end; i++)
			if (!page_get(s, i)) {
				violate_locked(p,
				               "block 0x%llx+%zu handed out over unmapped page %zu (0x%llx) of segment "
				               "0x%llx (%zu bytes)",
				               (unsigned long long)addr, size, i,
				               (unsigned long long)(s->base + i * p->page), (unsigned long long)s->base,
				               s->size);
				r = -EFAULT;
				break;
			}
	}
	if (r == 0 && p->nheld == p->held_cap) {
		size_t cap = p->held_cap ? p->held_cap * 2 : 256;
		struct held *n = realloc(p->held, cap * sizeof(*n));

		if (!n)
			r = -ENOMEM;
		else {
			p->held = n;
			p->held_cap = cap;
		}
	}
	if (r == 0)
		p->held[p->nheld++] = (struct held){addr, size};
	pthread_mutex_unlock(&p->lock);
	return r;
}

void replay_pages_taken_back(struct replay_pages *p, emm_addr_t addr)
{
	pthread_mutex_lock(&p->lock);
	for (size_t i = 0; i < p->nheld; i++)
		if (p->held[i].addr == addr) {
			p->held[i] = p->held[--p->nheld];
			break;
		}
	pthread_mutex_unlock(&p->lock);
}

const char *replay_pages_violation(const struct replay_pages *p)
{
	return p->violation[0] ? p->violation : NULL;
}
