/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_stream.c - what the heap does across streams: stealing
 * another stream's ready block for an allocation (a marker on the owner,
 * a GPU-side wait on the allocating stream), the stream lifecycle
 * (non-blocking streams created and destroyed, the blocks of a destroyed
 * stream fenced or orphaned, work carried in from streams no epoch records
 * on), and counting the ops that name a stream with the lock dropped (so
 * that a destroy can wait for them). Fence ops run with the arena lock
 * dropped (heap_internal.h); the emm_heap_stream_* entry points take each
 * arena's lock, emm_heap_try_steal expects it held.
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

#include "common/log.h"

#define STEAL_CANDIDATES 8u /* streams tried per steal */

/*
 * Steal a ready-stream block of another stream T for an allocation on S.
 * The block may be used on S only after T's work on it: record an event on
 * T (or on the legacy stream for blocking-class T) and make S wait for it on
 * the GPU; a synchronous allocation instead needs the event complete. The
 * candidates are taken out of their trees (reserved) while the ops run with
 * the lock dropped; the winner is handed out exactly as it was when the
 * event was recorded (never merged with a neighbour freed later), the
 * others go back. Returns the winner, reserved, for emm_pool_take_reserved.
 */
struct emm_block *emm_heap_try_steal(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream)
{
	struct emm_block *cand[STEAL_CANDIDATES];
	emm_stream_t key[STEAL_CANDIDATES], target[STEAL_CANDIDATES];
	unsigned n = 0, m = 0, recorded = 0, waits = 0, queries = 0, phase;
	struct emm_tree *t = &h->trees[pool];
	struct emm_tree_node *node = emm_tree_lower_bound(t, 1, 0, 0);
	int win = -1;

	while (node && n < STEAL_CANDIDATES) {
		emm_stream_t k = node->key[0];
		if (k != stream) {
			struct emm_block *c = find_fit(h, pool, k, rounded);
			if (c) {
				unsigned i = n++;
				while (i > 0 && cand[i - 1]->size > c->size) { /* keep sorted by size */
					cand[i] = cand[i - 1];
					i--;
				}
				cand[i] = c;
			}
		}
		if (k == UINT64_MAX)
			break;
		node = emm_tree_lower_bound(t, k + 1, 0, 0);
	}
	if (n == 0)
		return NULL;
	if (!h->has_fence) {
		emm_pool_reserve(h, cand[0]);
		return cand[0];
	}

	bool wait_on_gpu = stream != EMM_STREAM_SYNC && h->fops.stream_wait;
	if (stream != EMM_STREAM_SYNC && f_capturing(h, stream))
		return NULL;
	for (unsigned i = 0; i < n; i++) {
		emm_stream_t tg = emm_heap_fence_target(h, cand[i]->stream);
		if (f_capturing(h, tg))
			continue;
		key[m] = cand[i]->stream;
		target[m] = tg;
		cand[m++] = cand[i];
	}
	if (m == 0)
		return NULL;
	for (unsigned i = 0; i < m; i++)
		emm_pool_reserve(h, cand[i]);
	phase = emm_heap_inflight_enter(h);
	arena_unlock_release(h);

	for (unsigned i = 0; i < m && win < 0; i++) {
		uint64_t ev;
		int r;

		if (fop_record(h, target[i], &ev))
			continue;
		recorded++;
		if (wait_on_gpu) {
			r = fop_stream_wait(h, stream, ev);
			waits += r == 0;
		} else {
			r = fop_query(h, ev);
			queries++;
		}
		fop_release(h, ev);
		if (r == 0)
			win = (int)i;
	}

	arena_lock(h);
	h->st.events_recorded += recorded;
	h->st.stream_waits += waits;
	h->st.event_queries += queries;
	for (unsigned i = 0; i < m; i++)
		if ((int)i != win)
			emm_pool_block_ready(h, cand[i], key[i]);
	emm_heap_inflight_leave(h, phase);
	return win < 0 ? NULL : cand[win];
}

/* --- stream lifecycle ----------------------------------------------------- */

/* Announce a non-blocking stream in one arena. Lock held. */
static void nb_add(struct arena *h, emm_stream_t stream)
{
	if (emm_heap_is_nonblocking(h, stream))
		return;
	if (h->nb_count == h->nb_cap) {
		unsigned cap = h->nb_cap ? h->nb_cap * 2 : 8;
		emm_stream_t *nb = realloc(h->nb, cap * sizeof(*nb));
		if (!nb) {
			/* Treated as blocking-class: only its own frees are then
			 * fenced by it. Report, do not fail. */
			emm_error("out of memory tracking non-blocking stream 0x%llx", (unsigned long long)stream);
			return;
		}
		h->nb = nb;
		h->nb_cap = cap;
	}
	h->nb[h->nb_count++] = stream;
	h->nb_gen++;
	/* Blocks of fast-path epochs are ready-any although only the legacy
	 * event orders them: a new non-blocking stream must wait on it. The
	 * wait runs with the lock dropped; lf_users keeps the event from being
	 * replaced and released meanwhile, and nb_gen keeps an epoch that
	 * closes meanwhile (without an event on this stream) off the fast
	 * path, so no block becomes ready-any unordered for it. */
	if (h->has_last_fence && h->fops.stream_wait) {
		uint64_t ev = h->last_fence;
		h->lf_users++;
		arena_unlock_release(h);
		int r = fop_stream_wait(h, stream, ev);
		/* The wait could not be made (a driver error): the host waits
		 * for the event instead, else for the whole device. */
		int rs = r == 0 ? 0 : h->fops.synchronize ? fop_synchronize(h, ev) : -ENOSYS;
		if (rs != 0)
			rs = h->fops.device_synchronize ? fop_device_synchronize(h) : -ENOSYS;
		if (rs != 0)
			emm_error("non-blocking stream 0x%llx: neither a wait for the last fence nor a host wait "
			          "could be made (%d): blocks freed before it was created may still be in use",
			          (unsigned long long)stream, rs);
		arena_lock(h);
		h->lf_users--;
		if (r == 0)
			h->st.stream_waits++;
		else if (rs == 0)
			h->st.host_waits++;
	}
}

void emm_heap_carrier_joined(emm_heap_t *heap, emm_stream_t carrier)
{
	if (!heap || carrier == EMM_STREAM_SYNC)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		h->carrier = carrier;
		h->carrier_gen++; /* an idle carrier seen by a close in flight stays */
		nb_add(h, carrier);
		arena_unlock_release(h);
	}
}

void emm_heap_order_lost(emm_heap_t *heap)
{
	if (!heap)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		h->order_lost = true;
		h->order_lost_gen++;
		arena_unlock_release(h);
	}
}

void emm_heap_stream_created(emm_heap_t *heap, emm_stream_t stream, bool nonblocking)
{
	if (!heap || !nonblocking || stream == EMM_STREAM_SYNC)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		nb_add(h, stream);
		arena_unlock_release(h);
	}
}

/*
 * The stream is about to be destroyed (its handle is still valid during
 * this call; its work may run on after the destroy returns). Its ready
 * blocks get a marker recorded on it now; if none can be recorded (a
 * capture forbids it, the record fails) they become orphans, out of every
 * allocation's reach until the stream's work is known finished
 * (heap_fence.c: emm_heap_close_epoch, emm_heap_resolve_orphans). Ops
 * already running with the lock dropped may name the stream (an epoch
 * records on every live non-blocking stream, a steal on a candidate's
 * owner): wait for them before the handle goes.
 */
void emm_heap_stream_destroyed(emm_heap_t *heap, emm_stream_t stream)
{
	if (!heap || stream == EMM_STREAM_SYNC)
		return;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		bool was_nb = emm_heap_nb_remove(h, stream);
		emm_heap_inflight_quiesce(h);
		emm_heap_fence_key(h, stream, stream, h->orphans[was_nb ? 1 : 0]);
		arena_unlock_release(h);
	}
}

/* --- in-flight ops naming streams ----------------------------------------- */

unsigned emm_heap_inflight_enter(struct arena *h)
{
	unsigned phase = h->inflight_phase;
	h->inflight[phase]++;
	return phase;
}

void emm_heap_inflight_leave(struct arena *h, unsigned phase)
{
	if (--h->inflight[phase] == 0 && h->inflight_waiters)
		emm_arena_wake(h);
}

/* Wait until every op that started before now has left (lock held,
 * dropped while waiting: emm_arena_wait). Ops starting meanwhile count
 * in the other phase, so a steady stream of them cannot starve the wait. */
void emm_heap_inflight_quiesce(struct arena *h)
{
	unsigned phase = h->inflight_phase;

	h->inflight_phase ^= 1u;
	h->inflight_waiters++;
	while (h->inflight[phase])
		emm_arena_wait(h);
	h->inflight_waiters--;
}
