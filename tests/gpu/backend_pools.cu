/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/backend_pools.cu - libemm over the async and managed backends on
 * a real GPU (static cudart, -lcuda for two pointer queries). Run under
 * LD_PRELOAD=libemm.so with EMM_BACKEND=async or managed, and the same name
 * as the argument:
 *
 *   gpu-backend-pools async     segments from a private CUmemoryPool
 *   gpu-backend-pools managed   segments of managed memory
 *
 * Checks: many allocations (cudaMalloc and cudaMallocAsync on four streams,
 * 1 KiB .. 48 MiB) written by a kernel on another stream than the one that
 * allocated, read back and compared; libemm's counters show the pool served
 * every one and got segments from the backend; the memory is what the
 * backend promises (async: a pool that is not the device's default one, with
 * the release threshold at UINT64_MAX, that keeps what libemm releases and
 * hands it out again; managed: managed memory the host reads directly); and
 * a segment allocated while a blocking stream captures (the async backend's
 * detour around the legacy stream) leaves the capture valid and the graph
 * writes it. Exits 77 without a GPU.
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <vector>

#include "gpu_common.h"

#define CK(call)                                                                                             \
	do {                                                                                                 \
		cudaError_t e_ = (call);                                                                     \
		if (e_ != cudaSuccess) {                                                                     \
			emm_test_fail_("%s -> %s (%d)", #call, cudaGetErrorName(e_), (int)e_);               \
			return;                                                                              \
		}                                                                                            \
	} while (0)

#define CU(call)                                                                                             \
	do {                                                                                                 \
		CUresult r_ = (call);                                                                        \
		if (r_ != CUDA_SUCCESS) {                                                                    \
			emm_test_fail_("%s -> CUresult %d", #call, (int)r_);                                 \
			return;                                                                              \
		}                                                                                            \
	} while (0)

static const char *backend; /* "async" or "managed" */

__global__ void fill_kernel(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
		p[i] = gpu_pattern(i, seed);
}

static void fill(void *p, size_t n, unsigned seed, cudaStream_t s)
{
	fill_kernel<<<(unsigned)((n + 255) / 256 < 1024 ? (n + 255) / 256 : 1024), 256, 0, s>>>(
	    (unsigned char *)p, n, seed);
}

static cuuint64_t pool_attr(cudaMemPool_t pool, cudaMemPoolAttr attr)
{
	cuuint64_t v = 0;

	if (cudaMemPoolGetAttribute(pool, attr, &v) != cudaSuccess)
		return UINT64_C(0xdeadbeef);
	return v;
}

TEST_BEGIN(test_data_served)
{
	enum { N = 96, STREAMS = 4 };
	cudaStream_t st[STREAMS];
	struct gpu_snap a, b;
	void *p[N];
	size_t size[N];
	std::vector<unsigned char> host;

	assert_emm_present();
	st[0] = 0; /* the legacy stream */
	for (int i = 1; i < STREAMS; i++)
		CK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
	gpu_snap_take(&a);
	for (int i = 0; i < N; i++) {
		size[i] = i % 16 == 15 ? ((size_t)48 << 20) + 77 : (size_t)1024 << (i % 14);
		if (i % 2)
			CK(cudaMallocAsync(&p[i], size[i], st[i % STREAMS]));
		else
			CK(cudaMalloc(&p[i], size[i]));
		/* Allocated on one stream, written on the next (after it). */
		if (i % 2)
			CK(cudaStreamSynchronize(st[i % STREAMS]));
		fill(p[i], size[i], (unsigned)i, st[(i + 1) % STREAMS]);
	}
	CK(cudaDeviceSynchronize());
	gpu_snap_take(&b);
	expect_served("cudaMalloc/cudaMallocAsync", GPU_SCOPE_DEVICE, &a, &b, N);
	if (b.dev.backend_allocs == 0)
		emm_test_fail_("the backend served no segment");
	for (int i = 0; i < N; i++) {
		host.assign(size[i], 0);
		CK(cudaMemcpy(host.data(), p[i], size[i], cudaMemcpyDeviceToHost));
		if (!gpu_check_pattern(backend, host.data(), size[i], (unsigned)i))
			break;
	}
	for (int i = 0; i < N; i++) {
		if (i % 2)
			CK(cudaFreeAsync(p[i], st[(i + 1) % STREAMS]));
		else
			CK(cudaFree(p[i]));
	}
	CK(cudaDeviceSynchronize());
	gpu_snap_take(&a);
	expect_freed("cudaFree/cudaFreeAsync", GPU_SCOPE_DEVICE, &b, &a, N);
	for (int i = 1; i < STREAMS; i++)
		CK(cudaStreamDestroy(st[i]));
}
TEST_END

/* async: a private pool that keeps what libemm releases. */
static void check_async_pool(void)
{
	struct emm_stats s0, s1;
	CUmemoryPool pool = NULL;
	cudaMemPool_t def = NULL;
	void *p = NULL, *q = NULL;
	cuuint64_t used0, reserved0, used1, reserved1, reserved2;
	long long released;

	CK(cudaMalloc(&p, (size_t)64 << 20));
	CU(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, (CUdeviceptr)(uintptr_t)p));
	CK(cudaDeviceGetDefaultMemPool(&def, 0));
	if (!pool || (cudaMemPool_t)pool == def)
		emm_test_fail_("a block's pool is %p, the device's default pool %p: not a private pool",
		               (void *)pool, (void *)def);
	if (!pool)
		return;
	if (pool_attr((cudaMemPool_t)pool, cudaMemPoolAttrReleaseThreshold) != UINT64_MAX)
		emm_test_fail_("release threshold %llu, expected UINT64_MAX",
		               (unsigned long long)pool_attr((cudaMemPool_t)pool, cudaMemPoolAttrReleaseThreshold));
	CK(cudaFree(p));
	CK(cudaDeviceSynchronize());
	(void)gpu_stats(GPU_SCOPE_DEVICE, &s0);
	used0 = pool_attr((cudaMemPool_t)pool, cudaMemPoolAttrUsedMemCurrent);
	reserved0 = pool_attr((cudaMemPool_t)pool, cudaMemPoolAttrReservedMemCurrent);
	printf("  async pool: used %llu, reserved %llu, libemm holds %llu in %llu segments\n",
	       (unsigned long long)used0, (unsigned long long)reserved0, (unsigned long long)s0.reserved_bytes,
	       (unsigned long long)s0.segments);
	/* Everything libemm holds is in use in the pool. */
	if (used0 < s0.reserved_bytes)
		emm_test_fail_("pool used %llu < libemm's segments %llu", (unsigned long long)used0,
		               (unsigned long long)s0.reserved_bytes);

	released = gpu_release_idle(0, 0);
	CK(cudaDeviceSynchronize());
	(void)gpu_stats(GPU_SCOPE_DEVICE, &s1);
	used1 = pool_attr((cudaMemPool_t)pool, cudaMemPoolAttrUsedMemCurrent);
	reserved1 = pool_attr((cudaMemPool_t)pool, cudaMemPoolAttrReservedMemCurrent);
	printf("  after emm_release_idle (%lld bytes): used %llu, reserved %llu, backend frees +%llu\n", released,
	       (unsigned long long)used1, (unsigned long long)reserved1,
	       (unsigned long long)(s1.backend_frees - s0.backend_frees));
	if (released <= 0 || s1.backend_frees <= s0.backend_frees)
		emm_test_fail_("emm_release_idle gave nothing back through the backend (%lld)", released);
	if (used1 >= used0)
		emm_test_fail_("the pool's used memory did not drop (%llu -> %llu)", (unsigned long long)used0,
		               (unsigned long long)used1);
	if (reserved1 < reserved0)
		emm_test_fail_("the pool released memory to the device (%llu -> %llu): threshold ignored",
		               (unsigned long long)reserved0, (unsigned long long)reserved1);

	/* A new segment comes out of what the pool kept. */
	CK(cudaMalloc(&q, (size_t)64 << 20));
	fill(q, (size_t)64 << 20, 3, 0);
	CK(cudaDeviceSynchronize());
	reserved2 = pool_attr((cudaMemPool_t)pool, cudaMemPoolAttrReservedMemCurrent);
	if (reserved2 > reserved1)
		emm_test_fail_("the pool grew (%llu -> %llu) instead of reusing what it kept",
		               (unsigned long long)reserved1, (unsigned long long)reserved2);
	CK(cudaFree(q));
}

/* managed: managed memory the host can read. */
static void check_managed(void)
{
	const size_t n = (size_t)8 << 20;
	struct cudaPointerAttributes attr;
	unsigned int is_managed = 0;
	void *p = NULL;

	CK(cudaMalloc(&p, n));
	CK(cudaPointerGetAttributes(&attr, p));
	if (attr.type != cudaMemoryTypeManaged)
		emm_test_fail_("cudaPointerGetAttributes type %d, expected managed", (int)attr.type);
	CU(cuPointerGetAttribute(&is_managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)(uintptr_t)p));
	if (!is_managed)
		emm_test_fail_("CU_POINTER_ATTRIBUTE_IS_MANAGED is 0");
	fill(p, n, 11, 0);
	CK(cudaDeviceSynchronize());
	(void)gpu_check_pattern("managed, read on the host", (const unsigned char *)p, n, 11);
	CK(cudaFree(p));
}

TEST_BEGIN(test_backend_memory)
{
	assert_emm_present();
	if (strcmp(backend, "async") == 0)
		check_async_pool();
	else
		check_managed();
}
TEST_END

/* A new segment while a blocking stream captures: the capture survives and
 * its graph writes the block. */
TEST_BEGIN(test_segment_during_capture)
{
	const size_t n = ((size_t)160 << 20) + 4321; /* larger than anything cached */
	struct gpu_snap a, b;
	cudaStream_t s;
	cudaGraph_t graph = NULL;
	cudaGraphExec_t exec = NULL;
	cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
	std::vector<unsigned char> host(n);
	void *p = NULL;

	assert_emm_present();
	CK(cudaStreamCreate(&s)); /* blocking: the legacy stream is part of its capture */
	CK(cudaStreamBeginCapture(s, mode));
	gpu_snap_take(&a);
	cudaError_t e = cudaMalloc(&p, n);
	gpu_snap_take(&b);
	if (e == cudaSuccess)
		fill(p, n, 29, s);
	cudaError_t end = cudaStreamEndCapture(s, &graph);
	if (e != cudaSuccess || end != cudaSuccess) {
		emm_test_fail_("cudaMalloc during a relaxed capture: %s, end capture: %s", cudaGetErrorName(e),
		               cudaGetErrorName(end));
		(void)cudaGetLastError();
		if (p)
			(void)cudaFree(p);
		(void)cudaStreamDestroy(s);
		return;
	}
	expect_served("cudaMalloc during capture", GPU_SCOPE_DEVICE, &a, &b, 1);
	printf("  segment during capture: backend allocs +%llu\n",
	       (unsigned long long)(b.dev.backend_allocs - a.dev.backend_allocs));
	CK(cudaGraphInstantiate(&exec, graph, 0));
	CK(cudaGraphLaunch(exec, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost));
	(void)gpu_check_pattern("written by the graph", host.data(), n, 29);
	CK(cudaGraphExecDestroy(exec));
	CK(cudaGraphDestroy(graph));
	CK(cudaFree(p));
	CK(cudaStreamDestroy(s));
}
TEST_END

int main(int argc, char **argv)
{
	int count = 0;
	cudaError_t e;
	const char *env = getenv("EMM_BACKEND");

	if (argc < 2 || (strcmp(argv[1], "async") != 0 && strcmp(argv[1], "managed") != 0)) {
		fprintf(stderr, "usage: %s async|managed (with EMM_BACKEND set the same)\n", argv[0]);
		return 2;
	}
	backend = argv[1];
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		printf("skip: no usable CUDA device (cudaGetDeviceCount: %s, %d devices)\n", cudaGetErrorName(e),
		       count);
		return GPU_SKIP;
	}
	if (!env || strcmp(env, backend) != 0) {
		fprintf(stderr, "EMM_BACKEND is %s, expected %s\n", env ? env : "(unset)", backend);
		return 1;
	}
	printf("backend %s\n", backend);
	static emm_test_fn tests[] = {test_data_served, test_backend_memory, test_segment_during_capture, NULL};
	int rc = emm_test_run_list(tests);
	gpu_print_served(strcmp(backend, "async") == 0 ? "backend-async" : "backend-managed");
	return rc;
}
