/* SPDX-License-Identifier: MIT */
/*
 * process/pinned.c - the pinned-host heaps: one per (context, flag set of
 * cuMemHostAlloc), created on first use.
 *
 * Pinned heaps are per context: the driver frees cuMemHostAlloc memory
 * with the context that allocated it. Their fences are the context's events,
 * recorded on its legacy stream and its live non-blocking streams (the
 * streams are announced to the pinned heaps as to the device heap), because
 * pinned memory is read by asynchronous copies on those streams. They go
 * with their context (contexts.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>

#include "common/compiler.h"
#include "process/block_free.h"
#include "process/process_internal.h"
#include "process/process.h"

static int host_seg_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret_addr)
{
	struct pinned_source *src = state;

	return st_segment_alloc(src->entry, true, src->flags, size, stream, ret_addr);
}

static int host_seg_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	struct pinned_source *src = state;

	return st_segment_free(src->entry, true, addr, size, stream);
}

struct pinned_publish {
	struct ctx_entry *entry;
	unsigned flags;
	emm_heap_t *heap;   /* the one built */
	emm_heap_t *winner; /* the one in the entry afterwards */
};

/* st_ctx_lock held. */
static void publish_pinned_locked(void *arg)
{
	struct pinned_publish *p = arg;
	emm_heap_t *cur = atomic_load_explicit(&p->entry->pinned[p->flags], memory_order_relaxed);

	if (!cur) {
		atomic_store_explicit(&p->entry->pinned[p->flags], p->heap, memory_order_release);
		atomic_fetch_or(&st_free_flags, ST_FREE_PINNED);
		cur = p->heap;
	}
	p->winner = cur;
}

int emm_state_pinned_heap(unsigned int flags, emm_heap_t **ret_heap)
{
	struct pinned_publish pa;
	const struct emm_backend *b;
	struct emm_heap_params params;
	struct emm_segment_source src;
	struct ctx_entry *e;
	emm_heap_t *heap;
	int ret;

	if (!st_is_enabled())
		return -ENOSYS;
	b = st_host_backend.table;
	if (!st_opts->pinned || !b || !(b->caps & EMM_BACKEND_CAP_HOST_PINNED) || !b->host_segment_alloc ||
	    !b->host_segment_free)
		return -ENOSYS;
	if (flags >= PINNED_FLAG_SETS)
		return -EINVAL;
	ret = st_current_entry(&e, true);
	if (ret < 0)
		return ret;
	heap = atomic_load_explicit(&e->pinned[flags], memory_order_acquire);
	if (EMM_LIKELY(heap)) {
		*ret_heap = heap;
		return 0;
	}

	ret = st_host_backend_init(e);
	if (ret < 0)
		return ret;
	/* Built with no lock held (heap calls), published under st_ctx_lock
	 * unless another thread's heap for the flag set got there first. */
	st_heap_params(&params);
	/* The program writes pinned blocks from the host: reuse only after
	 * the free's fence events complete, whatever EMM_FREE_MODE says
	 * (stream order orders no host write; strict waits anyway). */
	params.host_accessible = true;
	if (params.free_mode == EMM_FREE_MODE_STREAM)
		params.free_mode = EMM_FREE_MODE_FENCE;
	src.state = &e->pinned_src[flags];
	src.alloc = host_seg_alloc;
	src.free = host_seg_free;
	ret = emm_heap_create(&params, &src, &e->fence, -2, &heap);
	if (ret < 0)
		return ret;
	pa = (struct pinned_publish){e, flags, heap, NULL};
	if (st_publish_heap(heap, e->ctx, publish_pinned_locked, &pa) < 0 || pa.winner != heap) {
		emm_heap_destroy(heap, false); /* new and empty: nothing to give back */
		if (!pa.winner)
			return -ENOMEM;
		heap = pa.winner;
	}
	*ret_heap = heap;
	return 0;
}

bool emm_state_heap_is_pinned(const emm_heap_t *heap)
{
	return emm_heap_device(heap) == -2;
}

void st_pinned_fork_child(void)
{
	atomic_fetch_and(&st_free_flags, ~ST_FREE_PINNED);
}
