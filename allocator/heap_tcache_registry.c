/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_tcache_registry.c - the per-thread front cache's binding
 * and flush side (the cache itself and its hot path: heap_tcache.c): the
 * registry of live heaps with a cache, each thread's cache (created at its
 * first free, bound to one heap and arena at a time, listed for
 * statistics), the flush generation, the counters moved into the arenas,
 * and the flushes.
 *
 * Flushed (every block back to the arena: pending ones to its open epoch,
 * ready ones ready-any in its trees) on thread exit, on an OOM retry of the
 * thread, at emm_heap_flush and emm_heap_release_idle of the thread, when
 * the thread moves to another heap, and at the next use of every other
 * thread's cache after emm_heap_release_idle or an OOM retry (a generation
 * they compare, one shared read). So an OOM retry cannot reach what other
 * threads hold at that moment: at most TC_READY_MAX plus one epoch's quota
 * per thread. A heap being destroyed bumps the generation too: a
 * cache bound to a heap no longer registered forgets its blocks without
 * touching them. In a fork child the forking thread's cache is forgotten.
 */
#include "allocator/heap_tcache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

_Thread_local struct tcache *emm_tc_tls __attribute__((tls_model("initial-exec")));
atomic_uint_fast64_t emm_tc_gen = 1;
static atomic_uint_fast64_t heap_uid_next = 1;

/* Live heaps (uid), for caches that find the generation changed. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tcache *tc_list;
static struct emm_heap **reg;
static size_t reg_count, reg_cap;
static pthread_once_t tc_once = PTHREAD_ONCE_INIT;
static pthread_key_t tc_key;
static bool tc_key_ok;

static void tc_thread_exit(void *arg);

/* Unbound and empty (the blocks forgotten); the list links stay. */
static void tc_reset(struct tcache *tc)
{
	struct tcache *next = tc->next, *prev = tc->prev;

	memset(tc, 0, sizeof(*tc));
	tc->next = next;
	tc->prev = prev;
}

static void tc_fork_child(void)
{
	/* The parent's heaps are the parent's: forget this thread's cache. */
	pthread_mutex_init(&reg_lock, NULL);
	reg_count = 0;
	tc_list = NULL;
	if (emm_tc_tls) {
		tc_reset(emm_tc_tls);
		emm_tc_tls->next = emm_tc_tls->prev = NULL;
		tc_list = emm_tc_tls;
	}
	atomic_fetch_add(&emm_tc_gen, 1);
}

static void tc_init_once(void)
{
	tc_key_ok = pthread_key_create(&tc_key, tc_thread_exit) == 0;
	pthread_atfork(NULL, NULL, tc_fork_child);
}

static bool reg_alive_locked(const struct emm_heap *heap, uint64_t uid)
{
	for (size_t i = 0; i < reg_count; i++)
		if (reg[i] == heap)
			return heap->uid == uid;
	return false;
}

void emm_tcache_heap_created(struct emm_heap *heap)
{
	heap->uid = atomic_fetch_add(&heap_uid_next, 1);
	if (!heap->tcache)
		return;
	pthread_once(&tc_once, tc_init_once);
	pthread_mutex_lock(&reg_lock);
	if (reg_count == reg_cap) {
		size_t cap = reg_cap ? reg_cap * 2 : 8;
		struct emm_heap **n = realloc(reg, cap * sizeof(*n));
		if (!n) {
			heap->tcache = false; /* no memory: this heap goes without */
			pthread_mutex_unlock(&reg_lock);
			return;
		}
		reg = n;
		reg_cap = cap;
	}
	reg[reg_count++] = heap;
	pthread_mutex_unlock(&reg_lock);
}

void emm_tcache_heap_destroyed(struct emm_heap *heap)
{
	if (!heap->tcache)
		return;
	pthread_mutex_lock(&reg_lock);
	for (size_t i = 0; i < reg_count; i++) {
		if (reg[i] == heap) {
			reg[i] = reg[--reg_count];
			break;
		}
	}
	atomic_fetch_add(&emm_tc_gen, 1);
	if (emm_tc_tls && emm_tc_tls->heap == heap)
		tc_reset(emm_tc_tls); /* forgotten: the memory goes with the heap */
	pthread_mutex_unlock(&reg_lock);
}

void emm_tcache_flush_all(void)
{
	atomic_fetch_add(&emm_tc_gen, 1);
}

/* Add the thread's counters to its arena. Lock held. */
void emm_tc_apply_delta(struct tcache *tc)
{
	struct arena *h = tc->arena;
	struct tc_delta *d = &tc->d;
	int64_t allocated = LD(d->allocated), requested = LD(d->requested);

	if (!LD(d->allocs) && !LD(d->frees))
		return;
	h->st.allocs += LD(d->allocs);
	h->st.frees += LD(d->frees);
	h->st.hits += LD(d->hits);
	h->st.live_blocks += (uint64_t)LD(d->live);
	/* Signed: the arena's count may be below zero for a while (stat_add). */
	if ((int64_t)h->st.allocated + d->allocated_max > (int64_t)h->st.allocated_peak)
		h->st.allocated_peak = h->st.allocated + (uint64_t)d->allocated_max;
	if ((int64_t)h->st.requested + d->requested_max > (int64_t)h->st.requested_peak)
		h->st.requested_peak = h->st.requested + (uint64_t)d->requested_max;
	h->st.allocated += (uint64_t)allocated;
	h->st.requested += (uint64_t)requested;
	h->st.allocated_total += LD(d->allocated_total);
	h->st.requested_total += LD(d->requested_total);
	/* The heap-wide peak sees the highest point first, then the rest. */
	stat_delta(h, d->allocated_max, d->requested_max);
	stat_delta(h, allocated - d->allocated_max, requested - d->requested_max);
	ST(d->allocs, 0);
	ST(d->frees, 0);
	ST(d->hits, 0);
	ST(d->live, 0);
	ST(d->allocated, 0);
	ST(d->requested, 0);
	ST(d->allocated_total, 0);
	ST(d->requested_total, 0);
	d->allocated_max = d->requested_max = 0;
}

void emm_tcache_stats_begin(void)
{
	pthread_mutex_lock(&reg_lock);
}

void emm_tcache_stats_end(void)
{
	pthread_mutex_unlock(&reg_lock);
}

size_t emm_tcache_add_counters(struct arena *h, struct heap_counters *c)
{
	size_t pending = 0;

	for (struct tcache *tc = tc_list; tc; tc = tc->next) {
		/* The uid too: a thread's cache stays bound to a destroyed heap
		 * until its next use, and a new heap (and its arenas) may have
		 * the old one's addresses. */
		if (tc->arena != h || tc->heap != h->owner || tc->uid != h->owner->uid)
			continue;
		struct tc_delta *d = &tc->d;
		c->allocs += LD(d->allocs);
		c->frees += LD(d->frees);
		c->hits += LD(d->hits);
		c->live_blocks += (uint64_t)LD(d->live);
		c->allocated += (uint64_t)LD(d->allocated);
		c->requested += (uint64_t)LD(d->requested);
		c->allocated_total += LD(d->allocated_total);
		c->requested_total += LD(d->requested_total);
		pending += LD(d->pend_bytes);
	}
	return pending;
}

/* The counters added and the thread's epoch joins the arena's open one.
 * Lock held. */
void emm_tc_pending_to_open(struct tcache *tc)
{
	struct arena *h = tc->arena;
	struct emm_block *b, *next;

	emm_tc_apply_delta(tc);
	for (b = tc->pend; b; b = next) {
		next = b->link;
		untc(b);
		pending_add(h, h->open, b);
	}
	tc->pend = NULL;
	tc->npend = 0;
	tc->pend_max = 0;
	ST(tc->d.pend_bytes, 0);
}

/* Every block back to the arena (pending ones to its open epoch, closed by
 * the next free or sync point) and the counters added. Lock held, never
 * dropped. */
static void flush_locked(struct tcache *tc)
{
	struct arena *h = tc->arena;
	struct emm_block *b, *next;

	emm_tc_pending_to_open(tc);
	for (unsigned c = 0; c < TC_CLASSES; c++) {
		for (b = tc->bins[c]; b; b = next) {
			next = b->link;
			untc(b);
			emm_pool_block_ready(h, b, 0);
		}
		tc->bins[c] = NULL;
		tc->nbin[c] = 0;
	}
	tc->ready_bytes = 0;
}

/* No fence op here, nor in releasing garbage (left to the arena's next
 * unlock): this runs at thread exit, outside libemm's guard, and under
 * reg_lock, which a heap destroy takes. */
static void flush(struct tcache *tc)
{
	arena_lock(tc->arena);
	flush_locked(tc);
	arena_unlock(tc->arena);
}

/* Unbind: flush into the heap if it is still registered, else forget. */
static void unbind_locked(struct tcache *tc)
{
	if (tc->heap && reg_alive_locked(tc->heap, tc->uid))
		flush(tc); /* a destroy waits for reg_lock: the heap stays */
	/* Unbound (destroyed heap, fork child): the blocks are forgotten. */
	tc_reset(tc);
}

void emm_tc_unbind(struct tcache *tc)
{
	pthread_mutex_lock(&reg_lock);
	unbind_locked(tc);
	pthread_mutex_unlock(&reg_lock);
}

static void tc_thread_exit(void *arg)
{
	struct tcache *tc = arg;

	pthread_mutex_lock(&reg_lock);
	unbind_locked(tc);
	if (tc->prev)
		tc->prev->next = tc->next;
	else if (tc_list == tc)
		tc_list = tc->next;
	if (tc->next)
		tc->next->prev = tc->prev;
	pthread_mutex_unlock(&reg_lock);
	emm_tc_tls = NULL;
	free(tc);
}

/* The calling thread's cache, bound to `heap` and arena h; NULL without
 * memory. A changed generation flushes (or forgets) what it holds. */
struct tcache *emm_tc_get(struct emm_heap *heap, struct arena *h)
{
	struct tcache *tc = emm_tc_tls;
	uint64_t gen = atomic_load_explicit(&emm_tc_gen, memory_order_acquire);

	if (EMM_LIKELY(tc_bound(tc, heap) && tc->arena == h))
		return tc;
	if (!tc) {
		pthread_once(&tc_once, tc_init_once);
		if (!tc_key_ok || !(tc = calloc(1, sizeof(*tc))))
			return NULL;
		if (pthread_setspecific(tc_key, tc)) {
			free(tc);
			return NULL;
		}
		emm_tc_tls = tc;
		pthread_mutex_lock(&reg_lock);
		tc->next = tc_list;
		if (tc_list)
			tc_list->prev = tc;
		tc_list = tc;
		pthread_mutex_unlock(&reg_lock);
	}
	pthread_mutex_lock(&reg_lock);
	unbind_locked(tc);
	bool alive = reg_alive_locked(heap, heap->uid);
	if (alive) {
		tc->heap = heap;
		tc->uid = heap->uid;
		tc->arena = h;
		tc->gen = gen;
	}
	pthread_mutex_unlock(&reg_lock);
	return alive ? tc : NULL;
}

void emm_tcache_apply_locked(struct arena *h)
{
	struct tcache *tc = emm_tc_tls;

	if (tc && tc->arena == h && tc_owned(tc, h->owner))
		emm_tc_apply_delta(tc);
}

void emm_tcache_flush_locked(struct arena *h)
{
	struct tcache *tc = emm_tc_tls;

	if (tc_owned(tc, h->owner) && tc->arena == h)
		flush_locked(tc);
}

void emm_tcache_sync(struct emm_heap *heap)
{
	struct tcache *tc = emm_tc_tls;

	if (!heap->tcache || !tc_owned(tc, heap))
		return;
	arena_lock(tc->arena);
	flush_locked(tc);
	arena_unlock_release(tc->arena);
}
