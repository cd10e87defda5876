/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_procaddr.c - cuGetProcAddress, cuGetProcAddress_v2,
 * cuGetExportTable (with the fake's one private table, fakecuda.h).
 *
 * The driver resolves a base name ("cuMemAlloc") and the CUDA version the
 * caller was built for to the exported function with that ABI: the highest
 * variant introduced at or before cudaVersion (cudaTypedefs.h names each
 * one PFN_<base>_v<version>). With CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
 * the per-thread variant (_ptsz / _ptds) is preferred where one exists. The
 * pointer returned is the fake's own exported function (the library links
 * with -Bsymbolic-functions, so a preloaded library exporting the same name
 * does not take its place), and dladdr() names it exactly.
 */
#include "fake.h"

#include <string.h>

struct proc_entry {
	const char *base;
	int version;           /* the CUDA version that introduced this ABI */
	bool per_thread;
	void *fn;
};

#define LEGACY(base, version, sym) {#base, version, false, (void *)sym},
#define PT(base, version, sym) {#base, version, true, (void *)sym},

static const struct proc_entry table[] = {
	LEGACY(cuInit, 2000, cuInit)
	LEGACY(cuDriverGetVersion, 2020, cuDriverGetVersion)
	LEGACY(cuGetErrorName, 6000, cuGetErrorName)
	LEGACY(cuGetErrorString, 6000, cuGetErrorString)
	LEGACY(cuGetProcAddress, 11030, cuGetProcAddress)
	LEGACY(cuGetProcAddress, 12000, cuGetProcAddress_v2)
	LEGACY(cuGetExportTable, 3000, cuGetExportTable)
	LEGACY(cuDeviceGet, 2000, cuDeviceGet)
	LEGACY(cuDeviceGetCount, 2000, cuDeviceGetCount)
	LEGACY(cuDeviceGetName, 2000, cuDeviceGetName)
	LEGACY(cuDeviceGetAttribute, 2000, cuDeviceGetAttribute)
	LEGACY(cuDeviceTotalMem, 3020, cuDeviceTotalMem_v2)
	LEGACY(cuDeviceGetUuid, 9020, cuDeviceGetUuid)
	LEGACY(cuDeviceGetUuid, 11040, cuDeviceGetUuid_v2)
	LEGACY(cuDevicePrimaryCtxRetain, 7000, cuDevicePrimaryCtxRetain)
	LEGACY(cuDevicePrimaryCtxRelease, 7000, cuDevicePrimaryCtxRelease)
	LEGACY(cuDevicePrimaryCtxRelease, 11000, cuDevicePrimaryCtxRelease_v2)
	LEGACY(cuDevicePrimaryCtxReset, 7000, cuDevicePrimaryCtxReset)
	LEGACY(cuDevicePrimaryCtxReset, 11000, cuDevicePrimaryCtxReset_v2)
	LEGACY(cuDevicePrimaryCtxGetState, 7000, cuDevicePrimaryCtxGetState)
	LEGACY(cuDevicePrimaryCtxSetFlags, 7000, cuDevicePrimaryCtxSetFlags)
	LEGACY(cuDevicePrimaryCtxSetFlags, 11000, cuDevicePrimaryCtxSetFlags_v2)
	LEGACY(cuCtxCreate, 2000, cuCtxCreate)
	LEGACY(cuCtxCreate, 3020, cuCtxCreate_v2)
	LEGACY(cuCtxCreate, 11040, cuCtxCreate_v3)
	LEGACY(cuCtxCreate, 12050, cuCtxCreate_v4)
	LEGACY(cuCtxDestroy, 2000, cuCtxDestroy)
	LEGACY(cuCtxDestroy, 4000, cuCtxDestroy_v2)
	LEGACY(cuCtxGetCurrent, 4000, cuCtxGetCurrent)
	LEGACY(cuCtxSetCurrent, 4000, cuCtxSetCurrent)
	LEGACY(cuCtxPushCurrent, 2000, cuCtxPushCurrent)
	LEGACY(cuCtxPushCurrent, 4000, cuCtxPushCurrent_v2)
	LEGACY(cuCtxPopCurrent, 2000, cuCtxPopCurrent)
	LEGACY(cuCtxPopCurrent, 4000, cuCtxPopCurrent_v2)
	LEGACY(cuCtxGetDevice, 2000, cuCtxGetDevice)
	LEGACY(cuCtxGetDevice, 13000, cuCtxGetDevice_v2)
	LEGACY(cuCtxSynchronize, 2000, cuCtxSynchronize)
	LEGACY(cuCtxSynchronize, 13000, cuCtxSynchronize_v2)
	LEGACY(cuCtxGetStreamPriorityRange, 5050, cuCtxGetStreamPriorityRange)
	LEGACY(cuCtxGetId, 12000, cuCtxGetId)
	LEGACY(cuMemAlloc, 2000, cuMemAlloc)
	LEGACY(cuMemAlloc, 3020, cuMemAlloc_v2)
	LEGACY(cuMemFree, 2000, cuMemFree)
	LEGACY(cuMemFree, 3020, cuMemFree_v2)
	LEGACY(cuMemAllocPitch, 2000, cuMemAllocPitch)
	LEGACY(cuMemAllocPitch, 3020, cuMemAllocPitch_v2)
	LEGACY(cuMemAllocAsync, 11020, cuMemAllocAsync)
	PT(cuMemAllocAsync, 11020, cuMemAllocAsync_ptsz)
	LEGACY(cuMemFreeAsync, 11020, cuMemFreeAsync)
	PT(cuMemFreeAsync, 11020, cuMemFreeAsync_ptsz)
	LEGACY(cuMemAllocHost, 2000, cuMemAllocHost)
	LEGACY(cuMemAllocHost, 3020, cuMemAllocHost_v2)
	LEGACY(cuMemHostAlloc, 2020, cuMemHostAlloc)
	LEGACY(cuMemFreeHost, 2000, cuMemFreeHost)
	LEGACY(cuMemHostRegister, 4000, cuMemHostRegister)
	LEGACY(cuMemHostRegister, 6050, cuMemHostRegister_v2)
	LEGACY(cuMemHostUnregister, 4000, cuMemHostUnregister)
	LEGACY(cuMemHostGetDevicePointer, 3020, cuMemHostGetDevicePointer_v2)
	LEGACY(cuMemHostGetFlags, 2030, cuMemHostGetFlags)
	LEGACY(cuMemAllocManaged, 6000, cuMemAllocManaged)
	LEGACY(cuMemGetInfo, 2000, cuMemGetInfo)
	LEGACY(cuMemGetInfo, 3020, cuMemGetInfo_v2)
	LEGACY(cuMemGetAddressRange, 2000, cuMemGetAddressRange)
	LEGACY(cuMemGetAddressRange, 3020, cuMemGetAddressRange_v2)
	LEGACY(cuPointerGetAttribute, 4000, cuPointerGetAttribute)
	LEGACY(cuPointerGetAttributes, 7000, cuPointerGetAttributes)
	LEGACY(cuMemsetD8, 3020, cuMemsetD8_v2)
	PT(cuMemsetD8, 7000, cuMemsetD8_v2_ptds)
	LEGACY(cuMemsetD8Async, 3020, cuMemsetD8Async)
	PT(cuMemsetD8Async, 7000, cuMemsetD8Async_ptsz)
	LEGACY(cuMemcpyHtoD, 3020, cuMemcpyHtoD_v2)
	PT(cuMemcpyHtoD, 7000, cuMemcpyHtoD_v2_ptds)
	LEGACY(cuMemcpyDtoH, 3020, cuMemcpyDtoH_v2)
	PT(cuMemcpyDtoH, 7000, cuMemcpyDtoH_v2_ptds)
	LEGACY(cuMemcpyDtoD, 3020, cuMemcpyDtoD_v2)
	PT(cuMemcpyDtoD, 7000, cuMemcpyDtoD_v2_ptds)
	LEGACY(cuMemcpy, 4000, cuMemcpy)
	PT(cuMemcpy, 7000, cuMemcpy_ptds)
	LEGACY(cuIpcGetMemHandle, 4010, cuIpcGetMemHandle)
	LEGACY(cuIpcOpenMemHandle, 4010, cuIpcOpenMemHandle)
	LEGACY(cuIpcOpenMemHandle, 11000, cuIpcOpenMemHandle_v2)
	LEGACY(cuIpcCloseMemHandle, 4010, cuIpcCloseMemHandle)
	LEGACY(cuStreamCreate, 2000, cuStreamCreate)
	LEGACY(cuStreamCreateWithPriority, 5050, cuStreamCreateWithPriority)
	LEGACY(cuStreamDestroy, 2000, cuStreamDestroy)
	LEGACY(cuStreamDestroy, 4000, cuStreamDestroy_v2)
	LEGACY(cuStreamGetFlags, 5050, cuStreamGetFlags)
	PT(cuStreamGetFlags, 7000, cuStreamGetFlags_ptsz)
	LEGACY(cuStreamGetPriority, 5050, cuStreamGetPriority)
	PT(cuStreamGetPriority, 7000, cuStreamGetPriority_ptsz)
	LEGACY(cuStreamGetCtx, 9020, cuStreamGetCtx)
	PT(cuStreamGetCtx, 9020, cuStreamGetCtx_ptsz)
	LEGACY(cuStreamGetCtx, 12050, cuStreamGetCtx_v2)
	PT(cuStreamGetCtx, 12050, cuStreamGetCtx_v2_ptsz)
	LEGACY(cuStreamGetId, 12000, cuStreamGetId)
	PT(cuStreamGetId, 12000, cuStreamGetId_ptsz)
	LEGACY(cuStreamSynchronize, 2000, cuStreamSynchronize)
	PT(cuStreamSynchronize, 7000, cuStreamSynchronize_ptsz)
	LEGACY(cuStreamQuery, 2000, cuStreamQuery)
	PT(cuStreamQuery, 7000, cuStreamQuery_ptsz)
	LEGACY(cuStreamWaitEvent, 3020, cuStreamWaitEvent)
	PT(cuStreamWaitEvent, 7000, cuStreamWaitEvent_ptsz)
	LEGACY(cuStreamBeginCapture, 10000, cuStreamBeginCapture)
	PT(cuStreamBeginCapture, 10000, cuStreamBeginCapture_ptsz)
	LEGACY(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2)
	PT(cuStreamBeginCapture, 10010, cuStreamBeginCapture_v2_ptsz)
	LEGACY(cuStreamEndCapture, 10000, cuStreamEndCapture)
	PT(cuStreamEndCapture, 10000, cuStreamEndCapture_ptsz)
	LEGACY(cuStreamIsCapturing, 10000, cuStreamIsCapturing)
	PT(cuStreamIsCapturing, 10000, cuStreamIsCapturing_ptsz)
	LEGACY(cuStreamGetCaptureInfo, 10010, cuStreamGetCaptureInfo)
	PT(cuStreamGetCaptureInfo, 10010, cuStreamGetCaptureInfo_ptsz)
	LEGACY(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2)
	PT(cuStreamGetCaptureInfo, 11030, cuStreamGetCaptureInfo_v2_ptsz)
	LEGACY(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3)
	PT(cuStreamGetCaptureInfo, 12030, cuStreamGetCaptureInfo_v3_ptsz)
	LEGACY(cuThreadExchangeStreamCaptureMode, 10010, cuThreadExchangeStreamCaptureMode)
	LEGACY(cuEventCreate, 2000, cuEventCreate)
	LEGACY(cuEventRecord, 2000, cuEventRecord)
	PT(cuEventRecord, 7000, cuEventRecord_ptsz)
	LEGACY(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags)
	PT(cuEventRecordWithFlags, 11010, cuEventRecordWithFlags_ptsz)
	LEGACY(cuEventQuery, 2000, cuEventQuery)
	LEGACY(cuEventSynchronize, 2000, cuEventSynchronize)
	LEGACY(cuEventDestroy, 2000, cuEventDestroy)
	LEGACY(cuEventDestroy, 4000, cuEventDestroy_v2)
	LEGACY(cuGraphDestroy, 10000, cuGraphDestroy)
	LEGACY(cuGraphInstantiateWithFlags, 11040, cuGraphInstantiateWithFlags)
	LEGACY(cuGraphInstantiate, 10000, cuGraphInstantiate)
	LEGACY(cuGraphInstantiate, 11000, cuGraphInstantiate_v2)
	LEGACY(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams)
	PT(cuGraphInstantiateWithParams, 12000, cuGraphInstantiateWithParams_ptsz)
	LEGACY(cuGraphCreate, 10000, cuGraphCreate)
	LEGACY(cuGraphClone, 10000, cuGraphClone)
	LEGACY(cuGraphAddChildGraphNode, 10000, cuGraphAddChildGraphNode)
	LEGACY(cuGraphLaunch, 10000, cuGraphLaunch)
	PT(cuGraphLaunch, 10000, cuGraphLaunch_ptsz)
	LEGACY(cuGraphExecDestroy, 10000, cuGraphExecDestroy)
	LEGACY(cuMemPoolCreate, 11020, cuMemPoolCreate)
	LEGACY(cuMemPoolDestroy, 11020, cuMemPoolDestroy)
	LEGACY(cuMemPoolTrimTo, 11020, cuMemPoolTrimTo)
	LEGACY(cuMemPoolSetAttribute, 11020, cuMemPoolSetAttribute)
	LEGACY(cuMemPoolGetAttribute, 11020, cuMemPoolGetAttribute)
	LEGACY(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync)
	PT(cuMemAllocFromPoolAsync, 11020, cuMemAllocFromPoolAsync_ptsz)
	LEGACY(cuDeviceGetDefaultMemPool, 11020, cuDeviceGetDefaultMemPool)
	LEGACY(cuDeviceGetMemPool, 11020, cuDeviceGetMemPool)
	LEGACY(cuDeviceSetMemPool, 11020, cuDeviceSetMemPool)
	LEGACY(cuMemAddressReserve, 10020, cuMemAddressReserve)
	LEGACY(cuMemAddressFree, 10020, cuMemAddressFree)
	LEGACY(cuMemCreate, 10020, cuMemCreate)
	LEGACY(cuMemRelease, 10020, cuMemRelease)
	LEGACY(cuMemMap, 10020, cuMemMap)
	LEGACY(cuMemUnmap, 10020, cuMemUnmap)
	LEGACY(cuMemSetAccess, 10020, cuMemSetAccess)
	LEGACY(cuMemGetAccess, 10020, cuMemGetAccess)
	LEGACY(cuMemGetAllocationGranularity, 10020, cuMemGetAllocationGranularity)
	LEGACY(cuMemGetAllocationPropertiesFromHandle, 10020, cuMemGetAllocationPropertiesFromHandle)
	LEGACY(cuMemRetainAllocationHandle, 11000, cuMemRetainAllocationHandle)
	LEGACY(cuDeviceCanAccessPeer, 4000, cuDeviceCanAccessPeer)
	LEGACY(cuCtxEnablePeerAccess, 4000, cuCtxEnablePeerAccess)
	LEGACY(cuCtxDisablePeerAccess, 4000, cuCtxDisablePeerAccess)
	LEGACY(cuMemcpyPeer, 4000, cuMemcpyPeer)
	PT(cuMemcpyPeer, 7000, cuMemcpyPeer_ptds)
	LEGACY(cuMemcpyPeerAsync, 4000, cuMemcpyPeerAsync)
	PT(cuMemcpyPeerAsync, 7000, cuMemcpyPeerAsync_ptsz)
	LEGACY(cuArrayCreate, 3020, cuArrayCreate_v2)
	LEGACY(cuArray3DCreate, 3020, cuArray3DCreate_v2)
	LEGACY(cuMipmappedArrayCreate, 5000, cuMipmappedArrayCreate)
	LEGACY(cuArrayDestroy, 2000, cuArrayDestroy)
	LEGACY(cuMipmappedArrayDestroy, 5000, cuMipmappedArrayDestroy)
	LEGACY(cuGraphAddMemAllocNode, 11040, cuGraphAddMemAllocNode)
};

#undef LEGACY
#undef PT

/* Both forms return CUDA_ERROR_INVALID_VALUE for a cudaVersion above the
 * driver's or unknown flags. When nothing matches, cuGetProcAddress_v2
 * answers CUDA_SUCCESS with *pfn NULL and the reason in *symbolStatus (as
 * documented); the 4-argument cuGetProcAddress answers CUDA_ERROR_NOT_FOUND
 * and leaves *pfn alone (seen on driver 580). With both stream flags set the
 * per-thread variant wins. The real driver crashes on a NULL symbol or pfn;
 * the fake answers CUDA_ERROR_INVALID_VALUE. */
static CUresult resolve(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
			CUdriverProcAddressQueryResult *status, bool v1)
{
	const cuuint64_t known = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	if (!symbol || !pfn || (flags & ~known))
		return CUDA_ERROR_INVALID_VALUE;
	if (cudaVersion > FAKE_DRIVER_VERSION) {
		*pfn = NULL;
		return CUDA_ERROR_INVALID_VALUE;
	}
	bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
	const struct proc_entry *legacy = NULL, *pt = NULL;
	bool found = false;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		const struct proc_entry *e = &table[i];
		if (strcmp(e->base, symbol) != 0)
			continue;
		found = true;
		if (e->version > cudaVersion)
			continue;
		const struct proc_entry **best = e->per_thread ? &pt : &legacy;
		if (!*best || (*best)->version < e->version)
			*best = e;
	}
	const struct proc_entry *pick = per_thread && pt ? pt : legacy;
	if (v1 && !pick)
		return CUDA_ERROR_NOT_FOUND;
	*pfn = pick ? pick->fn : NULL;
	if (status)
		*status = pick ? CU_GET_PROC_ADDRESS_SUCCESS
			 : found ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
				 : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
				      CUdriverProcAddressQueryResult *symbolStatus)
{
	FAKE_ENTER(cuGetProcAddress_v2);
	return resolve(symbol, pfn, cudaVersion, flags, symbolStatus, false);
}

FAKE_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	FAKE_ENTER(cuGetProcAddress);
	return resolve(symbol, pfn, cudaVersion, flags, NULL, true);
}

/* The one private table the fake has (fakecuda.h): memory a driver
 * component obtains from the driver behind the public entry points, as
 * libnvcuvid does through the real driver's tables. */
static const struct fakecuda_private_table private_table = {
	.size = sizeof(struct fakecuda_private_table),
	.alloc = fake_mem_private_alloc,
	.host_alloc = fake_mem_private_host_alloc,
};

/* The private tables cudart asks for: the fake has none of those. */
FAKE_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	static const CUuuid private_id = FAKECUDA_PRIVATE_TABLE_ID;

	FAKE_ENTER(cuGetExportTable);
	if (!ppExportTable || !pExportTableId)
		return CUDA_ERROR_INVALID_VALUE;
	if (memcmp(pExportTableId->bytes, private_id.bytes, sizeof(private_id.bytes)) == 0) {
		*ppExportTable = &private_table;
		return CUDA_SUCCESS;
	}
	*ppExportTable = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}
