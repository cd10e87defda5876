/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_types.h - the heap's private data structures: blocks,
 * segments, fences, an arena's counters, the arena and the heap of arenas.
 * Included by heap_internal.h alone (which holds the lock order, the
 * inline helpers and the prototypes over them); nothing outside
 * allocator/heap*.c sees these.
 *
 * In front of the arenas sits each thread's cache (heap_tcache.c): blocks
 * in it are LIVE with `tcached` set, in no tree and no fence, reached only
 * by that thread until it flushes.
 *
 * Data structures (all per arena, under its mutex):
 *   - segments: what the source gave, in a doubly linked list; each holds
 *     its blocks in address order (prev/next), which tile it exactly.
 *   - blocks: one struct per piece of a segment, recycled through a free
 *     list and allocated in slabs, so the steady state never mallocs. A
 *     block is LIVE (the program holds it), READY (free, under a stream
 *     key: 0 = ready-any, S = ready-stream S) or PENDING (free, on a
 *     fence's list, in no index).
 *   - per pool (small and large), two indexes of ready blocks: ready-any
 *     blocks in a segregated-fit index (sfit.h: best fit in a few bitmap
 *     operations, every allocation searches it), ready-stream blocks in a
 *     red-black tree keyed (stream key, size, address), where best fit is
 *     a lower_bound on (key, rounded size, 0). A block is in one at most,
 *     so its node is a union of the two.
 *   - fences: the open epoch collects synchronous frees; a closed fence
 *     carries its events and its blocks and sits in a FIFO polled on the
 *     allocation miss path. Closing an epoch with no live non-blocking
 *     stream makes its blocks ready-any at once (the legacy-stream event
 *     orders every later use; see emm_heap_last_fence). A fence whose
 *     events are being recorded (lock dropped) sits on the busy list: its
 *     blocks are pending like any other until it is published.
 *   - orphans: ready-stream blocks of a stream destroyed while no marker
 *     could be recorded on it (capture, failed record); its work may still
 *     run. Blocking-class ones join the next epoch close (the legacy-stream
 *     event orders a destroyed blocking stream's earlier work); non-blocking
 *     ones wait for a device-wide synchronize (heap_fence.c says why).
 *   - garbage: events to release and fence structs to recycle, gathered
 *     under the lock and released by the thread that drops it
 *     (arena_unlock_release).
 *   - idle list: segments whose only block is ready-any (whole and free),
 *     the candidates for release, oldest first.
 *   - granule bitmaps (page-granular heaps, heap_pages.c): per segment,
 *     which granules have memory behind them and which are being mapped.
 *     Only granules wholly inside a ready-any block may be unmapped, and
 *     only after the arena's last legacy event completed (lf_done): a
 *     fast-path epoch's blocks are ready-any before it has.
 */
#ifndef EMM_ALLOCATOR_HEAP_TYPES_H
#define EMM_ALLOCATOR_HEAP_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/blocktab.h"
#include "allocator/heap.h"
#include "allocator/sfit.h"
#include "allocator/tree.h"

#define POOL_SMALL 0u
#define POOL_LARGE 1u
#define NPOOLS     2u

enum block_state {
	BLOCK_UNUSED = 0, /* on the recycle list */
	BLOCK_LIVE,
	BLOCK_READY,
	BLOCK_PENDING,
	BLOCK_RESERVED, /* a steal candidate, out of its index while its fence op runs */
	BLOCK_MERGING,  /* inside emm_pool_ready_list only */
};

struct emm_segment;
struct emm_fence;

struct emm_block {
	union {
		struct emm_sfit_node fnode; /* READY, key 0: in ready[pool] */
		struct emm_tree_node node;  /* READY, key S: in trees[pool], key (S, size, addr) */
	};
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
	/* Freed into a thread's cache (heap_tcache.c): in no tree and no fence,
	 * reached by no other thread until that cache flushes. Its state stays
	 * BLOCK_LIVE there (the cache never writes state without the lock; a
	 * locked neighbour's merge sees a block that is not ready), and this
	 * flag, written without the lock (relaxed), tells it from a live one:
	 * TC_READY (reusable by that thread) or TC_PENDING (in its epoch). */
	_Atomic uint8_t tcached;
};

#define TC_READY   1u
#define TC_PENDING 2u

struct emm_segment {
	struct arena *arena;             /* never changes: segment structs are never freed before the heap */
	struct emm_segment *prev, *next; /* live segments; recycle list through next */
	struct emm_segment *idle_prev, *idle_next;
	struct emm_segment *all_next; /* every struct ever made, for destroy */
	struct emm_block *first, *last;
	emm_addr_t base;
	size_t size;
	emm_stream_t stream; /* key of the allocation that opened it (grow in place) */
	/* Page-granular heaps (heap_pages.c); gmap NULL: not page-managed. */
	uint64_t *gmap;  /* bit i set: granule i has memory behind it */
	uint64_t *gbusy; /* bit i set: granule i is being mapped, lock dropped */
	size_t gwords;   /* words allocated in each */
	size_t unmapped; /* granules not mapped (0 on the hot path) */
	unsigned paging; /* map/unmap calls in flight, lock dropped: no grow meanwhile */
	uint8_t pool;
	bool live;
	bool idle;    /* on the idle list: one block, ready-any */
	bool growing; /* a grow in place runs, lock dropped */
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
	emm_stream_t *targets;       /* busy: the streams to record events[i] on */
	unsigned rel_from;           /* garbage: release events[rel_from..nevents) */
	unsigned holds;              /* threads querying/synchronizing its events, lock dropped */
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
	uint64_t page_unmaps, page_maps, unmapped_total, remapped_total, grows, grown_total;
};

#define LONE_MAX 8u /* garbage events not held by a fence struct */

/* One arena: everything below is under its lock. */
struct arena {
	atomic_int lock; /* 0 free, 1 held, 2 held and contended (arena_lock, heap_internal.h) */
	/* Waits with the lock dropped (emm_arena_wait, heap.c): for an
	 * inflight[] count to drop to 0, for a map or grow in flight. */
	pthread_mutex_t wait_lock;
	pthread_cond_t wait_cv;
	atomic_uint wake_gen; /* bumped by every emm_arena_wake */
	struct emm_heap *owner;
	uint64_t bit; /* 1 << its index in owner->arenas (owner->holding) */
	struct emm_heap_params p;
	struct emm_segment_source src;
	struct emm_fence_ops fops;
	bool has_fence;
	struct emm_segment_pages pg; /* page-granular segments (heap_pages.c) */
	bool has_remap, has_grow;
	unsigned map_waiters; /* waiting for a map or grow in flight */

	struct emm_blocktab tab;       /* live blocks by address (blocktab.h) */
	struct emm_sfit ready[NPOOLS]; /* ready-any blocks */
	struct emm_tree trees[NPOOLS]; /* ready-stream blocks */
	struct emm_block *block_free;
	struct emm_fence *open;              /* never NULL */
	struct emm_fence *fq_head, *fq_tail; /* closed fences, oldest first */
	struct emm_fence *busy;              /* fences being recorded or synchronized, lock dropped */
	struct emm_fence *orphans[2];        /* [0] blocking-class, [1] non-blocking (never NULL) */
	struct emm_fence *dead;              /* garbage: fences whose events await release */
	uint64_t lone[LONE_MAX];             /* garbage: events to release */
	unsigned nlone;
	bool has_garbage;
	unsigned inflight[2], inflight_phase, inflight_waiters;
	struct heap_counters st;
	int64_t d_allocated, d_requested; /* not yet added to the owner's bytes */

	struct emm_segment *segs; /* live segments */
	struct emm_segment *idle_head, *idle_tail;
	struct emm_segment *seg_free, *seg_all;
	struct emm_fence *fence_free;
	_Atomic(struct emm_fence *) fence_returned; /* recycled without the lock: pushed, taken whole */
	void *slabs; /* block slabs, chained through their first word */

	emm_stream_t *nb; /* live non-blocking streams */
	unsigned nb_count, nb_cap;
	unsigned nb_gen; /* bumped by each non-blocking stream created */
	emm_stream_t carrier;  /* emm_heap_carrier_joined's stream (0: none yet); in nb while it may be busy */
	unsigned carrier_gen;  /* bumped each time the carrier joins */
	bool order_lost;       /* emm_heap_order_lost: closes park their blocks as orphans */
	unsigned order_lost_gen; /* bumped by each emm_heap_order_lost */

	uint64_t last_fence;
	bool has_last_fence;
	struct emm_fence *last_fence_owner; /* pending fence whose events[0] it is */
	unsigned lf_users;                  /* threads waiting on last_fence, lock dropped: keep it */
	unsigned lf_gen;                    /* bumped each time last_fence is replaced */
	bool lf_done; /* last_fence known complete (page give-back synchronized on it) */
	bool warned_query;
	size_t pending_limit; /* p.pending_limit, doubled after each wait that timed out */
	size_t epoch_free_bytes; /* a synchronous free closes the open epoch at these bytes */
	/* The open epoch's quota of frees: p.epoch_max_blocks, doubled in
	 * every arena of a heap that is not page-granular once EPOCH_WIDE_ARENAS
	 * of its arenas hold memory (emm_pool_note_holding, heap_pool.c). The
	 * driver serialises the event records of threads that close epochs
	 * at once: on 16 threads, steady state, 64-free epochs made 29.2 M
	 * pairs/s, 128-free ones 34.2 (tests/bench/RESULTS.md section 33, run
	 * E6). Stored by the thread that crosses the threshold without this
	 * arena's lock; read under it (arena_epoch_blocks). */
	atomic_uint epoch_blocks;
};

/* Arenas holding memory (distinct allocating threads, in practice) from
 * which every arena's epochs take twice the frees. */
#define EPOCH_WIDE_ARENAS 8u

/* The open epoch's quota of frees now (struct arena's epoch_blocks). */
static inline unsigned arena_epoch_blocks(struct arena *h)
{
	return atomic_load_explicit(&h->epoch_blocks, memory_order_relaxed);
}

/* Freed bytes close an epoch when a miss needs memory and they reach
 * p.epoch_max_bytes; a synchronous free closes it by bytes only at this
 * many times that (the hard bound on what an open epoch parks), or at
 * p.epoch_max_bytes on a heap with a release threshold (heap.c). */
#define EPOCH_HARD_FACTOR 16u

/*
 * A heap is a set of arenas, one per CPU by default (at most MAX_ARENAS,
 * a power of two). Each thread takes a slot on its first allocation
 * (round-robin) and serves both pools from its arena: with one shared
 * state every allocation moves the same cache lines (lock, counters, tree
 * nodes) between cores; measured on a 16-core host 8 threads paid
 * 10-14 us per cached pair against 87 ns with a heap each, and routing
 * requests over 1 MiB to the thread's own arena instead of arena 0 took 8
 * threads from 1.6 to about 10 M pairs/s on an H200 (project issue 11).
 * A free goes to the arena that owns the block's segment. With
 * large_shared (page-granular heaps holding their peak, EMM_HOLD_PEAK),
 * the large pool is arena 0's alone.
 */
#define MAX_ARENAS 64u

struct emm_heap {
	unsigned narenas; /* a power of two */
	int device;
	bool tcache;  /* params.thread_cache: synchronous frees go through thread caches */
	/* params.hold_peak on a heap with page give-back: every thread's
	 * large requests go to arena 0, so one set of segments grows and
	 * gives back (as PyTorch's one expandable segment per stream) instead
	 * of each thread's arena keeping its own idle pages mapped. */
	bool large_shared;
	uint64_t uid; /* unique per heap of the process, for the thread caches */
	struct arena *arenas[MAX_ARENAS];
	/* Bit i: arena i has had a segment (set on its first, never cleared).
	 * A miss looks for ready blocks only in those (heap_alloc.c): with 64
	 * CPUs and 16 threads the other 48 arenas are empty. */
	_Atomic uint64_t holding;
	/* Heap-wide bytes for the peaks (per-arena peaks do not add up):
	 * reserved exactly (segments change rarely); allocated and requested
	 * from per-arena deltas, flushed once they grow by STAT_FLUSH_UP or
	 * shrink by STAT_FLUSH_DOWN (so an alloc/free cycle flushes nothing),
	 * which bounds the peak's error by narenas times those. With one
	 * arena none of this runs: the arena's own peaks are exact. Reads
	 * (heap_stats.c) combine these with the arenas' exact peaks into an
	 * upper bound and its error (emm_stats' *_peak_error): exact with one
	 * arena used, or when the arenas peaked together. No shared counter
	 * is touched per allocation. */
	_Atomic int64_t reserved, allocated, requested;
	_Atomic int64_t reserved_peak, allocated_peak, requested_peak;
};

#endif
