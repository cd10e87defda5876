/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_array.c - CUDA arrays: cuArrayCreate_v2,
 * cuArray3DCreate_v2, cuMipmappedArrayCreate and their destroys. The fake
 * keeps only the handle (no texture memory behind it): libemm passes these
 * calls by and counts them, which is all the CPU suites check.
 *
 * Errors as the real driver documents them: CUDA_ERROR_NOT_INITIALIZED
 * before cuInit, CUDA_ERROR_INVALID_CONTEXT without a current context,
 * CUDA_ERROR_INVALID_VALUE for a NULL handle or descriptor, a 0 width, an
 * unknown format, a channel count other than 1, 2 or 4, or 0 mipmap levels;
 * CUDA_ERROR_INVALID_HANDLE for destroying an unknown array.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "fake.h"

struct fake_array {
	CUDA_ARRAY3D_DESCRIPTOR desc;
	unsigned int levels;
};

static struct fake_ptrset array_set, mipmap_set;

static bool format_ok(CUarray_format f)
{
	switch (f) {
	case CU_AD_FORMAT_UNSIGNED_INT8:
	case CU_AD_FORMAT_UNSIGNED_INT16:
	case CU_AD_FORMAT_UNSIGNED_INT32:
	case CU_AD_FORMAT_SIGNED_INT8:
	case CU_AD_FORMAT_SIGNED_INT16:
	case CU_AD_FORMAT_SIGNED_INT32:
	case CU_AD_FORMAT_HALF:
	case CU_AD_FORMAT_FLOAT:
		return true;
	default:
		return false;
	}
}

static CUresult create(struct fake_ptrset *set, void **handle, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned int levels)
{
	struct fake_ctx *ctx;
	struct fake_array *a = NULL;
	CUresult r;

	fake_lock();
	r = fake_current_ctx_locked(&ctx);
	if (r == CUDA_SUCCESS && (!handle || !d || !d->Width || !format_ok(d->Format) ||
	                          (d->NumChannels != 1 && d->NumChannels != 2 && d->NumChannels != 4) || !levels))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		a = malloc(sizeof(*a));
		if (!a)
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (r == CUDA_SUCCESS) {
		a->desc = *d;
		a->levels = levels;
		if (fake_ptrset_add(set, a))
			*handle = a;
		else {
			free(a);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	fake_unlock();
	return r;
}

static CUresult destroy(struct fake_ptrset *set, void *handle)
{
	CUresult r;

	fake_lock();
	r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!handle || !fake_ptrset_del(set, handle)))
		r = CUDA_ERROR_INVALID_HANDLE;
	fake_unlock();
	if (r == CUDA_SUCCESS)
		free(handle);
	return r;
}

FAKE_API CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
	CUDA_ARRAY3D_DESCRIPTOR d = {0};

	FAKE_ENTER(cuArrayCreate_v2);
	if (pAllocateArray) {
		d.Width = pAllocateArray->Width;
		d.Height = pAllocateArray->Height;
		d.Format = pAllocateArray->Format;
		d.NumChannels = pAllocateArray->NumChannels;
	}
	return create(&array_set, (void **)pHandle, pAllocateArray ? &d : NULL, 1);
}

FAKE_API CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
	FAKE_ENTER(cuArray3DCreate_v2);
	return create(&array_set, (void **)pHandle, pAllocateArray, 1);
}

FAKE_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                         unsigned int numMipmapLevels)
{
	FAKE_ENTER(cuMipmappedArrayCreate);
	return create(&mipmap_set, (void **)pHandle, pMipmappedArrayDesc, numMipmapLevels);
}

FAKE_API CUresult cuArrayDestroy(CUarray hArray)
{
	FAKE_ENTER(cuArrayDestroy);
	return destroy(&array_set, hArray);
}

FAKE_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
	FAKE_ENTER(cuMipmappedArrayDestroy);
	return destroy(&mipmap_set, hMipmappedArray);
}
