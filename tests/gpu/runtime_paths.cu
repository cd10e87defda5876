/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/runtime_paths.cu - the CUDA runtime API's allocation calls, as an
 * unmodified program makes them, must reach libemm's pool. Built three ways
 * from this one source (tests/gpu/meson.build):
 *
 *   gpu-runtime-static   -cudart static: cudaMalloc lives inside this
 *                        executable, so only the driver-level interception
 *                        (cudart's dlsym of cuGetProcAddress_v2, then every
 *                        driver function through it) can catch it.
 *   gpu-runtime-shared   -cudart shared: libemm's exported runtime shims (or
 *                        the driver shims under them).
 *   gpu-runtime-ptds     -cudart static --default-stream per-thread: stream 0
 *                        means this thread's default stream, and cudart asks
 *                        the driver for the _ptsz entry points.
 *
 * Every test writes its memory on the GPU, reads it back and compares, and
 * checks through libemm's counters that the pool served each allocation.
 * Managed memory is the exception: libemm passes it through, so the test
 * checks that pass-through counted it and the pool did not.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>
#include <vector>

#include "gpu_common.h"

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#define RT_CASE "runtime-ptds"
#define RT_HOW  "static cudart, --default-stream per-thread"
#elif defined(EMM_CUDART_SHARED)
#define RT_CASE "runtime-shared"
#define RT_HOW  "shared cudart"
#else
#define RT_CASE "runtime-static"
#define RT_HOW  "static cudart"
#endif

#define CK(call)                                                                                             \
	do {                                                                                                 \
		cudaError_t e_ = (call);                                                                     \
		if (e_ != cudaSuccess) {                                                                     \
			emm_test_fail_("%s -> %s (%d)", #call, cudaGetErrorName(e_), (int)e_);               \
			return;                                                                              \
		}                                                                                            \
	} while (0)

/* Same, for helpers that return false on failure. */
#define CKB(call)                                                                                            \
	do {                                                                                                 \
		cudaError_t e_ = (call);                                                                     \
		if (e_ != cudaSuccess) {                                                                     \
			emm_test_fail_("%s -> %s (%d)", #call, cudaGetErrorName(e_), (int)e_);               \
			return false;                                                                        \
		}                                                                                            \
	} while (0)

__global__ void fill_kernel(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = gpu_pattern(i, seed);
}

__global__ void fill2d_kernel(unsigned char *p, size_t pitch, size_t width, size_t height, unsigned seed)
{
	for (size_t y = blockIdx.y; y < height; y += gridDim.y)
		for (size_t x = blockIdx.x * (size_t)blockDim.x + threadIdx.x; x < width;
		     x += (size_t)gridDim.x * blockDim.x)
			p[y * pitch + x] = gpu_pattern(y * width + x, seed);
}

static unsigned grid_for(size_t n)
{
	size_t g = (n + 255) / 256;
	return (unsigned)(g < 1 ? 1 : (g > 1024 ? 1024 : g));
}

/* Write the pattern into device memory `d` on `stream` and check it by
 * copying it back. */
static bool write_and_check(const char *what, void *d, size_t n, unsigned seed, cudaStream_t stream)
{
	std::vector<unsigned char> host(n);

	fill_kernel<<<grid_for(n), 256, 0, stream>>>((unsigned char *)d, n, seed);
	CKB(cudaGetLastError());
	CKB(cudaMemcpyAsync(host.data(), d, n, cudaMemcpyDeviceToHost, stream));
	CKB(cudaStreamSynchronize(stream));
	return gpu_check_pattern(what, host.data(), n, seed) != 0;
}

/* cudaMalloc / cudaFree over a spread of sizes (small pool, large pool,
 * an odd size, a big one). */
TEST_BEGIN(test_malloc_free)
{
	static const size_t sizes[] = {256, 4096, 1u << 20, (3u << 20) + 5, 64u << 20};
	const size_t n = sizeof(sizes) / sizeof(sizes[0]);
	void *p[sizeof(sizes) / sizeof(sizes[0])] = {0};
	struct gpu_snap s0, s1, s2;

	assert_emm_present();
	gpu_snap_take(&s0);
	for (size_t i = 0; i < n; i++)
		CK(cudaMalloc(&p[i], sizes[i]));
	gpu_snap_take(&s1);
	expect_served("cudaMalloc (" RT_HOW ")", GPU_SCOPE_DEVICE, &s0, &s1, n);
	expect_live_delta(GPU_SCOPE_DEVICE, &s0, &s1, (long long)n);
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < i; j++)
			expect_true(p[i] != p[j]);
		expect_true(write_and_check("cudaMalloc", p[i], sizes[i], (unsigned)(i + 1), 0));
	}
	for (size_t i = 0; i < n; i++)
		CK(cudaFree(p[i]));
	CK(cudaFree(NULL));
	gpu_snap_take(&s2);
	expect_freed("cudaFree (" RT_HOW ")", GPU_SCOPE_DEVICE, &s1, &s2, n);
	expect_live_delta(GPU_SCOPE_DEVICE, &s0, &s2, 0);
}
TEST_END

TEST_BEGIN(test_malloc_pitch)
{
	const size_t width = 1000, height = 37;
	void *p = NULL;
	size_t pitch = 0;
	struct gpu_snap s0, s1, s2;
	std::vector<unsigned char> host(width * height);
	std::vector<unsigned char> expect(width * height);

	assert_emm_present();
	gpu_snap_take(&s0);
	CK(cudaMallocPitch(&p, &pitch, width, height));
	gpu_snap_take(&s1);
	expect_served("cudaMallocPitch (" RT_HOW ")", GPU_SCOPE_DEVICE, &s0, &s1, 1);
	expect_true(pitch >= width);
	printf("  cudaMallocPitch(%zu x %zu): pitch %zu\n", width, height, pitch);

	fill2d_kernel<<<dim3(4, 37), 256>>>((unsigned char *)p, pitch, width, height, 7);
	CK(cudaGetLastError());
	CK(cudaMemcpy2D(host.data(), width, p, pitch, width, height, cudaMemcpyDeviceToHost));
	gpu_fill_pattern(expect.data(), expect.size(), 7);
	expect_int_eq(memcmp(host.data(), expect.data(), host.size()), 0);
	CK(cudaFree(p));
	gpu_snap_take(&s2);
	expect_freed("cudaFree of a pitched block", GPU_SCOPE_DEVICE, &s1, &s2, 1);
}
TEST_END

/* Pinned host memory: cudaMallocHost, cudaHostAlloc (default and mapped +
 * portable). Counted in the pinned scope (-2). */
TEST_BEGIN(test_host_alloc)
{
	const size_t n1 = 1u << 20, n2 = 64u << 10, n3 = 12345;
	unsigned char *h1 = NULL, *h2 = NULL, *h3 = NULL;
	void *d = NULL;
	struct gpu_snap s0, s1, s2;

	assert_emm_present();
	gpu_snap_take(&s0);
	CK(cudaMallocHost((void **)&h1, n1));
	CK(cudaHostAlloc((void **)&h2, n2, cudaHostAllocDefault));
	CK(cudaHostAlloc((void **)&h3, n3, cudaHostAllocMapped | cudaHostAllocPortable));
	gpu_snap_take(&s1);
	expect_served("cudaMallocHost + cudaHostAlloc (" RT_HOW ")", GPU_SCOPE_PINNED, &s0, &s1, 3);

	/* h1 -> device -> h2: pinned source and destination of real copies. */
	CK(cudaMalloc(&d, n1));
	gpu_fill_pattern(h1, n1, 11);
	CK(cudaMemcpy(d, h1, n1, cudaMemcpyHostToDevice));
	memset(h1, 0, n1);
	CK(cudaMemcpy(h1, d, n1, cudaMemcpyDeviceToHost));
	expect_true(gpu_check_pattern("cudaMallocHost round trip", h1, n1, 11));
	CK(cudaMemcpy(h2, d, n2, cudaMemcpyDeviceToHost));
	expect_true(gpu_check_pattern("cudaHostAlloc destination", h2, n2, 11));

	/* Mapped: the kernel writes the host buffer directly. */
	void *h3_dev = NULL;
	CK(cudaHostGetDevicePointer(&h3_dev, h3, 0));
	memset(h3, 0, n3);
	fill_kernel<<<grid_for(n3), 256>>>((unsigned char *)h3_dev, n3, 12);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	expect_true(gpu_check_pattern("mapped cudaHostAlloc written by a kernel", h3, n3, 12));

	CK(cudaFree(d));
	gpu_snap_take(&s1);
	CK(cudaFreeHost(h1));
	CK(cudaFreeHost(h2));
	CK(cudaFreeHost(h3));
	gpu_snap_take(&s2);
	expect_freed("cudaFreeHost (" RT_HOW ")", GPU_SCOPE_PINNED, &s1, &s2, 3);
}
TEST_END

/* Managed memory is passed through: counted as pass-through, not pooled. */
TEST_BEGIN(test_managed_passthrough)
{
	const size_t n = 1u << 20;
	unsigned char *m = NULL;
	struct gpu_snap s0, s1, s2;

	assert_emm_present();
	gpu_snap_take(&s0);
	CK(cudaMallocManaged((void **)&m, n, cudaMemAttachGlobal));
	gpu_snap_take(&s1);
	unsigned long long pooled = (unsigned long long)(s1.proc.allocs - s0.proc.allocs) +
	                            (unsigned long long)(s1.dev.allocs - s0.dev.allocs);
	unsigned long long pt =
	    (unsigned long long)(s1.proc.passthrough_allocs - s0.proc.passthrough_allocs) +
	    (unsigned long long)(s1.dev.passthrough_allocs - s0.dev.passthrough_allocs);
	printf("  cudaMallocManaged: pool allocs +%llu, passthrough_allocs +%llu\n", pooled, pt);
	if (pooled != 0)
		emm_test_fail_("cudaMallocManaged was counted by the pool (allocs +%llu); managed memory is "
		               "expected to be passed through",
		               pooled);
	if (pt == 0)
		emm_test_fail_("ESCAPE: cudaMallocManaged (" RT_HOW "): not counted as pass-through either: "
		               "cuMemAllocManaged did not reach libemm");

	fill_kernel<<<grid_for(n), 256>>>(m, n, 21);
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	expect_true(gpu_check_pattern("managed memory written by a kernel", m, n, 21));
	CK(cudaFree(m));
	gpu_snap_take(&s2);
	unsigned long long ptf = (unsigned long long)(s2.proc.passthrough_frees - s1.proc.passthrough_frees) +
	                         (unsigned long long)(s2.dev.passthrough_frees - s1.dev.passthrough_frees);
	if (ptf == 0)
		emm_test_fail_("cudaFree of managed memory was not counted as a pass-through free");
	expect_int_eq(s2.proc.frees - s1.proc.frees, 0);
}
TEST_END

/* Stream-ordered: cudaMallocAsync / cudaFreeAsync on created streams (both
 * kinds), on stream 0 and on cudaStreamPerThread, three rounds so freed
 * blocks come back. */
TEST_BEGIN(test_malloc_async)
{
	static const size_t sizes[] = {512, 200000, 5u << 20};
	const size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
	cudaStream_t blocking = NULL, nonblocking = NULL;
	struct gpu_snap s0, s1;
	uint64_t made = 0;

	assert_emm_present();
	CK(cudaStreamCreate(&blocking));
	CK(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking));
	cudaStream_t streams[] = {blocking, nonblocking, 0, cudaStreamPerThread};
	const char *names[] = {"created blocking stream", "created non-blocking stream", "stream 0",
	                       "cudaStreamPerThread"};

	gpu_snap_take(&s0);
	for (unsigned round = 0; round < 3; round++) {
		for (size_t k = 0; k < 4; k++) {
			for (size_t i = 0; i < nsizes; i++) {
				void *p = NULL;
				unsigned seed = round * 100 + (unsigned)(k * 10 + i);
				CK(cudaMallocAsync(&p, sizes[i], streams[k]));
				made++;
				if (!write_and_check(names[k], p, sizes[i], seed, streams[k]))
					fprintf(stderr, "  (cudaMallocAsync of %zu bytes on %s, round %u)\n",
					        sizes[i], names[k], round);
				CK(cudaFreeAsync(p, streams[k]));
			}
		}
	}
	CK(cudaStreamSynchronize(blocking));
	CK(cudaStreamSynchronize(nonblocking));
	CK(cudaDeviceSynchronize());
	gpu_snap_take(&s1);
	expect_served("cudaMallocAsync (" RT_HOW ")", GPU_SCOPE_DEVICE, &s0, &s1, made);
	expect_freed("cudaFreeAsync (" RT_HOW ")", GPU_SCOPE_DEVICE, &s0, &s1, made);
	CK(cudaStreamDestroy(blocking));
	CK(cudaStreamDestroy(nonblocking));
}
TEST_END

/* A cached alloc/free loop: the pool must reuse blocks, not call the driver
 * per allocation; the data written each round must be that round's. */
TEST_BEGIN(test_reuse)
{
	const unsigned rounds = 200;
	const size_t n = 100000;
	struct gpu_snap s0, s1;

	assert_emm_present();
	gpu_snap_take(&s0);
	for (unsigned r = 0; r < rounds; r++) {
		void *p = NULL;
		CK(cudaMalloc(&p, n));
		if (!write_and_check("reused block", p, n, r, 0)) {
			fprintf(stderr, "  (round %u)\n", r);
			break;
		}
		CK(cudaFree(p));
	}
	gpu_snap_take(&s1);
	expect_served("cudaMalloc + cudaFree loop (" RT_HOW ")", GPU_SCOPE_DEVICE, &s0, &s1, rounds);
	unsigned long long hits = s1.dev.hits - s0.dev.hits,
	                   backend = s1.dev.backend_allocs - s0.dev.backend_allocs;
	if (hits == 0)
		emm_test_fail_("%u alloc/free rounds of one size gave no cache hit", rounds);
	if (backend >= rounds / 2)
		emm_test_fail_("%u alloc/free rounds took %llu backend allocations: not cached", rounds,
		               backend);
}
TEST_END

/* Two threads, each on its own per-thread default stream: stream 0 in the
 * --default-stream per-thread build, cudaStreamPerThread otherwise. */
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#define PT_STREAM ((cudaStream_t)0)
#define PT_NAME   "stream 0 (per-thread default stream)"
#else
#define PT_STREAM cudaStreamPerThread
#define PT_NAME   "cudaStreamPerThread"
#endif

struct pt_arg {
	unsigned id;
	unsigned rounds;
	int failures;
	char why[256];
};

static void *pt_thread(void *argp)
{
	struct pt_arg *arg = (struct pt_arg *)argp;
	const size_t n = 65536 + arg->id * 4096;
	std::vector<unsigned char> host(n);

	for (unsigned r = 0; r < arg->rounds; r++) {
		void *p = NULL;
		unsigned seed = arg->id * 1000 + r;
		cudaError_t e = cudaMallocAsync(&p, n, PT_STREAM);
		if (e == cudaSuccess) {
			fill_kernel<<<grid_for(n), 256, 0, PT_STREAM>>>((unsigned char *)p, n, seed);
			e = cudaGetLastError();
		}
		if (e == cudaSuccess)
			e = cudaMemcpyAsync(host.data(), p, n, cudaMemcpyDeviceToHost, PT_STREAM);
		if (e == cudaSuccess)
			e = cudaFreeAsync(p, PT_STREAM);
		if (e == cudaSuccess)
			e = cudaStreamSynchronize(PT_STREAM);
		if (e != cudaSuccess) {
			snprintf(arg->why, sizeof(arg->why), "round %u: %s", r, cudaGetErrorName(e));
			arg->failures++;
			return NULL;
		}
		for (size_t i = 0; i < n; i++) {
			if (host[i] != gpu_pattern(i, seed)) {
				snprintf(arg->why, sizeof(arg->why), "round %u: data mismatch at byte %zu", r,
				         i);
				arg->failures++;
				return NULL;
			}
		}
	}
	return NULL;
}

TEST_BEGIN(test_per_thread_streams)
{
	struct pt_arg args[2];
	pthread_t th[2];
	struct gpu_snap s0, s1;

	assert_emm_present();
	gpu_snap_take(&s0);
	for (unsigned i = 0; i < 2; i++) {
		args[i] = pt_arg();
		args[i].id = i;
		args[i].rounds = 50;
		assert_int_eq(pthread_create(&th[i], NULL, pt_thread, &args[i]), 0);
	}
	for (unsigned i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		if (args[i].failures)
			emm_test_fail_("thread %u on " PT_NAME ": %s", i, args[i].why);
	}
	gpu_snap_take(&s1);
	expect_served("cudaMallocAsync on " PT_NAME " from 2 threads", GPU_SCOPE_DEVICE, &s0, &s1, 100);
	expect_freed("cudaFreeAsync on " PT_NAME " from 2 threads", GPU_SCOPE_DEVICE, &s0, &s1, 100);
}
TEST_END

int main(void)
{
	int count = 0;
	cudaError_t e = cudaGetDeviceCount(&count);

	if (e != cudaSuccess || count == 0) {
		printf("skip: no usable CUDA device (cudaGetDeviceCount: %s, %d devices)\n",
		       cudaGetErrorName(e), count);
		return GPU_SKIP;
	}
	if (cudaSetDevice(0) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
		printf("FAIL: cannot initialise device 0\n");
		return 1;
	}
	cudaError_t (*rt_malloc)(void **, size_t) = cudaMalloc;
	printf("%s: %s; libemm %s; cudaMalloc resolves in %s\n", RT_CASE, RT_HOW,
	       gpu_emm_present() ? "loaded" : "NOT loaded", gpu_where((const void *)rt_malloc));

	static emm_test_fn tests[] = {
	    test_malloc_free,  test_malloc_pitch, test_host_alloc,         test_managed_passthrough,
	    test_malloc_async, test_reuse,        test_per_thread_streams, NULL,
	};
	int rc = emm_test_run_list(tests);
	if (cudaDeviceSynchronize() != cudaSuccess) {
		printf("FAIL: device error at the end: %s\n", cudaGetErrorName(cudaGetLastError()));
		rc = 1;
	}
	gpu_print_served(RT_CASE);
	return rc;
}
