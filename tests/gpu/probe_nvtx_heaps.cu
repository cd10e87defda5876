/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/probe_nvtx_heaps.cu - which memory compute-sanitizer accepts as
 * an NVTX sub-allocator heap (a measurement for project issue 16, not a
 * test; run it under `compute-sanitizer --tool memcheck`, without libemm).
 * Under EMM_BACKEND=vmm and async the tool refused libemm's segments
 * ("Call to nvtxMemHeapRegister failed"). Each case below registers one
 * range and prints whether the tool accepted it (a virtual-address heap's
 * handle is its address when accepted), then unregisters it:
 *
 *   cudaMalloc             4 MiB (the control: the driver backend's case)
 *   vmm-whole              8 MiB reserved, one 8 MiB handle mapped, access set
 *   vmm-two-maps           8 MiB reserved, two 4 MiB handles mapped
 *   vmm-partly-mapped      8 MiB reserved, 4 MiB mapped: the whole range
 *   vmm-mapped-part        the same: only the mapped 4 MiB
 *   vmm-no-access          8 MiB mapped, access not yet set
 *   vmm-big-reserve        64 MiB reserved (a growable segment), 8 MiB mapped: the 8 MiB
 *   pool-before-sync       cuMemAllocFromPoolAsync, registered before the stream ran it
 *   pool-after-sync        the same after cuStreamSynchronize
 *   managed                cuMemAllocManaged 4 MiB
 *
 * Prints "PROBE <case> accepted|refused". Exit 77 without a GPU.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>

#include "probe_nvtx.h"

static void probe(const char *name, CUdeviceptr p, size_t size)
{
	printf("CASE %s\n", name);
	fflush(stdout);
	nvtxMemHeapHandle_t h = probe_heap_register((const void *)(uintptr_t)p, size);
	bool ok = h == (nvtxMemHeapHandle_t)(uintptr_t)p;
	printf("PROBE %s %s\n", name, ok ? "accepted" : "refused");
	fflush(stdout);
	if (ok)
		nvtxMemHeapUnregister(NULL, h);
}

#define CK(x)                                                                        \
	do {                                                                         \
		CUresult r_ = (x);                                                   \
		if (r_ != CUDA_SUCCESS) {                                            \
			printf("%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, (int)r_); \
			return 1;                                                    \
		}                                                                    \
	} while (0)

static CUmemAllocationProp prop_of(CUdevice dev)
{
	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	return prop;
}

/* Reserve `reserve` bytes and map `nmaps` handles of `each` bytes at its
 * start; access set when `access`. */
static int vmm_range(CUdevice dev, size_t reserve, unsigned nmaps, size_t each, bool access, CUdeviceptr *ret,
                     CUmemGenericAllocationHandle *hs)
{
	CUmemAllocationProp prop = prop_of(dev);
	CK(cuMemAddressReserve(ret, reserve, 0, 0, 0));
	for (unsigned i = 0; i < nmaps; i++) {
		CK(cuMemCreate(&hs[i], each, &prop, 0));
		CK(cuMemMap(*ret + i * each, each, 0, hs[i], 0));
	}
	if (access) {
		CUmemAccessDesc a = {};
		a.location = prop.location;
		a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		CK(cuMemSetAccess(*ret, nmaps * each, &a, 1));
	}
	return 0;
}

static int vmm_done(CUdeviceptr p, size_t reserve, unsigned nmaps, size_t each, CUmemGenericAllocationHandle *hs)
{
	for (unsigned i = 0; i < nmaps; i++) {
		CK(cuMemUnmap(p + i * each, each));
		CK(cuMemRelease(hs[i]));
	}
	CK(cuMemAddressFree(p, reserve));
	return 0;
}

int main(void)
{
	CUdevice dev;
	CUcontext ctx;
	int n = 0;
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
		printf("skip: no GPU\n");
		return 77;
	}
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	const size_t MiB = 1 << 20;
	CUdeviceptr p;
	CUmemGenericAllocationHandle hs[2];

	CK(cuMemAlloc(&p, 4 * MiB));
	probe("cudaMalloc", p, 4 * MiB);
	CK(cuMemFree(p));

	/* The VMM cases: a reservation, handles mapped at its start, and the
	 * ranges registered (a second one where `size2` is set). */
	static const struct {
		const char *name, *name2;
		size_t reserve, each, size, size2;
		unsigned nmaps;
		bool access;
	} cases[] = {
	    {"vmm-whole", NULL, 8 * MiB, 8 * MiB, 8 * MiB, 0, 1, true},
	    {"vmm-two-maps", NULL, 8 * MiB, 4 * MiB, 8 * MiB, 0, 2, true},
	    {"vmm-partly-mapped", "vmm-mapped-part", 8 * MiB, 4 * MiB, 8 * MiB, 4 * MiB, 1, true},
	    {"vmm-no-access", NULL, 8 * MiB, 8 * MiB, 8 * MiB, 0, 1, false},
	    {"vmm-big-reserve", NULL, 64 * MiB, 8 * MiB, 8 * MiB, 0, 1, true},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (vmm_range(dev, cases[i].reserve, cases[i].nmaps, cases[i].each, cases[i].access, &p, hs))
			return 1;
		probe(cases[i].name, p, cases[i].size);
		if (cases[i].name2)
			probe(cases[i].name2, p, cases[i].size2);
		if (vmm_done(p, cases[i].reserve, cases[i].nmaps, cases[i].each, hs))
			return 1;
	}

	CUmemoryPool pool;
	CUmemPoolProps pp = {};
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = dev;
	CK(cuMemPoolCreate(&pool, &pp));
	CUstream s;
	CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	CK(cuMemAllocFromPoolAsync(&p, 4 * MiB, pool, s));
	probe("pool-before-sync", p, 4 * MiB);
	CK(cuStreamSynchronize(s));
	probe("pool-after-sync", p, 4 * MiB);
	CK(cuMemFreeAsync(p, s));
	CK(cuStreamSynchronize(s));
	CK(cuStreamDestroy(s));
	CK(cuMemPoolDestroy(pool));

	CK(cuMemAllocManaged(&p, 4 * MiB, CU_MEM_ATTACH_GLOBAL));
	probe("managed", p, 4 * MiB);
	CK(cuMemFree(p));
	CK(cuDevicePrimaryCtxRelease(dev));
	return 0;
}
