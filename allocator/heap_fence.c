/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_fence.c - fences and epochs of one arena: fence structs,
 * the garbage they leave (events released and structs recycled with the
 * lock dropped), closing the open epoch of synchronous frees, fencing a
 * stream key's ready blocks, and the orphans of destroyed streams (polling
 * the closed fences is heap_fence_poll.c's). Every function here expects
 * the arena lock held; those that call fence ops drop it around them
 * (heap_internal.h: lock order).
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

/* --- fence structs -------------------------------------------------------- */

struct emm_fence *emm_heap_fence_new(struct arena *h)
{
	struct emm_fence *f = h->fence_free;

	if (!f) /* structs recycled by garbage release, without the lock */
		f = atomic_exchange_explicit(&h->fence_returned, NULL, memory_order_acquire);
	if (f) {
		h->fence_free = f->next;
	} else {
		f = heap_zalloc_lines(sizeof(*f));
		if (!f)
			return NULL;
	}
	f->next = NULL;
	return f;
}

/* Room for n events and their target streams. */
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
	emm_stream_t *tg = realloc(f->targets, cap * sizeof(*tg));
	if (!tg)
		return -ENOMEM;
	f->targets = tg;
	f->cap = cap;
	return 0;
}

void emm_heap_fence_reset(struct emm_fence *f)
{
	f->blocks = NULL;
	f->bytes = 0;
	f->nblocks = 0;
	f->max_size[0] = f->max_size[1] = 0;
	f->nevents = f->done = 0;
	f->rel_from = 0;
	f->holds = 0;
	f->synced = f->retired = f->keep_legacy = false;
}

/* A fence with no events left to release back on the recycle list. */
static void fence_put(struct arena *h, struct emm_fence *f)
{
	emm_heap_fence_reset(f);
	f->next = h->fence_free;
	h->fence_free = f;
}

/* A finished fence: its events (all but a shared last fence) become
 * garbage, released once the lock drops; then the struct is recycled. */
void emm_heap_fence_recycle(struct arena *h, struct emm_fence *f)
{
	f->rel_from = 0;
	if (f->keep_legacy) {
		h->last_fence_owner = NULL; /* the heap owns it alone now */
		f->keep_legacy = false;
		f->rel_from = 1;
	}
	if (f->rel_from >= f->nevents) {
		fence_put(h, f);
		return;
	}
	f->next = h->dead;
	h->dead = f;
	h->has_garbage = true;
}

static void garbage_lone(struct arena *h, uint64_t ev)
{
	h->lone[h->nlone++] = ev;
	h->has_garbage = true;
}

void emm_heap_garbage_take(struct arena *h, struct fgarbage *g)
{
	g->dead = h->dead;
	g->nlone = h->nlone;
	for (unsigned i = 0; i < h->nlone; i++)
		g->lone[i] = h->lone[i];
	h->dead = NULL;
	h->nlone = 0;
	h->has_garbage = false;
}

static void fence_return(struct arena *h, struct emm_fence *f)
{
	emm_heap_fence_reset(f);
	f->next = atomic_load_explicit(&h->fence_returned, memory_order_relaxed);
	while (!atomic_compare_exchange_weak_explicit(&h->fence_returned, &f->next, f, memory_order_release,
	                                              memory_order_relaxed))
		;
}

/* Lock not held. */
void emm_heap_garbage_release(struct arena *h, struct fgarbage *g)
{
	struct emm_fence *f, *next;

	for (unsigned i = 0; i < g->nlone; i++)
		fop_release(h, g->lone[i]);
	for (f = g->dead; f; f = next) {
		next = f->next;
		for (unsigned i = f->rel_from; i < f->nevents; i++)
			fop_release(h, f->events[i]);
		fence_return(h, f);
	}
}

void emm_heap_garbage_drop(struct arena *h, bool call_ops)
{
	struct fgarbage g;

	emm_heap_garbage_take(h, &g);
	if (!call_ops) {
		g.nlone = 0;
		for (struct emm_fence *f = g.dead; f; f = f->next)
			f->rel_from = f->nevents;
	}
	emm_heap_garbage_release(h, &g);
}

/* Every block of a completed fence becomes ready-any. */
void fence_release_blocks(struct arena *h, struct emm_fence *f)
{
	h->st.pending -= f->bytes;
	emm_pool_ready_list(h, f->blocks);
	f->blocks = NULL;
	f->nblocks = 0;
	f->bytes = 0;
	f->max_size[0] = f->max_size[1] = 0;
}

void emm_heap_fence_move(struct arena *h, struct emm_fence *from, struct emm_fence *to)
{
	struct emm_block *b = from->blocks, *next;

	for (; b; b = next) {
		next = b->link;
		h->st.pending -= b->size;
		pending_add(h, to, b);
	}
	from->blocks = NULL;
	from->nblocks = 0;
	from->bytes = 0;
	from->max_size[0] = from->max_size[1] = 0;
}

static void busy_add(struct arena *h, struct emm_fence *f)
{
	f->next = h->busy;
	h->busy = f;
}

static void busy_del(struct arena *h, struct emm_fence *f)
{
	struct emm_fence **pp = &h->busy;

	while (*pp != f)
		pp = &(*pp)->next;
	*pp = f->next;
	f->next = NULL;
}

/* --- fences --------------------------------------------------------------- */

bool emm_heap_is_nonblocking(const struct arena *h, emm_stream_t s)
{
	for (unsigned i = 0; i < h->nb_count; i++)
		if (h->nb[i] == s)
			return true;
	return false;
}

bool emm_heap_nb_remove(struct arena *h, emm_stream_t s)
{
	for (unsigned j = 0; j < h->nb_count; j++) {
		if (h->nb[j] == s) {
			h->nb[j] = h->nb[--h->nb_count];
			return true;
		}
	}
	return false;
}

/* The stream an event must be recorded on to order work of stream key s:
 * the legacy stream is a barrier for blocking and per-thread streams. */
emm_stream_t emm_heap_fence_target(const struct arena *h, emm_stream_t s)
{
	return emm_heap_is_nonblocking(h, s) ? s : EMM_STREAM_LEGACY;
}

/* May the last fence be replaced now? Not while a thread waits on it with
 * the lock dropped, nor when its release would find no room. */
static bool can_set_last_fence(const struct arena *h)
{
	return h->lf_users == 0 && (!h->has_last_fence || h->last_fence_owner || h->nlone < LONE_MAX);
}

static void set_last_fence(struct arena *h, uint64_t ev, struct emm_fence *owner)
{
	if (h->has_last_fence) {
		if (h->last_fence_owner)
			h->last_fence_owner->keep_legacy = false; /* its fence releases it */
		else
			garbage_lone(h, h->last_fence);
	}
	h->last_fence = ev;
	h->has_last_fence = true;
	h->lf_gen++;
	h->lf_done = false;
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
 * non-blocking stream that is still busy. Blocking-class orphans join it
 * (the legacy event orders their destroyed stream's earlier work). Under
 * the lock the epoch is swapped for a new open one and parked on the busy
 * list (its blocks stay pending); the queries and records run with the lock
 * dropped; then it is published. 0 (closed, or nothing to close), -EBUSY (a
 * capture forbids recording: the epoch stays open), or another negative
 * errno.
 *
 * Idle non-blocking streams: each is asked first (stream_idle, one
 * cuStreamQuery); one whose work has all completed gets no event, since
 * everything enqueued on it before the epoch's frees is done already (the
 * question is asked after them). Only a stream that is busy, or that cannot
 * be asked, gets one. The legacy event is always recorded: a query of the
 * legacy stream does not cover the blocking and per-thread streams it
 * orders, and libemm cannot name them all. An idle stream skipped here
 * would still run later work on reused blocks unordered after
 * blocking-stream work that used them; so when every live non-blocking
 * stream is idle, each is made to wait for the legacy event (stream_wait:
 * cuStreamWaitEvent, no host wait), and the blocks are ready at once as
 * with none alive (the fast path below). Work enqueued on such a stream
 * between its query and its wait came after the frees, so it does not use
 * the blocks. Any busy stream, or a wait that fails, leaves the fence to
 * complete on the device as before.
 */
static int close_fence(struct arena *h, struct emm_fence *ep, bool own, struct emm_block **ret_ready);

int emm_heap_close_epoch(struct arena *h)
{
	return close_fence(h, h->open, false, NULL);
}

/* A thread cache's epoch (heap_tcache.c): `list` (linked through link,
 * accounted as freed) becomes a fence of its own; see heap_internal.h. */
int emm_heap_close_blocks(struct arena *h, struct emm_block *list, struct emm_block **ret_ready)
{
	struct emm_fence *ep = emm_heap_fence_new(h);
	struct emm_block *next;
	int r;

	*ret_ready = NULL;
	if (!ep) {
		/* No memory for a fence: the shared open epoch takes them. */
		for (; list; list = next) {
			next = list->link;
			pending_add(h, h->open, list);
		}
		return -ENOMEM;
	}
	emm_heap_fence_reset(ep);
	for (; list; list = next) {
		next = list->link;
		pending_add(h, ep, list);
	}
	/* The shared open epoch joins: one event for both. */
	emm_heap_fence_move(h, h->open, ep);
	r = close_fence(h, ep, true, ret_ready);
	if (r) {
		/* Not closed (capture, failed record): they wait in the open epoch. */
		emm_heap_fence_move(h, ep, h->open);
		fence_put(h, ep);
	}
	return r;
}

/* Close fence ep: the open epoch (own false: a new open one replaces it) or
 * a thread cache's own fence (own true: stays the caller's on failure).
 * With ret_ready, the fast path hands the blocks back through link
 * (state BLOCK_LIVE with tcached set: no longer pending) instead of making
 * them ready. */
static int close_fence(struct arena *h, struct emm_fence *ep, bool own, struct emm_block **ret_ready)
{
	struct emm_fence *next_open = NULL;
	unsigned n, m, gen, lfg, phase, i;
	int r = 0;

	if (ep->nblocks == 0 && h->orphans[0]->nblocks == 0)
		return own ? -ENOENT : 0;
	if (!h->has_fence) {
		if (own)
			return -EINVAL;
		h->st.epochs_closed++;
		fence_release_blocks(h, ep);
		return 0;
	}
	if (EMM_UNLIKELY(h->order_lost)) {
		/* Some stream's work was not carried (emm_heap_order_lost): no
		 * event proves it done. The blocks join the orphans, which a
		 * device synchronize resolves: here, once, as the real cuMemFree
		 * would wait, unless a capture forbids it (then at its end). */
		emm_heap_fence_move(h, h->orphans[0], h->orphans[1]);
		emm_heap_fence_move(h, ep, h->orphans[1]);
		if (own)
			fence_put(h, ep);
		if (!f_capturing(h, EMM_STREAM_SYNC))
			(void)emm_heap_resolve_orphans(h);
		return 0;
	}
	if (f_capturing(h, EMM_STREAM_SYNC))
		return -EBUSY;
	for (i = 0; i < h->nb_count; i++)
		if (f_capturing(h, h->nb[i]))
			return -EBUSY;
	n = 1 + h->nb_count;
	if (!own) {
		next_open = emm_heap_fence_new(h);
		if (!next_open)
			return -ENOMEM;
	}
	r = fence_reserve(ep, n);
	if (r) {
		if (next_open)
			fence_put(h, next_open);
		return r;
	}
	ep->targets[0] = EMM_STREAM_LEGACY;
	for (i = 0; i < h->nb_count; i++)
		ep->targets[1 + i] = h->nb[i];
	emm_heap_fence_move(h, h->orphans[0], ep);
	gen = h->nb_gen;
	lfg = h->lf_gen;
	emm_stream_t carrier = h->carrier;
	unsigned cgen = h->carrier_gen;
	bool carrier_idle = false;
	if (!own) {
		emm_heap_fence_reset(next_open);
		h->open = next_open;
	}
	busy_add(h, ep);
	phase = emm_heap_inflight_enter(h);
	arena_unlock_release(h);

	/* The in-flight count keeps every stream named here alive (a destroy
	 * waits for it: emm_heap_stream_destroyed). */
	m = 0;
	unsigned nidle = 0;
	for (i = 0; i < n && !r; i++) {
		if (i > 0 && fop_stream_idle(h, ep->targets[i]) == 0) {
			carrier_idle |= ep->targets[i] == carrier;
			ep->targets[1 + nidle++] = ep->targets[i]; /* i >= 1 + nidle */
			continue;
		}
		r = fop_record(h, ep->targets[i], &ep->events[m]);
		m += r == 0;
	}
	/* Every non-blocking stream idle: each waits for the legacy event
	 * from now on, and the blocks are as reusable as with none alive. */
	bool waited = !r && nidle == n - 1;
	unsigned nwaits = 0;
	for (i = 0; i < nidle && waited; i++)
		nwaits += waited = fop_stream_wait(h, ep->targets[1 + i], ep->events[0]) == 0;
	if (r)
		for (unsigned j = 0; j < m; j++)
			fop_release(h, ep->events[j]);

	arena_lock(h);
	busy_del(h, ep);
	emm_heap_inflight_leave(h, phase);
	/* The carrier idle: the work it waited for is done, and it joined
	 * no more since (carrier_gen): it leaves until it carries again. */
	if (carrier_idle && cgen == h->carrier_gen)
		emm_heap_nb_remove(h, carrier);
	if (r) {
		if (own)
			return r; /* the caller moves the blocks */
		/* Nothing recorded: the blocks wait in the open epoch again. */
		emm_heap_fence_move(h, ep, h->open);
		fence_put(h, ep);
		return r;
	}
	ep->nevents = m;
	ep->done = 0;
	h->st.events_recorded += m;
	h->st.stream_waits += nwaits;
	h->st.epochs_closed++;
	/* Another close that published meanwhile recorded its legacy event
	 * with the lock dropped too: which of the two the legacy stream runs
	 * later is unknown. Its event stays the last fence (it orders its own
	 * fast-path blocks), and this one takes the slow way, its blocks
	 * waiting for their own events: replacing it could hand a new
	 * non-blocking stream (nb_add) or the page give-back the older one. */
	bool can_last = can_set_last_fence(h) && lfg == h->lf_gen;
	if (waited && !h->p.host_accessible && gen == h->nb_gen && can_last) {
		/* Fast path: the legacy event orders every later use on blocking
		 * and per-thread streams, the live non-blocking streams (all
		 * idle) wait on it, and so do new ones (emm_heap_last_fence; one
		 * created while the lock was dropped changed nb_gen and sends us
		 * the slow way). The blocks are ready at once. Not for
		 * host-accessible memory: the host writes a reused pinned block
		 * at once, outside every stream, so it must wait for completion
		 * (a copy from it may still be in flight: measured on the H200). */
		set_last_fence(h, ep->events[0], NULL);
		ep->nevents = 0;
		if (ret_ready) {
			struct emm_block *b = ep->blocks, *bn;
			for (; b; b = bn) {
				bn = b->link;
				h->st.pending -= b->size;
				b->state = BLOCK_LIVE;
				atomic_store_explicit(&b->tcached, TC_READY, memory_order_relaxed);
				b->fence = NULL;
				b->stream = 0;
				b->link = *ret_ready;
				*ret_ready = b;
			}
			ep->blocks = NULL;
			ep->nblocks = 0;
			ep->bytes = 0;
			ep->max_size[0] = ep->max_size[1] = 0;
		} else {
			fence_release_blocks(h, ep);
		}
		fence_put(h, ep);
		return 0;
	}
	if (can_last)
		set_last_fence(h, ep->events[0], ep);
	fence_enqueue(h, ep);
	return 0;
}

/* The blocks ready under key, pending on fence `to` (orphans). */
static void key_to_fence(struct arena *h, emm_stream_t key, struct emm_fence *to)
{
	struct emm_block *b, *next;

	for (b = emm_pool_collect_key(h, key); b; b = next) {
		next = b->link;
		pending_add(h, to, b);
	}
}

/* Fence every block ready under stream key `key` with one event recorded on
 * `target`: they become pending until it completes. The record runs with
 * the lock dropped; the blocks wait on the busy list meanwhile. */
int emm_heap_fence_key(struct arena *h, emm_stream_t key, emm_stream_t target, struct emm_fence *fail_to)
{
	struct emm_fence *f;
	struct emm_block *b, *next;
	unsigned phase;
	int r;

	if (!emm_pool_has_key(h, key))
		return 0;
	if (!h->has_fence) {
		for (b = emm_pool_collect_key(h, key); b; b = next) {
			next = b->link;
			emm_pool_block_ready(h, b, 0);
		}
		return 0;
	}
	r = f_capturing(h, target) ? -EBUSY : 0;
	f = r ? NULL : emm_heap_fence_new(h);
	if (!r && !f)
		r = -ENOMEM;
	if (f) {
		emm_heap_fence_reset(f);
		r = fence_reserve(f, 1);
		if (r)
			fence_put(h, f);
	}
	if (r) {
		if (fail_to)
			key_to_fence(h, key, fail_to);
		return r;
	}
	key_to_fence(h, key, f);
	busy_add(h, f);
	phase = emm_heap_inflight_enter(h);
	arena_unlock_release(h);
	r = fop_record(h, target, &f->events[0]);
	arena_lock(h);
	busy_del(h, f);
	if (r) {
		if (fail_to) {
			emm_heap_fence_move(h, f, fail_to);
		} else {
			for (b = f->blocks; b; b = next) {
				next = b->link;
				h->st.pending -= b->size;
				emm_pool_block_ready(h, b, key);
			}
		}
		fence_put(h, f);
	} else {
		f->nevents = 1;
		h->st.events_recorded++;
		fence_enqueue(h, f);
	}
	/* Last: a destroy of key's stream waits for this, so the blocks put
	 * back above are in the tree when it looks. */
	emm_heap_inflight_leave(h, phase);
	return r;
}

/*
 * Orphans of a destroyed non-blocking stream: no event we can still record
 * orders its work (its handle is gone, and the legacy stream does not wait
 * for non-blocking streams), so only a device-wide synchronize proves it
 * finished. That host wait is done here, lock dropped, once recording is
 * allowed again (emm_heap_flush at capture end, the OOM retry, destroy),
 * rather than waiting for the program to synchronize by itself: programs in
 * steady state never do, and the memory would stay parked. It is one wait
 * per capture that destroyed such a stream with freed blocks, and never on
 * the allocation or free path. Blocking-class orphans ride along (they are
 * covered as well). 0, -EBUSY (capture), -ENOSYS, or the op's error (the
 * orphans are kept).
 */
int emm_heap_resolve_orphans(struct arena *h)
{
	struct emm_fence *f;
	unsigned lost_gen = h->order_lost_gen;
	int r;

	if (h->orphans[1]->nblocks == 0 && !h->order_lost)
		return 0;
	if (!h->fops.device_synchronize)
		return -ENOSYS;
	if (f_capturing(h, EMM_STREAM_SYNC))
		return -EBUSY;
	f = emm_heap_fence_new(h);
	if (!f)
		return -ENOMEM;
	emm_heap_fence_reset(f);
	emm_heap_fence_move(h, h->orphans[1], f);
	emm_heap_fence_move(h, h->orphans[0], f);
	busy_add(h, f);
	arena_unlock_release(h);
	r = fop_device_synchronize(h);
	arena_lock(h);
	busy_del(h, f);
	if (r) {
		emm_heap_fence_move(h, f, h->orphans[1]);
	} else {
		h->st.host_waits++;
		fence_release_blocks(h, f);
		/* Every work before the synchronize is done: closes may record
		 * again, unless more was lost meanwhile. */
		if (lost_gen == h->order_lost_gen)
			h->order_lost = false;
	}
	fence_put(h, f);
	return r;
}
