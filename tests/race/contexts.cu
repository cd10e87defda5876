/* SPDX-License-Identifier: MIT */
/*
 * tests/race/contexts.cu - libemm's per-context heaps across context
 * destruction and device resets (driver API, linked with -lcuda, plus the
 * runtime for the primary context).
 *
 *  1. Two contexts on one device (cuCtxCreate x2), blocks in both. Destroy
 *     the first with live blocks (one of them a quarter of the free memory:
 *     that much must come back to cuMemGetInfo, under the async backend
 *     too, whose pool outlives the context). A later cuMemFree of one of its pointers
 *     returns the driver's own error (with the second context current, and
 *     with no context current). The second context's blocks keep their data
 *     and still work (free, reallocate, copy). Destroy it with live blocks.
 *  2. Primary context through the runtime: cudaMalloc live blocks, then
 *     cuDevicePrimaryCtxReset; a stale pointer's cudaFree gets the driver's
 *     answer; cudaMalloc works again and is served by the pool.
 *  3. The same with cudaDeviceReset.
 *
 * Every call whose result is "whatever the driver says" is printed as
 *   RC <name> = <code>
 * and tests/race/run-driver-test.sh --compare-disabled runs the program twice
 * (EMM_DISABLE=1 and libemm on) and requires identical RC lines.
 *
 * Usage: contexts [--allow-no-emm]
 */
#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "race_util.h"

#define CKD(call)                                                                                \
	do {                                                                                     \
		CUresult ckd_r_ = (call);                                                        \
		if (ckd_r_ != CUDA_SUCCESS) {                                                    \
			const char *nm_ = "?";                                                   \
			cuGetErrorName(ckd_r_, &nm_);                                            \
			race_fail("%s -> %d %s", #call, (int)ckd_r_, nm_);                       \
		}                                                                                \
	} while (0)

static void print_rc(const char *what, int rc, bool driver)
{
	const char *nm = "?";
	if (driver)
		cuGetErrorName((CUresult)rc, &nm);
	else
		nm = cudaGetErrorName((cudaError_t)rc);
	printf("RC %s = %d (%s)\n", what, rc, nm);
	fflush(stdout);
}

static void fill_check_d(CUdeviceptr p, size_t bytes, unsigned v, const char *what)
{
	CKD(cuMemsetD32(p, v, bytes / 4));
	CKD(cuCtxSynchronize());
	std::vector<unsigned> h(bytes / 4);
	CKD(cuMemcpyDtoH(h.data(), p, bytes));
	size_t bad = 0;
	for (unsigned x : h)
		bad += x != v;
	race_check(bad == 0, "%s: %zu of %zu words wrong after memset", what, bad, h.size());
}

static size_t count_ne_d(CUdeviceptr p, size_t bytes, unsigned v)
{
	std::vector<unsigned> h(bytes / 4);
	CKD(cuMemcpyDtoH(h.data(), p, bytes));
	size_t bad = 0;
	for (unsigned x : h)
		bad += x != v;
	return bad;
}

int main(int argc, char **argv)
{
	bool allow_no_emm = false;
	for (int i = 1; i < argc; i++) {
		if (std::string(argv[i]) == "--allow-no-emm")
			allow_no_emm = true;
		else {
			fprintf(stderr, "usage: contexts [--allow-no-emm]\n");
			return 2;
		}
	}
	CUresult ir = cuInit(0);
	int ndev = 0;
	if (ir != CUDA_SUCCESS || cuDeviceGetCount(&ndev) != CUDA_SUCCESS || ndev == 0) {
		printf("SKIP: no usable CUDA device (cuInit -> %d, %d devices)\n", (int)ir, ndev);
		return RACE_SKIP;
	}
	race_require_emm(allow_no_emm);
	bool active = race_emm_active();
	printf("contexts: libemm %s\n", active ? "active" : "not active (baseline)");
	CUdevice dev;
	CKD(cuDeviceGet(&dev, 0));

	/* ---- 1. two contexts -------------------------------------------------------- */
	const size_t sz[3] = {4096, 1 << 20, 8 << 20};
	CUcontext c1, c2;
	CKD(cuCtxCreate(&c1, NULL, 0, dev));
	CKD(cuCtxCreate(&c2, NULL, 0, dev));

	struct emm_stats st0 = race_stats(0);
	CUdeviceptr a[3], b[3];
	CKD(cuCtxSetCurrent(c1));
	for (int i = 0; i < 3; i++) {
		CKD(cuMemAlloc(&a[i], sz[i]));
		fill_check_d(a[i], sz[i], 0x11110000u + i, "context 1 block");
	}
	CKD(cuCtxSetCurrent(c2));
	for (int i = 0; i < 3; i++) {
		CKD(cuMemAlloc(&b[i], sz[i]));
		fill_check_d(b[i], sz[i], 0x22220000u + i, "context 2 block");
	}
	/* A free and a reallocation in context 2, so it has cached blocks too. */
	CKD(cuMemFree(b[1]));
	CKD(cuMemAlloc(&b[1], sz[1]));
	CKD(cuMemsetD32(b[1], 0x22220001u, sz[1] / 4));
	CKD(cuCtxSynchronize());
	struct emm_stats st1 = race_stats(0);
	race_print_stats("device 0, allocations in two contexts", race_stats_delta(st0, st1));
	if (active)
		race_check(race_stats_delta(st0, st1).allocs >= 7, "the contexts' allocations did not go through the pool");

	/* A big live block in context 1 (a quarter of the free memory, at
	 * most 16 GiB): its memory must go back to the device with the
	 * context, whatever holds it (the async backend's pool outlives the
	 * context and is released with it). */
	size_t mfree = 0, mtotal = 0;
	CKD(cuCtxSetCurrent(c1));
	CKD(cuMemGetInfo(&mfree, &mtotal));
	size_t big = std::min(mfree / 4, (size_t)16 << 30) & ~(((size_t)2 << 20) - 1);
	CUdeviceptr abig;
	CKD(cuMemAlloc(&abig, big));
	CKD(cuMemsetD8(abig, 0x5a, big));
	CKD(cuCtxSynchronize());

	/* Destroy context 1 with its blocks live. */
	CKD(cuCtxSetCurrent(c2));
	size_t free_before = 0, free_after = 0;
	CKD(cuMemGetInfo(&free_before, &mtotal));
	CUresult r = cuCtxDestroy(c1);
	print_rc("cuCtxDestroy(context with live blocks)", r, true);
	race_check(r == CUDA_SUCCESS, "cuCtxDestroy with live blocks failed");
	CUcontext cur = NULL;
	CKD(cuCtxGetCurrent(&cur));
	if (cur != c2)
		CKD(cuCtxSetCurrent(c2));
	CKD(cuMemGetInfo(&free_after, &mtotal));
	printf("contexts: %.1f MiB block in the destroyed context; free memory %.1f -> %.1f MiB\n",
	       big / 1048576.0, free_before / 1048576.0, free_after / 1048576.0);
	const char *backend = getenv("EMM_BACKEND");
	if (active && backend && strcmp(backend, "vmm") == 0)
		printf("contexts: memory check skipped under EMM_BACKEND=vmm (what cuCtxDestroy does to "
		       "cuMemCreate allocations is not established)\n");
	else
		race_check(free_after >= free_before && free_after - free_before + ((size_t)64 << 20) >= big,
		           "destroying the context gave back %.1f MiB, less than its %.1f MiB block",
		           ((double)free_after - (double)free_before) / 1048576.0, big / 1048576.0);

	r = cuMemFree(a[0]);
	print_rc("cuMemFree(destroyed context's block, other context current)", r, true);
	race_check(r != CUDA_SUCCESS, "freeing a destroyed context's block succeeded");
	CKD(cuCtxSetCurrent(NULL));
	r = cuMemFree(a[1]);
	print_rc("cuMemFree(destroyed context's block, no context current)", r, true);
	race_check(r != CUDA_SUCCESS, "freeing a destroyed context's block with no context succeeded");
	CKD(cuCtxSetCurrent(c2));

	/* Context 2 is unharmed. */
	for (int i = 0; i < 3; i++) {
		size_t bad = count_ne_d(b[i], sz[i], 0x22220000u + i);
		race_check(bad == 0, "context 2 block %d lost data after context 1 was destroyed (%zu words)", i, bad);
	}
	r = cuMemFree(b[0]);
	print_rc("cuMemFree(live context's block after the other was destroyed)", r, true);
	race_check(r == CUDA_SUCCESS, "cuMemFree in the surviving context failed");
	CUdeviceptr b0;
	CKD(cuMemAlloc(&b0, sz[0]));
	fill_check_d(b0, sz[0], 0x33330000u, "context 2 reallocation");
	CUdeviceptr extra[4];
	for (int i = 0; i < 4; i++) {
		CKD(cuMemAlloc(&extra[i], sz[i % 3]));
		fill_check_d(extra[i], sz[i % 3], 0x44440000u + i, "context 2 new block");
	}
	CKD(cuMemcpyDtoD(b[2], extra[2], sz[2]));
	CKD(cuCtxSynchronize());
	race_check(count_ne_d(b[2], sz[2], 0x44440002u) == 0, "copy between context 2 blocks wrong");
	race_check(count_ne_d(b[1], sz[1], 0x22220001u) == 0, "context 2 block 1 changed");
	for (int i = 0; i < 4; i++)
		CKD(cuMemFree(extra[i]));
	race_print_stats("device 0, after context 1 was destroyed", race_stats_delta(st1, race_stats(0)));

	/* Destroy context 2 with b0, b[1], b[2] live. */
	r = cuCtxDestroy(c2);
	print_rc("cuCtxDestroy(second context with live blocks)", r, true);
	race_check(r == CUDA_SUCCESS, "cuCtxDestroy of the second context failed");
	CKD(cuCtxSetCurrent(NULL));

	/* ---- 2. primary context reset with live blocks ------------------------------------ */
	CK(cudaSetDevice(0));
	void *x = NULL, *y = NULL;
	CK(cudaMalloc(&x, 1 << 20));
	CK(cudaMalloc(&y, 8 << 20));
	CK(cudaMemset(x, 0x11, 1 << 20));
	CK(cudaMemset(y, 0x22, 8 << 20));
	CK(cudaDeviceSynchronize());
	r = cuDevicePrimaryCtxReset(dev);
	print_rc("cuDevicePrimaryCtxReset(with live blocks)", r, true);
	race_check(r == CUDA_SUCCESS, "cuDevicePrimaryCtxReset failed");
	struct emm_stats p0 = race_stats(0);
	cudaError_t e = cudaFree(x);
	print_rc("cudaFree(block of the reset primary context)", (int)e, false);
	cudaGetLastError();
	void *z = NULL;
	e = cudaMalloc(&z, 1 << 20);
	print_rc("cudaMalloc after cuDevicePrimaryCtxReset", (int)e, false);
	race_check(e == cudaSuccess, "cudaMalloc after cuDevicePrimaryCtxReset failed");
	if (e == cudaSuccess) {
		CK(cudaMemset(z, 0x5a, 1 << 20));
		std::vector<unsigned char> h(1 << 20);
		CK(cudaMemcpy(h.data(), z, h.size(), cudaMemcpyDeviceToHost));
		size_t bad = 0;
		for (unsigned char c : h)
			bad += c != 0x5a;
		race_check(bad == 0, "block allocated after the reset: %zu bytes wrong", bad);
		CK(cudaFree(z));
		void *z2;
		CK(cudaMalloc(&z2, 1 << 20));
		CK(cudaFree(z2));
	}
	struct emm_stats p1 = race_stats(0);
	race_print_stats("device 0, after cuDevicePrimaryCtxReset", race_stats_delta(p0, p1));
	if (active)
		race_check(race_stats_delta(p0, p1).allocs >= 2,
		      "cudaMalloc after cuDevicePrimaryCtxReset was not served by the pool");

	/* ---- 3. cudaDeviceReset with live blocks ---------------------------------------------- */
	CK(cudaMalloc(&x, 1 << 20));
	CK(cudaMalloc(&y, 4 << 20));
	CK(cudaMemset(y, 0x33, 4 << 20));
	CK(cudaFree(x)); /* one block freed (cached), one live */
	e = cudaDeviceReset();
	print_rc("cudaDeviceReset(with live and cached blocks)", (int)e, false);
	race_check(e == cudaSuccess, "cudaDeviceReset failed");
	struct emm_stats q0 = race_stats(0);
	e = cudaFree(y);
	print_rc("cudaFree(block from before cudaDeviceReset)", (int)e, false);
	cudaGetLastError();
	for (int i = 0; i < 3; i++) {
		CK(cudaMalloc(&z, (size_t)(1 << 20) << i));
		CK(cudaMemset(z, 0x5b, (size_t)(1 << 20) << i));
		CK(cudaDeviceSynchronize());
		CK(cudaFree(z));
	}
	struct emm_stats q1 = race_stats(0);
	race_print_stats("device 0, after cudaDeviceReset", race_stats_delta(q0, q1));
	if (active)
		race_check(race_stats_delta(q0, q1).allocs >= 3, "cudaMalloc after cudaDeviceReset was not served by the pool");
	race_print_stats("process, totals", race_stats(-1));

	if (race_fails) {
		printf("%d check(s) failed\n", race_fails);
		return 1;
	}
	printf("ok\n");
	return 0;
}
