/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_ctx.c - the driver calls that change which context is
 * current on the calling thread: cuCtxSetCurrent, cuCtxPushCurrent,
 * cuCtxPopCurrent and cuCtxCreate (every exported ABI). Each is passed to
 * the driver unchanged; libemm only learns that the thread's current
 * context may have changed, so the thread's context cache asks the driver
 * again at its next lookup (process/contexts.c explains when a cached
 * lookup may skip the driver). Destroying and resetting contexts are in
 * shims_stream.c (they also drop the context's heaps). cuCtxEnablePeerAccess
 * is here too: a memory checker's annotations of the peer's blocks must
 * stop once the current context can reach them (process/annotate_peer.c).
 */
#include <cuda.h>

#include "common/compiler.h"
#include "interpose/shims.h"

/* After a forwarded call: the thread's context cache is emptied whatever
 * it returned (a failed call changes nothing, and emptying costs one
 * lookup); a create's new handle (`made`, NULL for the others) is a live
 * context (a destroyed one's handle may come back). */
static CUresult forwarded(CUresult r, CUcontext *made)
{
	if (emm_state_enabled()) {
		if (r == CUDA_SUCCESS && made)
			emm_state_context_made(*made);
		emm_state_current_changed(false);
	}
	return r;
}

/* The real export `name` (typed `type`), called with the arguments. */
#define FORWARD(type, made, name, ...)                                                                       \
	do {                                                                                                 \
		type real_ = (type)emm_real_driver(name);                                                    \
                                                                                                             \
		if (!real_)                                                                                  \
			return CUDA_ERROR_NOT_INITIALIZED;                                                   \
		return forwarded(real_(__VA_ARGS__), made);                                                  \
	} while (0)

typedef CUresult (*set_fn)(CUcontext);
typedef CUresult (*pop_fn)(CUcontext *);
typedef CUresult (*create_fn)(CUcontext *, unsigned int, CUdevice);
typedef CUresult (*create_v3_fn)(CUcontext *, CUexecAffinityParam *, int, unsigned int, CUdevice);
typedef CUresult (*create_v4_fn)(CUcontext *, CUctxCreateParams *, unsigned int, CUdevice);
typedef CUresult (*peer_fn)(CUcontext, unsigned int);

EMM_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
	FORWARD(set_fn, NULL, "cuCtxSetCurrent", ctx);
}

EMM_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
	FORWARD(set_fn, NULL, "cuCtxPushCurrent_v2", ctx);
}

EMM_EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
	FORWARD(set_fn, NULL, "cuCtxPushCurrent", ctx);
}

EMM_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
	FORWARD(pop_fn, NULL, "cuCtxPopCurrent_v2", pctx);
}

EMM_EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
	FORWARD(pop_fn, NULL, "cuCtxPopCurrent", pctx);
}

EMM_EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FORWARD(create_fn, pctx, "cuCtxCreate", pctx, flags, dev);
}

EMM_EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FORWARD(create_fn, pctx, "cuCtxCreate_v2", pctx, flags, dev);
}

EMM_EXPORT CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                           unsigned int flags, CUdevice dev)
{
	FORWARD(create_v3_fn, pctx, "cuCtxCreate_v3", pctx, paramsArray, numParams, flags, dev);
}

EMM_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                                           CUdevice dev)
{
	FORWARD(create_v4_fn, pctx, "cuCtxCreate_v4", pctx, ctxCreateParams, flags, dev);
}

EMM_EXPORT CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peer, unsigned int flags)
{
	peer_fn real = (peer_fn)emm_real_driver("cuCtxEnablePeerAccess");
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(peer, flags);
	if ((r == CUDA_SUCCESS || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) && emm_state_enabled())
		emm_state_peer_access_enabled(peer);
	return r;
}
