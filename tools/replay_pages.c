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
 */
#include "tools/replay_pages.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

struct sim_seg {
	emm_addr_t base;
	size_t size, reserved;
	size_t mapped; /* bytes */
};

struct replay_pages {
	pthread_mutex_t lock;
	uint64_t capacity, mapped, peak;
	size_t page, grow_min;
	emm_addr_t next;
	struct sim_seg *segs;
	size_t nsegs, cap;
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
	free(p->segs);
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
		struct sim_seg *s = &p->segs[p->nsegs++];

		s->base = p->next;
		s->size = size;
		s->reserved = size >= p->grow_min && p->capacity > size ? p->capacity : size;
		s->reserved = (s->reserved + p->page - 1) & ~(p->page - 1);
		s->mapped = size;
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
		p->mapped -= s->mapped;
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
	if (s && !map && s->mapped >= len) {
		s->mapped -= len;
		p->mapped -= len;
		r = 0;
	} else if (s && map && s->size - s->mapped >= len && (r = charge_locked(p, len)) == 0) {
		s->mapped += len;
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
