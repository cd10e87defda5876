/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_vmm.c - the driver's virtual-memory-management calls:
 * reserve and free address ranges (cuMemAddressReserve, cuMemAddressFree),
 * create and release physical allocations (cuMemCreate, cuMemRelease),
 * map, unmap and set access (cuMemMap, cuMemUnmap, cuMemSetAccess), and the
 * calls that only look at or share them (cuMemGetAccess,
 * cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle,
 * cuMemExportToShareableHandle, cuMemImportFromShareableHandle).
 *
 * Each asks the process layer's VMM cache first (process/vmm.c: a whole
 * buffer freed with its range is kept mapped and handed back to the next
 * matching reserve + create + map + set-access), and otherwise calls the
 * driver with the program's arguments and returns its answer unchanged.
 * The cache serves a call only when the same call with the same arguments
 * succeeded before, so a served call is one the driver would have accepted.
 * EMM_VMM=off (or EMM_DISABLE) makes every one a plain jump to the driver.
 */
#include <cuda.h>
#include <stdint.h>

#include "common/compiler.h"
#include "common/log.h"
#include "interpose/shims.h"

#define VMM(fn)		   (emm_real_vmm()->fn)
#define CALL_VMM(fn, ...) (VMM(fn) ? VMM(fn)(__VA_ARGS__) : CUDA_ERROR_NOT_INITIALIZED)

static bool vmm_off(void)
{
	return emm_vmm_mode() == EMM_VMM_MODE_OFF;
}

/* EMM_VERBOSE=2: every VMM call the program makes, with what libemm did. */
#define VMM_TRACE(...)                          \
	do {                                    \
		if (emm_log_debug_enabled())    \
			emm_debug(__VA_ARGS__); \
	} while (0)

/* --- address ranges ------------------------------------------------------ */

EMM_EXPORT CUresult CUDAAPI cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                                unsigned long long flags)
{
	CUresult r;

	if (vmm_off())
		return CALL_VMM(cuMemAddressReserve, ptr, size, alignment, addr, flags);
	if (emm_vmm_reserve(size, alignment, addr, flags, ptr)) {
		VMM_TRACE("vmm: cuMemAddressReserve(%zu, align %zu, addr %#llx, flags %llu) -> %#llx (cache)", size,
		          alignment, (unsigned long long)addr, flags, (unsigned long long)*ptr);
		return CUDA_SUCCESS;
	}
	r = CALL_VMM(cuMemAddressReserve, ptr, size, alignment, addr, flags);
	VMM_TRACE("vmm: cuMemAddressReserve(%zu, align %zu, addr %#llx, flags %llu) -> %d %#llx", size, alignment,
	          (unsigned long long)addr, flags, (int)r, r == CUDA_SUCCESS ? (unsigned long long)*ptr : 0ull);
	emm_vmm_reserve_done(r == CUDA_SUCCESS ? *ptr : 0, size, addr, flags, r == CUDA_SUCCESS);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	CUresult r;

	if (vmm_off())
		return CALL_VMM(cuMemAddressFree, ptr, size);
	if (emm_vmm_address_free(ptr, size)) {
		VMM_TRACE("vmm: cuMemAddressFree(%#llx, %zu) (cache)", (unsigned long long)ptr, size);
		return CUDA_SUCCESS;
	}
	r = CALL_VMM(cuMemAddressFree, ptr, size);
	VMM_TRACE("vmm: cuMemAddressFree(%#llx, %zu) -> %d", (unsigned long long)ptr, size, (int)r);
	emm_vmm_address_free_done(ptr, size, r == CUDA_SUCCESS);
	return r;
}

/* --- physical allocations ------------------------------------------------ */

EMM_EXPORT CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                        const CUmemAllocationProp *prop, unsigned long long flags)
{
	CUresult r;

	if (vmm_off())
		return CALL_VMM(cuMemCreate, handle, size, prop, flags);
	if (emm_vmm_create(size, prop, flags, handle)) {
		VMM_TRACE("vmm: cuMemCreate(%zu) -> %#llx (cache)", size, (unsigned long long)*handle);
		return CUDA_SUCCESS;
	}
	r = CALL_VMM(cuMemCreate, handle, size, prop, flags);
	VMM_TRACE("vmm: cuMemCreate(%zu, type %d, loc %d/%d, handle types %d, compression %d, rdma %d, usage %d, "
	          "flags %llu) -> %d %#llx",
	          size, prop ? (int)prop->type : -1, prop ? (int)prop->location.type : -1,
	          prop ? prop->location.id : -1, prop ? (int)prop->requestedHandleTypes : -1,
	          prop ? (int)prop->allocFlags.compressionType : -1,
	          prop ? (int)prop->allocFlags.gpuDirectRDMACapable : -1, prop ? (int)prop->allocFlags.usage : -1,
	          flags, (int)r, r == CUDA_SUCCESS ? (unsigned long long)*handle : 0ull);
	/* Idle VMM memory is free memory to the program: give it back and
	 * try once more (EMM_OOM_RETRY). */
	if (r == CUDA_ERROR_OUT_OF_MEMORY && emm_vmm_oom_release())
		r = CALL_VMM(cuMemCreate, handle, size, prop, flags);
	emm_vmm_create_done(r == CUDA_SUCCESS ? *handle : 0, size, prop, flags, r == CUDA_SUCCESS);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
	CUresult r;

	if (vmm_off())
		return CALL_VMM(cuMemRelease, handle);
	if (emm_vmm_release(handle)) {
		VMM_TRACE("vmm: cuMemRelease(%#llx) (cache)", (unsigned long long)handle);
		return CUDA_SUCCESS;
	}
	r = CALL_VMM(cuMemRelease, handle);
	VMM_TRACE("vmm: cuMemRelease(%#llx) -> %d", (unsigned long long)handle, (int)r);
	emm_vmm_release_done(handle, r == CUDA_SUCCESS);
	return r;
}

/* --- mappings ------------------------------------------------------------ */

EMM_EXPORT CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                     unsigned long long flags)
{
	CUresult r;

	if (vmm_off())
		return CALL_VMM(cuMemMap, ptr, size, offset, handle, flags);
	if (emm_vmm_map(ptr, size, offset, handle, flags)) {
		VMM_TRACE("vmm: cuMemMap(%#llx, %zu, %zu, %#llx) (cache)", (unsigned long long)ptr, size, offset,
		          (unsigned long long)handle);
		return CUDA_SUCCESS;
	}
	r = CALL_VMM(cuMemMap, ptr, size, offset, handle, flags);
	VMM_TRACE("vmm: cuMemMap(%#llx, %zu, %zu, %#llx, %llu) -> %d", (unsigned long long)ptr, size, offset,
	          (unsigned long long)handle, flags, (int)r);
	emm_vmm_map_done(ptr, size, offset, handle, flags, r == CUDA_SUCCESS);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	CUresult r;

	if (vmm_off())
		return CALL_VMM(cuMemUnmap, ptr, size);
	if (emm_vmm_unmap(ptr, size)) {
		VMM_TRACE("vmm: cuMemUnmap(%#llx, %zu) (cache)", (unsigned long long)ptr, size);
		return CUDA_SUCCESS;
	}
	r = CALL_VMM(cuMemUnmap, ptr, size);
	VMM_TRACE("vmm: cuMemUnmap(%#llx, %zu) -> %d", (unsigned long long)ptr, size, (int)r);
	emm_vmm_unmap_done(ptr, size, r == CUDA_SUCCESS);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	CUresult r;

	if (vmm_off())
		return CALL_VMM(cuMemSetAccess, ptr, size, desc, count);
	if (emm_vmm_set_access(ptr, size, desc, count)) {
		VMM_TRACE("vmm: cuMemSetAccess(%#llx, %zu) (cache)", (unsigned long long)ptr, size);
		return CUDA_SUCCESS;
	}
	r = CALL_VMM(cuMemSetAccess, ptr, size, desc, count);
	VMM_TRACE("vmm: cuMemSetAccess(%#llx, %zu, %zu desc, first loc %d/%d flags %llu) -> %d",
	          (unsigned long long)ptr, size, count, desc && count ? (int)desc[0].location.type : -1,
	          desc && count ? desc[0].location.id : -1,
	          desc && count ? (unsigned long long)desc[0].flags : 0ull, (int)r);
	emm_vmm_set_access_done(ptr, size, desc, count, r == CUDA_SUCCESS);
	return r;
}

/* --- queries and sharing (always the driver's) ----------------------------- */

EMM_EXPORT CUresult CUDAAPI cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location,
                                           CUdeviceptr ptr)
{
	if (!vmm_off())
		emm_vmm_touch(ptr, 0, false, 0, false);
	return CALL_VMM(cuMemGetAccess, flags, location, ptr);
}

EMM_EXPORT CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	CUresult r;

	/* A second reference the program releases on its own: the buffer is
	 * never cached. */
	if (!vmm_off())
		emm_vmm_touch((CUdeviceptr)(uintptr_t)addr, 0, false, 0, true);
	r = CALL_VMM(cuMemRetainAllocationHandle, handle, addr);
	if (r == CUDA_SUCCESS && !vmm_off())
		emm_vmm_touch(0, 0, true, *handle, true);
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop,
                                                                   CUmemGenericAllocationHandle handle)
{
	if (!vmm_off())
		emm_vmm_touch(0, 0, true, handle, false);
	return CALL_VMM(cuMemGetAllocationPropertiesFromHandle, prop, handle);
}

EMM_EXPORT CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
                                                         CUmemAllocationHandleType handleType,
                                                         unsigned long long flags)
{
	/* Another process may map it: never reuse it for someone else. */
	if (!vmm_off())
		emm_vmm_touch(0, 0, true, handle, true);
	return CALL_VMM(cuMemExportToShareableHandle, shareableHandle, handle, handleType, flags);
}

EMM_EXPORT CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
                                                           CUmemAllocationHandleType shHandleType)
{
	CUresult r = CALL_VMM(cuMemImportFromShareableHandle, handle, osHandle, shHandleType);

	if (r == CUDA_SUCCESS && !vmm_off())
		emm_vmm_imported(*handle);
	return r;
}
