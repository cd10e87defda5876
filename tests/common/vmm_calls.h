/* SPDX-License-Identifier: MIT */
/*
 * tests/common/vmm_calls.h - the VMM call sequences the tests make, as
 * XLA's platform allocator makes them: a buffer is a reservation, one
 * cuMemCreate handle mapped whole and made accessible; its free unmaps,
 * releases and frees the range. Shared by the shim tests (tests/shims,
 * over the test-double driver) and the GPU tests (tests/gpu, C and CUDA
 * C++). Functions are static inline.
 */
#ifndef EMM_TESTS_VMM_CALLS_H
#define EMM_TESTS_VMM_CALLS_H

#include <cuda.h>
#include <string.h>

struct vmm_buf {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle h;
};

/* Pinned device memory on device `dev`, with these shareable handle types. */
static inline CUmemAllocationProp vmm_call_prop(int dev, CUmemAllocationHandleType types)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = dev;
	p.requestedHandleTypes = types;
	return p;
}

/* Read and write access for device `dev`. */
static inline CUmemAccessDesc vmm_call_access(int dev)
{
	CUmemAccessDesc d;

	memset(&d, 0, sizeof(d));
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = dev;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return d;
}

/* XLA's allocation: reserve, create with *p, map, set access d[0..nd). */
static inline CUresult vmm_call_alloc(struct vmm_buf *b, size_t size, const CUmemAllocationProp *p,
                                       const CUmemAccessDesc *d, size_t nd)
{
	CUresult r;

	b->size = size;
	if ((r = cuMemAddressReserve(&b->va, size, 0, 0, 0)) != CUDA_SUCCESS)
		return r;
	if ((r = cuMemCreate(&b->h, size, p, 0)) != CUDA_SUCCESS)
		return r;
	if ((r = cuMemMap(b->va, size, 0, b->h, 0)) != CUDA_SUCCESS)
		return r;
	return cuMemSetAccess(b->va, size, d, nd);
}

/* XLA's free: unmap the whole range, release the handle, free the range. */
static inline CUresult vmm_call_free(const struct vmm_buf *b)
{
	CUresult r;

	if ((r = cuMemUnmap(b->va, b->size)) != CUDA_SUCCESS)
		return r;
	if ((r = cuMemRelease(b->h)) != CUDA_SUCCESS)
		return r;
	return cuMemAddressFree(b->va, b->size);
}

#endif
