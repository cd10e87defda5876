/* SPDX-License-Identifier: MIT */
/*
 * process/contexts_retire.c - a context's device heap retired for a fresh
 * one, so that new blocks come from segments a memory checker does not
 * know.
 *
 * Under compute-sanitizer, once a second device appears libemm stops
 * offering a device's new segments as NVTX heaps (annotate_peer.c): the
 * tool reports every access a peer makes to another device's region. A
 * segment that still holds live blocks keeps its heap, though (the tool
 * reports every access to a heap taken back while its memory lives), and
 * the allocator would go on carving new blocks out of it, each a region a
 * peer's kernel may read: race-multidevice-strict drew 3 076 reports that
 * way. So the context's heap is replaced: allocations go to a fresh heap,
 * whose segments are plain allocations to the tool; the old one is
 * retired. It serves no allocation, takes the frees of its blocks (a free
 * finds its block's arena through the segment map), gives its idle memory
 * back after each of them (st_retired_heap_of) and is destroyed with the
 * context. Only blocks allocated before the second device appeared keep
 * their regions.
 *
 * A thread that read the old heap just before the swap may still carve one
 * block from it: harmless, the heap stays alive until its context goes.
 */
#include <stdatomic.h>

#include "common/compiler.h"
#include "common/log.h"
#include "process/block_free.h"
#include "process/process_internal.h"
#include "process/process.h"

#define MAX_RETIRE 16 /* contexts of one device retired at once */

static bool on_device(const struct ctx_entry *e, const void *arg)
{
	return !e->failed && e->heap && !e->retired && e->device == *(const int *)arg;
}

static bool is_entry(const struct ctx_entry *e, const void *arg)
{
	return e == arg;
}

struct swap_arg {
	struct ctx_entry *e;
	emm_heap_t *fresh, *old;
};

/* st_ctx_lock held: the entry, still registered and not retired, takes
 * the fresh heap. */
static void swap_locked(void *arg)
{
	struct swap_arg *a = arg;
	struct ctx_entry *e = st_ctx_find_locked(is_entry, a->e, false);

	if (e && e->heap && !e->retired) {
		a->old = e->heap;
		e->retired = a->old;
		e->heap = a->fresh;
		atomic_fetch_or(&st_free_flags, ST_FREE_RETIRED);
	}
}

void st_contexts_retire_heaps(int device)
{
	struct ctx_entry *list[MAX_RETIRE];
	size_t n;

	st_assert_unlocked("retiring heaps");
	st_lock(&st_ctx_lock);
	n = st_ctx_collect_locked(on_device, &device, list, MAX_RETIRE);
	st_unlock(&st_ctx_lock);
	for (size_t i = 0; i < n; i++) {
		struct swap_arg a = {list[i], NULL, NULL};

		if (st_entry_heap_create(list[i], &a.fresh) < 0)
			continue; /* no memory: the old heap goes on serving */
		if (st_publish_heap(a.fresh, list[i]->ctx, swap_locked, &a) < 0 || !a.old) {
			emm_heap_destroy(a.fresh, false);
			continue;
		}
		emm_debug("context %p (device %d): heap retired, a fresh one serves its new blocks",
		          (void *)list[i]->ctx, device);
		(void)emm_heap_release_idle(a.old, 0);
	}
}

static bool has_retired(const struct ctx_entry *e, const void *arg)
{
	return e->retired == arg;
}

emm_heap_t *st_retired_heap_of(emm_addr_t addr)
{
	emm_heap_t *heap;
	bool retired;

	/* A free names a block's start: its arena's table knows its heap. */
	if (EMM_LIKELY(!(atomic_load_explicit(&st_free_flags, memory_order_relaxed) & ST_FREE_RETIRED)) ||
	    !(heap = emm_heap_of_block(addr)))
		return NULL;
	st_lock(&st_ctx_lock);
	retired = st_ctx_find_locked(has_retired, heap, false) != NULL;
	st_unlock(&st_ctx_lock);
	/* The heap is destroyed only with its context, under the heap guard
	 * the caller is inside: it outlives the free. */
	return retired ? heap : NULL;
}
