/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/shims_vmm.h - the VMM call sequences the shim tests make, as
 * XLA's platform allocator makes them: a buffer is a reservation, one
 * cuMemCreate handle mapped whole and made accessible; its free unmaps,
 * releases and frees the range. Shared by test_shims_vmm.c and
 * test_shims_multidev.c. Functions are static inline.
 */
#ifndef EMM_TESTS_SHIMS_VMM_H
#define EMM_TESTS_SHIMS_VMM_H

#include <cuda.h>
#include <string.h>

struct buf {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle h;
};

/* Pinned device memory on device `dev`, with these shareable handle types. */
static inline CUmemAllocationProp shims_vmm_prop(int dev, CUmemAllocationHandleType types)
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
static inline CUmemAccessDesc shims_vmm_access(int dev)
{
	CUmemAccessDesc d;

	memset(&d, 0, sizeof(d));
	d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	d.location.id = dev;
	d.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return d;
}

/* XLA's allocation: reserve, create with *p, map, set access d[0..nd). */
static inline CUresult shims_vmm_alloc(struct buf *b, size_t size, const CUmemAllocationProp *p,
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
static inline CUresult shims_vmm_free(const struct buf *b)
{
	CUresult r;

	if ((r = cuMemUnmap(b->va, b->size)) != CUDA_SUCCESS)
		return r;
	if ((r = cuMemRelease(b->h)) != CUDA_SUCCESS)
		return r;
	return cuMemAddressFree(b->va, b->size);
}

#endif
