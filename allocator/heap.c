/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap.c - the caching allocator's entry points for a live
 * heap: the arena lock's slow path and waits, which arena a thread uses,
 * allocate (hit path and miss path),
 * free, block lookup, release of idle memory, flush, the last fence.
 * Creating and destroying a heap is heap_life.c's. The contract is heap.h;
 * the private structures and the other heap_*.c files' roles are in
 * heap_internal.h.
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "allocator/heap_debug.h"
#include "allocator/ptrmap.h"
#include "common/log.h"

/* Threads are spread over the arenas round-robin by a slot taken on their
 * first allocation (see struct emm_heap in heap_internal.h). */
static atomic_uint thread_rr;
static _Thread_local unsigned thread_slot_plus1 __attribute__((tls_model("initial-exec")));

#ifndef NDEBUG
_Thread_local unsigned emm_heap_lock_depth __attribute__((tls_model("initial-exec")));

void emm_heap_lock_violation(const char *op)
{
	emm_error("fence op '%s' called with %u allocator lock(s) held", op, emm_heap_lock_depth);
	abort();
}
#endif

unsigned emm_heap_debug_lock_depth(void)
{
#ifndef NDEBUG
	return emm_heap_lock_depth;
#else
	return 0;
#endif
}

/* --- the arena lock's slow path and its waits ------------------------------ */

/* -DEMM_ARENA_SPINS=N: another spin, for a measurement. 512 made 16 threads
 * on 32 CPUs no faster and waiting threads on 2 CPUs 2-3x slower
 * (tests/bench/RESULTS.md section 32, runs D6 and D7). */
#ifndef EMM_ARENA_SPINS
#define EMM_ARENA_SPINS 64 /* pauses before a waiter sleeps: longer than most sections */
#endif
#define ARENA_NAP_NS 50000 /* the longest sleep: bounds a wake lost to a fast unlock */

static void futex_wait(atomic_int *word, int val)
{
	struct timespec nap = {0, ARENA_NAP_NS};

	(void)syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, val, &nap, NULL, 0);
}

void emm_arena_lock_slow(struct arena *h)
{
	for (unsigned n = 0; n < EMM_ARENA_SPINS; n++) {
		int z = 0;
		if (atomic_load_explicit(&h->lock, memory_order_relaxed) == 0 &&
		    atomic_compare_exchange_weak_explicit(&h->lock, &z, 1, memory_order_acquire, memory_order_relaxed))
			return;
		emm_cpu_relax();
	}
	/* Sleep, marking the lock contended (2): its holder's unlock wakes one
	 * sleeper. Taken this way the lock stays marked, so our own unlock
	 * wakes the next sleeper too. */
	while (atomic_exchange_explicit(&h->lock, 2, memory_order_acquire) != 0)
		futex_wait(&h->lock, 2);
}

void emm_arena_unlock_slow(struct arena *h)
{
	atomic_store_explicit(&h->lock, 0, memory_order_release);
	(void)syscall(SYS_futex, &h->lock, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

/* A waker bumps wake_gen under the arena lock and wait_lock; a waiter
 * reads it under the arena lock before dropping that, so a wake between
 * the drop and the wait is seen, not lost. */
void emm_arena_wait(struct arena *h)
{
	unsigned gen = atomic_load_explicit(&h->wake_gen, memory_order_relaxed);

	arena_unlock(h);
	pthread_mutex_lock(&h->wait_lock);
	while (atomic_load_explicit(&h->wake_gen, memory_order_relaxed) == gen)
		pthread_cond_wait(&h->wait_cv, &h->wait_lock);
	pthread_mutex_unlock(&h->wait_lock);
	arena_lock(h);
}

void emm_arena_wake(struct arena *h)
{
	pthread_mutex_lock(&h->wait_lock);
	atomic_store_explicit(&h->wake_gen, atomic_load_explicit(&h->wake_gen, memory_order_relaxed) + 1,
	                      memory_order_relaxed);
	pthread_cond_broadcast(&h->wait_cv);
	pthread_mutex_unlock(&h->wait_lock);
}

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

struct arena *emm_heap_thread_arena(const struct emm_heap *heap)
{
	return thread_arena(heap);
}

/* The arena whose segment holds addr (the segment map, lock-free), or NULL:
 * not our memory. A segment's arena never changes, and its struct lives as
 * long as the heap, which the caller's guard keeps alive. */
static inline struct arena *arena_of(emm_addr_t addr)
{
	struct emm_segment *s = emm_segmap_value(addr);

	return s ? s->arena : NULL;
}

/* Enter taken block b in the table of h (its arena, locked) before it is
 * handed out; on failure it is free again at once (never handed out). */
static inline __attribute__((always_inline)) int publish_locked(struct arena *h, struct emm_block *b,
                                                                 emm_stream_t stream)
{
	int r = emm_blocktab_insert(&h->tab, b->addr, b);

	if (EMM_LIKELY(r == 0))
		return 0;
	if (r == -EEXIST)
		emm_error("block 0x%llx already in its arena's table", (unsigned long long)b->addr);
	untake_accounting(h, b);
	h->st.allocs--;
	h->st.frees--;
	emm_pool_block_ready(h, b, stream);
	return -ENOMEM;
}

/* The same with no lock held (a thread cache's block, one borrowed from
 * another arena): 0 and *ret_addr, or -ENOMEM. */
static int publish(struct emm_block *b, emm_stream_t stream, emm_addr_t *ret_addr)
{
	struct arena *h = b->seg->arena;
	emm_addr_t addr = b->addr;
	int r;

	arena_lock(h);
	r = publish_locked(h, b, stream);
	arena_unlock(h);
	if (r == 0)
		*ret_addr = addr;
	return r;
}

/* --- allocate and free ---------------------------------------------------- */

static inline __attribute__((always_inline)) int arena_alloc(struct arena *h, unsigned pool, size_t rounded,
                                                              size_t size, emm_stream_t stream, emm_addr_t *ret_addr)
{
	struct emm_block *b;
	emm_addr_t addr = 0;
	bool borrowed = false;
	int r;

	arena_lock(h);
	if (h->owner->tcache)
		emm_tcache_apply_locked(h);
	b = find_block(h, pool, rounded, stream);
	if (EMM_LIKELY(b)) {
		h->st.hits++;
		b = emm_pool_take_block(h, b, rounded, size, stream);
		if (EMM_LIKELY(!b->seg->unmapped)) {
			addr = b->addr;
			r = publish_locked(h, b, stream);
			arena_unlock(h);
			if (EMM_LIKELY(r == 0))
				*ret_addr = addr;
			return r;
		}
		r = emm_heap_alloc_map(h, pool, rounded, size, stream, &b);
	} else {
		r = emm_heap_alloc_slow(h, pool, rounded, size, stream, &b);
		/* A block borrowed from another arena had every page mapped when
		 * taken (take_other_arena); its segment's counter is that
		 * arena's, not ours to read. */
		if (r == 0 && b->seg->arena == h && EMM_UNLIKELY(b->seg->unmapped))
			r = emm_heap_alloc_map(h, pool, rounded, size, stream, &b);
	}
	if (r == 0) {
		addr = b->addr;
		borrowed = b->seg->arena != h;
		if (!borrowed)
			r = publish_locked(h, b, stream);
	}
	arena_unlock_release(h);
	if (r)
		return r;
	if (borrowed) /* into the table of its own arena */
		return publish(b, stream, ret_addr);
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
	struct emm_block *b;
	if (heap->tcache && emm_tcache_alloc(heap, pool, rounded, size, stream, &b))
		return publish(b, stream, ret_addr);
	struct arena *a = EMM_UNLIKELY(heap->large_shared) && pool == POOL_LARGE ? heap->arenas[0] : thread_arena(heap);
	return arena_alloc(a, pool, rounded, size, stream, ret_addr);
}

/* Free block b, just taken out of the table of h, whose lock is held. */
static inline __attribute__((always_inline)) int free_locked(struct arena *h, struct emm_block *b,
                                                           emm_stream_t stream, size_t *ret_requested)
{
	struct emm_segment *release = NULL;
	size_t requested;
	int strict = 0;

	requested = b->requested;
	if (stream == EMM_STREAM_SYNC && h->owner->tcache && h->p.free_mode != EMM_FREE_MODE_STRICT) {
		/* The thread cache takes its own lock when it closes its epoch. */
		arena_unlock(h);
		if (emm_tcache_free(b)) {
			if (ret_requested)
				*ret_requested = requested;
			return 0;
		}
		arena_lock(h);
	}

	if (stream == EMM_STREAM_SYNC && h->p.free_mode == EMM_FREE_MODE_STRICT && h->has_fence &&
	    h->fops.device_synchronize) {
		/* Like the real cuMemFree: wait for the device, lock not held. */
		arena_unlock(h);
		strict = fop_device_synchronize(h) == 0 ? 1 : -1;
		arena_lock(h);
	}

	untake_accounting(h, b);
	if (stream != EMM_STREAM_SYNC) {
		emm_pool_block_ready(h, b, stream);
	} else if (!h->has_fence || h->p.free_mode == EMM_FREE_MODE_STREAM) {
		emm_pool_block_ready(h, b, 0);
	} else if (strict) {
		h->st.host_waits++;
		if (strict > 0)
			emm_pool_block_ready(h, b, 0);
		else
			pending_add(h, h->open, b); /* the wait failed: fence it instead */
	} else {
		/* By count here; by bytes only at the hard bound (or with a
		 * release threshold, at EMM_EPOCH_BYTES: arena_create in
		 * heap_life.c): below it the bytes close the epoch when a miss
		 * needs memory (epoch_pressure, heap_alloc.c), so a large block
		 * freed and allocated again pays its close on the allocation,
		 * and frees nothing asks for again pay none. */
		struct emm_fence *ep = h->open;
		pending_add(h, ep, b);
		if (ep->nblocks >= arena_epoch_blocks(h) || ep->bytes >= h->epoch_free_bytes)
			emm_heap_close_epoch(h);
	}
	/* The threshold applies per arena. */
	bool over = false;
	if (EMM_UNLIKELY(h->p.release_threshold != SIZE_MAX &&
	                 h->st.reserved - h->st.allocated > h->p.release_threshold)) {
		if (h->idle_head)
			release = emm_pool_release_collect(h, h->p.release_threshold);
		over = h->has_remap;
	}
	arena_unlock_release(h);

	if (EMM_UNLIKELY(release))
		emm_pool_release_finish(h, release);
	if (EMM_UNLIKELY(over)) {
		/* Then the pages under free blocks (mapped idle bytes). */
		arena_lock(h);
		if (h->st.reserved - h->st.allocated > h->p.release_threshold)
			emm_pages_release(h, h->p.release_threshold);
		arena_unlock_release(h);
	}
	if (ret_requested)
		*ret_requested = requested;
	return 0;
}

/* A free of addr that starts no live block: inside our memory (a double
 * free, an interior pointer) it is refused, never passed on; else not ours. */
static int free_of_no_block(emm_addr_t addr)
{
	return emm_segmap_find(addr, NULL, NULL, NULL) == 0 ? -EINVAL : -ENOENT;
}

int emm_heap_free(emm_addr_t addr, emm_stream_t stream, size_t *ret_requested)
{
	struct arena *h = arena_of(addr);
	struct emm_block *b;

	if (EMM_UNLIKELY(!h))
		return -ENOENT;
	arena_lock(h);
	b = emm_blocktab_take(&h->tab, addr);
	if (EMM_UNLIKELY(!b)) {
		/* In our memory, no live block starts here: refused, never passed on. */
		arena_unlock(h);
		return -EINVAL;
	}
	return free_locked(h, b, stream, ret_requested);
}

int emm_heap_free_if(emm_addr_t addr, emm_stream_t stream, bool (*accept)(const emm_heap_t *heap, const void *arg),
                     const void *arg, size_t *ret_requested)
{
	struct arena *h = arena_of(addr);
	struct emm_block_range range;
	struct emm_block *b;

	if (!h)
		return -ENOENT;
	/* Whose block it would be is known before the look-up: the arena's. */
	bool accepted = accept(h->owner, arg);
	arena_lock(h);
	b = accepted ? emm_blocktab_take(&h->tab, addr) : emm_blocktab_get(&h->tab, addr);
	if (EMM_LIKELY(b)) {
		if (accepted)
			return free_locked(h, b, stream, ret_requested);
		arena_unlock(h);
		return -EXDEV;
	}
	arena_unlock(h);
	/* Not a block start. Inside a live block the caller refuses: -EXDEV as
	 * for its start; anywhere else in our memory (a block freed twice) it
	 * is refused here, never passed on. */
	if (emm_heap_find_block(addr, &range) == 0 && !accept(range.heap, arg))
		return -EXDEV;
	return free_of_no_block(addr);
}

emm_heap_t *emm_heap_of_block(emm_addr_t addr)
{
	struct arena *h = arena_of(addr);
	struct emm_block *b;

	if (!h)
		return NULL;
	arena_lock(h);
	b = emm_blocktab_get(&h->tab, addr);
	arena_unlock(h);
	return b ? h->owner : NULL;
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

	arena_lock(h);
	if (s->live && addr >= s->base && addr - s->base < s->size) {
		/* Exact start: one map lookup; interior: walk the segment. */
		struct emm_block *b = emm_blocktab_get(&h->tab, addr);
		if (!b || b->seg != s || b->state != BLOCK_LIVE || b->addr != addr) {
			for (b = s->first; b && addr - b->addr >= b->size; b = b->next)
				;
		}
		if (b && b->state == BLOCK_LIVE && !atomic_load_explicit(&b->tcached, memory_order_acquire)) {
			ret->base = b->addr;
			ret->size = b->size;
			ret->requested = b->requested;
			ret->segment_base = s->base;
			ret->segment_size = s->size;
			ret->heap = h->owner;
			r = 0;
		}
	}
	arena_unlock(h);
	return r;
}

int emm_heap_flush(emm_heap_t *heap)
{
	int r = 0;

	if (!heap)
		return -EINVAL;
	emm_tcache_sync(heap);
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		int ri = emm_heap_close_epoch(h);
		int ro = emm_heap_resolve_orphans(h);
		emm_heap_poll_fences(h);
		arena_unlock_release(h);
		if (!ri)
			ri = ro;
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
		arena_lock(h);
		if (h->has_last_fence) {
			*ret_event = h->last_fence;
			r = 0;
		}
		arena_unlock(h);
		if (r == 0)
			return 0;
	}
	return -ENOENT;
}

long long emm_heap_release_idle(emm_heap_t *heap, size_t keep)
{
	size_t idle[MAX_ARENAS], keep_all = keep;
	long long total = 0;

	if (!heap)
		return -EINVAL;
	/* This thread's cache now; every other thread's at its next use. */
	emm_tcache_sync(heap);
	if (heap->tcache)
		emm_tcache_flush_all();
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		emm_heap_close_epoch(h);
		emm_heap_poll_fences(h);
		idle[i] = h->st.reserved - h->st.allocated;
		arena_unlock_release(h);
	}
	/* `keep` is for the whole heap: spend it on the arenas in order. */
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		size_t k = idle[i] < keep ? idle[i] : keep;
		keep -= k;
		arena_lock(h);
		struct emm_segment *list = emm_pool_release_collect(h, k);
		arena_unlock(h);
		long long r = emm_pool_release_finish(h, list);
		if (r < 0)
			return r; /* the failed segment and the later ones stay */
		total += r;
	}
	/* Then the pages under free ready-any blocks, down to the same keep. */
	keep = keep_all;
	for (unsigned i = 0; i < heap->narenas; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		if (h->has_remap) {
			size_t idle_now = h->st.reserved - h->st.allocated;
			size_t k = idle_now < keep ? idle_now : keep;
			keep -= k;
			total += (long long)emm_pages_release(h, k);
		}
		arena_unlock_release(h);
	}
	return total;
}

int emm_heap_device(const emm_heap_t *heap)
{
	return heap->device;
}
