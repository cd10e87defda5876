/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_internal.h - what the files that implement heap.h (heap.c,
 * heap_life.c, heap_size.c, heap_pool.c, heap_segs.c, heap_fence.c,
 * heap_fence_poll.c, heap_stream.c, heap_oom.c, heap_stats.c, heap_check.c)
 * share beyond the heap's private structures (heap_types.h, included
 * here): the lock order, the small inline helpers of the alloc/free path,
 * and the prototypes those files call across each other. Nothing outside
 * allocator/heap*.c includes it.
 *
 * Lock order: heap lock, then the segment map's lock (segmap insert and
 * check run under the heap lock), or then the arena's wait_lock
 * (emm_arena_wake; emm_arena_wait takes it with the heap lock dropped).
 * An arena's block table (blocktab.h) is touched only under that arena's
 * lock; the segment map's lookups take no lock. The heap lock is
 * dropped around the segment source and around every fence operation
 * (record, query, stream_wait, synchronize, release, device_synchronize:
 * driver calls in production): under the lock a caller only takes the
 * blocks off and reserves the fence, then calls the op through the fop_*
 * wrappers below (which abort in debug builds if an arena lock is held),
 * then retakes the lock to publish. `capturing` is a state query and may
 * be asked under the lock. A function documented "lock held" may drop and
 * retake it inside; callers re-read any state they looked at before.
 *
 * Streams named by an op run with the lock dropped (records on a live
 * non-blocking stream, on a steal candidate's owner) are counted in
 * inflight[]; emm_heap_stream_destroyed waits for those to finish before
 * the stream's handle may go.
 *
 * The helpers below are static inline because the cached alloc/free pair
 * (tens of ns) runs through them; the build has no LTO, so a helper the hot
 * path calls in another file must be defined here to stay inlinable.
 */
#ifndef EMM_ALLOCATOR_HEAP_INTERNAL_H
#define EMM_ALLOCATOR_HEAP_INTERNAL_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/heap.h"
#include "allocator/heap_types.h"
#include "allocator/tree.h"
#include "common/compiler.h"

/* --- per-arena memory ------------------------------------------------------ */

/* Zeroed memory on cache lines of its own, for what one arena's thread
 * writes (the arena, its segments, its block slabs): malloc packs such
 * structs back to back, and then one thread's reads of its arena's tail
 * missed on every free while the next arena's thread took its lock (false
 * sharing). Freed with free(). */
/* What heap_zalloc_lines asks for: whole cache lines. */
static inline size_t heap_lines_size(size_t size)
{
	return (size + 63) & ~(size_t)63;
}

static inline void *heap_zalloc_lines(size_t size)
{
	void *p;
	size_t rounded = heap_lines_size(size);

	if (posix_memalign(&p, 64, rounded) != 0)
		return NULL;
	memset(p, 0, rounded);
	return p;
}

/* --- locking and fence operations --------------------------------------- */

#ifndef NDEBUG
/* Arena locks this thread holds (debug builds): a fence op called with one
 * held aborts (emm_heap_lock_violation, heap.c). */
extern _Thread_local unsigned emm_heap_lock_depth __attribute__((tls_model("initial-exec")));
__attribute__((noreturn)) void emm_heap_lock_violation(const char *op);
#define FOP_CHECK(op)                                       \
	do {                                                \
		if (EMM_UNLIKELY(emm_heap_lock_depth != 0)) \
			emm_heap_lock_violation(op);        \
	} while (0)
#else
#define FOP_CHECK(op) ((void)0)
#endif

/*
 * The arena lock: 0 free, 1 held, 2 held with a sleeper perhaps (a futex
 * word, Drepper's "mutex 2"). Critical sections are a few list and index
 * operations (no driver call, no host wait), and with an arena per CPU the
 * lock is nearly always free; so its unlock, uncontended, is a load and a
 * release store, not the atomic exchange of a pthread mutex's unlock,
 * which cost a one-thread alloc+free pair 11-21 % on the CPU test double
 * (tests/bench/RESULTS.md section 30). A waiter spins a little, then
 * sleeps on the futex (emm_arena_lock_slow, heap.c), as glibc's adaptive
 * mutex before it did: a lock that spun only was 2x slower when two CPUs
 * shared an arena and 2.5-3.5x slower with more threads than CPUs (section
 * 30), and one that slept at once made 16 threads of bench-core's working
 * set pay 886-981 ns a pair against 598-742 (section 28, run F). A
 * sleeper that marked the word in the nanoseconds between a fast unlock's
 * load and store is not woken by it: its sleep is bounded (ARENA_NAP_NS,
 * 50 µs), then it looks again.
 * Waiting for a condition with the lock dropped is emm_arena_wait /
 * emm_arena_wake.
 */
void emm_arena_lock_slow(struct arena *h);
void emm_arena_unlock_slow(struct arena *h);

static inline void arena_lock(struct arena *h)
{
	int z = 0;

	if (EMM_UNLIKELY(!atomic_compare_exchange_strong_explicit(&h->lock, &z, 1, memory_order_acquire,
	                                                          memory_order_relaxed)))
		emm_arena_lock_slow(h);
#ifndef NDEBUG
	emm_heap_lock_depth++;
#endif
}

/* Lock h if no other thread holds it: true when locked. */
static inline bool arena_trylock(struct arena *h)
{
	int z = 0;

	if (atomic_load_explicit(&h->lock, memory_order_relaxed) ||
	    !atomic_compare_exchange_strong_explicit(&h->lock, &z, 1, memory_order_acquire, memory_order_relaxed))
		return false;
#ifndef NDEBUG
	emm_heap_lock_depth++;
#endif
	return true;
}

static inline void arena_unlock(struct arena *h)
{
#ifndef NDEBUG
	emm_heap_lock_depth--;
#endif
	if (EMM_LIKELY(atomic_load_explicit(&h->lock, memory_order_relaxed) == 1))
		atomic_store_explicit(&h->lock, 0, memory_order_release);
	else
		emm_arena_unlock_slow(h);
}

/* Lock held: drop it until the next emm_arena_wake on h (or spuriously),
 * then take it again; callers loop on their condition. */
void emm_arena_wait(struct arena *h);
/* Lock held: wake every emm_arena_wait on h. */
void emm_arena_wake(struct arena *h);

/* Every call of h->fops goes through these (but `capturing`: f_capturing). */
static inline int fop_record(struct arena *h, emm_stream_t s, uint64_t *ret_event)
{
	FOP_CHECK("record");
	return h->fops.record(h->fops.ctx, s, ret_event);
}

static inline int fop_query(struct arena *h, uint64_t ev)
{
	FOP_CHECK("query");
	return h->fops.query(h->fops.ctx, ev);
}

static inline int fop_stream_wait(struct arena *h, emm_stream_t s, uint64_t ev)
{
	FOP_CHECK("stream_wait");
	return h->fops.stream_wait(h->fops.ctx, s, ev);
}

static inline int fop_synchronize(struct arena *h, uint64_t ev)
{
	FOP_CHECK("synchronize");
	return h->fops.synchronize(h->fops.ctx, ev);
}

static inline void fop_release(struct arena *h, uint64_t ev)
{
	FOP_CHECK("release");
	h->fops.release(h->fops.ctx, ev);
}

static inline int fop_device_synchronize(struct arena *h)
{
	FOP_CHECK("device_synchronize");
	return h->fops.device_synchronize(h->fops.ctx);
}

/* Not a marker's stream when the op is missing: -EBUSY (record one). */
static inline int fop_stream_idle(struct arena *h, emm_stream_t s)
{
	if (!h->fops.stream_idle)
		return -EBUSY;
	FOP_CHECK("stream_idle");
	return h->fops.stream_idle(h->fops.ctx, s);
}

/* Garbage taken off an arena under its lock, released after it drops. */
struct fgarbage {
	struct emm_fence *dead;
	uint64_t lone[LONE_MAX];
	unsigned nlone;
};

void emm_heap_garbage_take(struct arena *h, struct fgarbage *g);
void emm_heap_garbage_release(struct arena *h, struct fgarbage *g);

/* Drop the lock, then release what the locked section left as garbage. */
static inline void arena_unlock_release(struct arena *h)
{
	if (EMM_LIKELY(!h->has_garbage)) {
		arena_unlock(h);
		return;
	}
	struct fgarbage g;
	emm_heap_garbage_take(h, &g);
	arena_unlock(h);
	emm_heap_garbage_release(h, &g);
}

/* --- statistics helpers --------------------------------------------------- */

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

/* Compared as signed: with thread caches an arena's count can be below zero
 * for a while (another thread's frees added before the allocations they
 * free, which still sit in the allocating thread's cache counters). */
static inline void stat_add(uint64_t *cur, uint64_t *peak, uint64_t *total, uint64_t v)
{
	*cur += v;
	if ((int64_t)*cur > (int64_t)*peak)
		*peak = *cur;
	*total += v;
}

/* Push this arena's byte deltas into the heap-wide counters (heap_stats.c). */
void emm_heap_stat_flush(struct arena *h);

static inline void stat_delta(struct arena *h, int64_t allocated, int64_t requested)
{
	if (h->owner->narenas == 1)
		return;
	h->d_allocated += allocated;
	h->d_requested += requested;
	if (EMM_UNLIKELY(h->d_allocated >= STAT_FLUSH_UP || h->d_allocated <= -STAT_FLUSH_DOWN))
		emm_heap_stat_flush(h);
}

/* --- hot-path helpers ----------------------------------------------------- */

static inline struct emm_block *node_block(struct emm_tree_node *n)
{
	return (struct emm_block *)((char *)n - offsetof(struct emm_block, node));
}

static inline struct emm_block *fnode_block(struct emm_sfit_node *n)
{
	return (struct emm_block *)((char *)n - offsetof(struct emm_block, fnode));
}

/* Mark a block as in neither index (the union's two views both say so). */
static inline void block_unindex(struct emm_block *b)
{
	emm_tree_node_clear(&b->node);
	b->fnode.linked = false;
}

/* Is a block that is not ready in neither index? (A ready block is in the
 * one of its key: heap_check.c.) */
static inline bool block_unindexed(const struct emm_block *b)
{
	return !emm_tree_node_linked(&b->node) && !b->fnode.linked;
}

/* Best fit among the blocks ready under `key`, honouring the oversize rules
 * (blocks >= max_split serve only requests >= max_split, and only within
 * max_nosplit_slack of their size). The smallest fitting block is the first
 * candidate, so if it fails the rules every larger one does too. */
static inline struct emm_block *find_fit(struct arena *h, unsigned pool, emm_stream_t key, size_t rounded)
{
	struct emm_block *b;

	if (EMM_LIKELY(key == 0)) {
		struct emm_sfit_node *f = emm_sfit_best(&h->ready[pool], rounded);
		if (!f)
			return NULL;
		b = fnode_block(f);
	} else {
		struct emm_tree_node *n = emm_tree_lower_bound(&h->trees[pool], key, rounded, 0);
		if (!n || n->key[0] != key)
			return NULL;
		b = node_block(n);
	}
	size_t sz = b->size;
	if (EMM_UNLIKELY(sz >= h->p.max_split)) {
		if (rounded < h->p.max_split)
			return NULL;
		if (sz - rounded >= h->p.max_nosplit_slack)
			return NULL;
	}
	return b;
}

/* The best fit for an allocation on `stream`: its own key, then ready-any. */
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

/* A live block is free again: undo its live accounting. */
static inline void untake_accounting(struct arena *h, struct emm_block *b)
{
	h->st.frees++;
	h->st.live_blocks--;
	h->st.allocated -= b->size;
	h->st.requested -= b->requested;
	stat_delta(h, -(int64_t)b->size, -(int64_t)b->requested);
}

/* Put a free block on fence f's list: pending until f completes. */
static inline void pending_add(struct arena *h, struct emm_fence *f, struct emm_block *b)
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

/* --- heap_pool.c: blocks, trees, splitting and coalescing ---------------- */

/* Make a free block ready under `key` (0: any), merging with neighbours that
 * are ready under the same key. Never merges live or pending blocks. */
struct emm_block *emm_pool_block_ready(struct arena *h, struct emm_block *b, emm_stream_t key);
/* The same (key 0) for every block of a list through link, each free and in
 * no index: one index operation per run of neighbours, not two a block. */
void emm_pool_ready_list(struct arena *h, struct emm_block *list);
/* Take a ready block out of its index (its segment off the idle list). */
void emm_pool_unready(struct arena *h, struct emm_block *b);

/* Hand out a ready block: take it out of its tree, split off the remainder
 * (which stays ready under the same key), mark it live. Returns the live
 * block: a new struct when a ready-any b splits (b stays the remainder). */
struct emm_block *emm_pool_take_block(struct arena *h, struct emm_block *b, size_t rounded, size_t size,
                                      emm_stream_t stream);
/* Reserve a ready block (steal candidate): out of its tree, state RESERVED. */
void emm_pool_reserve(struct arena *h, struct emm_block *b);
/* emm_pool_take_block for a reserved block (no tree to leave; the
 * remainder merges with ready neighbours of its key). */
void emm_pool_take_reserved(struct arena *h, struct emm_block *b, size_t rounded, size_t size,
                            emm_stream_t stream);

/* Gather the blocks ready under `key` (both pools) into a list through
 * link, taking them out of the trees and marking them pending. */
struct emm_block *emm_pool_collect_key(struct arena *h, emm_stream_t key);
/* Is any block ready under `key`, in either pool? */
bool emm_pool_has_key(struct arena *h, emm_stream_t key);
/* The smallest stream key > after present in either tree, or 0 if none. */
emm_stream_t emm_pool_next_key(struct arena *h, emm_stream_t after);

/* Block metadata from the arena's slabs (NULL without memory), and back. */
struct emm_block *emm_pool_block_new(struct arena *h);
void emm_pool_block_recycle(struct arena *h, struct emm_block *b);

/* --- heap_segs.c: segments ------------------------------------------------ */

/* Arena h has a new segment. On its first, set its bit in owner->holding,
 * and widen every arena's epochs when that makes EPOCH_WIDE_ARENAS
 * (heap_types.h). h's lock held; the other arenas' quotas are stored
 * without theirs. */
void emm_pool_note_holding(struct arena *h);

/* Bytes of a segment with memory behind them. */
static inline size_t seg_mapped_bytes(const struct arena *h, const struct emm_segment *s)
{
	return s->size - s->unmapped * h->pg.granularity;
}

/* A new segment of seg_size from the source (lock dropped around the call),
 * its whole block ready-any in *ret. 0, or the source's error. */
int emm_pool_grow(struct arena *h, unsigned pool, size_t seg_size, emm_stream_t stream,
                  struct emm_block **ret);

/* Take idle segments off the arena until at most `keep` idle bytes remain;
 * give them back with emm_pool_release_finish once the lock is dropped. */
struct emm_segment *emm_pool_release_collect(struct arena *h, size_t keep);
long long emm_pool_release_finish(struct arena *h, struct emm_segment *list);

/* Does stream capture forbid recording on / querying for s now
 * (EMM_STREAM_SYNC: is any global capture active)? */
static inline bool f_capturing(struct arena *h, emm_stream_t s)
{
	return h->has_fence && h->fops.capturing && h->fops.capturing(h->fops.ctx, s);
}

/* --- heap_alloc.c: the allocation miss path ------------------------------- */

/* The miss path: completed fences, epoch pressure, stealing, a ready block
 * of another arena (then *ret is that arena's), growing in place or a new
 * segment, the OOM retry; the block taken (live) in *ret.
 * Lock held, dropped around fence ops and the source. */
int emm_heap_alloc_slow(struct arena *h, unsigned pool, size_t rounded, size_t size, emm_stream_t stream,
                        struct emm_block **ret);

/* The block taken in *ret lies over unmapped granules: map them; on
 * out-of-memory give back cache and retry the allocation once. 0 and the
 * block to hand out in *ret, or -errno (nothing taken). Lock held. */
int emm_heap_alloc_map(struct arena *h, unsigned pool, size_t rounded, size_t size, emm_stream_t stream,
                       struct emm_block **ret);

/* --- heap_pages.c: page-granular segments -------------------------------- */

/* A new segment: every granule mapped (no bitmap if the heap has no pages,
 * the segment is not granule-aligned, or there is no memory for one). */
void emm_pages_seg_init(struct arena *h, struct emm_segment *s);
void emm_pages_seg_drop(struct emm_segment *s); /* destroy: free the bitmaps */

/* Map every unmapped granule under live block b, which is not handed out
 * yet. 0, or the source's error (those granules stay unmapped). Lock held;
 * dropped around the calls (waits for maps of shared granules in flight). */
int emm_pages_map_block(struct arena *h, struct emm_block *b);

/* Unmap the granules wholly inside ready-any blocks, largest blocks first,
 * until at most `keep` idle bytes (reserved - allocated) remain. Returns the
 * bytes given back. Lock held; dropped around the calls. */
size_t emm_pages_release(struct arena *h, size_t keep);

/* Before memory of ready-any blocks is unmapped (emm_pages_release, a
 * page-granular heap's segment free): the work that may still use it. A
 * fast-path epoch makes its blocks ready-any before its legacy event
 * completes (stream order covers their reuse, but cuMemUnmap is not stream-
 * ordered), and the stream free mode makes them ready at the free: wait for
 * the arena's last legacy event, or the device in stream mode.
 * emm_pages_wait_begin (lock held, after the blocks concerned are out of
 * their trees) says what to wait for: 0, or -EBUSY when a wait is needed
 * and cannot be made (capture, no op; then nothing may be unmapped);
 * emm_pages_wait_run (lock not held) waits, 0 or the op's error;
 * emm_pages_wait_end (lock held) publishes it. */
enum emm_pages_wait_kind { PAGES_WAIT_NONE, PAGES_WAIT_EVENT, PAGES_WAIT_DEVICE };
struct emm_pages_wait {
	enum emm_pages_wait_kind kind;
	uint64_t ev; /* PAGES_WAIT_EVENT: the arena's last legacy event */
};
int emm_pages_wait_begin(struct arena *h, struct emm_pages_wait *w);
int emm_pages_wait_run(struct arena *h, const struct emm_pages_wait *w);
void emm_pages_wait_end(struct arena *h, const struct emm_pages_wait *w, int r);

/* About to map `need` more bytes (grow, new segment, remap under a block):
 * if the heap's mapped bytes would pass their high-water mark, give back
 * that many idle pages first (ready-any only, as emm_pages_release), this
 * arena's then the others' - so the device sees the memory move rather
 * than grow (EMM_HOLD_PEAK). Nothing without page give-back or when off.
 * Lock held; dropped around the calls and while other arenas are visited:
 * the caller's taken block stays its own, its lookups must be fresh. */
void emm_pages_hold_peak(struct arena *h, size_t need);
/* The bytes of the granules under block b that have no memory behind them
 * (emm_pages_map_block would map them). Lock held. */
size_t emm_pages_unmapped_under(const struct arena *h, const struct emm_block *b);
/* About what a miss for `rounded` on `stream` maps: the growth of the
 * segment emm_pages_grow would grow, else a new segment's seg_size. */
size_t emm_pages_grow_need(const struct arena *h, size_t rounded, emm_stream_t stream, size_t seg_size);

/* Grow the arena's newest large segment of `stream` in place so that its
 * tail can serve `rounded`: 0 and the ready-any tail block in *ret;
 * -ENOSPC (no such segment, or it cannot grow: open a new one), -EAGAIN
 * (another grow of it just finished: look again), -ENOMEM, or another
 * error. Lock held; dropped around the call. */
int emm_pages_grow(struct arena *h, size_t rounded, emm_stream_t stream, struct emm_block **ret);

/* --- heap_oom.c: out of memory ------------------------------------------- */

/* Fence, synchronize and release everything idle in the arena (lock held,
 * dropped around ops); then in the other arenas, one locked at a time. */
bool emm_heap_pending_wait(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream,
                           struct emm_block **ret);
void emm_heap_oom_recover(struct arena *h);
void emm_heap_oom_recover_others(struct arena *h);

/* --- heap_fence.c: fences, epochs, orphans; heap_stream.c: streams, in flight */

struct emm_fence *emm_heap_fence_new(struct arena *h);
/* Move every pending block of `from` to fence `to`. */
void emm_heap_fence_move(struct arena *h, struct emm_fence *from, struct emm_fence *to);
bool emm_heap_is_nonblocking(const struct arena *h, emm_stream_t s);
/* s leaves h's non-blocking streams: whether it was one. Lock held. */
bool emm_heap_nb_remove(struct arena *h, emm_stream_t s);
/* Ops that name a stream with the lock dropped: enter/leave around them
 * (lock held at both); quiesce waits for those already started. */
unsigned emm_heap_inflight_enter(struct arena *h);
void emm_heap_inflight_leave(struct arena *h, unsigned phase);
void emm_heap_inflight_quiesce(struct arena *h);
void emm_heap_fence_reset(struct emm_fence *f);
/* Every block of a completed fence becomes ready-any (for heap_fence_poll.c). */
void fence_release_blocks(struct arena *h, struct emm_fence *f);
/* A finished fence: its events become garbage, the struct is recycled. */
void emm_heap_fence_recycle(struct arena *h, struct emm_fence *f);
/* Release every garbage event and struct of a heap no thread uses any more
 * (destroy); with `call_ops` false just forget the events. */
void emm_heap_garbage_drop(struct arena *h, bool call_ops);

/* The stream an event must be recorded on to order work of stream key s. */
emm_stream_t emm_heap_fence_target(const struct arena *h, emm_stream_t s);

/* Close the open epoch: 0, -EBUSY (capture: stays open), or -errno. Lock
 * held; dropped around the records. */
int emm_heap_close_epoch(struct arena *h);

/* Close a thread cache's epoch: the blocks of `list` (linked through link,
 * accounted as freed, in no fence) and the open epoch's become one fence,
 * recorded like the open epoch (orphans of blocking streams join it). On the
 * fast path (no live non-blocking stream) they come back at once in
 * *ret_ready (BLOCK_LIVE, tcached, ready-any for the caller's cache); else
 * the fence is queued, or on failure (-EBUSY under capture, -errno) the
 * blocks join the open epoch. Lock held; dropped around the records. */
int emm_heap_close_blocks(struct arena *h, struct emm_block *list, struct emm_block **ret_ready);

/* --- heap_tcache.c, heap_tcache_registry.c: the per-thread front cache --- */

/* The arena the calling thread allocates from in `heap` (heap.c). */
struct arena *emm_heap_thread_arena(const struct emm_heap *heap);

/* Serve an allocation from the calling thread's cache: the block (live,
 * accounted in the thread's counters) in *ret, or false. No lock. */
bool emm_tcache_alloc(struct emm_heap *heap, unsigned pool, size_t rounded, size_t size,
                      emm_stream_t stream, struct emm_block **ret);
/* A synchronous free (not strict) of live block b, out of its arena's table,
 * in a heap with the cache on (the caller asks heap->tcache): true if the
 * calling thread's cache took it. No lock on the hot path. */
bool emm_tcache_free(struct emm_block *b);
/* An arena miss of `rounded`: if the calling thread's epoch holds half the
 * quota and a block that could serve it, its blocks join the open epoch
 * (for the pressure rule to close). Lock held, never dropped. */
void emm_tcache_pressure_locked(struct arena *h, size_t rounded);
/* The calling thread's cached blocks of arena h back to it (OOM retry). */
void emm_tcache_flush_locked(struct arena *h);
/* The calling thread's counters for arena h into it (an allocation the
 * arena serves: its peaks stay exact for one thread). Lock held. */
void emm_tcache_apply_locked(struct arena *h);
/* Everything in the calling thread's cache of `heap` back to it. No lock. */
void emm_tcache_sync(struct emm_heap *heap);
/* Statistics: between begin and end (no arena lock held at begin), with
 * arena h locked, add every thread's counters for h to *c (merged on read)
 * and return the bytes pending in their epochs. */
void emm_tcache_stats_begin(void);
void emm_tcache_stats_end(void);
size_t emm_tcache_add_counters(struct arena *h, struct heap_counters *c);
/* A uid for a new heap; a heap about to go (every cache forgets its
 * blocks); every cache to flush at its next use (trim). */
void emm_tcache_heap_created(struct emm_heap *heap);
void emm_tcache_heap_destroyed(struct emm_heap *heap);
void emm_tcache_flush_all(void);

/* Completed fences' blocks to ready-any; true if any. Lock held, dropped
 * around the queries (heap_fence_poll.c). */
bool emm_heap_poll_fences(struct arena *h);

/* Fence every block ready under `key` with one event recorded on `target`
 * (lock held; dropped around the record). On failure the blocks go to
 * `fail_to` (pending there) if not NULL, else back to ready under key. */
int emm_heap_fence_key(struct arena *h, emm_stream_t key, emm_stream_t target, struct emm_fence *fail_to);

/* Non-blocking orphans (and blocking ones with them) after a device-wide
 * synchronize, if no capture forbids it: 0, -EBUSY, or -errno; 0 too if
 * there are none. Lock held; dropped around the synchronize. */
int emm_heap_resolve_orphans(struct arena *h);

/* A ready-stream block of another stream, made safe to use on `stream`,
 * back in its tree for emm_pool_take_block. Lock held; dropped around the
 * fence ops. */
struct emm_block *emm_heap_try_steal(struct arena *h, unsigned pool, size_t rounded, emm_stream_t stream);

#endif
