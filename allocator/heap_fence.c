/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_fence.c - fences and epochs of one arena: fence structs
 * and their events, closing the open epoch of synchronous frees, polling
 * closed fences, fencing a stream key's ready blocks, stealing another
 * stream's ready block, and the stream lifecycle (non-blocking streams
 * created and destroyed). The emm_heap_stream_* entry points take each
 * arena's lock; every other function here expects it held.
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "common/log.h"

#define STEAL_CANDIDATES 8u /* streams tried per steal */

/* --- fence structs -------------------------------------------------------- */

struct emm_fence *emm_heap_fence_new(struct arena *h)
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

void emm_heap_fence_reset(struct emm_fence *f)
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
void emm_heap_fence_recycle(struct arena *h, struct emm_fence *f)
{
	for (unsigned i = 0; i < f->nevents; i++) {
		if (i == 0 && f->keep_legacy) {
			h->last_fence_owner = NULL; /* the heap owns it alone now */
			continue;
		}
		h->fops.release(h->fops.ctx, f->events[i]);
	}
	emm_heap_fence_reset(f);
	f->next = h->fence_free;
	h->fence_free = f;
}

/* Every block of a completed fence becomes ready-any. */
static void fence_release_blocks(struct arena *h, struct emm_fence *f)
{
	struct emm_block *b = f->blocks, *next;

	for (; b; b = next) {
		next = b->link;
		h->st.pending -= b->size;
		emm_pool_block_ready(h, b, 0);
	}
	f->blocks = NULL;
	f->nblocks = 0;
	f->bytes = 0;
	f->max_size[0] = f->max_size[1] = 0;
}

/* --- fences --------------------------------------------------------------- */

static bool is_nonblocking(const struct arena *h, emm_stream_t s)
{
	for (unsigned i = 0; i < h->nb_count; i++)
		if (h->nb[i] == s)
			return true;
	return false;
}

/* The stream an event must be recorded on to order work of stream key s:
 * the legacy stream is a barrier for blocking and per-thread streams. */
emm_stream_t emm_heap_fence_target(const struct arena *h, emm_stream_t s)
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
int emm_heap_close_epoch(struct arena *h)
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
		next_open = emm_heap_fence_new(h);
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
	emm_heap_fence_reset(next_open);
	h->open = next_open;
	return 0;
fail:
	if (next_open) {
		emm_heap_fence_reset(next_open);
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
bool emm_heap_poll_fences(struct arena *h)
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
			emm_heap_fence_recycle(h, f);
		} else {
			prev = f;
		}
	}
	return moved;
}

/* Fence every block ready under stream key `key` with one event recorded on
 * `target`: they become pending until it completes. */
int emm_heap_fence_key(struct arena *h, emm_stream_t key, emm_stream_t target)
{
	struct emm_fence *f;
	struct emm_block *b, *next;
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
	if (f_capturing(h, target))
		return -EBUSY;
	f = emm_heap_fence_new(h);
	if (!f)
		return -ENOMEM;
	emm_heap_fence_reset(f);
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
	for (b = emm_pool_collect_key(h, key); b; b = next) {
		next = b->link;
		pending_add(h, f, b);
	}
	fence_enqueue(h, f);
	return 0;
}

/*
 * Steal a ready-stream block of another stream T for an allocation on S.
 * The block may be used on S only after T's work on it: record an event on
 * T (or on the legacy stream for blocking-class T) and make S wait for it on
 * the GPU; a synchronous allocation instead needs the event complete.
 */
struct emm_block *emm_heap_try_steal(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream)
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
		emm_stream_t target = emm_heap_fence_target(h, cand[i]->stream);
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

/* --- stream lifecycle ----------------------------------------------------- */

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

/* Fence the ready-stream blocks of `stream` with a marker recorded on it. */
static void stream_fence_locked(struct arena *h, emm_stream_t stream)
{
	if (emm_heap_fence_key(h, stream, stream)) {
		/* Nothing can be recorded: ready-any (heap.h). */
		struct emm_block *b, *next;
		for (b = emm_pool_collect_key(h, stream); b; b = next) {
			next = b->link;
			emm_pool_block_ready(h, b, 0);
		}
	}
}

void emm_heap_stream_fence(emm_heap_t *heap, emm_stream_t stream)
{
	if (!heap || stream == EMM_STREAM_SYNC)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		pthread_mutex_lock(&h->lock);
		stream_fence_locked(h, stream);
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
		stream_fence_locked(h, stream);
		pthread_mutex_unlock(&h->lock);
	}
}
