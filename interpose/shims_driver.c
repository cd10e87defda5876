/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_driver.c - libemm's replacements for the driver API's
 * memory, stream, capture and context entry points, with the exact
 * prototypes and exported names of libcuda.so.1 (cuda.h renames cuMemAlloc
 * to cuMemAlloc_v2 and so on; the _ptsz names are spelled out), and
 * emm_shim_for(), the table the resolvers substitute from.
 *
 * Every shim follows the same rules:
 *   - libemm disabled (EMM_DISABLE, no backend): the real call, unchanged.
 *   - anything the pool does not serve - a NULL out-pointer, size 0, no
 *     current context, before cuInit, an argument the driver validates - is
 *     the real call with the same arguments, so the program sees exactly the
 *     driver's answer;
 *   - a free of a pointer libemm did not hand out goes to the driver
 *     (counted); a double or interior free inside libemm's memory is refused
 *     with CUDA_ERROR_INVALID_VALUE, the driver's code for it (the driver
 *     must not see it: it would free the whole segment);
 *   - the pool running dry (after releasing idle memory and retrying) is
 *     CUDA_ERROR_OUT_OF_MEMORY.
 *   - stream-ordered calls on a capturing stream go to the driver (graph
 *     memory nodes).
 *   - a free of one of our blocks while a captured graph may still use it
 *     (a capture is active, or the block was allocated during a capture
 *     whose graph lives) is quarantined until that graph and everything
 *     instantiated from it are destroyed (capture.c; the graph shims below
 *     tell it which graphs and executable graphs exist).
 * The logic lives in state.c, capture.c and allocator/; each shim is a few
 * lines.
 */
#include <cuda.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "allocator/heap.h"
#include "allocator/ptrmap.h"
#include "allocator/trace.h"
#include "common/compiler.h"
#include "common/log.h"
#include "interpose/shims.h"
#include "interpose/state.h"
#include "interpose/state_priv.h"

#define REAL(fn) (emm_state_real()->fn)
/* The real driver function; a process without a driver reads as not
 * initialised (it cannot have reached here through libcuda anyway). */
#define CALL_REAL(fn, ...) (REAL(fn) ? REAL(fn)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)
#define CALL_EXTRA(fn, ...)                                                                                  \
	(emm_state_real_extra()->fn ? emm_state_real_extra()->fn(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

/* The per-thread-default-stream exports, which cuda.h declares only when
 * the including program itself is built for per-thread default streams. */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                  const CUgraphNode *dependencies,
                                                  const CUgraphEdgeData *dependencyData,
                                                  size_t numDependencies, CUstreamCaptureMode mode);
CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph);
CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                   CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);

/* cuda.h maps these names to the newest ABI; the exports of the same names
 * are the old ABIs, which programs built against older headers still call. */
#undef cuGraphInstantiate
#undef cuGraphExecUpdate
#undef cuGraphAddNode
#undef cuGraphInstantiateWithParams
#undef cuStreamBeginCapture
CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream);
CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream);
CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                    char *logBuffer, size_t bufferSize);
CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                       char *logBuffer, size_t bufferSize);
CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                                   CUgraphExecUpdateResult *updateResult_out);
CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                size_t numDependencies, CUgraphNodeParams *nodeParams);
CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams);

/* --- helpers ----------------------------------------------------------- */

static void trace(enum emm_trace_action action, uint64_t ptr, size_t size, CUstream stream)
{
	if (emm_trace_enabled())
		emm_trace_event(action, ptr, size, (uint64_t)(uintptr_t)stream);
}

/*
 * Serve an allocation from `heap` (NULL: not served). Returns true and
 * *ret when the pool answered (CUDA_SUCCESS or CUDA_ERROR_OUT_OF_MEMORY);
 * false when the driver should answer instead.
 */
static bool heap_alloc(emm_heap_t *heap, size_t size, emm_stream_t key, CUstream stream, uint64_t *ret_addr,
                       CUresult *ret)
{
	emm_addr_t addr;
	int r = emm_heap_alloc(heap, size, key, &addr);

	if (r == 0) {
		*ret_addr = addr;
		trace(EMM_TRACE_ALLOCATE, addr, size, stream);
		*ret = CUDA_SUCCESS;
		return true;
	}
	if (r == -ENOMEM) {
		emm_state_report_oom(heap, size);
		trace(EMM_TRACE_ALLOCATE_FAILURE, 0, size, stream);
		*ret = CUDA_ERROR_OUT_OF_MEMORY;
		return true;
	}
	return false; /* -EINVAL, -EOVERFLOW, ...: the driver's answer */
}

/* Inside the heap guard (emm_state_enter). */
static bool device_alloc_guarded(CUdeviceptr *dptr, size_t size, emm_stream_t key, CUstream stream,
                                 CUresult *ret)
{
	emm_heap_t *heap;
	uint64_t addr;

	if (emm_state_current_heap(&heap) < 0)
		return false;
	if (!heap_alloc(heap, size, key, stream, &addr, ret))
		return false;
	if (*ret == CUDA_SUCCESS) {
		emm_capture_note_alloc(addr, heap);
		*dptr = (CUdeviceptr)addr;
	}
	return true;
}

static bool device_alloc(CUdeviceptr *dptr, size_t size, emm_stream_t key, CUstream stream, CUresult *ret)
{
	bool served;

	if (!dptr || size == 0)
		return false;
	emm_state_enter();
	served = device_alloc_guarded(dptr, size, key, stream, ret);
	emm_state_leave();
	return served;
}

static bool host_alloc_guarded(void **pp, size_t size, unsigned int flags, CUresult *ret)
{
	emm_heap_t *heap;
	uint64_t addr;

	if (emm_state_pinned_heap(flags, &heap) < 0)
		return false;
	if (!heap_alloc(heap, size, EMM_STREAM_SYNC, NULL, &addr, ret))
		return false;
	if (*ret == CUDA_SUCCESS) {
		emm_capture_note_alloc(addr, heap);
		*pp = (void *)(uintptr_t)addr;
	}
	return true;
}

static bool host_alloc(void **pp, size_t size, unsigned int flags, CUresult *ret)
{
	bool served;

	if (!pp || size == 0)
		return false;
	emm_state_enter();
	served = host_alloc_guarded(pp, size, flags, ret);
	emm_state_leave();
	return served;
}

/* Account for an allocation the driver made. */
static CUresult passed_alloc(CUresult r, uint64_t ptr, size_t size, CUstream stream,
                             enum emm_state_counter which)
{
	if (r == CUDA_SUCCESS) {
		emm_state_count(which);
		trace(EMM_TRACE_ALLOCATE, ptr, size, stream);
	} else if (r == CUDA_ERROR_OUT_OF_MEMORY) {
		trace(EMM_TRACE_ALLOCATE_FAILURE, 0, size, stream);
	}
	return r;
}

static CUresult passed_free(CUresult r, uint64_t ptr, CUstream stream, enum emm_state_counter which)
{
	if (r == CUDA_SUCCESS && ptr) {
		emm_state_count(which);
		trace(EMM_TRACE_FREE, ptr, 0, stream);
	}
	return r;
}

static void bad_free(const char *what, uint64_t ptr)
{
	static atomic_uint_fast64_t bad_frees;
	uint64_t n = atomic_fetch_add(&bad_frees, 1) + 1;

	emm_state_count(EMM_COUNT_BAD_FREE);
	if (n == 1 || n % 1000 == 0)
		emm_warn(
		    "%s(%#llx): not the start of a live block (double free or interior pointer): refused "
		    "with CUDA_ERROR_INVALID_VALUE (%llu such frees so far)",
		    what, (unsigned long long)ptr, (unsigned long long)n);
}

/*
 * Free `ptr` if it is one of libemm's blocks of the right kind (device or
 * pinned). Returns true and *ret when libemm answered; false when the
 * driver should (not ours, or ours but of the other kind: the driver then
 * refuses it without touching it). A block a captured graph may still
 * touch is quarantined instead of freed (capture.c).
 */
static bool pool_free_guarded(const char *what, uint64_t ptr, emm_stream_t key, CUstream stream, bool pinned,
                              CUresult *ret)
{
	size_t requested = 0;
	int r = emm_state_free_block(ptr, key, pinned, &requested);

	if (r == 0) {
		trace(EMM_TRACE_FREE, ptr, requested, stream);
		*ret = CUDA_SUCCESS;
		return true;
	}
	if (r == -ENOENT)
		return false;
	bad_free(what, ptr);
	*ret = CUDA_ERROR_INVALID_VALUE;
	return true;
}

static bool pool_free(const char *what, uint64_t ptr, emm_stream_t key, CUstream stream, bool pinned,
                      CUresult *ret)
{
	bool answered;

	if (ptr == 0)
		return false;
	emm_state_enter();
	answered = pool_free_guarded(what, ptr, key, stream, pinned, ret);
	emm_state_leave();
	return answered;
}

/* --- device memory ----------------------------------------------------- */

EMM_EXPORT CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemAlloc_v2, dptr, bytesize);
	if (device_alloc(dptr, bytesize, EMM_STREAM_SYNC, NULL, &r))
		return r;
	r = CALL_REAL(cuMemAlloc_v2, dptr, bytesize);
	return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, bytesize, NULL, EMM_COUNT_PASS_ALLOC);
}

EMM_EXPORT CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemFree_v2, dptr);
	if (pool_free("cuMemFree", dptr, EMM_STREAM_SYNC, NULL, false, &r))
		return r;
	return passed_free(CALL_REAL(cuMemFree_v2, dptr), dptr, NULL, EMM_COUNT_PASS_FREE);
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                               size_t Height, unsigned int ElementSizeBytes)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	/* The driver validates the element size (4, 8, 16) and rounds the
	 * width to the pitch alignment; anything else is its to answer. */
	if (dptr && pPitch && WidthInBytes && Height &&
	    (ElementSizeBytes == 4 || ElementSizeBytes == 8 || ElementSizeBytes == 16)) {
		size_t align = emm_state_pitch_alignment();
		size_t pitch = (WidthInBytes + align - 1) / align * align;

		if (pitch >= WidthInBytes && Height <= SIZE_MAX / pitch &&
		    device_alloc(dptr, pitch * Height, EMM_STREAM_SYNC, NULL, &r)) {
			if (r == CUDA_SUCCESS)
				*pPitch = pitch;
			return r;
		}
	}
	r = CALL_REAL(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
	return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, r == CUDA_SUCCESS ? *pPitch * Height : 0, NULL,
	                    EMM_COUNT_PASS_ALLOC);
}

/* --- stream-ordered device memory -------------------------------------- */

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

static CUresult alloc_async(alloc_async_fn real, CUdeviceptr *dptr, size_t bytesize, CUstream hStream,
                            bool ptsz)
{
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!emm_state_enabled())
		return real(dptr, bytesize, hStream);
	if (emm_state_stream_capturing(hStream, ptsz)) {
		/* The driver turns it into a graph memory node. */
		r = real(dptr, bytesize, hStream);
		return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, bytesize, hStream,
		                    EMM_COUNT_CAPTURE_ALLOC);
	}
	if (dptr && bytesize &&
	    device_alloc(dptr, bytesize, emm_state_stream_key(hStream, ptsz), hStream, &r))
		return r;
	r = real(dptr, bytesize, hStream);
	return passed_alloc(r, r == CUDA_SUCCESS && dptr ? *dptr : 0, bytesize, hStream,
	                    EMM_COUNT_PASS_ALLOC);
}

static CUresult free_async(free_async_fn real, CUdeviceptr dptr, CUstream hStream, bool ptsz)
{
	struct emm_block_range range;
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!emm_state_enabled())
		return real(dptr, hStream);
	if (dptr && emm_state_stream_capturing(hStream, ptsz)) {
		int found;

		emm_state_enter();
		found = emm_heap_find_block(dptr, &range);
		emm_state_leave();
		if (found != 0)
			return passed_free(real(dptr, hStream), dptr, hStream, EMM_COUNT_PASS_FREE);
		/* One of our blocks freed inside a capture: the driver cannot
		 * make a graph node of it. The graph quarantine keeps it until
		 * the graph is gone (as for a synchronous free during capture). */
		emm_debug("cuMemFreeAsync(%#llx) of a libemm block on a capturing stream: quarantined "
		          "while the captured graph lives",
		          (unsigned long long)dptr);
		if (pool_free("cuMemFreeAsync", dptr, EMM_STREAM_SYNC, hStream, false, &r))
			return r;
		return passed_free(real(dptr, hStream), dptr, hStream, EMM_COUNT_PASS_FREE);
	}
	if (pool_free("cuMemFreeAsync", dptr, emm_state_stream_key(hStream, ptsz), hStream, false, &r))
		return r;
	return passed_free(real(dptr, hStream), dptr, hStream, EMM_COUNT_PASS_FREE);
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(REAL(cuMemAllocAsync), dptr, bytesize, hStream, false);
}

EMM_EXPORT CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(REAL(cuMemAllocAsync_ptsz), dptr, bytesize, hStream, true);
}

EMM_EXPORT CUresult CUDAAPI cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(REAL(cuMemFreeAsync), dptr, hStream, false);
}

EMM_EXPORT CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(REAL(cuMemFreeAsync_ptsz), dptr, hStream, true);
}

/* --- pinned host memory ------------------------------------------------ */

EMM_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemAllocHost_v2, pp, bytesize);
	if (host_alloc(pp, bytesize, 0, &r))
		return r;
	r = CALL_REAL(cuMemAllocHost_v2, pp, bytesize);
	return passed_alloc(r, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pp : 0, bytesize, NULL,
	                    EMM_COUNT_PASS_HOST_ALLOC);
}

EMM_EXPORT CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemHostAlloc, pp, bytesize, Flags);
	if (host_alloc(pp, bytesize, Flags, &r))
		return r;
	r = CALL_REAL(cuMemHostAlloc, pp, bytesize, Flags);
	return passed_alloc(r, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pp : 0, bytesize, NULL,
	                    EMM_COUNT_PASS_HOST_ALLOC);
}

EMM_EXPORT CUresult CUDAAPI cuMemFreeHost(void *p)
{
	CUresult r;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemFreeHost, p);
	if (pool_free("cuMemFreeHost", (uint64_t)(uintptr_t)p, EMM_STREAM_SYNC, NULL, true, &r))
		return r;
	return passed_free(CALL_REAL(cuMemFreeHost, p), (uint64_t)(uintptr_t)p, NULL,
	                   EMM_COUNT_PASS_HOST_FREE);
}

EMM_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
	CUresult r = CALL_REAL(cuMemHostRegister_v2, p, bytesize, Flags);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_count(EMM_COUNT_HOST_REGISTER);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemHostUnregister(void *p)
{
	CUresult r = CALL_REAL(cuMemHostUnregister, p);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_count(EMM_COUNT_HOST_UNREGISTER);
	return r;
}

/* --- managed memory (accounted, passed through) ------------------------ */

EMM_EXPORT CUresult CUDAAPI cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
	CUresult r = CALL_REAL(cuMemAllocManaged, dptr, bytesize, flags);

	if (!emm_state_enabled())
		return r;
	return passed_alloc(r, r == CUDA_SUCCESS ? *dptr : 0, bytesize, NULL, EMM_COUNT_MANAGED_ALLOC);
}

/* --- queries ----------------------------------------------------------- */

EMM_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
	CUresult r = CALL_REAL(cuMemGetInfo_v2, free, total);

	/* Programs size their batches from this: memory libemm holds idle is
	 * free to them (EMM_MEMINFO_CACHED, on by default). */
	if (r == CUDA_SUCCESS && free && total && emm_state_enabled() &&
	    emm_state_options()->meminfo_cached) {
		size_t idle = emm_state_idle_bytes_current_device();
		if (*free >= *total || idle >= *total - *free)
			*free = *total;
		else
			*free += idle;
	}
	return r;
}

/* Inside one of libemm's segments but in no live block: memory the program
 * freed (or never got), which the driver would not know. */
static bool in_free_space(CUdeviceptr ptr)
{
	uint64_t base;
	size_t size;
	void *value;

	return emm_segmap_find(ptr, &base, &size, &value) == 0;
}

EMM_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct emm_block_range range;
	CUresult r = CALL_REAL(cuMemGetAddressRange_v2, pbase, psize, dptr);

	/* The driver validated the pointer (it lies in our segment); describe
	 * the block the program was given, as the driver does an allocation
	 * (its base and the size asked for). */
	if (r != CUDA_SUCCESS || !emm_state_enabled())
		return r;
	emm_state_enter();
	if (emm_heap_find_block(dptr, &range) == 0) {
		if (pbase)
			*pbase = (CUdeviceptr)range.base;
		if (psize)
			*psize = range.requested;
	} else if (in_free_space(dptr)) {
		if (psize)
			*psize = 0;
		r = CUDA_ERROR_NOT_FOUND; /* the driver's answer past an allocation's end */
	}
	emm_state_leave();
	return r;
}

/* Rewrite the range attributes the driver reported for the segment. */
static void fix_range_attribute(CUpointer_attribute attribute, void *data,
                                const struct emm_block_range *range)
{
	if (!data)
		return;
	if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR) {
		CUdeviceptr base = (CUdeviceptr)range->base;
		memcpy(data, &base, sizeof(base));
	} else if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE) {
		size_t size = range->requested;
		memcpy(data, &size, sizeof(size));
	}
}

EMM_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	struct emm_block_range range;
	CUresult r = CALL_REAL(cuPointerGetAttribute, data, attribute, ptr);

	if (r != CUDA_SUCCESS || !emm_state_enabled())
		return r;
	emm_state_enter();
	if (emm_heap_find_block(ptr, &range) == 0)
		fix_range_attribute(attribute, data, &range);
	else if (in_free_space(ptr))
		r = CUDA_ERROR_INVALID_VALUE; /* the driver's answer for memory nobody holds */
	emm_state_leave();
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                                   CUpointer_attribute *attributes, void **data,
                                                   CUdeviceptr ptr)
{
	struct emm_block_range range;
	CUresult r = CALL_REAL(cuPointerGetAttributes, numAttributes, attributes, data, ptr);

	if (r == CUDA_SUCCESS && attributes && data && emm_state_enabled()) {
		emm_state_enter();
		if (emm_heap_find_block(ptr, &range) == 0)
			for (unsigned int i = 0; i < numAttributes; i++)
				fix_range_attribute(attributes[i], data[i], &range);
		emm_state_leave();
	}
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	static atomic_bool warned;
	struct emm_block_range range;
	bool refuse = false;

	/* A handle names the driver allocation - our segment. The importer
	 * would map the segment base, not this block: refuse rather than be
	 * silently wrong. A block at its segment base opens at its own bytes. */
	if (pHandle && emm_state_enabled()) {
		emm_state_enter();
		refuse = emm_heap_find_block(dptr, &range) == 0 && range.base != range.segment_base &&
		         !emm_state_heap_is_pinned(range.heap);
		emm_state_leave();
	}
	if (refuse) {
		emm_state_count(EMM_COUNT_IPC_REFUSED);
		if (!atomic_exchange(&warned, true))
			emm_warn(
			    "cuIpcGetMemHandle(%#llx): the block lies at offset %llu inside a libemm "
			    "segment; "
			    "another process would open the segment, not this block, so libemm refuses "
			    "(CUDA_ERROR_NOT_SUPPORTED). Run this program with EMM_DISABLE=1 to export it",
			    (unsigned long long)dptr, (unsigned long long)(range.base - range.segment_base));
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	return CALL_REAL(cuIpcGetMemHandle, pHandle, dptr);
}

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

	/* Blocks freed on it get a marker recorded on it now, while it lives. */
	if (emm_state_enabled())
		emm_state_stream_destroyed(hStream);
	r = CALL_REAL(cuStreamDestroy_v2, hStream);
	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_capture_stream_destroyed(hStream);
	return r;
}

/* --- stream capture ---------------------------------------------------- */

/* The first ABI (no mode argument) captures in relaxed mode. */
EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream)
{
	CUresult r = CALL_EXTRA(stream_begin_capture_v1, hStream);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_capture_begin(hStream, false, CU_STREAM_CAPTURE_MODE_RELAXED);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream)
{
	CUresult r = CALL_EXTRA(cuStreamBeginCapture_ptsz, hStream);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_capture_begin(hStream, true, CU_STREAM_CAPTURE_MODE_RELAXED);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	CUresult r = CALL_REAL(cuStreamBeginCapture_v2, hStream, mode);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_capture_begin(hStream, false, mode);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	CUresult r = CALL_EXTRA(cuStreamBeginCapture_v2_ptsz, hStream, mode);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_capture_begin(hStream, true, mode);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                                        const CUgraphNode *dependencies,
                                                        const CUgraphEdgeData *dependencyData,
                                                        size_t numDependencies, CUstreamCaptureMode mode)
{
	CUresult r = CALL_EXTRA(cuStreamBeginCaptureToGraph, hStream, hGraph, dependencies, dependencyData,
	                        numDependencies, mode);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_capture_begin(hStream, false, mode);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream hStream, CUgraph hGraph,
                                                             const CUgraphNode *dependencies,
                                                             const CUgraphEdgeData *dependencyData,
                                                             size_t numDependencies, CUstreamCaptureMode mode)
{
	CUresult r = CALL_EXTRA(cuStreamBeginCaptureToGraph_ptsz, hStream, hGraph, dependencies,
	                        dependencyData, numDependencies, mode);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_capture_begin(hStream, true, mode);
	return r;
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

/* The driver frees a context's memory with it: its heaps are forgotten
 * without driver calls, and later frees of their pointers get the driver's
 * own error. */

EMM_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
	CUresult r = CALL_REAL(cuCtxDestroy_v2, ctx);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_context_destroyed(ctx);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	CUresult r = CALL_REAL(cuDevicePrimaryCtxReset_v2, dev);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_primary_reset(dev);
	return r;
}

/* cudaDeviceReset resets the primary context without calling our reset
 * shim; cudart's next call retains it again: a heap we keep for an
 * inactive primary context is stale. */
EMM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	if (emm_state_enabled())
		emm_state_primary_retaining(dev);
	return CALL_EXTRA(cuDevicePrimaryCtxRetain, pctx, dev);
}

EMM_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = CALL_REAL(cuDevicePrimaryCtxRelease_v2, dev);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_state_primary_released(dev);
	return r;
}

/* --- graphs ------------------------------------------------------------- */

/* What a graph object may run: the quarantine follows every way a graph's
 * nodes reach another graph or an executable graph (capture.c). */

static CUresult instantiated(CUresult r, CUgraphExec *phGraphExec, CUgraph hGraph)
{
	if (r == CUDA_SUCCESS && phGraphExec && emm_state_enabled())
		emm_graph_derived(*phGraphExec, true, hGraph, false, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                               char *logBuffer, size_t bufferSize)
{
	return instantiated(CALL_EXTRA(graph_instantiate_v1, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                  CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)
{
	return instantiated(CALL_EXTRA(graph_instantiate_v2, phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                        unsigned long long flags)
{
	return instantiated(CALL_EXTRA(cuGraphInstantiateWithFlags, phGraphExec, hGraph, flags), phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                         CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	return instantiated(CALL_EXTRA(graph_instantiate_with_params, phGraphExec, hGraph, instantiateParams),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                              CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	return instantiated(CALL_EXTRA(graph_instantiate_with_params_ptsz, phGraphExec, hGraph, instantiateParams),
	                    phGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph)
{
	CUresult r = CALL_EXTRA(cuGraphClone, phGraphClone, originalGraph);

	if (r == CUDA_SUCCESS && phGraphClone && emm_state_enabled())
		emm_graph_derived(*phGraphClone, false, originalGraph, false, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph,
                                                     const CUgraphNode *dependencies, size_t numDependencies,
                                                     CUgraph childGraph)
{
	CUresult r = CALL_EXTRA(cuGraphAddChildGraphNode, phGraphNode, hGraph, dependencies, numDependencies,
	                        childGraph);

	/* The child is cloned into the parent. */
	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_derived(hGraph, false, childGraph, false, false);
	return r;
}

/* A generic node that embeds a child graph: cloned, or moved (the child's
 * handle then belongs to the parent). */
static CUresult node_added(CUresult r, CUgraph hGraph, const CUgraphNodeParams *nodeParams)
{
	if (r == CUDA_SUCCESS && nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH && emm_state_enabled())
		emm_graph_derived(hGraph, false, nodeParams->graph.graph, false,
		                  nodeParams->graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphAddNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                           size_t numDependencies, CUgraphNodeParams *nodeParams)
{
	return node_added(
	    CALL_EXTRA(graph_add_node_v1, phGraphNode, hGraph, dependencies, numDependencies, nodeParams), hGraph,
	    nodeParams);
}

EMM_EXPORT CUresult CUDAAPI cuGraphAddNode_v2(CUgraphNode *phGraphNode, CUgraph hGraph,
                                              const CUgraphNode *dependencies, const CUgraphEdgeData *dependencyData,
                                              size_t numDependencies, CUgraphNodeParams *nodeParams)
{
	return node_added(CALL_EXTRA(graph_add_node_v2, phGraphNode, hGraph, dependencies, dependencyData,
	                             numDependencies, nodeParams),
	                  hGraph, nodeParams);
}

EMM_EXPORT CUresult CUDAAPI cuGraphNodeSetParams(CUgraphNode hNode, CUgraphNodeParams *nodeParams)
{
	CUresult r = CALL_EXTRA(cuGraphNodeSetParams, hNode, nodeParams);

	/* The node's graph is not named: keep the child's blocks for good. */
	if (r == CUDA_SUCCESS && nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH && emm_state_enabled())
		emm_graph_pin(nodeParams->graph.graph, false);
	return r;
}

/* An executable graph updated from hGraph may now run hGraph's nodes (and
 * still its old ones, conservatively). */
static CUresult exec_updated(CUresult r, CUgraphExec hGraphExec, CUgraph hGraph)
{
	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_derived(hGraphExec, true, hGraph, false, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecUpdate(CUgraphExec hGraphExec, CUgraph hGraph, CUgraphNode *hErrorNode_out,
                                              CUgraphExecUpdateResult *updateResult_out)
{
	return exec_updated(CALL_EXTRA(graph_exec_update_v1, hGraphExec, hGraph, hErrorNode_out, updateResult_out),
	                    hGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecUpdate_v2(CUgraphExec hGraphExec, CUgraph hGraph,
                                                 CUgraphExecUpdateResultInfo *resultInfo)
{
	return exec_updated(CALL_EXTRA(graph_exec_update_v2, hGraphExec, hGraph, resultInfo), hGraphExec, hGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecChildGraphNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                               CUgraph childGraph)
{
	return exec_updated(CALL_EXTRA(cuGraphExecChildGraphNodeSetParams, hGraphExec, hNode, childGraph), hGraphExec,
	                    childGraph);
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecNodeSetParams(CUgraphExec hGraphExec, CUgraphNode hNode,
                                                     CUgraphNodeParams *nodeParams)
{
	CUresult r = CALL_EXTRA(cuGraphExecNodeSetParams, hGraphExec, hNode, nodeParams);

	if (nodeParams && nodeParams->type == CU_GRAPH_NODE_TYPE_GRAPH)
		(void)exec_updated(r, hGraphExec, nodeParams->graph.graph);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
	CUresult r = CALL_EXTRA(cuGraphDestroy, hGraph);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_destroyed(hGraph, false);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	CUresult r = CALL_EXTRA(cuGraphExecDestroy, hGraphExec);

	if (r == CUDA_SUCCESS && emm_state_enabled())
		emm_graph_destroyed(hGraphExec, true);
	return r;
}

/* --- the substitution table -------------------------------------------- */

struct shim_entry {
	const char *name;
	void *fn;
};

#define SHIM(name)                                                                                           \
	{                                                                                                    \
#name, (void *)name                                                                          \
	}

/* Sorted by strcmp (checked on first use). */
static const struct shim_entry shim_table[] = {
    SHIM(cuCtxDestroy_v2),
    SHIM(cuDevicePrimaryCtxRelease_v2),
    SHIM(cuDevicePrimaryCtxReset_v2),
    SHIM(cuDevicePrimaryCtxRetain),
    SHIM(cuGraphAddChildGraphNode),
    SHIM(cuGraphAddNode),
    SHIM(cuGraphAddNode_v2),
    SHIM(cuGraphClone),
    SHIM(cuGraphDestroy),
    SHIM(cuGraphExecChildGraphNodeSetParams),
    SHIM(cuGraphExecDestroy),
    SHIM(cuGraphExecNodeSetParams),
    SHIM(cuGraphExecUpdate),
    SHIM(cuGraphExecUpdate_v2),
    SHIM(cuGraphInstantiate),
    SHIM(cuGraphInstantiateWithFlags),
    SHIM(cuGraphInstantiateWithParams),
    SHIM(cuGraphInstantiateWithParams_ptsz),
    SHIM(cuGraphInstantiate_v2),
    SHIM(cuGraphNodeSetParams),
    SHIM(cuIpcGetMemHandle),
    SHIM(cuMemAllocAsync),
    SHIM(cuMemAllocAsync_ptsz),
    SHIM(cuMemAllocHost_v2),
    SHIM(cuMemAllocManaged),
    SHIM(cuMemAllocPitch_v2),
    SHIM(cuMemAlloc_v2),
    SHIM(cuMemFreeAsync),
    SHIM(cuMemFreeAsync_ptsz),
    SHIM(cuMemFreeHost),
    SHIM(cuMemFree_v2),
    SHIM(cuMemGetAddressRange_v2),
    SHIM(cuMemGetInfo_v2),
    SHIM(cuMemHostAlloc),
    SHIM(cuMemHostRegister_v2),
    SHIM(cuMemHostUnregister),
    SHIM(cuPointerGetAttribute),
    SHIM(cuPointerGetAttributes),
    SHIM(cuStreamBeginCapture),
    SHIM(cuStreamBeginCaptureToGraph),
    SHIM(cuStreamBeginCaptureToGraph_ptsz),
    SHIM(cuStreamBeginCapture_ptsz),
    SHIM(cuStreamBeginCapture_v2),
    SHIM(cuStreamBeginCapture_v2_ptsz),
    SHIM(cuStreamCreate),
    SHIM(cuStreamCreateWithPriority),
    SHIM(cuStreamDestroy_v2),
    SHIM(cuStreamEndCapture),
    SHIM(cuStreamEndCapture_ptsz),
};

/* 1 sorted, -1 not (then a linear scan serves), 0 not checked yet. */
static atomic_int table_sorted;

static bool table_check(void)
{
	int s = atomic_load_explicit(&table_sorted, memory_order_relaxed);

	if (EMM_LIKELY(s != 0))
		return s > 0;
	s = 1;
	for (size_t i = 1; i < EMM_ARRAY_SIZE(shim_table); i++) {
		if (strcmp(shim_table[i - 1].name, shim_table[i].name) >= 0) {
			emm_error("internal: shim table out of order at %s", shim_table[i].name);
			s = -1;
			break;
		}
	}
	atomic_store_explicit(&table_sorted, s, memory_order_relaxed);
	return s > 0;
}

void *emm_shim_for(const char *exported_name)
{
	size_t lo = 0, hi = EMM_ARRAY_SIZE(shim_table);

	if (!exported_name)
		return NULL;
	if (EMM_LIKELY(table_check())) {
		while (lo < hi) {
			size_t mid = lo + (hi - lo) / 2;
			int c = strcmp(exported_name, shim_table[mid].name);
			if (c == 0)
				return shim_table[mid].fn;
			if (c < 0)
				hi = mid;
			else
				lo = mid + 1;
		}
	} else {
		for (size_t i = 0; i < EMM_ARRAY_SIZE(shim_table); i++)
			if (strcmp(exported_name, shim_table[i].name) == 0)
				return shim_table[i].fn;
	}
	return emm_resolver_shim_for(exported_name);
}
