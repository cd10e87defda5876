/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_query.c - the driver API's memory queries: cuMemGetInfo (idle
 * cache counted as free), cuMemGetAddressRange and cuPointerGetAttribute(s)
 * (the block the program was given, not the segment behind it), and
 * cuIpcGetMemHandle (exported only for a block that is a whole segment).
 */
#include <cuda.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"
#include "interpose/shims.h"

/* --- queries ----------------------------------------------------------- */

EMM_EXPORT CUresult CUDAAPI cuMemGetInfo_v2(size_t *free, size_t *total)
{
	CUresult r;

	/* Unmapped and released but not yet made real (a program giving VMM
	 * memory back, then asking what is free): make it real first. */
	if (emm_vmm_mode() == EMM_VMM_MODE_CACHE)
		emm_vmm_flush_pending();
	r = CALL_REAL(cuMemGetInfo_v2, free, total);

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

EMM_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	struct emm_block_range range;
	CUresult r = CALL_REAL(cuMemGetAddressRange_v2, pbase, psize, dptr);
	int found;

	/* The driver validated the pointer (it lies in our segment); describe
	 * the block the program was given, as the driver does an allocation
	 * (its base and the size asked for). */
	if (r != CUDA_SUCCESS || !emm_state_enabled())
		return r;
	found = emm_serve_find_block(dptr, &range);
	if (found == 0) {
		if (pbase)
			*pbase = (CUdeviceptr)range.base;
		if (psize)
			*psize = range.requested;
	} else if (found == -ENXIO) {
		if (psize)
			*psize = 0;
		r = CUDA_ERROR_NOT_FOUND; /* the driver's answer past an allocation's end */
	}
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
	int found;

	if (r != CUDA_SUCCESS || !emm_state_enabled())
		return r;
	found = emm_serve_find_block(ptr, &range);
	if (found == 0)
		fix_range_attribute(attribute, data, &range);
	else if (found == -ENXIO)
		r = CUDA_ERROR_INVALID_VALUE; /* the driver's answer for memory nobody holds */
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                                   CUpointer_attribute *attributes, void **data,
                                                   CUdeviceptr ptr)
{
	struct emm_block_range range;
	CUresult r = CALL_REAL(cuPointerGetAttributes, numAttributes, attributes, data, ptr);

	if (r == CUDA_SUCCESS && attributes && data && emm_state_enabled() &&
	    emm_serve_find_block(ptr, &range) == 0)
		for (unsigned int i = 0; i < numAttributes; i++)
			fix_range_attribute(attributes[i], data[i], &range);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	static atomic_bool warned;
	struct emm_block_range range;
	bool refuse = false;

	/* A handle names the driver allocation - our segment. The importer
	 * maps the whole segment at its base: only a block that is the whole
	 * segment opens at its own bytes and shows nobody else's. Any other
	 * block is refused rather than silently wrong. Pinned memory is the
	 * driver's to refuse. */
	bool found = false, no_ipc = false;

	if (pHandle && emm_state_enabled()) {
		emm_state_enter();
		found = emm_serve_find_block(dptr, &range) == 0 && !emm_state_heap_is_pinned(range.heap);
		emm_state_leave();
		/* Segments of a backend that cannot share them (vmm, async,
		 * managed) are refused clearly rather than with the driver's
		 * puzzling answer about memory the program did not allocate. */
		no_ipc = found && !emm_state_backend_can_ipc();
		refuse = found && (no_ipc || range.base != range.segment_base || range.size != range.segment_size);
	}
	if (refuse) {
		emm_state_count(EMM_COUNT_IPC_REFUSED);
		if (!atomic_exchange(&warned, true)) {
			if (no_ipc)
				emm_warn("cuIpcGetMemHandle(%#llx): the %s backend's memory cannot be exported with "
				         "cuIpcGetMemHandle, so libemm refuses (CUDA_ERROR_NOT_SUPPORTED). Run this "
				         "program with EMM_BACKEND=driver or EMM_DISABLE=1 to export it",
				         (unsigned long long)dptr, emm_state_backend_name());
			else
				emm_warn("cuIpcGetMemHandle(%#llx): the block (%zu bytes at offset %llu) shares a "
				         "libemm segment of %zu bytes; another process would open the whole segment, "
				         "not this block, so libemm refuses (CUDA_ERROR_NOT_SUPPORTED). Run this "
				         "program with EMM_DISABLE=1 to export it",
				         (unsigned long long)dptr, range.size,
				         (unsigned long long)(range.base - range.segment_base), range.segment_size);
		}
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	return CALL_REAL(cuIpcGetMemHandle, pHandle, dptr);
}
