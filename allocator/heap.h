/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap.h - the caching allocator for one memory space: the device
 * memory of one CUDA context, or the pinned host memory of one flag set.
 *
 * This is the contract interpose/ codes against. The allocator knows nothing
 * of symbol names, CUDA types or environment variables: memory comes from a
 * segment source (a backend instance), completion markers from fence ops
 * (the real driver's events, or a test double), and policy from params.
 *
 * Pools: requests up to params.small_max go to the small pool, carved from
 * params.small_segment segments; larger requests go to the large pool
 * (requests below params.large_segment/2 share segments of about
 * large_segment holding a whole number of them, see heap_size.c; larger
 * ones get the request rounded to params.large_round).
 * Sizes round to 512 B (or power-of-two divisions). Free blocks live in
 * best-fit trees keyed by (stream, size, address); neighbours coalesce.
 *
 * Free blocks are in one of three states:
 *   ready-any      - reusable by any allocation (its fences completed);
 *   ready-stream S - freed with a stream-ordered free on S: reusable at once
 *                    by stream-ordered allocations on S, by others only after
 *                    a marker recorded on S completes or is waited on;
 *   pending        - freed, waiting on a fence (an epoch of synchronous frees
 *                    or an event); out of reach of every allocation until the
 *                    fence completes.
 *
 * Stream keys (emm_stream_t): EMM_STREAM_SYNC for synchronous calls
 * (cuMemAlloc/cuMemFree carry no stream), EMM_STREAM_LEGACY for the legacy
 * default stream, a per-thread default stream is (thread_index << 8) | 2,
 * any other stream is its CUstream handle value. Only streams announced with
 * emm_heap_stream_created(..., nonblocking=true) are treated as non-blocking;
 * every other key is blocking-class (ordered by the legacy stream).
 *
 * Thread safety: every function may be called from any thread concurrently.
 * No fence op and no segment source call is made while the heap holds one
 * of its locks, so they may take their own locks freely.
 * Errors are negative errno values; out-parameters are untouched on failure.
 */
#ifndef EMM_ALLOCATOR_HEAP_H
#define EMM_ALLOCATOR_HEAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "emm/emm.h"

typedef uint64_t emm_addr_t;
typedef uint64_t emm_stream_t;
typedef struct emm_heap emm_heap_t;

#define EMM_STREAM_SYNC ((emm_stream_t)0)
#define EMM_STREAM_LEGACY ((emm_stream_t)1)
#define EMM_STREAM_PER_THREAD_KEY(thread_index) ((((emm_stream_t)(thread_index)) << 8) | 2u)
#define EMM_STREAM_IS_PER_THREAD(s) (((s) & 0xffu) == 2u)
/* A created stream: the key is its CUstream handle. */
#define EMM_STREAM_IS_HANDLE(s) \
	((s) != EMM_STREAM_SYNC && (s) != EMM_STREAM_LEGACY && !EMM_STREAM_IS_PER_THREAD(s))

#define EMM_MIN_BLOCK 512u

/* What a synchronous free (no stream) does before the block may be reused. */
enum emm_free_mode {
	EMM_FREE_MODE_FENCE,  /* default: epoch fences, never a host wait on the fast path */
	EMM_FREE_MODE_STRICT, /* wait like the real cuMemFree: device sync, then reusable */
	EMM_FREE_MODE_STREAM, /* trust stream order (PyTorch's assumption): reusable at once */
};

struct emm_heap_params {
	size_t small_max;	     /* requests <= this use the small pool (1 MiB) */
	size_t small_segment;	     /* small-pool segment size (2 MiB) */
	size_t large_segment;	     /* about the segment for large requests < large_segment/2 (20 MiB) */
	size_t large_round;	     /* other large segments round up to this (2 MiB) */
	size_t max_split;	     /* cached blocks >= this are never split (SIZE_MAX: no limit) */
	size_t max_nosplit_slack;    /* an unsplittable block serves requests up to this much smaller (20 MiB) */
	unsigned roundup_divisions;  /* 0: round to 512 B; N (power of 2): N steps per power of two */
	size_t release_threshold;    /* idle reserved bytes above this go back (SIZE_MAX: keep all) */
	bool oom_retry;		     /* on backend failure release idle segments and retry once */
	bool hold_peak;		     /* page-granular heaps: give back idle pages before mapping past the high-water mark */
	enum emm_free_mode free_mode;
	unsigned epoch_max_blocks;   /* close the open epoch after this many synchronous frees (64),
				      * or half as many when an allocation needs its memory; twice
				      * as many once 8 arenas hold memory (not page-granular heaps) */
	unsigned epoch_max_blocks_paged; /* at most this in page-granular heaps (8): their freed blocks are
					  * reused or their pages given back only once fenced, and the
					  * smaller quota keeps the peak down (PyTorch's loop under vmm:
					  * 8.04 GiB NVML peak at 32, 7.66 at 8, 7.39 at 2; H200) */
	size_t epoch_max_bytes;	     /* an allocation that misses closes it once it holds this many
				      * bytes (64 MiB); a free closes by bytes only at 16 times this */
	bool host_accessible;	     /* the host touches the blocks (pinned memory): reuse waits for every
				      * fence event to complete, even with no non-blocking stream alive */
	size_t pending_limit;	     /* a miss that would reserve more while the arena holds more than
				      * this in freed blocks still fenced first waits (polling, bounded)
				      * for its oldest fences (1 GiB; 0: never) */
	unsigned arenas;	     /* arenas, threads spread over them (0: one per CPU, <= 64;
				      * rounded down to a power of two); both pools per arena */
	bool thread_cache;	     /* a per-thread front cache for synchronous frees (heap_tcache.c):
				      * recently freed blocks reused without a search of the pools; default false */
};

/* Where segments come from: a backend instance, seen through two calls. */
struct emm_segment_source {
	void *state;
	int (*alloc)(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret_addr);
	int (*free)(void *state, emm_addr_t addr, size_t size, emm_stream_t stream);
};

/*
 * Page-granular segments (a backend with EMM_BACKEND_CAP_REMAP and/or
 * CAP_GROW, e.g. vmm): optional, given to emm_heap_create_paged.
 *
 * With unmap/map the heap keeps, per segment, which granules have physical
 * memory behind them. The granules lying wholly inside a free ready-any
 * block (never one any part of which is live, pending a fence, ready for one
 * stream only, orphaned or reserved) may be unmapped: on the OOM retry,
 * above the release threshold (which then counts mapped idle bytes) and in
 * emm_heap_release_idle, and before a growth past the high-water mark
 * (hold_peak). Unmapping is not stream-ordered, and a ready-any block may
 * still be read by work enqueued before its free (a fast-path epoch, the
 * stream free mode): every unmap, and every free of a page-granular
 * segment, first waits for the arena's last legacy-stream event (the
 * device in stream mode), once per event; during a capture, when it cannot
 * wait, nothing is unmapped. A block handed out over unmapped granules gets them
 * mapped first (the lock dropped around the call; on failure the OOM retry
 * runs). reserved_bytes counts mapped bytes only.
 *
 * With grow, a large-pool miss first tries to extend the arena's newest
 * large segment of the same stream key in place (its tail block, if
 * ready-any, grows; else a new block is appended) before opening a new one.
 */
struct emm_segment_pages {
	void *state;
	size_t granularity; /* a power of two >= 512; segments not aligned to it are left alone */
	/* Release / back again [seg + offset, + length), whole granules; both or neither. */
	int (*unmap)(void *state, emm_addr_t seg, size_t seg_size, size_t offset, size_t length);
	int (*map)(void *state, emm_addr_t seg, size_t seg_size, size_t offset, size_t length);
	/* Extend a segment in place (-ENOSPC: it cannot); NULL: no growth. */
	int (*grow)(void *state, emm_addr_t seg, size_t old_size, size_t new_size);
};

/*
 * Completion markers, supplied by the embedder (interpose/ maps them to
 * cuEventRecord/cuEventQuery/cuStreamWaitEvent/cuEventSynchronize on the
 * context's streams; tests use a double with delayed completion). A NULL
 * fence-ops pointer means "there is no asynchronous work": every fence is
 * complete at once (host simulation).
 */
struct emm_fence_ops {
	void *ctx;
	/* Record a marker on `stream` (never EMM_STREAM_SYNC). */
	int (*record)(void *ctx, emm_stream_t stream, uint64_t *ret_event);
	/* 0: complete; -EBUSY: not yet; other negative errno: failure. */
	int (*query)(void *ctx, uint64_t event);
	/* Make later work on `stream` wait for `event`, without a host wait. */
	int (*stream_wait)(void *ctx, emm_stream_t stream, uint64_t event);
	/* Block the host until `event` completes. */
	int (*synchronize)(void *ctx, uint64_t event);
	/* The event is no longer needed. */
	void (*release)(void *ctx, uint64_t event);
	/* Block the host until all work on the device completes (strict mode). */
	int (*device_synchronize)(void *ctx);
	/* True if recording on / querying for `stream` is forbidden now because
	 * of stream capture (EMM_STREAM_SYNC: is any global capture active). */
	bool (*capturing)(void *ctx, emm_stream_t stream);
	/* Optional (NULL: never asked). Has all work enqueued on `stream` (a
	 * non-blocking stream handle) so far completed? 0: yes, so a marker
	 * recorded on it now would already be complete; -EBUSY: not yet, or
	 * not known (a capture forbids asking); other negative errno: failure.
	 * Closing an epoch records no marker on a stream that answers 0. */
	int (*stream_idle)(void *ctx, emm_stream_t stream);
};

/* The live block containing an address. */
struct emm_block_range {
	emm_addr_t base;	 /* start of the block the program was given */
	size_t size;		 /* its rounded size */
	size_t requested;	 /* what the program asked for */
	emm_addr_t segment_base; /* the backend segment behind it */
	size_t segment_size;
	emm_heap_t *heap;
};

void emm_heap_params_default(struct emm_heap_params *params);

/* The size a request is rounded to (>= 512, multiple of 512). 0 for 0. */
size_t emm_heap_round_size(const struct emm_heap_params *params, size_t size);

/* The segment size the heap asks the backend for to serve `rounded`. */
size_t emm_heap_segment_size(const struct emm_heap_params *params, size_t rounded);

/*
 * Create a heap. `device` is recorded for statistics (-2 for pinned host).
 * params, src and fence are copied; fence may be NULL.
 */
int emm_heap_create(const struct emm_heap_params *params, const struct emm_segment_source *src,
		    const struct emm_fence_ops *fence, int device, emm_heap_t **ret_heap);

/* The same with page-granular segments (pages may be NULL: as above).
 * -EINVAL for a granularity that is not a power of two >= 512, or only one
 * of unmap/map, or neither pair nor grow. */
int emm_heap_create_paged(const struct emm_heap_params *params, const struct emm_segment_source *src,
			  const struct emm_segment_pages *pages, const struct emm_fence_ops *fence, int device,
			  emm_heap_t **ret_heap);

/*
 * Destroy a heap. With release_segments, idle and live segments go back to
 * the source (pending fences are synchronized first); without it (context
 * already destroyed, driver gone) nothing is called and the memory is simply
 * forgotten. Live blocks are dropped from the pointer map either way, so a
 * later free of one returns -ENOENT.
 */
void emm_heap_destroy(emm_heap_t *heap, bool release_segments);

/*
 * Allocate `size` bytes for use on `stream` (EMM_STREAM_SYNC: unknown, any
 * stream). -EINVAL for size 0, -ENOMEM when the source is exhausted (after
 * the OOM retry), -EOVERFLOW for sizes too large to round.
 */
int emm_heap_alloc(emm_heap_t *heap, size_t size, emm_stream_t stream, emm_addr_t *ret_addr);

/*
 * Free the block starting at `addr`, from whichever heap owns it. `stream`
 * is EMM_STREAM_SYNC for a synchronous free. Returns 0 and the block's
 * requested size; -ENOENT if no heap knows the address (not ours: the caller
 * forwards it to the driver); -EINVAL if it lies inside libemm's memory but
 * is not the start of a live block (double free, interior pointer).
 */
int emm_heap_free(emm_addr_t addr, emm_stream_t stream, size_t *ret_requested);

/* emm_heap_free, if accept(the heap of the block at addr, arg): else
 * -EXDEV and nothing changes (a free naming the other kind of memory; also
 * for an interior pointer of a live block of a refused heap). accept is
 * asked once, before the look-up, with no lock held. A block start costs
 * what emm_heap_free's does; -EINVAL and -ENOENT as it. */
int emm_heap_free_if(emm_addr_t addr, emm_stream_t stream, bool (*accept)(const emm_heap_t *heap, const void *arg),
                     const void *arg, size_t *ret_requested);

/* The live block containing `addr` (interior pointers allowed); -ENOENT. */
int emm_heap_find_block(emm_addr_t addr, struct emm_block_range *ret_range);

/* The heap of the live block starting at `addr` (the segment map, then one
 * lookup in its arena's table under the arena lock: the free path's
 * question "whose is it"); NULL when no live block starts there. The caller
 * owns the block, so it cannot change under the call; if another thread
 * frees it meanwhile (a double free) the answer is still a heap of the same
 * arena. */
emm_heap_t *emm_heap_of_block(emm_addr_t addr);

/* Stream lifecycle, so epochs know the live non-blocking streams. For a
 * non-blocking stream this also makes it wait (fence->stream_wait, on the
 * GPU) on emm_heap_last_fence's event; no epoch closing meanwhile makes
 * blocks ready-any without an event this stream is ordered after. */
void emm_heap_stream_created(emm_heap_t *heap, emm_stream_t stream, bool nonblocking);
/* The stream is being destroyed (call it before the real destroy): its
 * ready-stream blocks become fenced by a marker recorded on it now. If none
 * can be recorded (capture, failed record) they are orphaned, out of every
 * allocation's reach until its work is known finished: a blocking-class
 * stream's by the next epoch close, a non-blocking stream's by the device
 * synchronize emm_heap_flush does once no capture forbids it. */
void emm_heap_stream_destroyed(emm_heap_t *heap, emm_stream_t stream);
/* Work the heap's freed blocks may still be used by, on a stream no epoch
 * of the heap records on (a non-blocking stream about to be destroyed,
 * another context's stream a block was freed on), was made the work of
 * `carrier`: a non-blocking stream of the heap's context that the program
 * never sees, made to wait for it on the GPU. The carrier joins the heap's
 * non-blocking streams, so every epoch closed from now on records on it (or
 * finds it idle, that work done), until a close finds it idle and drops it
 * (call it before the stream it carries leaves: emm_heap_stream_destroyed). */
void emm_heap_carrier_joined(emm_heap_t *heap, emm_stream_t carrier);
/* Such work could not be carried (no carrier, a capture forbade the marker
 * or the wait): every epoch closed from now on parks its blocks, out of
 * every allocation's reach, until a device-wide synchronize
 * (emm_heap_flush, the OOM retry) proves all work before it finished. */
void emm_heap_order_lost(emm_heap_t *heap);

/* Close the open epoch now, synchronize the device for orphans of destroyed
 * non-blocking streams (a host wait; see emm_heap_stream_destroyed), and
 * move completed fences to ready (sync points; call it on every heap at
 * capture end). -EBUSY while a capture forbids it. */
int emm_heap_flush(emm_heap_t *heap);

/* Return idle segments to the source until at most `keep` idle bytes remain,
 * then (page-granular heaps) the pages under free ready-any blocks.
 * Returns bytes released (>= 0) or a negative errno: the source's error if
 * it failed a free (that segment and the ones not yet handled stay idle in
 * the heap, still counted and reusable). */
long long emm_heap_release_idle(emm_heap_t *heap, size_t keep);

/* Add this heap's counters into *out (fields are summed; peaks summed too). */
void emm_heap_add_stats(emm_heap_t *heap, struct emm_stats *out);

/* Largest free block and total idle bytes (for OOM reports, cuMemGetInfo). */
void emm_heap_idle_info(emm_heap_t *heap, size_t *ret_idle_bytes, size_t *ret_largest_free);

int emm_heap_device(const emm_heap_t *heap);

/*
 * The event recorded on the legacy stream by the most recent epoch close,
 * or -ENOENT if none (or the fence ops are NULL). When an epoch closes while
 * no non-blocking stream is live, its blocks become ready-any at once: the
 * legacy event orders every later use on blocking and per-thread streams.
 * Each newly created non-blocking stream must wait on this event:
 * emm_heap_stream_created(..., true) does that itself.
 * The heap owns the event; it stays valid only until the next epoch close
 * or heap destroy, so this is for diagnostics and tests.
 */
int emm_heap_last_fence(emm_heap_t *heap, uint64_t *ret_event);

/*
 * Walk every segment and verify: blocks tile the segment, neighbour links
 * agree, no two adjacent free blocks of the same state and stream, every
 * free block is in exactly the right tree or fence list, counters match
 * (with every thread cache's own counters added). A thread allocating or
 * freeing through its cache meanwhile may make the counters disagree: call
 * it with the heap quiet, as the tests do. Returns 0, or -EFAULT after
 * logging the first violation.
 */
int emm_heap_check(emm_heap_t *heap);

#endif
