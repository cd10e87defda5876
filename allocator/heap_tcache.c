/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_tcache.c - the per-thread front cache (jemalloc's tcache,
 * mimalloc's thread-local free lists): blocks a thread freed with a
 * synchronous free, reused by its next allocations without a lock or a
 * shared atomic write. Only for heaps created with params.thread_cache.
 *
 * Each thread has one cache, bound to one heap (and its arena of that heap)
 * at a time; it holds only blocks of that arena (a block freed by another
 * thread than its allocator's goes the shared way). Two lists:
 *
 *   - pending: freed, not yet reusable (fence mode): the thread's own epoch.
 *     After EMM_EPOCH_BLOCKS frees (or 16 times EMM_EPOCH_BYTES, the hard
 *     bound), or at an allocation that misses while it holds EMM_EPOCH_BYTES,
 *     it is closed in one arena lock (emm_heap_close_blocks): one event on the legacy stream,
 *     exactly as the shared open epoch closes, whose blocks join it (so
 *     every synchronous free still counts towards an epoch close). When the
 *     arena misses and half the quota is pending with a block that could
 *     serve the miss, the blocks join the shared open epoch, which the
 *     arena's pressure rule then closes (emm_tcache_pressure_locked). With no live non-blocking
 *     stream the blocks come straight back, ready-any; otherwise the fence
 *     stays in the arena and they are reached through it like every other
 *     epoch's blocks. So a block in a cache is reused only when it would be
 *     reusable from the shared heap (DESIGN.md section 4): the fence rules
 *     are the shared heap's, only the lock is gone.
 *   - ready: ready-any blocks in bins by size class (4 per power of two,
 *     512 B - 8 MiB), at most TC_BIN_MAX (32) per bin and TC_READY_MAX bytes in
 *     all; an allocation takes a block of its class and pool at least its
 *     size (so at most a quarter larger), live and unsplit. Blocks freed
 *     with no fence ops or in stream mode are ready at once.
 *
 * Counters (allocations, frees, hits, bytes) are the thread's own and are
 * added to the arena under its lock whenever the cache takes it (epoch
 * close, flush) and when the thread reads statistics; the peaks carry the
 * highest point reached in between, so one thread's peaks stay exact.
 *
 * Heaps with a release threshold (EMM_RELEASE_THRESHOLD) free the shared
 * way, where the threshold is checked at every free, and so do pinned heaps
 * (host_accessible). A thread that frees into heaps of two devices in turn
 * flushes its cache at every change of heap.
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
#include "allocator/heap_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


#define TC_CLASSES   64
#define TC_BIN_MAX   32u
#define TC_MAX_SIZE  ((size_t)8 << 20)
#define TC_READY_MAX ((size_t)32 << 20)

/* Written by the owner without a lock (relaxed loads and stores, no
 * read-modify-write), read by statistics under the arena lock and reg_lock
 * (emm_tcache_add_counters); moved into the arena under its lock. */
struct tc_delta {
	_Atomic uint64_t allocs, frees, hits;
	_Atomic int64_t live, allocated, requested;
	int64_t allocated_max, requested_max; /* highest allocated/requested reached since the last apply */
	_Atomic uint64_t allocated_total, requested_total;
	_Atomic size_t pend_bytes; /* bytes in the thread's epoch */
};

#define LD(x)     atomic_load_explicit(&(x), memory_order_relaxed)
#define ST(x, v)  atomic_store_explicit(&(x), (v), memory_order_relaxed)
#define BUMP(x, v) ST(x, LD(x) + (v))

struct tcache {
	struct tcache *next, *prev; /* every thread's cache, under reg_lock */
	/* Bound under reg_lock (statistics read them). */
	struct emm_heap *heap; /* NULL: unbound */
	uint64_t uid;
	struct arena *arena;
	uint64_t gen;
	struct emm_block *bins[TC_CLASSES];
	uint8_t nbin[TC_CLASSES];
	size_t ready_bytes;
	struct emm_block *pend;
	unsigned npend;
	size_t pend_max; /* the largest pending block */
	unsigned skip;   /* synchronous frees to let pass: its epochs do not come back at once */
	struct tc_delta d;
};

static _Thread_local struct tcache *tls_tc __attribute__((tls_model("initial-exec")));
static atomic_uint_fast64_t tc_gen = 1;
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
	if (tls_tc) {
		tc_reset(tls_tc);
		tls_tc->next = tls_tc->prev = NULL;
		tc_list = tls_tc;
	}
	atomic_fetch_add(&tc_gen, 1);
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
	atomic_fetch_add(&tc_gen, 1);
	if (tls_tc && tls_tc->heap == heap)
		tc_reset(tls_tc); /* forgotten: the memory goes with the heap */
	pthread_mutex_unlock(&reg_lock);
}

void emm_tcache_flush_all(void)
{
	atomic_fetch_add(&tc_gen, 1);
}

/* 4 classes per power of two from 512 B. */
static inline unsigned size_class(size_t size)
{
	unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
	return (k - 9u) * 4u + (unsigned)((size >> (k - 2u)) & 3u);
}

/* The block leaves the cache (lock held: it goes to the arena). */
static inline void untc(struct emm_block *b)
{
	atomic_store_explicit(&b->tcached, 0, memory_order_relaxed);
}

/* Add the thread's counters to its arena. Lock held. */
static void apply_delta(struct tcache *tc)
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
	if (h->st.allocated + (uint64_t)d->allocated_max > h->st.allocated_peak)
		h->st.allocated_peak = h->st.allocated + (uint64_t)d->allocated_max;
	if (h->st.requested + (uint64_t)d->requested_max > h->st.requested_peak)
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
static void pending_to_open(struct tcache *tc)
{
	struct arena *h = tc->arena;
	struct emm_block *b, *next;

	apply_delta(tc);
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

	pending_to_open(tc);
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

static void unbind(struct tcache *tc)
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
	tls_tc = NULL;
	free(tc);
}

/* Is tc bound to `heap` (not another heap at the same address), with no
 * destroy or flush request since? */
static inline bool tc_bound(const struct tcache *tc, const struct emm_heap *heap)
{
	return tc && tc->heap == heap && tc->gen == atomic_load_explicit(&tc_gen, memory_order_acquire) &&
	       tc->uid == heap->uid;
}

/* The calling thread's cache, bound to `heap` and arena h; NULL without
 * memory. A changed generation flushes (or forgets) what it holds. */
static struct tcache *tc_get(struct emm_heap *heap, struct arena *h)
{
	struct tcache *tc = tls_tc;
	uint64_t gen = atomic_load_explicit(&tc_gen, memory_order_acquire);

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
		tls_tc = tc;
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

static void close_pending(struct tcache *tc);

/* Does the thread's epoch hold the bytes for a miss of `rounded` to close
 * it (as epoch_pressure for the arena's open epoch, heap_alloc.c)? */
static inline bool tc_pressure_bytes(const struct tcache *tc, size_t rounded)
{
	size_t bytes = LD(tc->d.pend_bytes);

	return tc->pend && bytes >= tc->arena->p.epoch_max_bytes && bytes >= rounded;
}

bool emm_tcache_alloc(struct emm_heap *heap, unsigned pool, size_t rounded, size_t size,
                      emm_stream_t stream, struct emm_block **ret)
{
	struct tcache *tc = tls_tc;

	if (EMM_UNLIKELY(rounded > TC_MAX_SIZE))
		return false;
	if (EMM_UNLIKELY(!tc_bound(tc, heap))) {
		if (tc && tc->heap)
			unbind(tc); /* bound again at the thread's next free */
		return false;
	}
	unsigned c = size_class(rounded);
	struct emm_block **pp = &tc->bins[c], *b;
	for (; (b = *pp); pp = &b->link)
		if (b->size >= rounded && b->pool == pool)
			break;
	if (!b) {
		/* The epoch's close by bytes, now that memory is needed. */
		if (!tc_pressure_bytes(tc, rounded))
			return false;
		close_pending(tc);
		for (pp = &tc->bins[c]; (b = *pp); pp = &b->link)
			if (b->size >= rounded && b->pool == pool)
				break;
		if (!b)
			return false;
	}
	*pp = b->link;
	tc->nbin[c]--;
	tc->ready_bytes -= b->size;
	b->link = NULL;
	b->requested = size;
	b->stream = stream;
	atomic_store_explicit(&b->tcached, 0, memory_order_release);

	struct tc_delta *d = &tc->d;
	int64_t allocated = LD(d->allocated) + (int64_t)b->size, requested = LD(d->requested) + (int64_t)size;
	BUMP(d->allocs, 1);
	BUMP(d->hits, 1);
	BUMP(d->live, 1);
	ST(d->allocated, allocated);
	ST(d->requested, requested);
	if (allocated > d->allocated_max)
		d->allocated_max = allocated;
	if (requested > d->requested_max)
		d->requested_max = requested;
	BUMP(d->allocated_total, b->size);
	BUMP(d->requested_total, size);
	*ret = b;
	return true;
}

/* Put ready-any block b (live, tcached) in its bin: false if full. */
static inline bool bin_put(struct tcache *tc, struct emm_block *b)
{
	if (b->size > TC_MAX_SIZE)
		return false;
	unsigned c = size_class(b->size);

	if (tc->nbin[c] >= TC_BIN_MAX || tc->ready_bytes + b->size > TC_READY_MAX)
		return false;
	atomic_store_explicit(&b->tcached, TC_READY, memory_order_relaxed);
	b->link = tc->bins[c];
	tc->bins[c] = b;
	tc->nbin[c]++;
	tc->ready_bytes += b->size;
	return true;
}

/* Close the thread's epoch; its blocks come back to the bins if they can. */
static void close_pending(struct tcache *tc)
{
	struct arena *h = tc->arena;
	struct emm_block *ready = NULL, *b, *next;
	struct emm_block *list = tc->pend;

	tc->pend = NULL;
	tc->npend = 0;
	tc->pend_max = 0;
	ST(tc->d.pend_bytes, 0);
	arena_lock(h);
	apply_delta(tc);
	for (b = list; b; b = b->link)
		untc(b);
	emm_heap_close_blocks(h, list, &ready);
	/* Not the fast path (a non-blocking stream is alive, a capture): the
	 * blocks wait in the arena as before and the cache only costs; let
	 * the next few epochs go the shared way. */
	if (!ready)
		tc->skip = 4 * h->p.epoch_max_blocks;
	for (b = ready; b; b = next) {
		next = b->link;
		if (!bin_put(tc, b)) {
			untc(b);
			emm_pool_block_ready(h, b, 0);
		}
	}
	arena_unlock_release(h);
}

bool emm_tcache_free(struct emm_block *b)
{
	struct arena *h = b->seg->arena;
	struct emm_heap *heap = h->owner;
	struct tcache *tc = tls_tc;

	/* A release threshold is checked at every free of the shared way;
	 * host-accessible (pinned) blocks never come back from an epoch at
	 * once, and a thread moving between a pinned and a device heap would
	 * flush its cache at every move. */
	if (EMM_UNLIKELY(!heap->tcache || b->size > TC_MAX_SIZE || h->p.release_threshold != SIZE_MAX ||
	                 h->p.host_accessible))
		return false;
	if (EMM_UNLIKELY(!tc_bound(tc, heap) || tc->arena != h)) {
		if (h != emm_heap_thread_arena(heap))
			return false; /* another thread's arena: the shared way */
		tc = tc_get(heap, h);
		if (!tc)
			return false;
	}
	bool fenced = h->has_fence && h->p.free_mode == EMM_FREE_MODE_FENCE;
	struct tc_delta *d = &tc->d;
	size_t size = b->size, requested = b->requested;

	if (!fenced) {
		if (!bin_put(tc, b))
			return false;
	} else if (tc->skip) {
		tc->skip--;
		return false;
	} else {
		atomic_store_explicit(&b->tcached, TC_PENDING, memory_order_relaxed);
		b->link = tc->pend;
		tc->pend = b;
		tc->npend++;
		BUMP(tc->d.pend_bytes, size);
		if (size > tc->pend_max)
			tc->pend_max = size;
	}
	BUMP(d->frees, 1);
	BUMP(d->live, -1);
	BUMP(d->allocated, -(int64_t)size);
	BUMP(d->requested, -(int64_t)requested);
	/* By bytes only at the hard bound: below it a miss that needs the
	 * memory closes the epoch (emm_tcache_alloc, emm_tcache_pressure_locked). */
	if (fenced && (tc->npend >= h->p.epoch_max_blocks || LD(tc->d.pend_bytes) >= h->epoch_free_bytes))
		close_pending(tc);
	return true;
}

void emm_tcache_pressure_locked(struct arena *h, size_t rounded)
{
	struct tcache *tc = tls_tc;

	if (!tc_bound(tc, h->owner) || tc->arena != h)
		return;
	if (!tc_pressure_bytes(tc, rounded) &&
	    (tc->pend_max < rounded || tc->npend < (h->p.epoch_max_blocks + 1) / 2))
		return;
	pending_to_open(tc);
}

void emm_tcache_apply_locked(struct arena *h)
{
	struct tcache *tc = tls_tc;

	if (tc && tc->arena == h && tc_bound(tc, h->owner))
		apply_delta(tc);
}

void emm_tcache_flush_locked(struct arena *h)
{
	struct tcache *tc = tls_tc;

	if (tc_bound(tc, h->owner) && tc->arena == h)
		flush_locked(tc);
}

void emm_tcache_sync(struct emm_heap *heap)
{
	struct tcache *tc = tls_tc;

	if (!heap->tcache || !tc_bound(tc, heap))
		return;
	arena_lock(tc->arena);
	flush_locked(tc);
	arena_unlock_release(tc->arena);
}
