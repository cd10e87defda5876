/* SPDX-License-Identifier: MIT */
/*
 * process/poison.c - EMM_POISON=<byte>: every device block the program
 * frees is filled with the byte before anyone can be handed it again, so
 * that a kernel reading a block after its free (or on a stream with no
 * dependency on the freeing one) reads garbage instead of stale data.
 *
 * The fill is stream-ordered, one cuMemsetD8Async enqueued before the
 * block goes back to its heap: on the free's stream for cuMemFreeAsync,
 * on the legacy stream for a synchronous free. A synchronous free promises
 * that the work enqueued before it is done with the block (the real
 * cuMemFree waits for the device), and the legacy stream does not wait for
 * non-blocking streams: so the legacy stream first waits (on the GPU) for
 * an event recorded on each of the context's live non-blocking streams,
 * and a kernel still reading the block there is not disturbed. The fence
 * rules then order
 * it before any reuse (DESIGN.md section 4): same-stream reuse follows it
 * in stream order; a synchronous free's epoch event is recorded later on
 * the legacy stream (a barrier for blocking and per-thread streams) and on
 * each non-blocking stream after it, and a stream-ordered free's event is
 * recorded after it on its stream, so any other stream waits for the fill.
 *
 * Not poisoned: pinned host blocks (a host memset is not stream-ordered),
 * blocks freed while their stream (or, for a synchronous free, any
 * global-mode capture, or a non-blocking stream it must wait for) is
 * capturing (the memset would become a graph node; the graph quarantine
 * keeps those blocks anyway), synchronous frees while more than 64
 * non-blocking streams live, blocks of another context than the current
 * one, and anything at exit.
 */
#include <cuda.h>
#include <stdatomic.h>
#include <stdint.h>

#include "common/log.h"
#include "process/poison.h"
#include "process/process.h"
#include "process/process_internal.h"

#define MAX_NB_STREAMS 64

/* Make the legacy stream wait for the work enqueued so far on every live
 * non-blocking stream of the current context. False when it cannot (a
 * capture forbids a record, too many streams, a failed call). */
static bool legacy_after_nonblocking(void)
{
	const struct emm_real_driver_table *t = st_real_table();
	emm_stream_t keys[MAX_NB_STREAMS];
	CUcontext ctx = NULL;
	size_t n;
	bool ok = true;

	if (!t->cuCtxGetCurrent || !t->cuEventCreate || !t->cuEventRecord || !t->cuStreamWaitEvent ||
	    !t->cuEventDestroy_v2 || t->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		return false;
	n = st_stream_nonblocking_keys(ctx, keys, MAX_NB_STREAMS);
	if (n > MAX_NB_STREAMS)
		return false;
	for (size_t i = 0; i < n && ok; i++) {
		CUevent ev;

		if (emm_state_capture_forbids(keys[i]) || t->cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
			return false;
		ok = t->cuEventRecord(ev, emm_state_stream_handle(keys[i])) == CUDA_SUCCESS &&
		     t->cuStreamWaitEvent(CU_STREAM_LEGACY, ev, 0) == CUDA_SUCCESS;
		(void)t->cuEventDestroy_v2(ev); /* released once the wait is done */
	}
	return ok;
}

void st_poison_block_slow(emm_addr_t addr, emm_stream_t key)
{
	struct emm_block_range b;
	emm_heap_t *current = NULL;
	CUresult (*fn)(CUdeviceptr, unsigned char, size_t, CUstream);
	CUresult r;

	if (st_is_exiting() || emm_heap_find_block(addr, &b) != 0 || b.base != addr ||
	    emm_state_heap_is_pinned(b.heap))
		return;
	if (emm_state_current_heap_lookup(&current) != 0 || current != b.heap || emm_state_capture_forbids(key))
		return;
	fn = emm_real_vmm()->cuMemsetD8Async;
	if (!fn || (key == EMM_STREAM_SYNC && !legacy_after_nonblocking()))
		return;
	r = fn((CUdeviceptr)addr, (unsigned char)st_opts->poison, b.size, emm_state_stream_handle(key));
	if (r != CUDA_SUCCESS)
		emm_debug("EMM_POISON: cuMemsetD8Async(%#llx, %zu) failed (%d)", (unsigned long long)addr, b.size,
		          (int)r);
}
