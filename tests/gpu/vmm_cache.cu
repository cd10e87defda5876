// SPDX-License-Identifier: MIT
/*
 * tests/gpu/vmm_cache.cu - libemm's VMM shims and cache on a real GPU
 * (meson test --suite gpu: vmm-cache, run by tests/race/run-test.sh
 * --compare-disabled, i.e. once with EMM_DISABLE=1 and once with libemm):
 *
 *   codes   misuse of every VMM shim: "RC ..." lines, which the runner
 *           compares between the two runs (the driver's codes)
 *   xla     XLA's per-buffer pattern, several rounds: the data a kernel
 *           writes is right, and from the second round on libemm serves
 *           the buffers from its cache (emm_stats: vmm_hits)
 *   fence   a kernel still writing buffer A on a non-blocking stream when
 *           A is freed: the next allocation of A's size does not get A
 *           while the kernel runs (and the data of what it got survives);
 *           libemm run only (without it the free unmaps under the kernel)
 *   fence-streams  the same with XLA's 18 idle non-blocking streams alive
 *           (they get no fence event), and once the kernel has ended the
 *           freed buffer comes back from the cache; libemm run only
 * Under a memory checker (NVTX_INJECTION64_PATH) libemm keeps no freed VMM
 * buffer: xla wants no cache hit, fence-streams no reuse.
 *   sleep   unmap + release keeping the range (vLLM's sleep): NVML's used
 *           memory drops by the buffer's size within 500 ms; map again works
 *   share   a handle made shareable (POSIX fd), exported and imported back:
 *           works and is never cached
 * Exits 77 without a GPU. Without NVML the sleep case is skipped.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gpu_common.h"
#include "vmm_calls.h"

#define MIB ((size_t)1 << 20)

static int failures;
#define FAIL(...)                                                                                            \
	do {                                                                                                 \
		printf("FAIL: " __VA_ARGS__);                                                                \
		printf("\n");                                                                                \
		failures++;                                                                                  \
	} while (0)
#define RC(call) printf("RC %-72s %d\n", #call, (int)(call))
#define OK(call)                                                                                             \
	do {                                                                                                 \
		CUresult r_ = (call);                                                                        \
		if (r_ != CUDA_SUCCESS) {                                                                    \
			FAIL("%s: %d", #call, (int)r_);                                                      \
			return;                                                                              \
		}                                                                                            \
	} while (0)

static int g_dev;
static bool g_emm; /* libemm loaded and not disabled */

static CUmemAllocationProp prop_of(CUmemAllocationHandleType types)
{
	return vmm_call_prop(g_dev, types);
}

static CUmemAccessDesc access_rw(void)
{
	return vmm_call_access(g_dev);
}

static CUresult xla_alloc(struct vmm_buf *b, size_t size, CUmemAllocationHandleType types = CU_MEM_HANDLE_TYPE_NONE)
{
	CUmemAllocationProp p = prop_of(types);
	CUmemAccessDesc d = access_rw();

	return vmm_call_alloc(b, size, &p, &d, 1);
}

static struct emm_stats stats(void)
{
	struct emm_stats s;

	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	if (gpu_stats_fn())
		gpu_stats_fn()(-1, &s);
	return s;
}

__global__ void fill(unsigned *p, size_t n, unsigned v)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = v ^ (unsigned)i;
}

/* Writes v into p[0..n) over and over for about `ns` nanoseconds. */
__global__ void spin_fill(unsigned *p, size_t n, unsigned v, long long ns)
{
	long long start = clock64();
	long long cycles = ns * 2; /* at least 2 GHz: runs at least `ns` */

	while (clock64() - start < cycles)
		for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
			p[i] = v;
}

static bool check_fill(const struct vmm_buf *b, unsigned v)
{
	size_t n = b->size / sizeof(unsigned);
	unsigned *host = (unsigned *)malloc(b->size);
	bool ok = host && cudaMemcpy(host, (void *)(uintptr_t)b->va, b->size, cudaMemcpyDeviceToHost) == cudaSuccess;

	for (size_t i = 0; ok && i < n; i += 997)
		ok = host[i] == (v ^ (unsigned)i);
	free(host);
	return ok;
}

/* --- codes --------------------------------------------------------------- */

static void case_codes(void)
{
	CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = access_rw();
	CUmemGenericAllocationHandle h;
	unsigned long long fl;
	CUdeviceptr va;
	struct vmm_buf b, c;
	int fd = -1;
	CUmemoryPool pool;
	CUmemPoolProps pp;

	RC(cuMemAddressReserve(&va, 2 * MIB, 3 * MIB, 0, 0));
	RC(cuMemAddressReserve(&va, 0, 0, 0, 0));
	RC(cuMemCreate(&h, 2 * MIB, &p, 1));
	RC(cuMemCreate(NULL, 2 * MIB, &p, 0));
	RC(cuMemCreate(&h, 12345, &p, 0));
	for (int round = 0; round < 2; round++) {
		RC(xla_alloc(&b, 4 * MIB));
		RC(cuMemUnmap(b.va, 2 * MIB));
		RC(cuMemAddressFree(b.va, b.size));
		RC(cuMemGetAccess(NULL, &d.location, b.va));
		RC(cuMemGetAllocationPropertiesFromHandle(NULL, b.h));
		RC(cuMemExportToShareableHandle(&fd, b.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		RC(vmm_call_free(&b));
		/* Freed: in libemm cached, so each use of the stale objects must
		 * see what the driver says about freed ones. */
#define STALE(call) (xla_alloc(&b, 4 * MIB), vmm_call_free(&b), (call))
		RC(STALE(cuMemGetAccess(&fl, &d.location, b.va)));
		RC(STALE(cuMemUnmap(b.va, b.size)));
		RC(STALE(cuMemAddressFree(b.va, b.size)));
		RC(STALE(cuMemSetAccess(b.va, b.size, &d, 1)));
		RC(STALE(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)b.va)));
		RC(cuMemCreate(&h, 4 * MIB, &p, 0));
		RC(STALE(cuMemMap(b.va, 4 * MIB, 0, h, 0)));
		RC(cuMemRelease(h));
#undef STALE
		/* Unmapped and released, the range kept. */
		RC(xla_alloc(&c, 4 * MIB));
		RC(cuMemUnmap(c.va, c.size));
		RC(cuMemRelease(c.h));
		RC(cuMemSetAccess(c.va, c.size, &d, 1));
		RC(cuMemGetAccess(&fl, &d.location, c.va));
		RC(cuMemAddressFree(c.va, c.size));
	}
	RC(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)-1, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
	memset(&pp, 0, sizeof(pp));
	RC(cuMemPoolCreate(&pool, &pp));
	pp.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = g_dev;
	if (cuMemPoolCreate(&pool, &pp) == CUDA_SUCCESS) {
		RC(cuMemAllocFromPoolAsync(&va, 0, pool, 0));
		RC(cuMemAllocFromPoolAsync(&va, 1 * MIB, pool, 0));
		RC(cuMemFreeAsync(va, 0));
		RC(cuStreamSynchronize(0));
		RC(cuMemPoolDestroy(pool));
	}
}

/* --- xla ------------------------------------------------------------------- */

static void case_xla(void)
{
	static const size_t sizes[] = {2 * MIB, 4 * MIB, 2 * MIB, 16 * MIB, 64 * MIB};
	const int n = (int)(sizeof(sizes) / sizeof(sizes[0])), rounds = 20;
	struct emm_stats s0 = stats(), s1;
	struct vmm_buf b[5];

	for (int round = 0; round < rounds; round++) {
		for (int i = 0; i < n; i++) {
			OK(xla_alloc(&b[i], sizes[i]));
			fill<<<256, 256>>>((unsigned *)(uintptr_t)b[i].va, sizes[i] / 4, round * 16 + i);
		}
		for (int i = 0; i < n; i++)
			if (!check_fill(&b[i], round * 16 + i))
				FAIL("xla: round %d buffer %d: wrong data", round, i);
		for (int i = n - 1; i >= 0; i--)
			OK(vmm_call_free(&b[i]));
	}
	s1 = stats();
	printf("xla: %d buffers, VMM allocations %llu, from the cache %llu\n", n * rounds,
	       (unsigned long long)(s1.vmm_allocs - s0.vmm_allocs), (unsigned long long)(s1.vmm_hits - s0.vmm_hits));
	if (g_emm && gpu_checker_attached() && s1.vmm_hits != s0.vmm_hits)
		FAIL("xla: %llu buffers from the cache under a memory checker, want none",
		     (unsigned long long)(s1.vmm_hits - s0.vmm_hits));
	else if (g_emm && !gpu_checker_attached() && s1.vmm_hits - s0.vmm_hits < (uint64_t)(n * (rounds - 1)))
		FAIL("xla: %llu of %d buffers from the cache, want at least %d",
		     (unsigned long long)(s1.vmm_hits - s0.vmm_hits), n * rounds, n * (rounds - 1));
}

/* --- fence ----------------------------------------------------------------- */

static void case_fence(void)
{
	const size_t size = 32 * MIB;
	struct vmm_buf a, b;
	CUstream s;
	bool running;

	/* Without libemm the free really unmaps A under the kernel (the VMM
	 * frees do not wait: tests/bench/RESULTS.md section 7): a fault. */
	if (!g_emm) {
		printf("fence: needs libemm (skipped in the EMM_DISABLE=1 run)\n");
		return;
	}
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(xla_alloc(&a, size));
	spin_fill<<<64, 256, 0, (cudaStream_t)s>>>((unsigned *)(uintptr_t)a.va, size / 4, 0xdeadbeef, 300000000ll);
	OK(vmm_call_free(&a)); /* the kernel is still writing A */
	OK(xla_alloc(&b, size));
	running = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
	if (running && b.va == a.va)
		FAIL("fence: the buffer freed under a running kernel was handed out again before it ended");
	fill<<<256, 256>>>((unsigned *)(uintptr_t)b.va, size / 4, 7);
	OK(cuStreamSynchronize(s));
	OK(cuCtxSynchronize());
	if (!check_fill(&b, 7))
		FAIL("fence: the new buffer's data was overwritten");
	printf("fence: kernel running at the reuse: %s; new buffer %s\n", running ? "yes" : "no (inconclusive)",
	       b.va == a.va ? "is the freed one" : "is another");
	OK(vmm_call_free(&b));
	OK(cuStreamDestroy(s));
}

/* --- fence with XLA's streams -------------------------------------------------- */

/* XLA keeps 18 non-blocking streams per GPU. At a cached free libemm asks
 * each (cuStreamQuery) and records an event only on the busy ones: with 18
 * idle streams and a kernel still writing A on a 19th, A is not handed back
 * while the kernel runs, and once it has ended the cache serves A again. */
static void case_fence_streams(void)
{
	enum { NIDLE = 18 };
	const size_t size = 24 * MIB;
	struct emm_stats s0, s1;
	CUstream idle[NIDLE], s;
	struct vmm_buf a, b, c;
	bool running;

	if (!g_emm) {
		printf("fence-streams: needs libemm (skipped in the EMM_DISABLE=1 run)\n");
		return;
	}
	for (int i = 0; i < NIDLE; i++)
		OK(cuStreamCreate(&idle[i], CU_STREAM_NON_BLOCKING));
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(xla_alloc(&a, size));
	spin_fill<<<64, 256, 0, (cudaStream_t)s>>>((unsigned *)(uintptr_t)a.va, size / 4, 0xdeadbeef, 300000000ll);
	OK(vmm_call_free(&a)); /* the kernel is still writing A; 18 streams idle */
	OK(xla_alloc(&b, size));
	running = cuStreamQuery(s) == CUDA_ERROR_NOT_READY;
	if (running && b.va == a.va)
		FAIL("fence-streams: the buffer freed under a running kernel was handed out again before it ended");
	fill<<<256, 256>>>((unsigned *)(uintptr_t)b.va, size / 4, 9);
	OK(cuStreamSynchronize(s));
	OK(cuCtxSynchronize());
	if (!check_fill(&b, 9))
		FAIL("fence-streams: the new buffer's data was overwritten");
	s0 = stats();
	OK(xla_alloc(&c, size)); /* A's kernel has ended: A from the cache */
	s1 = stats();
	if (b.va != a.va && !gpu_checker_attached() && (c.va != a.va || s1.vmm_hits == s0.vmm_hits))
		FAIL("fence-streams: after the kernel ended the freed buffer was not served from the cache");
	printf("fence-streams: kernel running at the reuse: %s; new buffer %s; after the kernel %s\n",
	       running ? "yes" : "no (inconclusive)", b.va == a.va ? "is the freed one" : "is another",
	       c.va == a.va ? "the freed one from the cache" : "another");
	OK(vmm_call_free(&c));
	OK(vmm_call_free(&b));
	OK(cuStreamDestroy(s));
	for (int i = 0; i < NIDLE; i++)
		OK(cuStreamDestroy(idle[i]));
}

/* --- sleep (NVML) ------------------------------------------------------------ */

typedef struct {
	unsigned long long total, free, used;
} nvml_memory;

static void case_sleep(void)
{
	void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	int (*init)(void), (*by_bus)(const char *, void **), (*meminfo)(void *, nvml_memory *);
	CUmemAllocationProp p = prop_of(CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = access_rw();
	const size_t size = 512 * MIB;
	nvml_memory m0, m1;
	char bus[64];
	void *dev;
	struct vmm_buf b;
	int waited = 0;

	if (!nvml) {
		printf("sleep: no libnvidia-ml.so.1: skipped\n");
		return;
	}
	*(void **)&init = dlsym(nvml, "nvmlInit_v2");
	*(void **)&by_bus = dlsym(nvml, "nvmlDeviceGetHandleByPciBusId_v2");
	*(void **)&meminfo = dlsym(nvml, "nvmlDeviceGetMemoryInfo");
	if (!init || !by_bus || !meminfo || init() != 0 || cuDeviceGetPCIBusId(bus, sizeof(bus), g_dev) != CUDA_SUCCESS ||
	    by_bus(bus, &dev) != 0) {
		printf("sleep: NVML unusable: skipped\n");
		return;
	}
	OK(xla_alloc(&b, size));
	fill<<<256, 256>>>((unsigned *)(uintptr_t)b.va, size / 4, 1);
	OK(cuCtxSynchronize());
	meminfo(dev, &m0);
	OK(cuMemUnmap(b.va, b.size));
	OK(cuMemRelease(b.h));
	do {
		usleep(10000);
		waited += 10;
		meminfo(dev, &m1);
	} while (m1.used + size > m0.used + 64 * MIB && waited < 500);
	printf("sleep: NVML used %llu MiB -> %llu MiB after %d ms\n", m0.used >> 20, m1.used >> 20, waited);
	if (m1.used + size > m0.used + 64 * MIB)
		FAIL("sleep: unmap + release did not give the memory back within 500 ms");
	OK(cuMemCreate(&b.h, size, &p, 0));
	OK(cuMemMap(b.va, size, 0, b.h, 0));
	OK(cuMemSetAccess(b.va, size, &d, 1));
	fill<<<256, 256>>>((unsigned *)(uintptr_t)b.va, size / 4, 2);
	if (!check_fill(&b, 2))
		FAIL("sleep: wrong data after mapping again");
	OK(vmm_call_free(&b));
}

/* --- share ------------------------------------------------------------------- */

static void case_share(void)
{
	struct emm_stats s0 = stats(), s1;
	CUmemGenericAllocationHandle h2;
	CUmemAccessDesc d = access_rw();
	CUdeviceptr va2;
	struct vmm_buf b;
	int fd;

	for (int round = 0; round < 3; round++) {
		OK(xla_alloc(&b, 8 * MIB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		OK(cuMemExportToShareableHandle(&fd, b.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
		OK(cuMemImportFromShareableHandle(&h2, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
		OK(cuMemAddressReserve(&va2, 8 * MIB, 0, 0, 0));
		OK(cuMemMap(va2, 8 * MIB, 0, h2, 0));
		OK(cuMemSetAccess(va2, 8 * MIB, &d, 1));
		fill<<<256, 256>>>((unsigned *)(uintptr_t)b.va, b.size / 4, 9);
		{
			struct vmm_buf alias = {va2, 8 * MIB, h2};
			if (!check_fill(&alias, 9))
				FAIL("share: the imported mapping does not show the exporter's bytes");
			OK(vmm_call_free(&alias));
		}
		close(fd);
		OK(vmm_call_free(&b));
	}
	s1 = stats();
	if (s1.vmm_hits != s0.vmm_hits)
		FAIL("share: a shareable allocation was served from the cache");
}

int main(void)
{
	CUdevice dev;
	CUcontext ctx;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS) {
		printf("no GPU: skipped\n");
		return GPU_SKIP;
	}
	g_dev = (int)dev;
	if (cudaFree(0) != cudaSuccess || cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) {
		printf("no context: skipped\n");
		return GPU_SKIP;
	}
	g_emm = gpu_emm_present() && !getenv("EMM_DISABLE");
	case_codes();
	case_xla();
	case_fence();
	case_fence_streams();
	case_sleep();
	case_share();
	{
		struct emm_stats s = stats();
		printf("emm-served: case=vmm-cache vmm_allocs=%llu vmm_hits=%llu vmm_materializations=%llu "
		       "vmm_idle_released=%llu pool_allocs=%llu\n",
		       (unsigned long long)s.vmm_allocs, (unsigned long long)s.vmm_hits,
		       (unsigned long long)s.vmm_materializations, (unsigned long long)s.vmm_idle_released,
		       (unsigned long long)s.pool_allocs);
	}
	printf("%s\n", failures ? "vmm-cache: FAILED" : "vmm-cache: ok");
	return failures ? 1 : 0;
}
