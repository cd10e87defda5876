/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/heap_doubles.h - test doubles for the heap's two
 * dependencies, shared by the allocator tests:
 *
 *   fake_src   - a segment source handing out fake addresses from a bump
 *                pointer (with a guard gap, so segments are never adjacent),
 *                with a capacity and a switch to fail the next N calls;
 *                checks every free against what it handed out, and can
 *                fail the Nth free (fail_free_at).
 *   fake_fence - fence ops whose events complete only when the test says so
 *                (or at once with auto_complete); logs stream waits, counts
 *                host waits, flags use of a released event and double
 *                releases; capture can be switched on per stream; aborts
 *                if called under an allocator lock (debug builds); an
 *                optional probe runs at the start of every operation
 *                (test-heap-unlocked uses it to see whether a heap lock
 *                is held at that moment); with idle_model on, answers
 *                stream_idle as a stream query would: idle when no event
 *                recorded on it is pending and the test has not marked
 *                it busy (other work running on it); off, every stream
 *                reads busy (an event recorded on each, as before the
 *                question existed).
 *
 * Both are thread-safe (one mutex each) for the stress test.
 */
#ifndef EMM_TESTS_HEAP_DOUBLES_H
#define EMM_TESTS_HEAP_DOUBLES_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/heap.h"
#include "allocator/heap_debug.h"
#include "emm_test.h"

#define FAKE_MIB ((size_t)1 << 20)

/* --- segment source ------------------------------------------------------- */

struct fake_seg {
	uint64_t addr;
	size_t size;
	bool live;
};

struct fake_src {
	pthread_mutex_t lock;
	size_t capacity; /* bytes that may be live at once */
	size_t used;
	int fail_next; /* fail this many calls with -ENOMEM */
	unsigned fail_free_at; /* fail the Nth free call (1-based; 0: never) with -EIO */
	unsigned free_calls;
	unsigned allocs, frees, failures, bad_frees;
	struct fake_seg *segs;
	size_t nsegs, cap;
};

/* Addresses are process-unique across every fake_src (the pointer maps
 * are process-wide). */
static uint64_t fake_bump = UINT64_C(0x10000000000);
static pthread_mutex_t fake_bump_lock = PTHREAD_MUTEX_INITIALIZER;

static inline int fake_src_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret)
{
	struct fake_src *s = state;
	(void)stream;
	pthread_mutex_lock(&s->lock);
	if (s->fail_next > 0 || size > s->capacity - s->used) {
		if (s->fail_next > 0)
			s->fail_next--;
		s->failures++;
		pthread_mutex_unlock(&s->lock);
		return -ENOMEM;
	}
	if (s->nsegs == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 64;
		s->segs = realloc(s->segs, s->cap * sizeof(*s->segs));
		if (!s->segs)
			abort();
	}
	pthread_mutex_lock(&fake_bump_lock);
	uint64_t addr = fake_bump;
	fake_bump += ((size + 2 * FAKE_MIB - 1) & ~(2 * FAKE_MIB - 1)) + 2 * FAKE_MIB;
	pthread_mutex_unlock(&fake_bump_lock);
	s->segs[s->nsegs++] = (struct fake_seg){addr, size, true};
	s->used += size;
	s->allocs++;
	pthread_mutex_unlock(&s->lock);
	*ret = addr;
	return 0;
}

static inline int fake_src_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	struct fake_src *s = state;
	(void)stream;
	pthread_mutex_lock(&s->lock);
	if (++s->free_calls == s->fail_free_at) {
		s->failures++;
		pthread_mutex_unlock(&s->lock);
		return -EIO;
	}
	/* Addresses only grow, so segs is sorted: binary search. */
	size_t lo = 0, hi = s->nsegs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (s->segs[mid].addr < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (size_t i = lo; i < s->nsegs && i == lo; i++) {
		if (s->segs[i].live && s->segs[i].addr == addr) {
			if (s->segs[i].size != size)
				s->bad_frees++;
			s->segs[i].live = false;
			s->used -= s->segs[i].size;
			s->frees++;
			pthread_mutex_unlock(&s->lock);
			return 0;
		}
	}
	s->bad_frees++;
	pthread_mutex_unlock(&s->lock);
	return -EINVAL;
}

static inline void fake_src_init(struct fake_src *s, size_t capacity)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	s->capacity = capacity;
}

static inline void fake_src_fini(struct fake_src *s)
{
	free(s->segs);
	pthread_mutex_destroy(&s->lock);
}

static inline struct emm_segment_source fake_src_ops(struct fake_src *s)
{
	return (struct emm_segment_source){s, fake_src_alloc, fake_src_free};
}

/* --- fence ops ------------------------------------------------------------ */

struct fake_event {
	emm_stream_t stream;
	bool done, released;
};

struct fake_wait {
	emm_stream_t stream;
	uint64_t event;
};

struct fake_fence {
	pthread_mutex_t lock;
	bool auto_complete;          /* events complete when recorded */
	bool capture_sync;           /* a global capture is active */
	emm_stream_t capture_stream; /* this stream is capturing (0: none) */
	int fail_record;             /* fail this many records */
	bool idle_model;             /* answer stream_idle from the model (off: always busy) */
	int fail_idle;               /* fail this many stream_idle calls with -EIO */
	emm_stream_t busy[8];        /* streams with work other than events running */
	unsigned nbusy;
	struct fake_event *ev;       /* event id = index + 1 */
	size_t nev, cap;
	size_t done_upto; /* events with id <= this are complete */
	size_t max_done;  /* highest id known complete */
	struct fake_wait waits[256];
	unsigned nwaits;
	unsigned records, queries, syncs, device_syncs, releases, idle_queries;
	unsigned misuse; /* query/wait/sync on a released or unknown event, double release */
	/* Called first thing in every operation but `capturing`, outside the
	 * double's lock, with the operation's name (NULL: none). */
	void (*probe)(const char *op);
};

static inline void fake_probe(struct fake_fence *f, const char *op)
{
	/* Fence ops are driver calls in production: never under a heap lock
	 * (counted in debug builds; the heap's own wrappers abort first). */
	if (emm_heap_debug_lock_depth() != 0) {
		fprintf(stderr, "fake_fence: %s called under %u allocator lock(s)\n", op,
		        emm_heap_debug_lock_depth());
		abort();
	}
	if (f->probe)
		f->probe(op);
}

static inline struct fake_event *fake_ev(struct fake_fence *f, uint64_t id)
{
	if (id == 0 || id > f->nev || f->ev[id - 1].released) {
		f->misuse++;
		return NULL;
	}
	return &f->ev[id - 1];
}

static inline int fake_record(void *ctx, emm_stream_t stream, uint64_t *ret)
{
	struct fake_fence *f = ctx;
	fake_probe(f, "record");
	pthread_mutex_lock(&f->lock);
	if (stream == EMM_STREAM_SYNC)
		f->misuse++;
	if (f->fail_record > 0) {
		f->fail_record--;
		pthread_mutex_unlock(&f->lock);
		return -EIO;
	}
	if (f->nev == f->cap) {
		f->cap = f->cap ? f->cap * 2 : 256;
		f->ev = realloc(f->ev, f->cap * sizeof(*f->ev));
		if (!f->ev)
			abort();
	}
	f->ev[f->nev++] = (struct fake_event){stream, f->auto_complete, false};
	f->records++;
	if (f->auto_complete)
		f->max_done = f->nev;
	*ret = f->nev;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

static inline int fake_query(void *ctx, uint64_t id)
{
	struct fake_fence *f = ctx;
	fake_probe(f, "query");
	pthread_mutex_lock(&f->lock);
	struct fake_event *e = fake_ev(f, id);
	f->queries++;
	int r = !e || e->done || id <= f->done_upto ? 0 : -EBUSY;
	pthread_mutex_unlock(&f->lock);
	return r;
}

static inline int fake_stream_wait(void *ctx, emm_stream_t stream, uint64_t id)
{
	struct fake_fence *f = ctx;
	fake_probe(f, "stream_wait");
	pthread_mutex_lock(&f->lock);
	fake_ev(f, id);
	if (f->nwaits < 256)
		f->waits[f->nwaits] = (struct fake_wait){stream, id};
	f->nwaits++;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

static inline int fake_synchronize(void *ctx, uint64_t id)
{
	struct fake_fence *f = ctx;
	fake_probe(f, "synchronize");
	pthread_mutex_lock(&f->lock);
	struct fake_event *e = fake_ev(f, id);
	if (e)
		e->done = true;
	if (id > f->max_done)
		f->max_done = id;
	f->syncs++;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

static inline void fake_release(void *ctx, uint64_t id)
{
	struct fake_fence *f = ctx;
	fake_probe(f, "release");
	pthread_mutex_lock(&f->lock);
	struct fake_event *e = fake_ev(f, id);
	if (e)
		e->released = true;
	f->releases++;
	pthread_mutex_unlock(&f->lock);
}

static inline int fake_device_synchronize(void *ctx)
{
	struct fake_fence *f = ctx;
	fake_probe(f, "device_synchronize");
	pthread_mutex_lock(&f->lock);
	f->done_upto = f->max_done = f->nev;
	f->device_syncs++;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

static inline int fake_stream_idle(void *ctx, emm_stream_t stream)
{
	struct fake_fence *f = ctx;
	fake_probe(f, "stream_idle");
	pthread_mutex_lock(&f->lock);
	int r = 0;
	f->idle_queries++;
	/* A query during a capture that forbids it is misuse (the heap must
	 * not ask then). */
	if (f->capture_sync || stream == EMM_STREAM_SYNC || stream == f->capture_stream)
		f->misuse++;
	if (f->fail_idle > 0) {
		f->fail_idle--;
		r = -EIO;
	} else if (!f->idle_model) {
		r = -EBUSY;
	} else {
		for (unsigned i = 0; i < f->nbusy; i++)
			if (f->busy[i] == stream)
				r = -EBUSY;
		for (size_t i = f->done_upto; i < f->nev && r == 0; i++)
			if (f->ev[i].stream == stream && !f->ev[i].done)
				r = -EBUSY;
	}
	pthread_mutex_unlock(&f->lock);
	return r;
}

/* Mark `stream` busy (work running on it) or idle again. */
static inline void fake_set_busy(struct fake_fence *f, emm_stream_t stream, bool busy)
{
	pthread_mutex_lock(&f->lock);
	for (unsigned i = 0; i < f->nbusy; i++) {
		if (f->busy[i] == stream) {
			f->busy[i] = f->busy[--f->nbusy];
			break;
		}
	}
	if (busy && f->nbusy < 8)
		f->busy[f->nbusy++] = stream;
	pthread_mutex_unlock(&f->lock);
}

/* Events recorded on `stream` so far (released or not). */
static inline unsigned fake_records_on(struct fake_fence *f, emm_stream_t stream)
{
	unsigned n = 0;
	pthread_mutex_lock(&f->lock);
	for (size_t i = 0; i < f->nev; i++)
		n += f->ev[i].stream == stream;
	pthread_mutex_unlock(&f->lock);
	return n;
}

static inline bool fake_capturing(void *ctx, emm_stream_t stream)
{
	struct fake_fence *f = ctx;
	pthread_mutex_lock(&f->lock);
	bool r = f->capture_sync || (stream != EMM_STREAM_SYNC && stream == f->capture_stream);
	pthread_mutex_unlock(&f->lock);
	return r;
}

/* Complete every event recorded so far (on `stream`, or all with 0). */
static inline void fake_complete(struct fake_fence *f, emm_stream_t stream)
{
	pthread_mutex_lock(&f->lock);
	if (stream == 0) {
		f->done_upto = f->max_done = f->nev;
	} else {
		for (size_t i = f->done_upto; i < f->nev; i++) {
			if (f->ev[i].stream == stream) {
				f->ev[i].done = true;
				if (i + 1 > f->max_done)
					f->max_done = i + 1;
			}
		}
	}
	pthread_mutex_unlock(&f->lock);
}

/* Events recorded and not yet released. */
static inline unsigned fake_live_events(struct fake_fence *f)
{
	unsigned n = 0;
	pthread_mutex_lock(&f->lock);
	for (size_t i = 0; i < f->nev; i++)
		n += !f->ev[i].released;
	pthread_mutex_unlock(&f->lock);
	return n;
}

static inline void fake_fence_init(struct fake_fence *f)
{
	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->lock, NULL);
}

static inline void fake_fence_fini(struct fake_fence *f)
{
	free(f->ev);
	pthread_mutex_destroy(&f->lock);
}

static inline struct emm_fence_ops fake_fence_ops(struct fake_fence *f)
{
	return (struct emm_fence_ops){
	    .ctx = f,
	    .record = fake_record,
	    .query = fake_query,
	    .stream_wait = fake_stream_wait,
	    .synchronize = fake_synchronize,
	    .release = fake_release,
	    .device_synchronize = fake_device_synchronize,
	    .capturing = fake_capturing,
	    .stream_idle = fake_stream_idle,
	};
}

/* A heap over `src` (reset to `capacity` bytes) and `fence` (reset): 0 and
 * *ret, or emm_heap_create's error. */
static inline int fake_heap_create(const struct emm_heap_params *p, struct fake_src *src, size_t capacity,
                                   struct fake_fence *fence, emm_heap_t **ret)
{
	fake_src_init(src, capacity);
	fake_fence_init(fence);
	struct emm_segment_source s = fake_src_ops(src);
	struct emm_fence_ops f = fake_fence_ops(fence);
	return emm_heap_create(p, &s, &f, 0, ret);
}

/* fake_heap_create with one arena (blocks carved in address order) and
 * epochs of 16 frees, the OOM retry on or off. */
static inline int fake_heap_create_one_arena(struct fake_src *src, size_t capacity, bool oom_retry,
                                             struct fake_fence *fence, emm_heap_t **ret)
{
	struct emm_heap_params p;

	emm_heap_params_default(&p);
	p.epoch_max_blocks = 16;
	p.oom_retry = oom_retry;
	p.arenas = 1;
	return fake_heap_create(&p, src, capacity, fence, ret);
}

/* Check and destroy a heap made by fake_heap_create, then verify nothing
 * leaked (every segment back, every event released, no misuse) and free
 * the doubles (emm_test.h records failures). */
static inline void fake_heap_destroy_checked(emm_heap_t *h, struct fake_src *src, struct fake_fence *fence)
{
	expect_int_eq(emm_heap_check(h), 0);
	emm_heap_destroy(h, true);
	expect_int_eq(src->bad_frees, 0);
	expect_u64_eq(src->used, 0);
	expect_int_eq(fence->misuse, 0);
	expect_int_eq(fake_live_events(fence), 0);
	fake_src_fini(src);
	fake_fence_fini(fence);
}

static inline struct emm_stats heap_stats(emm_heap_t *h)
{
	struct emm_stats st;
	memset(&st, 0, sizeof(st));
	st.struct_size = sizeof(st);
	emm_heap_add_stats(h, &st);
	return st;
}

/* Allocate / free, recording a test failure on error (emm_test.h). */
static inline emm_addr_t xalloc(emm_heap_t *h, size_t size, emm_stream_t s)
{
	emm_addr_t a = 0;
	int r = emm_heap_alloc(h, size, s, &a);
	if (r)
		emm_test_fail_("alloc %zu on 0x%llx: %d", size, (unsigned long long)s, r);
	return a;
}

static inline void xfree(emm_addr_t a, emm_stream_t s)
{
	int r = emm_heap_free(a, s, NULL);
	if (r)
		emm_test_fail_("free 0x%llx: %d", (unsigned long long)a, r);
}

#endif
