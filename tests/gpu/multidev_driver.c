/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/multidev_driver.c - several devices through the driver API
 * (issue 14 part 1), the parts tests/race/multidevice.cu (runtime API,
 * kernels, races) does not cover:
 *
 *  1. cuMemGetInfo per device stays honest: memory libemm holds idle on
 *     device 0 is reported free on device 0, and device 1's answer does not
 *     move (within what the driver itself moves by);
 *  2. peer access through the driver: cuCtxEnablePeerAccess /
 *     cuCtxDisablePeerAccess return the driver's codes (success, then
 *     CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
 *     cuMemcpyPeer and cuMemcpyDtoD between pool blocks of two devices move
 *     the right bytes; pointer attributes name the owner from either context;
 *     a cuMemFree made while the other device's context is current counts on
 *     the owner's heap only;
 *  3. the VMM calls on device 1 (location id 1), mapped for both devices:
 *     data right, and under libemm the second round is served from device
 *     1's VMM cache (vmm_hits on device 1, no VMM counter of device 0 moves).
 *
 * Exits 77 with fewer than two devices or no driver. Every check holds
 * without libemm too (counters are then not read).
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_common.h"

static int g_fails;

#define CHECK(cond, ...)                                                     \
	do {                                                                 \
		if (!(cond)) {                                               \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
			g_fails++;                                           \
		}                                                            \
	} while (0)

#define CU(call)                                                                    \
	do {                                                                        \
		CUresult r_ = (call);                                               \
		if (r_ != CUDA_SUCCESS) {                                           \
			const char *n_ = NULL;                                      \
			cuGetErrorName(r_, &n_);                                    \
			fprintf(stderr, "FAIL %s:%d: %s = %s\n", __FILE__, __LINE__, \
			        #call, n_ ? n_ : "?");                              \
			exit(1);                                                    \
		}                                                                   \
	} while (0)

static CUcontext g_ctx[2];
static CUdevice g_dev[2];

static struct emm_stats stats_of(int dev)
{
	struct emm_stats s;

	(void)gpu_stats(dev, &s);
	return s;
}

static size_t free_of(int d)
{
	size_t f = 0, t = 0;

	CU(cuCtxSetCurrent(g_ctx[d]));
	CU(cuMemGetInfo(&f, &t));
	return f;
}

static long long mib_diff(size_t a, size_t b)
{
	return ((long long)a - (long long)b) / (1 << 20);
}

/* 1. idle memory on device 0 is free there; device 1 does not move. */
static void part_meminfo(void)
{
	const size_t big = (size_t)1 << 30, slack = (size_t)96 << 20;
	size_t f0 = free_of(0), f1 = free_of(1), f0_live, f0_after, f1_after;
	CUdeviceptr p;

	CU(cuCtxSetCurrent(g_ctx[0]));
	CU(cuMemAlloc(&p, big));
	f0_live = free_of(0);
	CHECK(f0_live + big - slack <= f0, "device 0 free did not fall by the 1 GiB block: %zu -> %zu MiB",
	      f0 >> 20, f0_live >> 20);
	CU(cuCtxSetCurrent(g_ctx[1]));
	CU(cuMemFree(p)); /* freed from device 1's context: back to device 0's heap */
	f0_after = free_of(0);
	f1_after = free_of(1);
	printf("meminfo: device 0 free %zu -> %zu (live) -> %zu MiB (freed); device 1 free %zu -> %zu MiB\n",
	       f0 >> 20, f0_live >> 20, f0_after >> 20, f1 >> 20, f1_after >> 20);
	CHECK(f0_after + slack >= f0, "device 0: the freed 1 GiB is not reported free (%lld MiB below the start)",
	      mib_diff(f0, f0_after));
	CHECK(f1_after + slack >= f1 && f1_after <= f1 + slack, "device 1's free moved by %lld MiB",
	      mib_diff(f1_after, f1));
}

static void fill_check(CUcontext ctx, CUdeviceptr p, size_t words, unsigned want, const char *what)
{
	unsigned *h = malloc(words * 4);
	size_t bad = 0;

	CU(cuCtxSetCurrent(ctx));
	CU(cuMemcpyDtoH(h, p, words * 4));
	for (size_t i = 0; i < words; i++)
		bad += h[i] != want;
	CHECK(bad == 0, "%s: %zu of %zu words differ from %#x (first word %#x)", what, bad, words, want, h[0]);
	free(h);
}

/* 2. peer access codes, peer copies, attributes, a cross-device free. */
static void part_peer(void)
{
	const size_t n = 3 << 20; /* bytes; inside a shared segment of the pool */
	int can = 0, ord = -1;
	CUdeviceptr a, b, c;
	CUresult r;

	CU(cuDeviceCanAccessPeer(&can, g_dev[0], g_dev[1]));
	CU(cuCtxSetCurrent(g_ctx[0]));
	if (can) {
		r = cuCtxEnablePeerAccess(g_ctx[1], 0);
		CHECK(r == CUDA_SUCCESS, "cuCtxEnablePeerAccess: %d, want 0", (int)r);
		r = cuCtxEnablePeerAccess(g_ctx[1], 0);
		CHECK(r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "cuCtxEnablePeerAccess again: %d, want %d", (int)r,
		      (int)CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	} else {
		printf("EMM-PARTIAL: ran 3, skipped 1 (peer access: cuDeviceCanAccessPeer = 0)\n");
	}
	if (can) {
		r = cuCtxEnablePeerAccess(g_ctx[1], 1u << 31);
		CHECK(r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
		      "cuCtxEnablePeerAccess(bad flags): %d", (int)r);
	}

	CU(cuMemAlloc(&a, n));
	CU(cuMemsetD32(a, 0xA11CE000u, n / 4));
	CU(cuCtxSetCurrent(g_ctx[1]));
	CU(cuMemAlloc(&b, n));
	CU(cuMemAlloc(&c, n));
	CU(cuMemcpyPeer(b, g_ctx[1], a, g_ctx[0], n));
	CU(cuCtxSynchronize());
	fill_check(g_ctx[1], b, n / 4, 0xA11CE000u, "cuMemcpyPeer device 0 -> 1");
	CU(cuMemsetD32(c, 0xB0B0B0B0u, n / 4));
	CU(cuMemcpyDtoD(a, c, n)); /* unified addressing: a copy across devices */
	CU(cuCtxSynchronize());
	fill_check(g_ctx[0], a, n / 4, 0xB0B0B0B0u, "cuMemcpyDtoD device 1 -> 0");

	/* pointer attributes name the owner whichever context is current */
	for (int cur = 0; cur < 2; cur++) {
		CU(cuCtxSetCurrent(g_ctx[cur]));
		CU(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a + 4096));
		CHECK(ord == 0, "device ordinal of a device-0 block asked from device %d: %d", cur, ord);
		CU(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, b + 4096));
		CHECK(ord == 1, "device ordinal of a device-1 block asked from device %d: %d", cur, ord);
	}

	/* a free from the other device's context counts on the owner */
	struct emm_stats s0 = stats_of(0), s1 = stats_of(1);
	CU(cuCtxSetCurrent(g_ctx[1]));
	CU(cuMemFree(a));
	struct emm_stats e0 = stats_of(0), e1 = stats_of(1);
	if (gpu_emm_present()) {
		CHECK(e0.frees == s0.frees + 1 && e1.frees == s1.frees,
		      "cross-device free: device 0 frees %+lld, device 1 %+lld (want +1, +0)",
		      (long long)(e0.frees - s0.frees), (long long)(e1.frees - s1.frees));
		CHECK(e0.passthrough_frees == s0.passthrough_frees && e1.passthrough_frees == s1.passthrough_frees,
		      "the cross-device free went to the driver");
	}
	CU(cuMemFree(b));
	CU(cuMemFree(c));
	if (can) {
		CU(cuCtxSetCurrent(g_ctx[0]));
		r = cuCtxDisablePeerAccess(g_ctx[1]);
		CHECK(r == CUDA_SUCCESS, "cuCtxDisablePeerAccess: %d", (int)r);
		r = cuCtxDisablePeerAccess(g_ctx[1]);
		CHECK(r == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "cuCtxDisablePeerAccess again: %d, want %d", (int)r,
		      (int)CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
	}
}

/* 3. the VMM calls on device 1, twice: data right, the second round a hit. */
static void vmm_round(size_t size, int peer, unsigned tag)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc acc[2];
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = g_dev[1];
	memset(acc, 0, sizeof(acc));
	for (int i = 0; i < 2; i++) {
		acc[i].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc[i].location.id = g_dev[i == 0 ? 1 : 0];
		acc[i].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	}
	CU(cuCtxSetCurrent(g_ctx[1]));
	CU(cuMemAddressReserve(&va, size, 0, 0, 0));
	CU(cuMemCreate(&h, size, &prop, 0));
	CU(cuMemMap(va, size, 0, h, 0));
	CU(cuMemSetAccess(va, size, acc, peer ? 2 : 1));
	CU(cuMemsetD32(va, tag, size / 4));
	CU(cuCtxSynchronize());
	fill_check(g_ctx[1], va, size / 4, tag, "VMM on device 1, read from device 1");
	if (peer) {
		CUdeviceptr d0;
		CU(cuCtxSetCurrent(g_ctx[0]));
		CU(cuMemAlloc(&d0, size));
		CU(cuMemcpyDtoD(d0, va, size));
		CU(cuCtxSynchronize());
		fill_check(g_ctx[0], d0, size / 4, tag, "VMM on device 1, copied by device 0");
		CU(cuMemFree(d0));
	}
	CU(cuCtxSetCurrent(g_ctx[1]));
	CU(cuMemUnmap(va, size));
	CU(cuMemRelease(h));
	CU(cuMemAddressFree(va, size));
}

static void part_vmm(int peer)
{
	CUmemAllocationProp prop;
	size_t gran = 0;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = g_dev[1];
	CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	struct emm_stats s0 = stats_of(0), s1 = stats_of(1);
	vmm_round(8 * gran, peer, 0x0D0D0001u);
	struct emm_stats m1 = stats_of(1);
	vmm_round(8 * gran, peer, 0x0D0D0002u);
	struct emm_stats e0 = stats_of(0), e1 = stats_of(1);
	printf("vmm on device 1: device 1 vmm_allocs %+lld vmm_hits %+lld (second round %+lld); device 0 vmm_allocs %+lld\n",
	       (long long)(e1.vmm_allocs - s1.vmm_allocs), (long long)(e1.vmm_hits - s1.vmm_hits),
	       (long long)(e1.vmm_hits - m1.vmm_hits), (long long)(e0.vmm_allocs - s0.vmm_allocs));
	if (gpu_emm_present()) {
		CHECK(e1.vmm_allocs - s1.vmm_allocs == 2, "device 1 counted %lld VMM allocations, want 2",
		      (long long)(e1.vmm_allocs - s1.vmm_allocs));
		if (gpu_checker_attached()) /* no VMM cache under a checker */
			CHECK(e1.vmm_hits == s1.vmm_hits, "a VMM buffer was reused under a memory checker");
		else
			CHECK(e1.vmm_hits > m1.vmm_hits, "the second VMM round on device 1 was not served from its cache");
		CHECK(e0.vmm_allocs == s0.vmm_allocs && e0.vmm_hits == s0.vmm_hits,
		      "device 0's VMM counters moved for device 1's allocations");
	}
}

int main(void)
{
	int n = 0, can = 0;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS || n < 2) {
		printf("SKIP: %d device(s); this test needs 2 or more\n", n);
		return GPU_SKIP;
	}
	for (int d = 0; d < 2; d++) {
		CU(cuDeviceGet(&g_dev[d], d));
		CU(cuDevicePrimaryCtxRetain(&g_ctx[d], g_dev[d]));
	}
	printf("multidev-driver: %d devices, libemm %s\n", n, gpu_emm_present() ? "loaded" : "not loaded");
	part_meminfo();
	part_peer();
	CU(cuDeviceCanAccessPeer(&can, g_dev[0], g_dev[1]));
	part_vmm(can);
	CU(cuCtxSetCurrent(NULL));
	for (int d = 0; d < 2; d++)
		CU(cuDevicePrimaryCtxRelease(g_dev[d]));
	if (g_fails) {
		printf("FAIL: %d check(s) failed\n", g_fails);
		return 1;
	}
	printf("ok: every check passed\n");
	return 0;
}
