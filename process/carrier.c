/* SPDX-License-Identifier: MIT */
/*
 * process/carrier.c - work no epoch of a heap records on, carried into
 * one it does: each context's carrier, a non-blocking stream of libemm's
 * own (the program never sees it), made to wait on the GPU for the work of
 * a stream that is about to go or that belongs to another context
 * (emm_heap_carrier_joined, allocator/heap.h).
 *
 *   - A non-blocking stream destroyed with work in flight: epochs record on
 *     the live non-blocking streams only, so a block freed before or after
 *     the destroy would be reused while that work still runs. The carrier
 *     waits for a marker recorded on the stream before its destroy.
 *   - A block freed with cuMemFreeAsync on a stream of another context:
 *     the heap's markers (its context's legacy stream, its non-blocking
 *     streams) do not order that stream. The carrier waits for it, and the
 *     block is freed as by cuMemFree.
 *
 * When the marker or the wait cannot be made (a capture forbids it, no
 * memory) the heap parks every block it closes until a device-wide
 * synchronize (emm_heap_order_lost). An allocation on another context's
 * stream is not served at all: the driver allocates it on the stream's
 * device, as without libemm. The carrier is made at the first need and
 * goes with its context (the driver destroys it). Only processes with
 * heaps or registered streams of more than one context pay for the
 * question. Not seen: a free on the legacy or per-thread stream of a
 * context that has neither (it is taken for the block's own context's).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/log.h"
#include "process/process.h"
#include "process/carrier.h"
#include "process/process_internal.h"

/* e's carrier, made now if needed; NULL when it cannot be made. */
static CUstream carrier_of(struct ctx_entry *e)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUstream s = atomic_load_explicit(&e->carrier, memory_order_acquire), none = NULL;
	CUresult r;
	bool pushed;

	if (s || !real->cuStreamCreate)
		return s;
	pushed = st_push_ctx(e->ctx);
	r = real->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	st_pop_ctx(pushed);
	if (r != CUDA_SUCCESS) {
		emm_debug("no carrier stream for context %p (%d)", (void *)e->ctx, (int)r);
		return NULL;
	}
	if (!atomic_compare_exchange_strong(&e->carrier, &none, s)) {
		if (real->cuStreamDestroy_v2)
			(void)real->cuStreamDestroy_v2(s); /* another thread's came first */
		s = none;
	}
	return s;
}

/* Make e's carrier wait for all work enqueued so far on stream `key` of
 * context kctx (NULL: the current one): a marker recorded there, waited
 * for on the GPU. 0 and the carrier's key; 1 when the stream is idle
 * (nothing to carry); -EBUSY (a capture forbids the marker or the wait),
 * -ENOMEM, -ENOSYS or -EIO. */
static int carry(struct ctx_entry *e, emm_stream_t key, CUcontext kctx, emm_stream_t *ret_carrier)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUstream carrier;
	CUevent ev = NULL;
	unsigned phase;
	CUresult r;
	bool pushed;

	/* Idle already (the fence op's one cuStreamQuery, through the capture
	 * gate; a legacy or per-thread key is not asked): its work is done. */
	if (e->fence.stream_idle && e->fence.stream_idle(e->fence.ctx, key) == 0)
		return 1;
	if (!real->cuEventCreate || !real->cuEventRecord || !real->cuStreamWaitEvent || !real->cuEventDestroy_v2)
		return -ENOSYS;
	carrier = carrier_of(e);
	if (!carrier)
		return -ENOMEM;
	if (!st_capture_gate_enter(key, &phase))
		return -EBUSY;
	pushed = kctx ? st_push_ctx(kctx) : false;
	r = real->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING);
	if (r == CUDA_SUCCESS) {
		r = real->cuEventRecord(ev, emm_state_stream_handle(key));
		if (r != CUDA_SUCCESS)
			(void)real->cuEventDestroy_v2(ev);
	}
	st_pop_ctx(pushed);
	st_capture_gate_leave(phase);
	if (r != CUDA_SUCCESS)
		return -EIO;

	/* The wait, then an event of the carrier's context recorded on it
	 * after the wait: an operation of the carrier's own that completes
	 * only after the wait, so the carrier reads busy (cuStreamQuery)
	 * until then. */
	emm_stream_t ckey = emm_state_stream_key(carrier, false);
	if (st_capture_gate_enter_wait(ckey, &phase)) {
		CUevent after = NULL;
		pushed = st_push_ctx(e->ctx);
		r = real->cuStreamWaitEvent(carrier, ev, 0);
		if (r == CUDA_SUCCESS)
			r = real->cuEventCreate(&after, CU_EVENT_DISABLE_TIMING);
		if (r == CUDA_SUCCESS) {
			r = real->cuEventRecord(after, carrier);
			(void)real->cuEventDestroy_v2(after); /* released once recorded work is done */
		}
		st_pop_ctx(pushed);
		st_capture_gate_leave(phase);
	} else {
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	}
	(void)real->cuEventDestroy_v2(ev);
	if (r != CUDA_SUCCESS)
		return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? -EBUSY : -EIO;
	*ret_carrier = ckey;
	return 0;
}

void st_carry_into(emm_heap_t *heap, struct ctx_entry *e, emm_stream_t key, CUcontext kctx)
{
	emm_stream_t carrier;
	int r = e ? carry(e, key, kctx, &carrier) : -ENOENT;

	if (r == 1)
		return; /* its work is done */
	if (r == 0) {
		emm_heap_carrier_joined(heap, carrier);
		return;
	}
	emm_debug("stream %#llx: its work could not be carried (%d): freed blocks wait for a device synchronize",
	          (unsigned long long)key, r);
	emm_heap_order_lost(heap);
}

/* The context of stream `key`: its registry entry's, else the current. */
static CUcontext key_context(emm_stream_t key)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUcontext ctx = EMM_STREAM_IS_HANDLE(key) ? emm_state_stream_context(key) : NULL;

	if (!ctx && (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS))
		ctx = NULL;
	return ctx;
}

/* The first context noted, and whether another one was since. */
static _Atomic(CUcontext) first_ctx;
static atomic_bool several;

void st_note_context(CUcontext ctx)
{
	CUcontext none = NULL;

	if (!ctx || atomic_load_explicit(&several, memory_order_relaxed))
		return;
	if (!atomic_compare_exchange_strong(&first_ctx, &none, ctx) && none != ctx)
		atomic_store(&several, true);
}

void st_carrier_fork_child(void)
{
	atomic_store(&first_ctx, NULL);
	atomic_store(&several, false);
}

/* Heaps or streams of more than one context: the questions below can
 * have another answer than "the same context". */
static inline bool several_contexts(void)
{
	return atomic_load_explicit(&several, memory_order_relaxed);
}

/* Called inside the heap guard (emm_serve_free): the heap found here lives
 * until the caller leaves it. */
emm_stream_t st_free_key(emm_addr_t addr, emm_stream_t key)
{
	struct emm_block_range range;
	struct ctx_entry *e;
	CUcontext kctx;

	if (key == EMM_STREAM_SYNC || !several_contexts())
		return key;
	if (emm_serve_find_block(addr, &range) != 0 || emm_state_heap_is_pinned(range.heap))
		return key;
	if (st_is_exiting())
		return key; /* no driver call once exit began; nothing is reused now */
	e = st_heap_entry(range.heap);
	kctx = key_context(key);
	if (!e || !kctx || kctx == e->ctx)
		return key;
	/* Another context's stream: its work is carried into the block's
	 * heap, and the block is freed as by cuMemFree. */
	st_carry_into(range.heap, e, key, kctx);
	return EMM_STREAM_SYNC;
}

bool st_stream_foreign(emm_stream_t key)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUcontext kctx, cur = NULL;

	if (!EMM_STREAM_IS_HANDLE(key) || !several_contexts())
		return false;
	kctx = emm_state_stream_context(key);
	if (!kctx || !real->cuCtxGetCurrent || real->cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
		return false;
	return kctx != cur;
}
