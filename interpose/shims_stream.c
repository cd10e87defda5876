/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_stream.c - the driver API's stream, stream-capture and context
 * lifecycle entry points: each calls the real function and tells the
 * process layer what changed (a stream created or destroyed, a capture
 * begun or ended, a context destroyed, reset, retained or released).
 */
#include <cuda.h>
#include <stdbool.h>

#include "common/compiler.h"
#include "interpose/shims.h"

/* --- streams ----------------------------------------------------------- */

EMM_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	CUresult r = CALL_REAL(cuStreamCreate, phStream, Flags);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_stream_created(*phStream, Flags & CU_STREAM_NON_BLOCKING);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	CUresult r = CALL_REAL(cuStreamCreateWithPriority, phStream, flags, priority);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_stream_created(*phStream, flags & CU_STREAM_NON_BLOCKING);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
	CUresult r;

	/* Blocks freed on it get a marker recorded on it now, while it lives;
	 * it is forgotten only once the driver has destroyed it. */
	if (emm_state_enabled())
		emm_state_stream_destroying(hStream);
	r = CALL_REAL(cuStreamDestroy_v2, hStream);
	if (emm_state_enabled()) {
		if (r == CUDA_SUCCESS) {
			emm_state_stream_destroyed(hStream);
			emm_capture_stream_destroyed(hStream);
		} else {
			emm_state_stream_destroy_failed(hStream);
		}
	}
	return r;
}

/* --- stream capture ---------------------------------------------------- */

/* The capture is recorded before the driver begins it (so that no fence op
 * of libemm's lands inside it) and forgotten if the driver refuses. */
#define BEGIN_CAPTURE(ptsz, mode, call)                                                                   \
	do {                                                                                               \
		struct emm_capture *cap_ = emm_state_enabled() ? emm_state_capture_begin(hStream, ptsz, mode) \
		                                               : NULL;                                         \
		CUresult r_ = (call);                                                                      \
		emm_state_capture_begun(cap_, r_ == CUDA_SUCCESS);                                         \
		return r_;                                                                                 \
	} while (0)

/* The first ABI (no mode argument) captures in relaxed mode. */
EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream)
{
	BEGIN_CAPTURE(false, CU_STREAM_CAPTURE_MODE_RELAXED, CALL_EXTRA(stream_begin_capture_v1, hStream));
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream)
{
	BEGIN_CAPTURE(true, CU_STREAM_CAPTURE_MODE_RELAXED, CALL_EXTRA(cuStreamBeginCapture_ptsz, hStream));
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(false, mode, CALL_REAL(cuStreamBeginCapture_v2, hStream, mode));
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(true, mode, CALL_EXTRA(cuStreamBeginCapture_v2_ptsz, hStream, mode));
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                        const CUgraphNode *dependencies,
                                                        const CUgraphEdgeData *dependencyData,
                                                        size_t numDependencies, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(false, mode,
	              CALL_EXTRA(cuStreamBeginCaptureToGraph, hStream, hGraph, dependencies, dependencyData,
	                         numDependencies, mode));
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                             const CUgraphNode *dependencies,
                                                             const CUgraphEdgeData *dependencyData,
                                                             size_t numDependencies, CUstreamCaptureMode mode)
{
	BEGIN_CAPTURE(true, mode,
	              CALL_EXTRA(cuStreamBeginCaptureToGraph_ptsz, hStream, hGraph, dependencies, dependencyData,
	                         numDependencies, mode));
}

/* The capture is over unless the call failed and the stream still
 * captures (ended from the wrong thread, say). The graph it made (none if
 * it failed) inherits what the capture quarantined. */
static void capture_maybe_ended(CUresult r, CUstream hStream, bool ptsz, CUgraph *phGraph)
{
	CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;

	if (!emm_state_enabled())
		return;
	if (r != CUDA_SUCCESS && REAL(cuStreamIsCapturing) &&
	    REAL(cuStreamIsCapturing)(ptsz && !hStream ? CU_STREAM_PER_THREAD : hStream, &status) ==
	        CUDA_SUCCESS &&
	    status != CU_STREAM_CAPTURE_STATUS_NONE)
		return;
	emm_state_capture_end(hStream, ptsz, r == CUDA_SUCCESS && phGraph ? *phGraph : NULL);
}

EMM_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	CUresult r = CALL_REAL(cuStreamEndCapture, hStream, phGraph);

	capture_maybe_ended(r, hStream, false, phGraph);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	CUresult r = CALL_EXTRA(cuStreamEndCapture_ptsz, hStream, phGraph);

	capture_maybe_ended(r, hStream, true, phGraph);
	return r;
}

/* --- contexts ---------------------------------------------------------- */

/* A context synchronisation completes all work issued before it: freed VMM
 * buffers of the context need no fence of their own then
 * (process/vmm_sync.c). */
EMM_EXPORT CUresult CUDAAPI cuCtxSynchronize(void)
{
	bool on = emm_state_enabled();
	uint64_t ticket = on ? emm_state_ctx_sync_begin() : 0;
	CUresult r = REAL(cuCtxSynchronize) ? REAL(cuCtxSynchronize)() : CUDA_ERROR_NOT_INITIALIZED;

	if (on && r == CUDA_SUCCESS)
		emm_state_ctx_sync_done(ticket);
	return r;
}


/* The driver frees a context's memory with it: its heaps are forgotten
 * without driver calls, and later frees of their pointers get the driver's
 * own error. */

EMM_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
	bool on = emm_state_enabled();
	CUresult r;

	if (on)
		emm_state_context_destroying(ctx);
	r = CALL_REAL(cuCtxDestroy_v2, ctx);
	if (on && r == CUDA_SUCCESS) {
		emm_state_context_destroyed(ctx);
		emm_state_context_gone(ctx);
	} else if (on)
		emm_state_context_destroy_failed(ctx);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	CUcontext ctx = emm_state_enabled() ? emm_state_primary_resetting(dev) : NULL;
	CUresult r = CALL_REAL(cuDevicePrimaryCtxReset_v2, dev);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_primary_reset(dev);
	else if (ctx)
		emm_state_context_destroy_failed(ctx);
	return r;
}

/* cudaDeviceReset resets the primary context without calling our reset
 * shim; cudart's next call retains it again: a heap we keep for an
 * inactive primary context is stale. */
EMM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	bool on = emm_state_enabled();
	CUresult r;

	if (on)
		emm_state_primary_retaining(dev);
	r = CALL_EXTRA(cuDevicePrimaryCtxRetain, pctx, dev);
	if (on && r == CUDA_SUCCESS)
		emm_state_context_made(*pctx);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = CALL_REAL(cuDevicePrimaryCtxRelease_v2, dev);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_primary_released(dev);
	return r;
}
