/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/vmm_semantics.cu - a measurement, not a test: do the VMM calls
 * that free memory (cuMemUnmap, cuMemRelease, cuMemAddressFree) wait for
 * work already running on the device, as cuMemFree does? libemm's VMM cache
 * must keep whatever a program could rely on.
 *
 * For each call: a kernel that spins for ~200 ms (writing only its own
 * buffer, then a flag in mapped host memory) runs on a non-blocking stream;
 * 5 ms later the host makes the call on unrelated memory and times it. A
 * call that returns after the flag is set waited for the device.
 *
 *   vmm_semantics        prints one "VMM-SEM" line per call; exit 77 without a GPU
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#define CK(x)                                                                                  \
	do {                                                                                   \
		CUresult r_ = (x);                                                             \
		if (r_ != CUDA_SUCCESS) {                                                      \
			const char *n_ = "?";                                                  \
			cuGetErrorName(r_, &n_);                                               \
			fprintf(stderr, "%s:%d: %s -> %s\n", __FILE__, __LINE__, #x, n_);     \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

__global__ void spin(unsigned long long ns, volatile unsigned *done, unsigned *scratch)
{
	unsigned long long t0;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
	for (;;) {
		unsigned long long t;
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
		scratch[threadIdx.x] += 1;
		if (t - t0 > ns)
			break;
	}
	__threadfence_system();
	if (threadIdx.x == 0)
		*done = 1;
}

static volatile unsigned *g_done;
static unsigned *g_done_dev, *g_scratch;
static cudaStream_t g_stream;

static void start_kernel(void)
{
	*g_done = 0;
	spin<<<1, 32, 0, g_stream>>>(200000000ull, g_done_dev, g_scratch);
	if (cudaGetLastError() != cudaSuccess) {
		fprintf(stderr, "launch failed\n");
		exit(1);
	}
	std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

static void report(const char *call, double ms, bool done)
{
	printf("VMM-SEM call=%s host_ms=%.3f kernel_done_at_return=%d -> %s\n", call, ms, done ? 1 : 0,
	       done ? "waited for the device" : "did not wait");
}

template <class F> static void timed(const char *name, F f)
{
	start_kernel();
	auto t0 = std::chrono::steady_clock::now();
	f();
	auto t1 = std::chrono::steady_clock::now();
	bool done = *g_done != 0;
	report(name, std::chrono::duration<double, std::milli>(t1 - t0).count(), done);
	cudaStreamSynchronize(g_stream);
}

int main(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("SKIP: no GPU\n");
		return 77;
	}
	cudaSetDevice(0);
	cudaFree(0);
	CUdevice dev;
	CK(cuCtxGetDevice(&dev));
	cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
	unsigned *h;
	cudaHostAlloc((void **)&h, 4096, cudaHostAllocMapped);
	g_done = h;
	cudaHostGetDevicePointer((void **)&g_done_dev, h, 0);
	cudaMalloc((void **)&g_scratch, 4096);

	CUmemAllocationProp prop = {};
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	size_t gran = 0;
	CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	size_t size = 8 * gran;
	CUmemAccessDesc access = {};
	access.location = prop.location;
	access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	printf("VMM-SEM granularity=%zu size=%zu\n", gran, size);

	/* The classic free, for comparison. */
	CUdeviceptr classic;
	CK(cuMemAlloc(&classic, size));
	timed("cuMemFree", [&] { CK(cuMemFree(classic)); });

	/* One mapping, taken apart step by step. */
	CUdeviceptr va;
	CUmemGenericAllocationHandle hd;
	CK(cuMemAddressReserve(&va, size, 0, 0, 0));
	CK(cuMemCreate(&hd, size, &prop, 0));
	CK(cuMemMap(va, size, 0, hd, 0));
	CK(cuMemSetAccess(va, size, &access, 1));
	timed("cuMemUnmap", [&] { CK(cuMemUnmap(va, size)); });
	timed("cuMemRelease(unmapped)", [&] { CK(cuMemRelease(hd)); });
	timed("cuMemAddressFree", [&] { CK(cuMemAddressFree(va, size)); });

	/* Release while still mapped: deferred until the unmap. */
	CK(cuMemAddressReserve(&va, size, 0, 0, 0));
	CK(cuMemCreate(&hd, size, &prop, 0));
	CK(cuMemMap(va, size, 0, hd, 0));
	CK(cuMemSetAccess(va, size, &access, 1));
	timed("cuMemRelease(mapped)", [&] { CK(cuMemRelease(hd)); });
	timed("cuMemUnmap(after release)", [&] { CK(cuMemUnmap(va, size)); });
	CK(cuMemAddressFree(va, size));

	/* Making a mapping. */
	timed("cuMemAddressReserve+Create+Map+SetAccess", [&] {
		CK(cuMemAddressReserve(&va, size, 0, 0, 0));
		CK(cuMemCreate(&hd, size, &prop, 0));
		CK(cuMemMap(va, size, 0, hd, 0));
		CK(cuMemSetAccess(va, size, &access, 1));
	});
	/* XLA's per-buffer free. */
	timed("cuMemUnmap+Release+AddressFree", [&] {
		CK(cuMemUnmap(va, size));
		CK(cuMemRelease(hd));
		CK(cuMemAddressFree(va, size));
	});
	printf("VMM-SEM done\n");
	return 0;
}
