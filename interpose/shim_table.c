/* SPDX-License-Identifier: MIT */
/*
 * interpose/shim_table.c - the substitution table: an exact exported driver name
 * to libemm's replacement (emm_shim_for), sorted, checked on first use, and
 * falling back to the resolvers' own replacements.
 */
#include <cuda.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"
#include "interpose/shims.h"

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
    SHIM(cuArray3DCreate_v2),
    SHIM(cuArrayCreate_v2),
    SHIM(cuCtxCreate),
    SHIM(cuCtxCreate_v2),
    SHIM(cuCtxCreate_v3),
    SHIM(cuCtxCreate_v4),
    SHIM(cuCtxDestroy_v2),
    SHIM(cuCtxEnablePeerAccess),
    SHIM(cuCtxPopCurrent),
    SHIM(cuCtxPopCurrent_v2),
    SHIM(cuCtxPushCurrent),
    SHIM(cuCtxPushCurrent_v2),
    SHIM(cuCtxSetCurrent),
    SHIM(cuCtxSynchronize),
    SHIM(cuDevicePrimaryCtxRelease_v2),
    SHIM(cuDevicePrimaryCtxReset_v2),
    SHIM(cuDevicePrimaryCtxRetain),
    SHIM(cuGraphAddChildGraphNode),
    SHIM(cuGraphAddMemAllocNode),
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
    SHIM(cuIpcCloseMemHandle),
    SHIM(cuIpcGetMemHandle),
    SHIM(cuIpcOpenMemHandle),
    SHIM(cuIpcOpenMemHandle_v2),
    SHIM(cuMemAddressFree),
    SHIM(cuMemAddressReserve),
    SHIM(cuMemAllocAsync),
    SHIM(cuMemAllocAsync_ptsz),
    SHIM(cuMemAllocFromPoolAsync),
    SHIM(cuMemAllocFromPoolAsync_ptsz),
    SHIM(cuMemAllocHost_v2),
    SHIM(cuMemAllocManaged),
    SHIM(cuMemAllocPitch_v2),
    SHIM(cuMemAlloc_v2),
    SHIM(cuMemCreate),
    SHIM(cuMemExportToShareableHandle),
    SHIM(cuMemFreeAsync),
    SHIM(cuMemFreeAsync_ptsz),
    SHIM(cuMemFreeHost),
    SHIM(cuMemFree_v2),
    SHIM(cuMemGetAccess),
    SHIM(cuMemGetAddressRange_v2),
    SHIM(cuMemGetAllocationPropertiesFromHandle),
    SHIM(cuMemGetInfo_v2),
    SHIM(cuMemHostAlloc),
    SHIM(cuMemHostRegister_v2),
    SHIM(cuMemHostUnregister),
    SHIM(cuMemImportFromShareableHandle),
    SHIM(cuMemMap),
    SHIM(cuMemPoolCreate),
    SHIM(cuMemPoolDestroy),
    SHIM(cuMemPoolGetAttribute),
    SHIM(cuMemPoolSetAttribute),
    SHIM(cuMemPoolTrimTo),
    SHIM(cuMemRelease),
    SHIM(cuMemRetainAllocationHandle),
    SHIM(cuMemSetAccess),
    SHIM(cuMemUnmap),
    SHIM(cuMipmappedArrayCreate),
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
