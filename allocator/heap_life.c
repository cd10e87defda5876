/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_life.c - a heap's creation and destruction: its arenas
 * (each on cache lines of its own, with its lock and its wait mutex and
 * condition: heap_internal.h, arena_lock), and at destroy
 * the wait for pending fences, the segments back to their source and the
 * metadata freed. The entry points of a live heap are heap.c's.
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "allocator/ptrmap.h"
#include "common/log.h"

static void drop_fence_struct(struct emm_fence *f)
{
	free(f->events);
	free(f->targets);
	free(f);
}

static struct arena *arena_create(struct emm_heap *owner, const struct emm_heap_params *params,
                                  const struct emm_segment_source *src, const struct emm_segment_pages *pages,
                                  const struct emm_fence_ops *fence)
{
	struct arena *h = heap_zalloc_lines(sizeof(*h));
	if (!h)
		return NULL;
	atomic_init(&h->lock, 0);
	atomic_init(&h->wake_gen, 0);
	if (pthread_mutex_init(&h->wait_lock, NULL)) {
		free(h);
		return NULL;
	}
	if (pthread_cond_init(&h->wait_cv, NULL)) {
		pthread_mutex_destroy(&h->wait_lock);
		free(h);
		return NULL;
	}
	if (pages) {
		h->pg = *pages;
		h->has_remap = pages->unmap && pages->map;
		h->has_grow = pages->grow != NULL;
	}
	h->owner = owner;
	h->p = *params;
	if (h->has_remap && params->epoch_max_blocks_paged < h->p.epoch_max_blocks)
		h->p.epoch_max_blocks = params->epoch_max_blocks_paged;
	h->pending_limit = params->pending_limit;
	if (h->p.epoch_max_blocks == 0)
		h->p.epoch_max_blocks = 1;
	atomic_init(&h->epoch_blocks, h->p.epoch_max_blocks);
	if (h->p.epoch_max_bytes == 0)
		h->p.epoch_max_bytes = 1;
	/* With a release threshold a free closes by bytes at once, as before:
	 * the memory is wanted back (by other processes), and a block parked
	 * in an open epoch cannot go. */
	if (h->p.release_threshold != SIZE_MAX)
		h->epoch_free_bytes = h->p.epoch_max_bytes;
	else if (h->p.epoch_max_bytes > SIZE_MAX / EPOCH_HARD_FACTOR)
		h->epoch_free_bytes = SIZE_MAX;
	else
		h->epoch_free_bytes = h->p.epoch_max_bytes * EPOCH_HARD_FACTOR;
	h->src = *src;
	if (fence) {
		h->fops = *fence;
		h->has_fence = true;
	}
	for (unsigned i = 0; i < NPOOLS; i++) {
		emm_sfit_init(&h->ready[i]);
		emm_tree_init(&h->trees[i]);
	}
	h->open = emm_heap_fence_new(h);
	h->orphans[0] = h->open ? emm_heap_fence_new(h) : NULL;
	h->orphans[1] = h->orphans[0] ? emm_heap_fence_new(h) : NULL;
	if (!h->orphans[1] || emm_blocktab_init(&h->tab) < 0) {
		free(h->orphans[1]);
		free(h->open);
		free(h->orphans[0]);
		pthread_cond_destroy(&h->wait_cv);
		pthread_mutex_destroy(&h->wait_lock);
		free(h);
		return NULL;
	}
	emm_heap_fence_reset(h->open);
	emm_heap_fence_reset(h->orphans[0]);
	emm_heap_fence_reset(h->orphans[1]);
	return h;
}

static void arena_destroy(struct arena *h, bool release_segments)
{
	/* No other thread may use the heap any more. The lock is taken only
	 * where a helper drops and retakes it; the waits are never under it. */
	if (release_segments && h->has_fence) {
		/* Wait for every pending fence and orphan before the memory goes
		 * back: close the epoch (a capture may forbid it), else and for
		 * orphans of non-blocking streams, synchronize the device. */
		arena_lock(h);
		emm_heap_close_epoch(h);
		bool need_sync = h->open->nblocks || h->orphans[0]->nblocks || h->orphans[1]->nblocks;
		arena_unlock(h);
		if (need_sync && h->fops.device_synchronize) {
			fop_device_synchronize(h);
			h->st.host_waits++;
		}
		for (struct emm_fence *f = h->fq_head; f; f = f->next) {
			if (f->retired || f->synced || !h->fops.synchronize)
				continue;
			for (unsigned i = f->done; i < f->nevents; i++) {
				fop_synchronize(h, f->events[i]);
				h->st.host_waits++;
			}
		}
		for (struct emm_fence *f = h->fq_head, *fnext; f; f = fnext) {
			fnext = f->next;
			emm_heap_fence_recycle(h, f);
		}
		h->fq_head = h->fq_tail = NULL;
		if (h->has_last_fence && !h->last_fence_owner)
			fop_release(h, h->last_fence);
		h->has_last_fence = false;
		emm_heap_garbage_drop(h, true);
	} else {
		emm_heap_garbage_drop(h, false);
	}

	/* Forget every address; give segments back if asked. */
	struct emm_segment *s, *next;
	for (s = h->segs; s; s = next) {
		next = s->next;
		emm_segmap_remove(s->base); /* its addresses are no longer ours */
		if (release_segments) {
			/* The heap goes away whatever happens: try every segment. */
			int r = h->src.free(h->src.state, s->base, s->size, EMM_STREAM_SYNC);
			if (r == 0)
				h->st.backend_frees++;
			else
				emm_warn("segment source failed to free 0x%llx (+%zu) at destroy: %d",
				         (unsigned long long)s->base, s->size, r);
		}
	}

	for (s = h->seg_all; s; s = next) {
		next = s->all_next;
		emm_pages_seg_drop(s);
		free(s);
	}
	for (struct emm_fence *f = h->fence_free, *fnext; f; f = fnext) {
		fnext = f->next;
		drop_fence_struct(f);
	}
	for (struct emm_fence *f = atomic_load(&h->fence_returned), *fnext; f; f = fnext) {
		fnext = f->next;
		drop_fence_struct(f);
	}
	if (!release_segments) {
		for (struct emm_fence *f = h->fq_head, *fnext; f; f = fnext) {
			fnext = f->next;
			drop_fence_struct(f);
		}
	}
	drop_fence_struct(h->open);
	drop_fence_struct(h->orphans[0]);
	drop_fence_struct(h->orphans[1]);
	for (void *slab = h->slabs, *snext; slab; slab = snext) {
		snext = *(void **)slab;
		free(slab);
	}
	free(h->nb);
	emm_blocktab_fini(&h->tab);
	pthread_cond_destroy(&h->wait_cv);
	pthread_mutex_destroy(&h->wait_lock);
	free(h);
}

int emm_heap_create(const struct emm_heap_params *params, const struct emm_segment_source *src,
                    const struct emm_fence_ops *fence, int device, emm_heap_t **ret_heap)
{
	return emm_heap_create_paged(params, src, NULL, fence, device, ret_heap);
}

int emm_heap_create_paged(const struct emm_heap_params *params, const struct emm_segment_source *src,
                          const struct emm_segment_pages *pages, const struct emm_fence_ops *fence, int device,
                          emm_heap_t **ret_heap)
{
	if (!params || !src || !src->alloc || !src->free || !ret_heap)
		return -EINVAL;
	if (pages && (pages->granularity < EMM_MIN_BLOCK || (pages->granularity & (pages->granularity - 1)) ||
	              !pages->unmap != !pages->map || (!pages->map && !pages->grow)))
		return -EINVAL;
	if (params->small_segment == 0 || params->small_segment % EMM_MIN_BLOCK ||
	    params->large_segment == 0 || params->large_segment % EMM_MIN_BLOCK || params->large_round == 0 ||
	    params->large_round % EMM_MIN_BLOCK || params->max_nosplit_slack == 0)
		return -EINVAL;
	if (fence && (!fence->record || !fence->query || !fence->release))
		return -EINVAL;

	struct emm_heap *heap = calloc(1, sizeof(*heap));
	if (!heap)
		return -ENOMEM;
	unsigned n = params->arenas;
	if (n == 0) {
		long cpus = sysconf(_SC_NPROCESSORS_ONLN);
		n = cpus > 0 ? (unsigned)cpus : 1;
	}
	if (n > MAX_ARENAS)
		n = MAX_ARENAS;
	heap->narenas = 1;
	while (heap->narenas * 2 <= n)
		heap->narenas *= 2;
	heap->device = device;
	heap->tcache = params->thread_cache;
	heap->large_shared = params->hold_peak && pages && pages->unmap && pages->map;
	for (unsigned i = 0; i < heap->narenas; i++) {
		heap->arenas[i] = arena_create(heap, params, src, pages, fence);
		if (heap->arenas[i])
			heap->arenas[i]->bit = (uint64_t)1 << i;
		if (!heap->arenas[i]) {
			while (i-- > 0)
				arena_destroy(heap->arenas[i], false);
			free(heap);
			return -ENOMEM;
		}
	}
	emm_tcache_heap_created(heap);
	*ret_heap = heap;
	return 0;
}

void emm_heap_destroy(emm_heap_t *heap, bool release_segments)
{
	if (!heap)
		return;
	emm_tcache_heap_destroyed(heap);
	for (unsigned i = 0; i < heap->narenas; i++)
		arena_destroy(heap->arenas[i], release_segments);
	free(heap);
}
