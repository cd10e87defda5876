/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_tcache.h - what the two halves of the per-thread front
 * cache share: the cache's structure and limits, the thread's cache and the
 * flush generation, and the calls the hot path (heap_tcache.c: allocation,
 * free, the thread's epoch) makes into the binding/flush side
 * (heap_tcache_registry.c: the heap registry, binding, flushes, statistics,
 * thread exit and fork). heap_tcache.c describes the cache. Nothing but
 * those two files includes it.
 */
#ifndef EMM_ALLOCATOR_HEAP_TCACHE_H
#define EMM_ALLOCATOR_HEAP_TCACHE_H

#include "allocator/heap_internal.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TC_CLASSES   64
#define TC_BIN_MAX   64u
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

/* The calling thread's cache (NULL before its first free into a cached
 * heap) and the generation a cache compares to notice destroys and flush
 * requests (heap_tcache_registry.c). */
extern _Thread_local struct tcache *emm_tc_tls __attribute__((tls_model("initial-exec")));
extern atomic_uint_fast64_t emm_tc_gen;

/* The block leaves the cache (lock held: it goes to the arena). */
static inline void untc(struct emm_block *b)
{
	atomic_store_explicit(&b->tcached, 0, memory_order_relaxed);
}

/* Is tc bound to `heap` (not another heap at the same address), with no
 * destroy or flush request since? */
static inline bool tc_bound(const struct tcache *tc, const struct emm_heap *heap)
{
	return tc && tc->heap == heap && tc->gen == atomic_load_explicit(&emm_tc_gen, memory_order_acquire) &&
	       tc->uid == heap->uid;
}

/* Is tc bound to `heap` (the same instance), whatever moved the generation
 * since? For the thread's own flushes, counters and pressure under a lock
 * of `heap` (OOM retry, release_idle, flush): the caller keeps the heap
 * alive, and tc_bound would say no after another heap's release_idle or a
 * flush request and leave the blocks in the cache. */
static inline bool tc_owned(const struct tcache *tc, const struct emm_heap *heap)
{
	return tc && tc->heap == heap && tc->uid == heap->uid;
}

/* The calling thread's cache, bound to `heap` and arena h; NULL without
 * memory. A changed generation flushes (or forgets) what it holds. */
struct tcache *emm_tc_get(struct emm_heap *heap, struct arena *h);
/* Flush into the bound heap if it is still registered, else forget; unbound
 * after. */
void emm_tc_unbind(struct tcache *tc);
/* Add the thread's counters to its arena. Lock held. */
void emm_tc_apply_delta(struct tcache *tc);
/* The counters added and the thread's epoch joins the arena's open one.
 * Lock held. */
void emm_tc_pending_to_open(struct tcache *tc);

#endif
