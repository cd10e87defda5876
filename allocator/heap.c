/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap.c - the caching allocator core: pools, blocks, best-fit
 * trees, splitting and coalescing, fences and epochs, OOM recovery,
 * release, statistics and the invariant checker. The contract is heap.h.
 *
 * Data structures (all per heap, under one mutex):
 *   - segments: what the source gave, in a doubly linked list; each holds
 *     its blocks in address order (prev/next), which tile it exactly.
 *   - blocks: one struct per piece of a segment, recycled through a free
 *     list and allocated in slabs, so the steady state never mallocs. A
 *     block is LIVE (the program holds it), READY (free, in its pool's tree
 *     keyed (stream key, size, address); key 0 = ready-any, key S =
 *     ready-stream S) or PENDING (free, on a fence's list, in no tree).
 *   - two red-black trees (small and large pool): best fit is a
 *     lower_bound on (key, rounded size, 0), checked against the key.
 *   - fences: the open epoch collects synchronous frees; a closed fence
 *     carries its events and its blocks and sits in a FIFO polled on the
 *     allocation miss path. Closing an epoch with no live non-blocking
 *     stream makes its blocks ready-any at once (the legacy-stream event
 *     orders every later use; see emm_heap_last_fence).
 *   - idle list: segments whose only block is ready-any (whole and free),
 *     the candidates for release, oldest first.
 *
 * Lock order: heap lock, then the segment map's lock (segmap insert/remove
 * and check run under the heap lock). The block map is only touched outside
 * the heap lock except in emm_heap_find_block and destroy. The heap lock is
 * dropped around the segment source and around host waits.
 */
#include "allocator/heap.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "allocator/ptrmap.h"
#include "allocator/tree.h"
#include "common/compiler.h"
#include "common/log.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

#define POOL_SMALL 0u
#define POOL_LARGE 1u
#define NPOOLS     2u

#define BLOCK_SLAB       128u /* blocks per metadata slab */
#define STEAL_CANDIDATES 8u   /* streams tried per steal */

enum block_state {
	BLOCK_UNUSED = 0, /* on the recycle list */
	BLOCK_LIVE,
	BLOCK_READY,
	BLOCK_PENDING,
};

struct emm_segment;
struct emm_fence;

struct emm_block {
	struct emm_tree_node node;     /* READY: in pools[pool].tree, key (stream, size, addr) */
	struct emm_block *prev, *next; /* address neighbours within the segment */
	struct emm_segment *seg;
	struct emm_block *link;  /* PENDING: fence list; UNUSED: recycle list */
	struct emm_fence *fence; /* PENDING: the fence holding it */
	emm_addr_t addr;
	size_t size;
	size_t requested;    /* LIVE: what the program asked for */
	emm_stream_t stream; /* READY: 0 (any) or S; LIVE: the allocation stream */
	uint8_t state;
	uint8_t pool;
};

struct emm_segment {
	struct arena *arena;             /* never changes: segment structs are never freed before the heap */
	struct emm_segment *prev, *next; /* live segments; recycle list through next */
	struct emm_segment *idle_prev, *idle_next;
	struct emm_segment *all_next; /* every struct ever made, for destroy */
	struct emm_block *first;
	emm_addr_t base;
	size_t size;
	uint8_t pool;
	bool live;
	bool idle; /* on the idle list: one block, ready-any */
};

/* An epoch (synchronous frees) or a stream fence (stream destroy, OOM). */
struct emm_fence {
	struct emm_fence *next; /* closed-fence FIFO; recycle list */
	struct emm_block *blocks;
	size_t bytes;
	unsigned nblocks;
	size_t max_size[NPOOLS]; /* largest block per pool (open epoch: pressure test) */
	uint64_t *events;
	unsigned nevents, done, cap; /* events[0..done) are known complete */
	unsigned holds;              /* threads synchronizing its events with the lock dropped */
	bool synced;                 /* every event was synchronized */
	bool retired;                /* blocks already made ready, waiting for holds to drop */
	bool keep_legacy;            /* events[0] is the heap's last fence: do not release it */
};

struct heap_counters {
	uint64_t allocs, frees, hits, misses;
	uint64_t backend_allocs, backend_frees, oom_retries, ooms;
	uint64_t splits, merges;
	uint64_t events_recorded, event_queries, stream_waits, host_waits, epochs_closed;
	uint64_t allocated, allocated_peak, allocated_total;
	uint64_t requested, requested_peak, requested_total;
	uint64_t reserved, reserved_peak, reserved_total;
	uint64_t pending, segments, live_blocks;
};

/* One arena: everything below is under its lock. */
struct arena {
	pthread_mutex_t lock;
	struct emm_heap *owner;
	struct emm_heap_params p;
	struct emm_segment_source src;
	struct emm_fence_ops fops;
	bool has_fence;

	struct emm_tree trees[NPOOLS];
	struct emm_block *block_free;
	struct emm_fence *open;              /* never NULL */
	struct emm_fence *fq_head, *fq_tail; /* closed fences, oldest first */
	struct heap_counters st;
	int64_t d_allocated, d_requested; /* not yet added to the owner's bytes */

	struct emm_segment *segs; /* live segments */
	struct emm_segment *idle_head, *idle_tail;
	struct emm_segment *seg_free, *seg_all;
	struct emm_fence *fence_free;
	void *slabs; /* block slabs, chained through their first word */

	emm_stream_t *nb; /* live non-blocking streams */
	unsigned nb_count, nb_cap;

	uint64_t last_fence;
	bool has_last_fence;
	struct emm_fence *last_fence_owner; /* pending fence whose events[0] it is */
	bool warned_query;
};

/*
 * A heap is a set of arenas. The small pool of each thread lives in its
 * own arena (threads are spread round-robin), the large pool in arena 0:
 * with one shared state, every allocation moves the same cache lines
 * (lock, counters, tree nodes) between cores, and measured on a 16-core
 * host 8 threads paid 10-14 us per cached pair against 87 ns with a heap
 * each. Small blocks are the frequent ones; large ones stay shared so their
 * memory is not multiplied by the thread count. A free goes to the arena
 * that owns the block's segment.
 */
#define MAX_ARENAS 8u

struct emm_heap {
	unsigned narenas; /* a power of two */
	int device;
	struct arena *arenas[MAX_ARENAS];
	/* Heap-wide bytes for the peaks (per-arena peaks do not add up):
	 * reserved exactly (segments change rarely); allocated and requested
	 * from per-arena deltas, flushed once they grow by STAT_FLUSH_UP or
	 * shrink by STAT_FLUSH_DOWN (so an alloc/free cycle flushes nothing),
	 * which bounds the peak's error by narenas times those. With one
	 * arena none of this runs: the arena's own peaks are exact. */
	_Atomic int64_t reserved, allocated, requested;
	_Atomic int64_t reserved_peak, allocated_peak, requested_peak;
};

#define STAT_FLUSH_UP   ((int64_t)1 << 20)
#define STAT_FLUSH_DOWN ((int64_t)64 << 20)

static inline void peak_update(_Atomic int64_t *peak, int64_t v)
{
	int64_t p = atomic_load_explicit(peak, memory_order_relaxed);
	while (v > p && !atomic_compare_exchange_weak_explicit(peak, &p, v, memory_order_relaxed,
	                                                       memory_order_relaxed))
		;
}

static inline void heap_stat_add(_Atomic int64_t *cur, _Atomic int64_t *peak, int64_t delta)
{
	int64_t v = atomic_fetch_add_explicit(cur, delta, memory_order_relaxed) + delta;
	peak_update(peak, v);
}

static atomic_uint thread_rr;
static _Thread_local unsigned thread_slot_plus1;

static inline unsigned thread_slot(void)
{
	unsigned s = thread_slot_plus1;
	if (EMM_UNLIKELY(!s)) {
		s = atomic_fetch_add_explicit(&thread_rr, 1, memory_order_relaxed) + 1;
		thread_slot_plus1 = s;
	}
	return s - 1;
}

static inline struct arena *thread_arena(const struct emm_heap *heap)
{
	return heap->arenas[thread_slot() & (heap->narenas - 1)];
}

/* --- sizes --------------------------------------------------------------- */

void emm_heap_params_default(struct emm_heap_params *p)
{
	/* Every field, including ones added later, starts zeroed. */
	memset(p, 0, sizeof(*p));
	p->small_max = 1 * MIB;
	p->small_segment = 2 * MIB;
	p->large_segment = 20 * MIB;
	p->large_round = 2 * MIB;
	p->max_split = SIZE_MAX;
	p->max_nosplit_slack = 20 * MIB;
	p->roundup_divisions = 0;
	p->release_threshold = SIZE_MAX;
	p->oom_retry = true;
	p->free_mode = EMM_FREE_MODE_FENCE;
	p->epoch_max_blocks = 32;
	p->epoch_max_bytes = 64 * MIB;
	p->host_accessible = false;
	p->arenas = 0;
}

/* x rounded up to a multiple of align (a power of two), or 0 on overflow. */
static inline size_t align_up_checked(size_t x, size_t align)
{
	if (x > SIZE_MAX - (align - 1))
		return 0;
	return (x + align - 1) & ~(align - 1);
}

/* x rounded up to a multiple of m (any m > 0), or 0 on overflow. */
static inline size_t round_up_checked(size_t x, size_t m)
{
	size_t r = x % m;
	if (r == 0)
		return x;
	if (x > SIZE_MAX - (m - r))
		return 0;
	return x + (m - r);
}

static inline size_t pow2_floor(size_t x)
{
	return (size_t)1 << (63 - __builtin_clzll((unsigned long long)x));
}

size_t emm_heap_round_size(const struct emm_heap_params *p, size_t size)
{
	size_t step = EMM_MIN_BLOCK;

	if (size == 0)
		return 0;
	if (size <= EMM_MIN_BLOCK)
		return EMM_MIN_BLOCK;
	if (p->roundup_divisions) {
		/* N steps per power-of-two interval (N rounded down to a power
		 * of two), never finer than 512 B: PyTorch's
		 * roundup_power2_divisions. */
		size_t div_step = pow2_floor(size) / pow2_floor(p->roundup_divisions);
		if (div_step > step)
			step = div_step;
	}
	return align_up_checked(size, step);
}

size_t emm_heap_segment_size(const struct emm_heap_params *p, size_t rounded)
{
	if (rounded == 0)
		return 0;
	if (rounded <= p->small_max)
		return rounded <= p->small_segment ? p->small_segment
		                                   : round_up_checked(rounded, p->small_segment);
	if (rounded < p->large_segment / 2)
		return p->large_segment;
	return round_up_checked(rounded, p->large_round);
}

/* --- metadata recycling -------------------------------------------------- */

static struct emm_block *block_new(struct arena *h)
{
	struct emm_block *b = h->block_free;

	if (EMM_UNLIKELY(!b)) {
		/* One slab: a pointer-sized header chaining the slabs, then blocks. */
		size_t hdr = EMM_ALIGN_UP(sizeof(void *), _Alignof(struct emm_block));
		char *slab = malloc(hdr + BLOCK_SLAB * sizeof(struct emm_block));
		if (!slab)
			return NULL;
		*(void **)slab = h->slabs;
		h->slabs = slab;
		struct emm_block *arr = (struct emm_block *)(slab + hdr);
		for (unsigned i = 0; i < BLOCK_SLAB; i++) {
			arr[i].state = BLOCK_UNUSED;
			arr[i].link = i + 1 < BLOCK_SLAB ? &arr[i + 1] : NULL;
		}
		b = arr;
	}
	h->block_free = b->link;
	b->prev = b->next = NULL;
	b->link = NULL;
	b->fence = NULL;
	b->requested = 0;
	b->stream = 0;
	emm_tree_node_clear(&b->node);
	return b;
}

static inline void block_recycle(struct arena *h, struct emm_block *b)
{
	b->state = BLOCK_UNUSED;
	b->seg = NULL;
	b->link = h->block_free;
	h->block_free = b;
}

static struct emm_segment *segment_new(struct arena *h)
{
	struct emm_segment *s = h->seg_free;

	if (s) {
		h->seg_free = s->next;
	} else {
		s = calloc(1, sizeof(*s));
		if (!s)
			return NULL;
		s->arena = h;
		s->all_next = h->seg_all;
		h->seg_all = s;
	}
	s->prev = s->next = NULL;
	s->idle_prev = s->idle_next = NULL;
	s->first = NULL;
	s->live = false;
	s->idle = false;
	return s;
}

static struct emm_fence *fence_new(struct arena *h)
{
	struct emm_fence *f = h->fence_free;

	if (f) {
		h->fence_free = f->next;
	} else {
		f = calloc(1, sizeof(*f));
		if (!f)
			return NULL;
	}
	f->next = NULL;
	return f;
}

/* Room for n events. */
static int fence_reserve(struct emm_fence *f, unsigned n)
{
	if (f->cap >= n)
		return 0;
	unsigned cap = f->cap ? f->cap : 4;
	while (cap < n)
		cap *= 2;
	uint64_t *ev = realloc(f->events, cap * sizeof(*ev));
	if (!ev)
		return -ENOMEM;
	f->events = ev;
	f->cap = cap;
	return 0;
}

static void fence_reset(struct emm_fence *f)
{
	f->blocks = NULL;
	f->bytes = 0;
	f->nblocks = 0;
	f->max_size[0] = f->max_size[1] = 0;
	f->nevents = f->done = 0;
	f->holds = 0;
	f->synced = f->retired = f->keep_legacy = false;
}

/* Release a finished fence's events (all but a shared last fence) and
 * put the struct on the recycle list. */
static void fence_recycle(struct arena *h, struct emm_fence *f)
{
	for (unsigned i = 0; i < f->nevents; i++) {
		if (i == 0 && f->keep_legacy) {
			h->last_fence_owner = NULL; /* the heap owns it alone now */
			continue;
		}
		h->fops.release(h->fops.ctx, f->events[i]);
	}
	fence_reset(f);
	f->next = h->fence_free;
	h->fence_free = f;
}

/* --- trees, idle list, ready blocks --------------------------------------- */

static void idle_add(struct arena *h, struct emm_segment *s)
{
	s->idle = true;
	s->idle_next = NULL;
	s->idle_prev = h->idle_tail;
	if (h->idle_tail)
		h->idle_tail->idle_next = s;
	else
		h->idle_head = s;
	h->idle_tail = s;
}

static void idle_del(struct arena *h, struct emm_segment *s)
{
	if (s->idle_prev)
		s->idle_prev->idle_next = s->idle_next;
	else
		h->idle_head = s->idle_next;
	if (s->idle_next)
		s->idle_next->idle_prev = s->idle_prev;
	else
		h->idle_tail = s->idle_prev;
	s->idle = false;
	s->idle_prev = s->idle_next = NULL;
}

static inline void tree_put(struct arena *h, struct emm_block *b)
{
	b->node.key[0] = b->stream;
	b->node.key[1] = b->size;
	b->node.key[2] = b->addr;
	emm_tree_insert(&h->trees[b->pool], &b->node);
	if (!b->prev && !b->next && b->stream == 0)
		idle_add(h, b->seg);
}

static inline void tree_take(struct arena *h, struct emm_block *b)
{
	if (b->seg->idle)
		idle_del(h, b->seg);
	emm_tree_remove(&h->trees[b->pool], &b->node);
}

static inline struct emm_block *node_block(struct emm_tree_node *n)
{
	return (struct emm_block *)((char *)n - offsetof(struct emm_block, node));
}

/* Make a free block ready under `key` (0: any), merging with neighbours that
 * are ready under the same key. Never merges live or pending blocks. */
static struct emm_block *block_ready(struct arena *h, struct emm_block *b, emm_stream_t key)
{
	struct emm_block *n;

	b->state = BLOCK_READY;
	b->stream = key;
	b->fence = NULL;
	b->link = NULL;

	n = b->prev;
	if (n && n->state == BLOCK_READY && n->stream == key) {
		tree_take(h, n);
		b->addr = n->addr;
		b->size += n->size;
		b->prev = n->prev;
		if (b->prev)
			b->prev->next = b;
		else
			b->seg->first = b;
		block_recycle(h, n);
		h->st.merges++;
	}
	n = b->next;
	if (n && n->state == BLOCK_READY && n->stream == key) {
		tree_take(h, n);
		b->size += n->size;
		b->next = n->next;
		if (b->next)
			b->next->prev = b;
		block_recycle(h, n);
		h->st.merges++;
	}
	tree_put(h, b);
	return b;
}

static void pending_add(struct arena *h, struct emm_fence *f, struct emm_block *b)
{
	b->state = BLOCK_PENDING;
	b->fence = f;
	b->link = f->blocks;
	f->blocks = b;
	f->nblocks++;
	f->bytes += b->size;
	if (b->size > f->max_size[b->pool])
		f->max_size[b->pool] = b->size;
	h->st.pending += b->size;
}

/* Every block of a completed fence becomes ready-any. */
static void fence_release_blocks(struct arena *h, struct emm_fence *f)
{
	struct emm_block *b = f->blocks, *next;

	for (; b; b = next) {
		next = b->link;
		h->st.pending -= b->size;
		block_ready(h, b, 0);
	}
	f->blocks = NULL;
	f->nblocks = 0;
	f->bytes = 0;
	f->max_size[0] = f->max_size[1] = 0;
}

/* Best fit among the blocks ready under `key`, honouring the oversize rules
 * (blocks >= max_split serve only requests >= max_split, and only within
 * max_nosplit_slack of their size). The smallest fitting block is the first
 * candidate, so if it fails the rules every larger one does too. */
static inline struct emm_block *find_fit(struct arena *h, unsigned pool, emm_stream_t key, size_t rounded)
{
	struct emm_tree_node *n = emm_tree_lower_bound(&h->trees[pool], key, rounded, 0);

	if (!n || n->key[0] != key)
		return NULL;
	size_t sz = n->key[1];
	if (EMM_UNLIKELY(sz >= h->p.max_split)) {
		if (rounded < h->p.max_split)
			return NULL;
		if (sz - rounded >= h->p.max_nosplit_slack)
			return NULL;
	}
	return node_block(n);
}

static inline bool should_split(const struct arena *h, const struct emm_block *b, size_t rounded)
{
	size_t rem = b->size - rounded;

	if (b->pool == POOL_SMALL)
		return rem >= EMM_MIN_BLOCK;
	/* Large pool: remainders must be worth a large block (> small_max, 1 MiB
	 * by default), and oversize requests never split. */
	return rounded < h->p.max_split && rem > h->p.small_max;
}

static inline void stat_add(uint64_t *cur, uint64_t *peak, uint64_t *total, uint64_t v)
{
	*cur += v;
	if (*cur > *peak)
		*peak = *cur;
	*total += v;
}

/* Push this arena's byte deltas into the heap-wide counters. */
static void stat_flush(struct arena *h)
{
	if (h->d_allocated)
		heap_stat_add(&h->owner->allocated, &h->owner->allocated_peak, h->d_allocated);
	if (h->d_requested)
		heap_stat_add(&h->owner->requested, &h->owner->requested_peak, h->d_requested);
	h->d_allocated = h->d_requested = 0;
}

static inline void stat_delta(struct arena *h, int64_t allocated, int64_t requested)
{
	if (h->owner->narenas == 1)
		return;
	h->d_allocated += allocated;
	h->d_requested += requested;
	if (EMM_UNLIKELY(h->d_allocated >= STAT_FLUSH_UP || h->d_allocated <= -STAT_FLUSH_DOWN))
		stat_flush(h);
}

/* Hand out a ready block: take it out of its tree, split off the remainder
 * (which stays ready under the same key), mark it live. */
static void take_block(struct arena *h, struct emm_block *b, size_t rounded, size_t size, emm_stream_t stream)
{
	tree_take(h, b);
	if (b->size > rounded && should_split(h, b, rounded)) {
		struct emm_block *r = block_new(h);
		if (r) { /* without metadata the whole block goes out: still correct */
			r->seg = b->seg;
			r->pool = b->pool;
			r->addr = b->addr + rounded;
			r->size = b->size - rounded;
			r->stream = b->stream;
			r->state = BLOCK_READY;
			r->prev = b;
			r->next = b->next;
			if (b->next)
				b->next->prev = r;
			b->next = r;
			b->size = rounded;
			/* b was maximal, so r's other neighbour is not mergeable. */
			tree_put(h, r);
			h->st.splits++;
		}
	}
	b->state = BLOCK_LIVE;
	b->requested = size;
	b->stream = stream;
	h->st.allocs++;
	h->st.live_blocks++;
	stat_add(&h->st.allocated, &h->st.allocated_peak, &h->st.allocated_total, b->size);
	stat_add(&h->st.requested, &h->st.requested_peak, &h->st.requested_total, size);
	stat_delta(h, (int64_t)b->size, (int64_t)size);
}

/* A live block is free again: undo its live accounting. */
static inline void untake_accounting(struct arena *h, struct emm_block *b)
{
	h->st.frees++;
	h->st.live_blocks--;
	h->st.allocated -= b->size;
	h->st.requested -= b->requested;
	stat_delta(h, -(int64_t)b->size, -(int64_t)b->requested);
}

/* --- fences --------------------------------------------------------------- */

static inline bool f_capturing(struct arena *h, emm_stream_t s)
{
	return h->has_fence && h->fops.capturing && h->fops.capturing(h->fops.ctx, s);
}

static bool is_nonblocking(const struct arena *h, emm_stream_t s)
{
	for (unsigned i = 0; i < h->nb_count; i++)
		if (h->nb[i] == s)
			return true;
	return false;
}

/* The stream an event must be recorded on to order work of stream key s:
 * the legacy stream is a barrier for blocking and per-thread streams. */
static inline emm_stream_t fence_target(const struct arena *h, emm_stream_t s)
{
	return is_nonblocking(h, s) ? s : EMM_STREAM_LEGACY;
}

static void set_last_fence(struct arena *h, uint64_t ev, struct emm_fence *owner)
{
	if (h->has_last_fence) {
		if (h->last_fence_owner)
			h->last_fence_owner->keep_legacy = false; /* its fence releases it */
		else
			h->fops.release(h->fops.ctx, h->last_fence);
	}
	h->last_fence = ev;
	h->has_last_fence = true;
	h->last_fence_owner = owner;
	if (owner)
		owner->keep_legacy = true;
}

static void fence_enqueue(struct arena *h, struct emm_fence *f)
{
	f->next = NULL;
	if (h->fq_tail)
		h->fq_tail->next = f;
	else
		h->fq_head = f;
	h->fq_tail = f;
}

/*
 * Close the open epoch: one event on the legacy stream and one on each live
 * non-blocking stream. 0 (closed, or nothing to close), -EBUSY (a capture
 * forbids recording: the epoch stays open), or another negative errno.
 */
static int close_epoch(struct arena *h)
{
	struct emm_fence *ep = h->open, *next_open = NULL;
	int r;

	if (ep->nblocks == 0)
		return 0;
	if (!h->has_fence) {
		h->st.epochs_closed++;
		fence_release_blocks(h, ep);
		return 0;
	}
	if (f_capturing(h, EMM_STREAM_SYNC))
		return -EBUSY;
	for (unsigned i = 0; i < h->nb_count; i++)
		if (f_capturing(h, h->nb[i]))
			return -EBUSY;
	if (h->nb_count || h->p.host_accessible) {
		next_open = fence_new(h);
		if (!next_open)
			return -ENOMEM;
	}
	r = fence_reserve(ep, 1 + h->nb_count);
	if (r)
		goto fail;
	r = h->fops.record(h->fops.ctx, EMM_STREAM_LEGACY, &ep->events[0]);
	if (r)
		goto fail;
	ep->nevents = 1;
	h->st.events_recorded++;
	for (unsigned i = 0; i < h->nb_count; i++) {
		r = h->fops.record(h->fops.ctx, h->nb[i], &ep->events[1 + i]);
		if (r) {
			for (unsigned j = 0; j < ep->nevents; j++)
				h->fops.release(h->fops.ctx, ep->events[j]);
			ep->nevents = 0;
			goto fail;
		}
		ep->nevents++;
		h->st.events_recorded++;
	}
	h->st.epochs_closed++;
	if (!h->nb_count && !h->p.host_accessible) {
		/* Fast path: the legacy event orders every later use on blocking
		 * and per-thread streams, and new non-blocking streams wait on it
		 * (emm_heap_last_fence). The blocks are ready at once. Not for
		 * host-accessible memory: the host writes a reused pinned block
		 * at once, outside every stream, so it must wait for completion
		 * (a copy from it may still be in flight: measured on the H200). */
		set_last_fence(h, ep->events[0], NULL);
		ep->nevents = 0;
		fence_release_blocks(h, ep);
		return 0;
	}
	set_last_fence(h, ep->events[0], ep);
	ep->done = 0;
	fence_enqueue(h, ep);
	fence_reset(next_open);
	h->open = next_open;
	return 0;
fail:
	if (next_open) {
		fence_reset(next_open);
		next_open->next = h->fence_free;
		h->fence_free = next_open;
	}
	return r;
}

/* Have all of a closed fence's events completed? Queries only (no host
 * wait), never while a global capture is active. *capture: 0 unchecked,
 * 1 checked and free, 2 capturing. */
static bool fence_complete(struct arena *h, struct emm_fence *f, int *capture)
{
	if (f->synced)
		return true;
	while (f->done < f->nevents) {
		if (*capture == 0)
			*capture = f_capturing(h, EMM_STREAM_SYNC) ? 2 : 1;
		if (*capture == 2)
			return false;
		int r = h->fops.query(h->fops.ctx, f->events[f->done]);
		h->st.event_queries++;
		if (r == -EBUSY)
			return false;
		if (r != 0 && !h->warned_query) {
			/* A failed query means a broken context: no more work will
			 * run on it, so the fence counts as passed. */
			emm_warn("event query failed (%d): treating the fence as complete", r);
			h->warned_query = true;
		}
		f->done++;
	}
	return true;
}

/* Move completed fences' blocks to ready-any, oldest first, stopping at the
 * first incomplete one. True if any block became ready. */
static bool poll_fences(struct arena *h)
{
	struct emm_fence *prev = NULL, *f = h->fq_head, *next;
	bool moved = false;
	int capture = 0;

	for (; f; f = next) {
		next = f->next;
		if (!f->retired) {
			if (!fence_complete(h, f, &capture))
				break;
			if (f->nblocks)
				moved = true;
			fence_release_blocks(h, f);
			f->retired = true;
		}
		if (f->holds == 0) {
			if (prev)
				prev->next = next;
			else
				h->fq_head = next;
			if (h->fq_tail == f)
				h->fq_tail = prev;
			fence_recycle(h, f);
		} else {
			prev = f;
		}
	}
	return moved;
}

/* Gather the blocks ready under `key` (both pools) into a list, taking them
 * out of the trees and marking them pending so they do not merge. */
static struct emm_block *collect_key(struct arena *h, emm_stream_t key)
{
	struct emm_block *list = NULL;

	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		struct emm_tree_node *n;
		while ((n = emm_tree_lower_bound(&h->trees[pool], key, 0, 0)) && n->key[0] == key) {
			struct emm_block *b = node_block(n);
			tree_take(h, b);
			b->state = BLOCK_PENDING;
			b->link = list;
			list = b;
		}
	}
	return list;
}

static bool has_key(struct arena *h, emm_stream_t key)
{
	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		struct emm_tree_node *n = emm_tree_lower_bound(&h->trees[pool], key, 0, 0);
		if (n && n->key[0] == key)
			return true;
	}
	return false;
}

/* Fence every block ready under stream key `key` with one event recorded on
 * `target`: they become pending until it completes. */
static int fence_key(struct arena *h, emm_stream_t key, emm_stream_t target)
{
	struct emm_fence *f;
	struct emm_block *b, *next;
	int r;

	if (!has_key(h, key))
		return 0;
	if (!h->has_fence) {
		for (b = collect_key(h, key); b; b = next) {
			next = b->link;
			block_ready(h, b, 0);
		}
		return 0;
	}
	if (f_capturing(h, target))
		return -EBUSY;
	f = fence_new(h);
	if (!f)
		return -ENOMEM;
	fence_reset(f);
	r = fence_reserve(f, 1);
	if (!r)
		r = h->fops.record(h->fops.ctx, target, &f->events[0]);
	if (r) {
		f->next = h->fence_free;
		h->fence_free = f;
		return r;
	}
	f->nevents = 1;
	h->st.events_recorded++;
	for (b = collect_key(h, key); b; b = next) {
		next = b->link;
		pending_add(h, f, b);
	}
	fence_enqueue(h, f);
	return 0;
}

/* The smallest stream key > after present in either tree, or 0 if none. */
static emm_stream_t next_key(struct arena *h, emm_stream_t after)
{
	emm_stream_t best = 0;

	if (after == UINT64_MAX)
		return 0;
	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		struct emm_tree_node *n = emm_tree_lower_bound(&h->trees[pool], after + 1, 0, 0);
		if (n && (best == 0 || n->key[0] < best))
			best = n->key[0];
	}
	return best;
}

/*
 * Steal a ready-stream block of another stream T for an allocation on S.
 * The block may be used on S only after T's work on it: record an event on
 * T (or on the legacy stream for blocking-class T) and make S wait for it on
 * the GPU; a synchronous allocation instead needs the event complete.
 */
static struct emm_block *try_steal(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream)
{
	struct emm_block *cand[STEAL_CANDIDATES];
	unsigned n = 0;
	struct emm_tree *t = &h->trees[pool];
	struct emm_tree_node *node = emm_tree_lower_bound(t, 1, 0, 0);

	while (node && n < STEAL_CANDIDATES) {
		emm_stream_t key = node->key[0];
		if (key != stream) {
			struct emm_block *c = find_fit(h, pool, key, rounded);
			if (c) {
				unsigned i = n++;
				while (i > 0 && cand[i - 1]->size > c->size) { /* keep sorted by size */
					cand[i] = cand[i - 1];
					i--;
				}
				cand[i] = c;
			}
		}
		if (key == UINT64_MAX)
			break;
		node = emm_tree_lower_bound(t, key + 1, 0, 0);
	}
	if (n == 0)
		return NULL;
	if (!h->has_fence)
		return cand[0];

	bool wait_on_gpu = stream != EMM_STREAM_SYNC && h->fops.stream_wait;
	if (stream != EMM_STREAM_SYNC && f_capturing(h, stream))
		return NULL;
	for (unsigned i = 0; i < n; i++) {
		emm_stream_t target = fence_target(h, cand[i]->stream);
		uint64_t ev;
		int r;

		if (f_capturing(h, target))
			continue;
		if (h->fops.record(h->fops.ctx, target, &ev))
			continue;
		h->st.events_recorded++;
		if (wait_on_gpu) {
			r = h->fops.stream_wait(h->fops.ctx, stream, ev);
			if (r == 0)
				h->st.stream_waits++;
		} else {
			r = h->fops.query(h->fops.ctx, ev);
			h->st.event_queries++;
		}
		h->fops.release(h->fops.ctx, ev);
		if (r == 0)
			return cand[i];
	}
	return NULL;
}

/* --- segments ------------------------------------------------------------- */

static void seg_link(struct arena *h, struct emm_segment *s)
{
	s->live = true;
	s->prev = NULL;
	s->next = h->segs;
	if (h->segs)
		h->segs->prev = s;
	h->segs = s;
}

static void seg_unlink(struct arena *h, struct emm_segment *s)
{
	if (s->prev)
		s->prev->next = s->next;
	else
		h->segs = s->next;
	if (s->next)
		s->next->prev = s->prev;
	s->prev = s->next = NULL;
	s->live = false;
}

static void seg_recycle(struct arena *h, struct emm_segment *s)
{
	s->first = NULL;
	s->next = h->seg_free;
	h->seg_free = s;
}

/*
 * Get a segment of seg_size from the source (lock dropped around the call)
 * and make its whole block ready-any. 0 and the block, or the source's
 * error (-ENOMEM: out of memory).
 */
static int grow(struct arena *h, unsigned pool, size_t seg_size, emm_stream_t stream, struct emm_block **ret)
{
	emm_addr_t addr = 0;
	int r;

	pthread_mutex_unlock(&h->lock);
	r = h->src.alloc(h->src.state, seg_size, stream, &addr);
	pthread_mutex_lock(&h->lock);
	if (r)
		return r < 0 ? r : -ENOMEM;

	struct emm_segment *s = segment_new(h);
	struct emm_block *b = s ? block_new(h) : NULL;
	if (b)
		r = emm_segmap_insert(addr, seg_size, s);
	if (!b || r) {
		if (r == -EEXIST)
			emm_error("segment source returned 0x%llx (+%zu), overlapping a known segment",
			          (unsigned long long)addr, seg_size);
		if (b)
			block_recycle(h, b);
		if (s)
			seg_recycle(h, s);
		pthread_mutex_unlock(&h->lock);
		h->src.free(h->src.state, addr, seg_size, EMM_STREAM_SYNC);
		pthread_mutex_lock(&h->lock);
		return -ENOMEM;
	}
	s->base = addr;
	s->size = seg_size;
	s->pool = (uint8_t)pool;
	s->first = b;
	seg_link(h, s);
	b->seg = s;
	b->pool = (uint8_t)pool;
	b->addr = addr;
	b->size = seg_size;
	h->st.backend_allocs++;
	h->st.segments++;
	stat_add(&h->st.reserved, &h->st.reserved_peak, &h->st.reserved_total, seg_size);
	heap_stat_add(&h->owner->reserved, &h->owner->reserved_peak, (int64_t)seg_size);
	*ret = block_ready(h, b, 0);
	return 0;
}

/* Take whole idle segments off the heap until at most `keep` idle bytes
 * (reserved - allocated) remain. Returns them chained through next; the
 * caller gives them back with release_finish once the lock is dropped. */
static struct emm_segment *release_collect(struct arena *h, size_t keep)
{
	struct emm_segment *list = NULL;

	while (h->idle_head && h->st.reserved - h->st.allocated > keep) {
		struct emm_segment *s = h->idle_head;
		struct emm_block *b = s->first;

		tree_take(h, b);
		block_recycle(h, b);
		seg_unlink(h, s);
		emm_segmap_remove(s->base);
		h->st.reserved -= s->size;
		heap_stat_add(&h->owner->reserved, &h->owner->reserved_peak, -(int64_t)s->size);
		h->st.segments--;
		s->first = NULL;
		s->next = list;
		list = s;
	}
	return list;
}

/* Called without the lock. Returns the bytes given back. */
static long long release_finish(struct arena *h, struct emm_segment *list)
{
	long long bytes = 0;
	uint64_t freed = 0;
	struct emm_segment *s, *next;

	if (!list)
		return 0;
	for (s = list; s; s = s->next) {
		int r = h->src.free(h->src.state, s->base, s->size, EMM_STREAM_SYNC);
		if (r) {
			emm_warn("segment source failed to free 0x%llx (+%zu): %d",
			         (unsigned long long)s->base, s->size, r);
			continue;
		}
		bytes += (long long)s->size;
		freed++;
	}
	pthread_mutex_lock(&h->lock);
	h->st.backend_frees += freed;
	for (s = list; s; s = next) {
		next = s->next;
		seg_recycle(h, s);
	}
	pthread_mutex_unlock(&h->lock);
	return bytes;
}

/*
 * Out of memory: close the open epoch, fence every ready-stream block,
 * synchronize every pending fence (host waits, lock dropped), then give all
 * idle segments back. Lock held on entry and on return.
 */
static void oom_recover(struct arena *h)
{
	struct emm_fence **held = NULL;
	uint64_t *events = NULL;
	size_t nheld = 0, nevents = 0;

	close_epoch(h);
	if (h->has_fence) {
		for (emm_stream_t key = next_key(h, 0); key; key = next_key(h, key))
			fence_key(h, key, fence_target(h, key));

		bool can_sync = h->fops.synchronize && !f_capturing(h, EMM_STREAM_SYNC);
		size_t nf = 0, ne = 0;
		for (struct emm_fence *f = h->fq_head; f; f = f->next) {
			if (!f->retired && !f->synced) {
				nf++;
				ne += f->nevents - f->done;
			}
		}
		if (can_sync && nf) {
			held = malloc(nf * sizeof(*held));
			events = malloc((ne ? ne : 1) * sizeof(*events));
		}
		if (held && events) {
			for (struct emm_fence *f = h->fq_head; f; f = f->next) {
				if (f->retired || f->synced)
					continue;
				f->holds++; /* its events stay alive while we wait */
				held[nheld++] = f;
				for (unsigned i = f->done; i < f->nevents; i++)
					events[nevents++] = f->events[i];
			}
			pthread_mutex_unlock(&h->lock);
			size_t failed = 0;
			for (size_t i = 0; i < nevents; i++)
				if (h->fops.synchronize(h->fops.ctx, events[i]))
					failed++;
			pthread_mutex_lock(&h->lock);
			h->st.host_waits += nevents;
			for (size_t i = 0; i < nheld; i++) {
				held[i]->holds--;
				if (!failed)
					held[i]->synced = true;
			}
		}
		free(held);
		free(events);
	}
	poll_fences(h);
	struct emm_segment *list = release_collect(h, 0);
	if (list) {
		pthread_mutex_unlock(&h->lock);
		release_finish(h, list);
		pthread_mutex_lock(&h->lock);
	}
}

/* The other arenas' idle memory goes back too (one arena locked at a time:
 * ours is dropped meanwhile). Lock held on entry and on return. */
static void oom_recover_others(struct arena *h)
{
	struct emm_heap *heap = h->owner;

	if (heap->narenas == 1)
		return;
	pthread_mutex_unlock(&h->lock);
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *a = heap->arenas[i];
		if (a == h)
			continue;
		pthread_mutex_lock(&a->lock);
		oom_recover(a);
		pthread_mutex_unlock(&a->lock);
	}
	pthread_mutex_lock(&h->lock);
}

/* --- allocate and free ---------------------------------------------------- */

static inline struct emm_block *find_block(struct arena *h, unsigned pool, size_t rounded,
                                           emm_stream_t stream)
{
	struct emm_block *b = NULL;

	if (stream != EMM_STREAM_SYNC)
		b = find_fit(h, pool, stream, rounded);
	if (!b)
		b = find_fit(h, pool, 0, rounded);
	return b;
}

/* The miss path: completed fences, epoch pressure, stealing, the source,
 * and the OOM retry. Lock held. */
static int alloc_slow(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream,
                      struct emm_block **ret)
{
	struct emm_block *b;
	int r;

	if (h->fq_head && poll_fences(h) && (b = find_block(h, pool, rounded, stream)))
		goto hit;

	/* Pressure: the open epoch holds a block that could serve this and has
	 * seen half its quota of frees. Half, not less: a loop of alloc/kernel/
	 * free then records one event per epoch_max_blocks/2 pairs (0.0625 at
	 * the default 32, measured on the H200), while the memory parked in an
	 * open epoch stays bounded by half the quota. */
	struct emm_fence *ep = h->open;
	if (ep->max_size[pool] >= rounded && ep->nblocks >= (h->p.epoch_max_blocks + 1) / 2 &&
	    close_epoch(h) == 0) {
		if ((b = find_block(h, pool, rounded, stream)))
			goto hit;
		if (h->fq_head && poll_fences(h) && (b = find_block(h, pool, rounded, stream)))
			goto hit;
	}

	if ((b = try_steal(h, pool, rounded, stream)))
		goto hit;

	size_t seg_size = emm_heap_segment_size(&h->p, rounded);
	if (!seg_size)
		return -EOVERFLOW;
	r = grow(h, pool, seg_size, stream, &b);
	if (r == -ENOMEM && h->p.oom_retry) {
		oom_recover(h);
		oom_recover_others(h);
		h->st.oom_retries++;
		if ((b = find_block(h, pool, rounded, stream)))
			goto hit;
		r = grow(h, pool, seg_size, stream, &b);
	}
	if (r) {
		if (r == -ENOMEM)
			h->st.ooms++;
		return r;
	}
	h->st.misses++;
	*ret = b;
	return 0;
hit:
	h->st.hits++;
	*ret = b;
	return 0;
}

static int arena_alloc(struct arena *h, unsigned pool, size_t rounded, size_t size, emm_stream_t stream,
                       emm_addr_t *ret_addr)
{
	struct emm_block *b;
	emm_addr_t addr;
	int r;

	pthread_mutex_lock(&h->lock);
	b = find_block(h, pool, rounded, stream);
	if (EMM_LIKELY(b)) {
		h->st.hits++;
	} else {
		r = alloc_slow(h, pool, rounded, stream, &b);
		if (r) {
			pthread_mutex_unlock(&h->lock);
			return r;
		}
	}
	take_block(h, b, rounded, size, stream);
	addr = b->addr;
	pthread_mutex_unlock(&h->lock);

	r = emm_blockmap_insert(addr, b);
	if (EMM_UNLIKELY(r)) {
		if (r == -EEXIST)
			emm_error("block 0x%llx already in the block map", (unsigned long long)addr);
		/* Never handed out, never used: ready again at once. */
		pthread_mutex_lock(&h->lock);
		untake_accounting(h, b);
		h->st.allocs--;
		h->st.frees--;
		block_ready(h, b, stream);
		pthread_mutex_unlock(&h->lock);
		return -ENOMEM;
	}
	*ret_addr = addr;
	return 0;
}

int emm_heap_alloc(emm_heap_t *heap, size_t size, emm_stream_t stream, emm_addr_t *ret_addr)
{
	const struct emm_heap_params *p;
	size_t rounded;
	unsigned pool;

	if (EMM_UNLIKELY(!heap || !ret_addr || size == 0))
		return -EINVAL;
	p = &heap->arenas[0]->p;
	if (EMM_LIKELY(p->roundup_divisions == 0 && size <= SIZE_MAX - (EMM_MIN_BLOCK - 1)))
		rounded = (size + (EMM_MIN_BLOCK - 1)) & ~(size_t)(EMM_MIN_BLOCK - 1);
	else
		rounded = emm_heap_round_size(p, size);
	if (EMM_UNLIKELY(!rounded))
		return -EOVERFLOW;
	pool = rounded <= p->small_max ? POOL_SMALL : POOL_LARGE;
	return arena_alloc(pool == POOL_SMALL ? thread_arena(heap) : heap->arenas[0], pool, rounded, size,
	                   stream, ret_addr);
}

int emm_heap_free(emm_addr_t addr, emm_stream_t stream, size_t *ret_requested)
{
	struct emm_block *b = emm_blockmap_take(addr);
	struct emm_segment *release = NULL;
	struct arena *h;
	size_t requested;
	int strict = 0;

	if (EMM_UNLIKELY(!b))
		return emm_segmap_find(addr, NULL, NULL, NULL) == 0 ? -EINVAL : -ENOENT;
	h = b->seg->arena;

	if (stream == EMM_STREAM_SYNC && h->p.free_mode == EMM_FREE_MODE_STRICT && h->has_fence &&
	    h->fops.device_synchronize) {
		/* Like the real cuMemFree: wait for the device, lock not held. */
		strict = h->fops.device_synchronize(h->fops.ctx) == 0 ? 1 : -1;
	}

	pthread_mutex_lock(&h->lock);
	requested = b->requested;
	untake_accounting(h, b);
	if (stream != EMM_STREAM_SYNC) {
		block_ready(h, b, stream);
	} else if (!h->has_fence || h->p.free_mode == EMM_FREE_MODE_STREAM) {
		block_ready(h, b, 0);
	} else if (strict) {
		h->st.host_waits++;
		if (strict > 0)
			block_ready(h, b, 0);
		else
			pending_add(h, h->open, b); /* the wait failed: fence it instead */
	} else {
		struct emm_fence *ep = h->open;
		pending_add(h, ep, b);
		if (ep->nblocks >= h->p.epoch_max_blocks || ep->bytes >= h->p.epoch_max_bytes)
			close_epoch(h);
	}
	/* The threshold applies per arena. */
	if (EMM_UNLIKELY(h->p.release_threshold != SIZE_MAX && h->idle_head &&
	                 h->st.reserved - h->st.allocated > h->p.release_threshold))
		release = release_collect(h, h->p.release_threshold);
	pthread_mutex_unlock(&h->lock);

	if (EMM_UNLIKELY(release))
		release_finish(h, release);
	if (ret_requested)
		*ret_requested = requested;
	return 0;
}

int emm_heap_find_block(emm_addr_t addr, struct emm_block_range *ret)
{
	uint64_t base;
	size_t size;
	void *value;

	if (!ret || emm_segmap_find(addr, &base, &size, &value))
		return -ENOENT;
	struct emm_segment *s = value;
	struct arena *h = s->arena;
	int r = -ENOENT;

	pthread_mutex_lock(&h->lock);
	if (s->live && addr >= s->base && addr - s->base < s->size) {
		/* Exact start: one map lookup; interior: walk the segment. */
		struct emm_block *b = emm_blockmap_get(addr);
		if (!b || b->seg != s || b->state != BLOCK_LIVE || b->addr != addr) {
			for (b = s->first; b && addr - b->addr >= b->size; b = b->next)
				;
		}
		if (b && b->state == BLOCK_LIVE) {
			ret->base = b->addr;
			ret->size = b->size;
			ret->requested = b->requested;
			ret->segment_base = s->base;
			ret->segment_size = s->size;
			ret->heap = h->owner;
			r = 0;
		}
	}
	pthread_mutex_unlock(&h->lock);
	return r;
}

/* --- lifecycle ------------------------------------------------------------ */

static void drop_fence_struct(struct emm_fence *f)
{
	free(f->events);
	free(f);
}

static struct arena *arena_create(struct emm_heap *owner, const struct emm_heap_params *params,
                                  const struct emm_segment_source *src, const struct emm_fence_ops *fence)
{
	struct arena *h = calloc(1, sizeof(*h));
	if (!h)
		return NULL;
	if (pthread_mutex_init(&h->lock, NULL)) {
		free(h);
		return NULL;
	}
	h->owner = owner;
	h->p = *params;
	if (h->p.epoch_max_blocks == 0)
		h->p.epoch_max_blocks = 1;
	h->src = *src;
	if (fence) {
		h->fops = *fence;
		h->has_fence = true;
	}
	for (unsigned i = 0; i < NPOOLS; i++)
		emm_tree_init(&h->trees[i]);
	h->open = fence_new(h);
	if (!h->open) {
		pthread_mutex_destroy(&h->lock);
		free(h);
		return NULL;
	}
	fence_reset(h->open);
	return h;
}

static void arena_destroy(struct arena *h, bool release_segments)
{
	/* No other thread may use the heap any more, so nothing here takes the
	 * lock, and the waits below are never under it. */
	if (release_segments && h->has_fence) {
		/* Wait for every pending fence before the memory goes back. */
		if (close_epoch(h) != 0 && h->open->nblocks && h->fops.device_synchronize) {
			h->fops.device_synchronize(h->fops.ctx); /* could not close (capture) */
			h->st.host_waits++;
		}
		for (struct emm_fence *f = h->fq_head; f; f = f->next) {
			if (f->retired || f->synced || !h->fops.synchronize)
				continue;
			for (unsigned i = f->done; i < f->nevents; i++) {
				h->fops.synchronize(h->fops.ctx, f->events[i]);
				h->st.host_waits++;
			}
		}
		for (struct emm_fence *f = h->fq_head, *fnext; f; f = fnext) {
			fnext = f->next;
			fence_recycle(h, f);
		}
		h->fq_head = h->fq_tail = NULL;
		if (h->has_last_fence && !h->last_fence_owner)
			h->fops.release(h->fops.ctx, h->last_fence);
		h->has_last_fence = false;
	}

	/* Forget every address; give segments back if asked. */
	struct emm_segment *s, *next;
	for (s = h->segs; s; s = next) {
		next = s->next;
		for (struct emm_block *b = s->first; b; b = b->next)
			if (b->state == BLOCK_LIVE && emm_blockmap_get(b->addr) == b)
				emm_blockmap_take(b->addr);
		emm_segmap_remove(s->base);
		if (release_segments) {
			if (h->src.free(h->src.state, s->base, s->size, EMM_STREAM_SYNC) == 0)
				h->st.backend_frees++;
		}
	}

	for (s = h->seg_all; s; s = next) {
		next = s->all_next;
		free(s);
	}
	for (struct emm_fence *f = h->fence_free, *fnext; f; f = fnext) {
		fnext = f->next;
		drop_fence_struct(f);
	}
	if (!release_segments) {
		for (struct emm_fence *f = h->fq_head, *fnext; f; f = fnext) {
			fnext = f->next;
			drop_fence_struct(f);
		}
	}
	drop_fence_struct(h->open);
	for (void *slab = h->slabs, *snext; slab; slab = snext) {
		snext = *(void **)slab;
		free(slab);
	}
	free(h->nb);
	pthread_mutex_destroy(&h->lock);
	free(h);
}

int emm_heap_create(const struct emm_heap_params *params, const struct emm_segment_source *src,
                    const struct emm_fence_ops *fence, int device, emm_heap_t **ret_heap)
{
	if (!params || !src || !src->alloc || !src->free || !ret_heap)
		return -EINVAL;
	if (params->small_segment == 0 || params->small_segment % EMM_MIN_BLOCK ||
	    params->large_segment == 0 || params->large_segment % EMM_MIN_BLOCK || params->large_round == 0 ||
	    params->large_round % EMM_MIN_BLOCK || params->max_nosplit_slack == 0)
		return -EINVAL;
	if (fence && (!fence->record || !fence->query || !fence->release))
		return -EINVAL;

	struct emm_heap *heap = calloc(1, sizeof(*heap));
	if (!heap)
		return -ENOMEM;
	unsigned n = params->arenas;
	if (n == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		n = cpus > 0 ? (unsigned)cpus : 1;
	}
	if (n > MAX_ARENAS)
		n = MAX_ARENAS;
	heap->narenas = 1;
	while (heap->narenas * 2 <= n)
		heap->narenas *= 2;
	heap->device = device;
	for (unsigned i = 0; i < heap->narenas; i++) {
		heap->arenas[i] = arena_create(heap, params, src, fence);
		if (!heap->arenas[i]) {
			while (i-- > 0)
				arena_destroy(heap->arenas[i], false);
			free(heap);
			return -ENOMEM;
		}
	}
	*ret_heap = heap;
	return 0;
}

void emm_heap_destroy(emm_heap_t *heap, bool release_segments)
{
	if (!heap)
		return;
	for (unsigned i = 0; i < heap->narenas; i++)
		arena_destroy(heap->arenas[i], release_segments);
	free(heap);
}

void emm_heap_stream_created(emm_heap_t *heap, emm_stream_t stream, bool nonblocking)
{
	if (!heap || !nonblocking || stream == EMM_STREAM_SYNC)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		if (!is_nonblocking(h, stream)) {
			if (h->nb_count == h->nb_cap) {
				unsigned cap = h->nb_cap ? h->nb_cap * 2 : 8;
				emm_stream_t *nb = realloc(h->nb, cap * sizeof(*nb));
				if (!nb) {
					/* Treated as blocking-class: only its own frees
					 * are then fenced by it. Report, do not fail. */
					pthread_mutex_unlock(&h->lock);
					emm_error("out of memory tracking non-blocking stream 0x%llx",
					          (unsigned long long)stream);
					continue;
				}
				h->nb = nb;
				h->nb_cap = cap;
			}
			h->nb[h->nb_count++] = stream;
			/* Blocks of fast-path epochs are ready-any although only
			 * the legacy event orders them: a new non-blocking stream
			 * must wait on it. Done here, under the lock, so no epoch
			 * can close between the wait and the announcement. */
			if (h->has_last_fence && h->fops.stream_wait &&
			    h->fops.stream_wait(h->fops.ctx, stream, h->last_fence) == 0)
				h->st.stream_waits++;
		}
		pthread_mutex_unlock(&h->lock);
	}
}

void emm_heap_stream_destroyed(emm_heap_t *heap, emm_stream_t stream)
{
	if (!heap || stream == EMM_STREAM_SYNC)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		for (unsigned j = 0; j < h->nb_count; j++) {
			if (h->nb[j] == stream) {
				h->nb[j] = h->nb[--h->nb_count];
				break;
			}
		}
		if (fence_key(h, stream, stream)) {
			/* Nothing can be recorded: ready-any (heap.h). */
			struct emm_block *b, *next;
			for (b = collect_key(h, stream); b; b = next) {
				next = b->link;
				block_ready(h, b, 0);
			}
		}
		pthread_mutex_unlock(&h->lock);
	}
}

int emm_heap_flush(emm_heap_t *heap)
{
	int r = 0;

	if (!heap)
		return -EINVAL;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		int ri = close_epoch(h);
		poll_fences(h);
		pthread_mutex_unlock(&h->lock);
		if (ri && !r)
			r = ri;
	}
	return r;
}

int emm_heap_last_fence(emm_heap_t *heap, uint64_t *ret_event)
{
	if (!heap || !ret_event)
		return -EINVAL;
	/* The calling thread's arena first: the one its frees close. */
	unsigned first = thread_slot() & (heap->narenas - 1);
	for (unsigned k = 0; k < heap->narenas; k++) {
		struct arena *h = heap->arenas[(first + k) & (heap->narenas - 1)];
		int r = -ENOENT;
		pthread_mutex_lock(&h->lock);
		if (h->has_last_fence) {
			*ret_event = h->last_fence;
			r = 0;
		}
		pthread_mutex_unlock(&h->lock);
		if (r == 0)
			return 0;
	}
	return -ENOENT;
}

long long emm_heap_release_idle(emm_heap_t *heap, size_t keep)
{
	size_t idle[MAX_ARENAS];
	long long total = 0;

	if (!heap)
		return -EINVAL;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		close_epoch(h);
		poll_fences(h);
		idle[i] = h->st.reserved - h->st.allocated;
		pthread_mutex_unlock(&h->lock);
	}
	/* `keep` is for the whole heap: spend it on the arenas in order. */
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		size_t k = idle[i] < keep ? idle[i] : keep;
		keep -= k;
		pthread_mutex_lock(&h->lock);
		struct emm_segment *list = release_collect(h, k);
		pthread_mutex_unlock(&h->lock);
		total += release_finish(h, list);
	}
	return total;
}

void emm_heap_add_stats(emm_heap_t *heap, struct emm_stats *out)
{
	if (!heap || !out)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		const struct heap_counters *c = &h->st;
		out->allocs += c->allocs;
		out->frees += c->frees;
		out->hits += c->hits;
		out->misses += c->misses;
		out->backend_allocs += c->backend_allocs;
		out->backend_frees += c->backend_frees;
		out->oom_retries += c->oom_retries;
		out->ooms += c->ooms;
		out->splits += c->splits;
		out->merges += c->merges;
		out->events_recorded += c->events_recorded;
		out->event_queries += c->event_queries;
		out->stream_waits += c->stream_waits;
		out->host_waits += c->host_waits;
		out->epochs_closed += c->epochs_closed;
		out->allocated_bytes += c->allocated;
		out->allocated_bytes_total += c->allocated_total;
		out->requested_bytes += c->requested;
		out->requested_bytes_total += c->requested_total;
		out->reserved_bytes += c->reserved;
		out->reserved_bytes_total += c->reserved_total;
		if (heap->narenas == 1) {
			out->allocated_bytes_peak += c->allocated_peak;
			out->requested_bytes_peak += c->requested_peak;
		} else {
			stat_flush(h);
		}
		out->pending_bytes += c->pending;
		out->segments += c->segments;
		out->live_blocks += c->live_blocks;
		pthread_mutex_unlock(&h->lock);
	}
	out->reserved_bytes_peak +=
	    (uint64_t)atomic_load_explicit(&heap->reserved_peak, memory_order_relaxed);
	if (heap->narenas > 1) {
		out->allocated_bytes_peak +=
		    (uint64_t)atomic_load_explicit(&heap->allocated_peak, memory_order_relaxed);
		out->requested_bytes_peak +=
		    (uint64_t)atomic_load_explicit(&heap->requested_peak, memory_order_relaxed);
	}
}

void emm_heap_idle_info(emm_heap_t *heap, size_t *ret_idle, size_t *ret_largest)
{
	size_t largest = 0, idle = 0;

	for (unsigned i = 0; heap && i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		idle += h->st.reserved - h->st.allocated;
		/* The largest block of each key group is the one before the next
		 * group's first. */
		for (unsigned pool = 0; pool < NPOOLS; pool++) {
			const struct emm_tree *t = &h->trees[pool];
			struct emm_tree_node *n = emm_tree_first(t);
			while (n) {
				emm_stream_t key = n->key[0];
				struct emm_tree_node *nx =
				    key == UINT64_MAX ? NULL : emm_tree_lower_bound(t, key + 1, 0, 0);
				struct emm_tree_node *last = nx ? emm_tree_prev(nx) : emm_tree_last(t);
				if (last->key[1] > largest)
					largest = last->key[1];
				n = nx;
			}
		}
		pthread_mutex_unlock(&h->lock);
	}
	if (ret_idle)
		*ret_idle = idle;
	if (ret_largest)
		*ret_largest = largest;
}

int emm_heap_device(const emm_heap_t *heap)
{
	return heap->device;
}

/* --- invariants ----------------------------------------------------------- */

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (EMM_UNLIKELY(!(cond))) {                                                                 \
			emm_error("heap check: " __VA_ARGS__);                                               \
			return -EFAULT;                                                                      \
		}                                                                                            \
	} while (0)

static int check_locked(struct arena *h)
{
	uint64_t allocated = 0, requested = 0, pending = 0, reserved = 0, live = 0, segments = 0;
	size_t ready[NPOOLS] = {0, 0}, npending = 0, nidle = 0;

	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		const char *why = "";
		CHECK(emm_tree_check(&h->trees[pool], &why) >= 0, "pool %u tree: %s", pool, why);
	}

	for (struct emm_segment *s = h->segs; s; s = s->next) {
		uint64_t base = 0;
		size_t size = 0;
		void *value = NULL;
		struct emm_block *prev = NULL;
		emm_addr_t expect = s->base;
		size_t nblocks = 0;

		CHECK(s->live && s->arena == h, "segment 0x%llx not live or of another arena",
		      (unsigned long long)s->base);
		CHECK(s->pool == POOL_SMALL || h == h->owner->arenas[0],
		      "large-pool segment 0x%llx outside arena 0", (unsigned long long)s->base);
		CHECK(s->next == NULL || s->next->prev == s, "segment list links disagree at 0x%llx",
		      (unsigned long long)s->base);
		CHECK(emm_segmap_find(s->base, &base, &size, &value) == 0 && base == s->base &&
		          size == s->size && value == s,
		      "segment 0x%llx (+%zu) missing from the segment map", (unsigned long long)s->base,
		      s->size);
		CHECK(s->first && s->first->prev == NULL, "segment 0x%llx: bad first block",
		      (unsigned long long)s->base);
		for (struct emm_block *b = s->first; b; b = b->next) {
			nblocks++;
			CHECK(b->seg == s, "block 0x%llx: wrong segment", (unsigned long long)b->addr);
			CHECK(b->prev == prev, "block 0x%llx: prev link disagrees",
			      (unsigned long long)b->addr);
			CHECK(b->addr == expect,
			      "block at 0x%llx, expected 0x%llx: blocks do not tile the segment",
			      (unsigned long long)b->addr, (unsigned long long)expect);
			CHECK(b->size > 0 && b->size % EMM_MIN_BLOCK == 0,
			      "block 0x%llx: size %zu not a multiple of %u", (unsigned long long)b->addr,
			      b->size, EMM_MIN_BLOCK);
			CHECK(b->size <= s->base + s->size - b->addr,
			      "block 0x%llx (+%zu) runs past its segment", (unsigned long long)b->addr,
			      b->size);
			CHECK(b->pool == s->pool, "block 0x%llx: pool disagrees with segment",
			      (unsigned long long)b->addr);
			switch (b->state) {
			case BLOCK_LIVE:
				CHECK(!emm_tree_node_linked(&b->node), "live block 0x%llx in a tree",
				      (unsigned long long)b->addr);
				CHECK(b->requested <= b->size, "live block 0x%llx: requested %zu > size %zu",
				      (unsigned long long)b->addr, b->requested, b->size);
				allocated += b->size;
				requested += b->requested;
				live++;
				break;
			case BLOCK_READY:
				CHECK(emm_tree_node_linked(&b->node) &&
				          emm_tree_find(&h->trees[b->pool], b->stream, b->size, b->addr) ==
				              &b->node,
				      "ready block 0x%llx (+%zu, key 0x%llx) not in its pool's tree",
				      (unsigned long long)b->addr, b->size, (unsigned long long)b->stream);
				CHECK(!(prev && prev->state == BLOCK_READY && prev->stream == b->stream),
				      "adjacent mergeable free blocks at 0x%llx and 0x%llx",
				      (unsigned long long)prev->addr, (unsigned long long)b->addr);
				ready[b->pool]++;
				break;
			case BLOCK_PENDING:
				CHECK(!emm_tree_node_linked(&b->node), "pending block 0x%llx in a tree",
				      (unsigned long long)b->addr);
				CHECK(b->fence != NULL, "pending block 0x%llx without a fence",
				      (unsigned long long)b->addr);
				pending += b->size;
				npending++;
				break;
			default:
				CHECK(0, "block 0x%llx in state %u", (unsigned long long)b->addr, b->state);
			}
			expect = b->addr + b->size;
			prev = b;
		}
		CHECK(expect == s->base + s->size, "segment 0x%llx: blocks end at 0x%llx, segment at 0x%llx",
		      (unsigned long long)s->base, (unsigned long long)expect,
		      (unsigned long long)(s->base + s->size));
		bool whole_any = nblocks == 1 && s->first->state == BLOCK_READY && s->first->stream == 0;
		CHECK(s->idle == whole_any, "segment 0x%llx: idle flag %d, whole ready-any %d",
		      (unsigned long long)s->base, s->idle, whole_any);
		reserved += s->size;
		segments++;
	}

	for (unsigned pool = 0; pool < NPOOLS; pool++)
		CHECK(h->trees[pool].count == ready[pool],
		      "pool %u tree holds %zu blocks, %zu ready blocks found", pool, h->trees[pool].count,
		      ready[pool]);

	/* Fences: the open epoch, then the closed FIFO. */
	size_t listed = 0;
	for (struct emm_fence *f = h->open; f; f = f == h->open ? h->fq_head : f->next) {
		size_t n = 0, bytes = 0;
		for (struct emm_block *b = f->blocks; b; b = b->link) {
			CHECK(b->state == BLOCK_PENDING && b->fence == f,
			      "fence list holds block 0x%llx in state %u", (unsigned long long)b->addr,
			      b->state);
			CHECK(b->seg && b->seg->live, "fence holds block 0x%llx of a dead segment",
			      (unsigned long long)b->addr);
			n++;
			bytes += b->size;
		}
		CHECK(n == f->nblocks && bytes == f->bytes, "fence counts %u blocks/%zu bytes, lists %zu/%zu",
		      f->nblocks, f->bytes, n, bytes);
		CHECK(!f->retired || n == 0, "retired fence still holds blocks");
		CHECK(f == h->open || f->done <= f->nevents, "fence event index past its events");
		if (f->next == NULL && f != h->open)
			CHECK(h->fq_tail == f, "fence FIFO tail disagrees");
		listed += n;
	}
	CHECK(listed == npending, "%zu pending blocks, %zu on fence lists", npending, listed);

	for (struct emm_segment *s = h->idle_head; s; s = s->idle_next) {
		CHECK(s->idle && s->live, "idle list holds a segment not idle");
		CHECK(s->idle_next == NULL || s->idle_next->idle_prev == s, "idle list links disagree");
		nidle++;
	}
	for (struct emm_segment *s = h->segs; s; s = s->next)
		if (s->idle)
			nidle--;
	CHECK(nidle == 0, "idle list and idle flags disagree");

	CHECK(allocated == h->st.allocated, "allocated bytes %llu, counter %llu",
	      (unsigned long long)allocated, (unsigned long long)h->st.allocated);
	CHECK(requested == h->st.requested, "requested bytes %llu, counter %llu",
	      (unsigned long long)requested, (unsigned long long)h->st.requested);
	CHECK(pending == h->st.pending, "pending bytes %llu, counter %llu", (unsigned long long)pending,
	      (unsigned long long)h->st.pending);
	CHECK(reserved == h->st.reserved, "reserved bytes %llu, counter %llu", (unsigned long long)reserved,
	      (unsigned long long)h->st.reserved);
	CHECK(live == h->st.live_blocks, "live blocks %llu, counter %llu", (unsigned long long)live,
	      (unsigned long long)h->st.live_blocks);
	CHECK(segments == h->st.segments, "segments %llu, counter %llu", (unsigned long long)segments,
	      (unsigned long long)h->st.segments);
	return 0;
}

int emm_heap_check(emm_heap_t *heap)
{
	int r = 0;

	if (!heap)
		return -EINVAL;
	for (unsigned i = 0; i < heap->narenas && r == 0; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		r = check_locked(h);
		pthread_mutex_unlock(&h->lock);
	}
	return r;
}
