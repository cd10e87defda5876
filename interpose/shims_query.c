/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_query.c - the driver API's memory queries: cuMemGetInfo (idle
 * cache counted as free), cuMemGetAddressRange and cuPointerGetAttribute(s)
 * (the block the program was given, not the segment behind it; a block
 * opened through a libemm IPC handle likewise), and legacy IPC of any
 * block (cuIpcGetMemHandle, cuIpcOpenMemHandle[_v2], cuIpcCloseMemHandle;
 * process/ipc*.c).
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

/* The range the program was given that contains addr: one of our blocks,
 * or a block opened through a libemm IPC handle (as its exporter answers).
 * 0, -ENXIO (in our memory or an opened segment, in no such block),
 * -ENOENT. */
static int block_range(CUdeviceptr addr, CUdeviceptr *ret_base, size_t *ret_size)
{
	struct emm_block_range range;
	emm_addr_t base;
	size_t size;
	int found = emm_serve_find_block(addr, &range);

	if (found == 0) {
		*ret_base = (CUdeviceptr)range.base;
		*ret_size = range.requested;
	} else if (found == -ENOENT && (found = emm_ipc_find_import(addr, &base, &size)) == 0) {
		*ret_base = (CUdeviceptr)base;
		*ret_size = size;
	}
	return found;
}

/* A query of a VMM buffer whose free libemm deferred sees what the driver
 * would: the deferred calls made real first (process/vmm.c). */
static inline void vmm_query(CUdeviceptr ptr)
{
	if (emm_vmm_mode() == EMM_VMM_MODE_CACHE)
		emm_vmm_touch(ptr, 0, false, 0, false);
}

EMM_EXPORT CUresult CUDAAPI cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	vmm_query(dptr);
	CUdeviceptr base, seg_base = 0;
	size_t size, seg_size = 0;
	int found;

	if (!emm_state_enabled())
		return CALL_REAL(cuMemGetAddressRange_v2, pbase, psize, dptr);
	/* The driver validates the pointer (in our segment, it answers for
	 * the segment); the program is told of the block it was given, as the
	 * driver tells of an allocation (its base and the size asked for),
	 * and of nothing at a failure: the outputs are written last. */
	CUresult r = CALL_REAL(cuMemGetAddressRange_v2, pbase ? &seg_base : NULL, psize ? &seg_size : NULL, dptr);
	if (r != CUDA_SUCCESS)
		return r;
	found = block_range(dptr, &base, &size);
	if (found == -ENXIO)
		return CUDA_ERROR_NOT_FOUND; /* the driver's answer past an allocation's end */
	if (found != 0) {
		base = seg_base; /* not ours: the driver's answer */
		size = seg_size;
	}
	if (pbase)
		*pbase = base;
	if (psize)
		*psize = size;
	return CUDA_SUCCESS;
}

/* Rewrite the range attributes the driver reported for the segment, and
 * the context it reported as none (a VMM-backed segment belongs to no
 * context; the program's cudaMalloc block belongs to its heap's). */
static void fix_range_attribute(CUpointer_attribute attribute, void *data, CUdeviceptr ptr, CUdeviceptr base,
                                size_t size)
{
	CUcontext ctx;

	if (!data)
		return;
	if (attribute == CU_POINTER_ATTRIBUTE_RANGE_START_ADDR)
		memcpy(data, &base, sizeof(base));
	else if (attribute == CU_POINTER_ATTRIBUTE_RANGE_SIZE)
		memcpy(data, &size, sizeof(size));
	else if (attribute == CU_POINTER_ATTRIBUTE_CONTEXT && !*(CUcontext *)data &&
	         emm_serve_block_context((emm_addr_t)ptr, &ctx) == 0)
		memcpy(data, &ctx, sizeof(ctx));
}

EMM_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
{
	vmm_query(ptr);
	CUresult r = CALL_REAL(cuPointerGetAttribute, data, attribute, ptr);
	CUdeviceptr base;
	size_t size;
	int found;

	if (r != CUDA_SUCCESS || !emm_state_enabled())
		return r;
	found = block_range(ptr, &base, &size);
	if (found == 0)
		fix_range_attribute(attribute, data, ptr, base, size);
	else if (found == -ENXIO)
		r = CUDA_ERROR_INVALID_VALUE; /* the driver's answer for memory nobody holds */
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuPointerGetAttributes(unsigned int numAttributes,
                                                   CUpointer_attribute *attributes, void **data,
                                                   CUdeviceptr ptr)
{
	CUdeviceptr base;
	size_t size;
	CUresult r;

	vmm_query(ptr);
	if (!attributes || !data || !emm_state_enabled())
		return CALL_REAL(cuPointerGetAttributes, numAttributes, attributes, data, ptr);
	int found = block_range(ptr, &base, &size);
	if (found == -ENXIO) {
		/* Memory nobody holds: the driver's answer for a pointer that is
		 * not CUDA memory (success, the defaults, the range attributes
		 * left alone), as the pointer 0 gets it, but for the host
		 * pointer, which such memory has at its own address. */
		r = CALL_REAL(cuPointerGetAttributes, numAttributes, attributes, data, (CUdeviceptr)0);
		for (unsigned int i = 0; r == CUDA_SUCCESS && i < numAttributes; i++)
			if (attributes[i] == CU_POINTER_ATTRIBUTE_HOST_POINTER && data[i])
				memcpy(data[i], &(void *){(void *)(uintptr_t)ptr}, sizeof(void *));
		return r;
	}
	r = CALL_REAL(cuPointerGetAttributes, numAttributes, attributes, data, ptr);
	if (r == CUDA_SUCCESS && found == 0)
		for (unsigned int i = 0; i < numAttributes; i++)
			fix_range_attribute(attributes[i], data[i], ptr, base, size);
	return r;
}

/* --- IPC (process/ipc*.c keep the books; the driver calls are here) ------ */

EMM_EXPORT CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
	struct emm_ipc_export ex;
	CUipcMemHandle segment;
	CUresult r;
	int got;

	/* A handle names a driver allocation - our segment. A block that is
	 * the whole segment is exported with the driver's handle; any other
	 * gets a libemm handle that names the block (another libemm process
	 * opens it at the block's first byte, the driver refuses it). Pinned
	 * memory and memory not ours are the driver's to answer. */
	if (!pHandle)
		return CALL_REAL(cuIpcGetMemHandle, pHandle, dptr);
	got = emm_ipc_export_begin((emm_addr_t)dptr, &ex);
	if (got == -EINVAL)
		return CUDA_ERROR_INVALID_VALUE;
	if (got == -ENOTSUP) {
		emm_state_count(EMM_COUNT_IPC_REFUSED);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	if (got != 0)
		return CALL_REAL(cuIpcGetMemHandle, pHandle, dptr);
	r = CALL_REAL(cuIpcGetMemHandle, &segment, (CUdeviceptr)ex.segment_base);
	if (r != CUDA_SUCCESS)
		return r;
	if (emm_ipc_export_done(&ex, &segment, pHandle) != 0) {
		emm_state_count(EMM_COUNT_IPC_REFUSED);
		return CUDA_ERROR_NOT_SUPPORTED;
	}
	return CUDA_SUCCESS;
}

typedef CUresult (*ipc_open_fn)(CUdeviceptr *, CUipcMemHandle, unsigned int);

static CUresult ipc_open(ipc_open_fn real, CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags)
{
	struct emm_ipc_import im;
	emm_addr_t ptr = 0;
	CUdeviceptr base;
	CUresult r;
	int got;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	/* The driver checks the arguments; a libemm handle goes through the
	 * registry to the segment's own handle. */
	got = pdptr && !(flags & ~(unsigned int)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
	          ? emm_ipc_import_begin(&handle, &im, &ptr)
	          : -ENOENT;
	if (got == -ENOENT)
		return real(pdptr, handle, flags);
	if (got < 0)
		return got == -ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY
		       : got == -ENXIO ? CUDA_ERROR_INVALID_CONTEXT
		                       : CUDA_ERROR_INVALID_VALUE;
	if (got == 0) {
		r = real(&base, im.segment, flags);
		if (r != CUDA_SUCCESS) {
			emm_ipc_import_failed(&im);
			return r;
		}
		got = emm_ipc_import_done(&im, (emm_addr_t)base, &ptr);
		if (got != 0) {
			(void)CALL_REAL(cuIpcCloseMemHandle, base);
			return got == -ENOMEM ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_VALUE;
		}
	}
	*pdptr = (CUdeviceptr)ptr;
	return CUDA_SUCCESS;
}

EMM_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return ipc_open(REAL(cuIpcOpenMemHandle_v2), pdptr, handle, Flags);
}

/* The export of the old name (cuda.h renames it to _v2): the same ABI. */
EMM_EXPORT CUresult CUDAAPI cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
	return ipc_open((ipc_open_fn)emm_real_driver("cuIpcOpenMemHandle"), pdptr, handle, Flags);
}

EMM_EXPORT CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
	emm_addr_t base;
	unsigned closes;
	CUresult r = CUDA_SUCCESS;
	int got = emm_ipc_close((emm_addr_t)dptr, &base, &closes);

	if (got == -EINVAL)
		return CUDA_ERROR_INVALID_VALUE; /* the driver's answer for a pointer no open gave */
	if (got != 0)
		return CALL_REAL(cuIpcCloseMemHandle, dptr);
	while (closes-- > 0) {
		CUresult c = CALL_REAL(cuIpcCloseMemHandle, (CUdeviceptr)base);
		if (r == CUDA_SUCCESS)
			r = c;
	}
	return r;
}
