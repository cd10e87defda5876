/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims_array.c - CUDA arrays (cuArrayCreate, cuArray3DCreate,
 * cuMipmappedArrayCreate): the driver lays them out for the texture units,
 * so libemm passes every call through unchanged and only counts the
 * successful ones with the bytes their descriptor describes (EMM_STATS
 * "passed by": arrays). The runtime's cudaMallocArray, cudaMalloc3DArray
 * and cudaMallocMipmappedArray reach these through cudart's driver calls
 * (cuGetProcAddress hands out these shims), so they are counted once, here.
 *
 * The bytes are width x height x depth x channels x element size, summed
 * over the mipmap levels (each halves every extent, at least 1): the
 * driver's layout may round them up. Formats without a per-element size
 * (block-compressed, YUV) count their calls with 0 bytes.
 */
#include <cuda.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/compiler.h"
#include "interpose/shims.h"

static uint64_t element_bytes(CUarray_format format, unsigned int channels)
{
	switch (format) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT8:
		return channels;
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_HALF:
		return 2ull * channels;
	case CU_AD_FORMAT_UNSIGNED_INT32:
	case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_FLOAT:
		return 4ull * channels;
	default:
		return 0;
	}
}

static uint64_t extent(size_t n)
{
	return n ? n : 1;
}

/* The bytes of `levels` mipmap levels of a width x height x depth array
 * (a 0 height or depth is one row, one layer). */
static uint64_t array_bytes(const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	uint64_t elem = element_bytes(d->Format, d->NumChannels), total = 0;
	uint64_t w = extent(d->Width), h = extent(d->Height), z = extent(d->Depth);

	/* Layered arrays keep their layer count at every level. */
	bool layered = (d->Flags & CUDA_ARRAY3D_LAYERED) != 0;

	for (unsigned int l = 0; l < (levels ? levels : 1); l++) {
		total += w * h * z * elem;
		w = w > 1 ? w / 2 : 1;
		h = h > 1 ? h / 2 : 1;
		if (!layered)
			z = z > 1 ? z / 2 : 1;
	}
	return total;
}

static CUresult counted(CUresult r, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	if (r == CUDA_SUCCESS && d && emm_state_enabled())
		emm_state_passby(EMM_PASSBY_ARRAY, array_bytes(d, levels));
	return r;
}

EMM_EXPORT CUresult CUDAAPI cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
	CUDA_ARRAY3D_DESCRIPTOR d = {0};
	CUresult r = CALL_EXTRA(cuArrayCreate_v2, pHandle, pAllocateArray);

	if (pAllocateArray) {
		d.Width = pAllocateArray->Width;
		d.Height = pAllocateArray->Height;
		d.Format = pAllocateArray->Format;
		d.NumChannels = pAllocateArray->NumChannels;
	}
	return counted(r, pAllocateArray ? &d : NULL, 1);
}

EMM_EXPORT CUresult CUDAAPI cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
	return counted(CALL_EXTRA(cuArray3DCreate_v2, pHandle, pAllocateArray), pAllocateArray, 1);
}

EMM_EXPORT CUresult CUDAAPI cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                                   const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                                   unsigned int numMipmapLevels)
{
	return counted(CALL_EXTRA(cuMipmappedArrayCreate, pHandle, pMipmappedArrayDesc, numMipmapLevels),
	               pMipmappedArrayDesc, numMipmapLevels);
}
