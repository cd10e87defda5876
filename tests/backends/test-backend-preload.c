/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/test-backend-preload.c - libemm preloaded with a given
 * backend over the fake driver (LD_PRELOAD=libemm.so, EMM_BACKEND set by the
 * meson test): allocations of many sizes, synchronous and stream-ordered,
 * keep their data; libemm's pool serves them all (emm_stats_get, found with
 * dlsym); the segments come from the backend's driver calls and nothing
 * else; emm_release_idle gives them back through the backend; a context
 * destroyed or reset under live blocks gives its memory back and leaves
 * the driver's answers to later frees.
 *
 *   test-backend-preload async              EMM_BACKEND=async
 *   test-backend-preload managed            EMM_BACKEND=managed
 *   test-backend-preload example LIB.so     EMM_BACKEND=LIB.so (the
 *                                           out-of-tree example backend)
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emm/emm.h"
#include "emm_test.h"
#include "fakecuda.h"

static const char *kind;
static const char *example_path;

static void stats_of(int device, struct emm_stats *out)
{
	static int (*get)(int, struct emm_stats *);

	memset(out, 0, sizeof(*out));
	out->struct_size = sizeof(*out);
	if (!get)
		*(void **)&get = dlsym(RTLD_DEFAULT, "emm_stats_get");
	if (!get || get(device, out) != 0) {
		fprintf(stderr, "emm_stats_get not found or failed: is libemm.so preloaded?\n");
		exit(1);
	}
}

static void stats(struct emm_stats *out)
{
	stats_of(0, out);
}

/* The driver call each segment comes from, under each backend. */
static const char *segment_call(void)
{
	if (strcmp(kind, "async") == 0)
		return "cuMemAllocFromPoolAsync";
	if (strcmp(kind, "managed") == 0)
		return "cuMemAllocManaged";
	return "cuMemAlloc_v2";
}

static const char *segment_free_call(void)
{
	return strcmp(kind, "async") == 0 ? "cuMemFreeAsync" : "cuMemFree_v2";
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(seed * 31 + i * 7);
}

TEST_BEGIN(test_served_with_data)
{
	static unsigned char in[1 << 16], out[1 << 16];
	struct emm_stats s0, s1;
	CUdeviceptr live[64];
	CUstream s;
	size_t n;
	int bad = 0;

	stats(&s0);
	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	for (int round = 0; round < 4; round++) {
		for (int i = 0; i < 64; i++) {
			size_t size = (size_t)256 << (i % 14); /* 256 B .. 2 MiB */
			CUresult r = i % 3 == 0 ? cuMemAllocAsync(&live[i], size, s) : cuMemAlloc(&live[i], size);

			assert_int_eq(r, CUDA_SUCCESS);
			n = size < sizeof(in) ? size : sizeof(in);
			fill(in, n, (unsigned)(round * 64 + i));
			bad |= cuMemcpyHtoD(live[i] + size - n, in, n) != CUDA_SUCCESS;
		}
		for (int i = 0; i < 64; i++) {
			size_t size = (size_t)256 << (i % 14);

			n = size < sizeof(in) ? size : sizeof(in);
			fill(in, n, (unsigned)(round * 64 + i));
			bad |= cuMemcpyDtoH(out, live[i] + size - n, n) != CUDA_SUCCESS;
			bad |= memcmp(in, out, n) != 0;
			bad |= (i % 3 == 0 ? cuMemFreeAsync(live[i], s) : cuMemFree(live[i])) != CUDA_SUCCESS;
		}
	}
	expect_false(bad);
	assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	stats(&s1);
	fprintf(stderr, "%s: %llu allocations served, %llu segments from the backend (%llu %s calls)\n", kind,
	        (unsigned long long)(s1.allocs - s0.allocs),
	        (unsigned long long)(s1.backend_allocs - s0.backend_allocs),
	        (unsigned long long)fakecuda_calls(segment_call()), segment_call());
	expect_u64_eq(s1.allocs - s0.allocs, 256);
	expect_u64_eq(s1.frees - s0.frees, 256);
	expect_u64_eq(s1.passthrough_allocs, 0);
	expect_true(s1.backend_allocs >= 1);
	/* Every segment is one call of the backend's own allocation. */
	expect_u64_eq(fakecuda_calls(segment_call()), s1.backend_allocs);
	if (strcmp(kind, "example") != 0)
		expect_u64_eq(fakecuda_calls("cuMemAlloc_v2"), 0);
}
TEST_END

/* What the memory is, by the driver's own account. */
TEST_BEGIN(test_memory_kind)
{
	CUdeviceptr d;
	CUmemoryPool pool = NULL, def = NULL;
	unsigned int managed = 2;

	assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	expect_int_eq(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, d), CUDA_SUCCESS);
	expect_int_eq(managed, strcmp(kind, "managed") == 0);
	expect_int_eq(cuPointerGetAttribute(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, d), CUDA_SUCCESS);
	if (strcmp(kind, "async") == 0) {
		/* A private pool, not the device's default one. */
		assert_int_eq(cuDeviceGetDefaultMemPool(&def, 0), CUDA_SUCCESS);
		expect_true(pool != NULL && pool != def);
	} else {
		expect_ptr_null(pool);
	}
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
}
TEST_END

/* Idle segments go back through the backend's free. */
TEST_BEGIN(test_release_idle)
{
	long long (*release)(int, size_t);
	struct emm_stats s1;
	uint64_t frees0 = fakecuda_calls(segment_free_call());

	*(void **)&release = dlsym(RTLD_DEFAULT, "emm_release_idle");
	assert_ptr_not_null(release);
	assert_int_eq(cuCtxSynchronize(), CUDA_SUCCESS);
	expect_true(release(0, 0) > 0);
	stats(&s1);
	expect_true(s1.backend_frees >= 1);
	expect_u64_eq(fakecuda_calls(segment_free_call()) - frees0, s1.backend_frees);
	expect_u64_eq(s1.segments, s1.backend_allocs - s1.backend_frees);
}
TEST_END

/* Pinned host memory is cached although these backends serve device
 * memory only: it comes from the built-in driver backend. */
TEST_BEGIN(test_pinned_cached)
{
	struct emm_stats p0, p1;
	void *a, *b;

	stats_of(-2, &p0);
	assert_int_eq(cuMemHostAlloc(&a, 1 << 20, 0), CUDA_SUCCESS);
	fill(a, 1 << 20, 3);
	assert_int_eq(cuMemFreeHost(a), CUDA_SUCCESS);
	assert_int_eq(cuMemHostAlloc(&b, 1 << 20, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemFreeHost(b), CUDA_SUCCESS);
	stats_of(-2, &p1);
	expect_u64_eq(p1.allocs - p0.allocs, 2);
	expect_u64_eq(p1.frees - p0.frees, 2);
	expect_u64_eq(p1.passthrough_allocs, p0.passthrough_allocs);
}
TEST_END

/* A backend whose memory cannot be shared: even a whole-segment block is
 * refused with a clear CUDA_ERROR_NOT_SUPPORTED, not the driver's answer. */
TEST_BEGIN(test_ipc_refused)
{
	CUipcMemHandle h;
	CUdeviceptr d;

	assert_int_eq(cuMemAlloc(&d, (size_t)12 << 20), CUDA_SUCCESS);
	expect_int_eq(cuIpcGetMemHandle(&h, d), CUDA_ERROR_NOT_SUPPORTED);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
}
TEST_END

/* The example backend counted exactly what libemm asked of it. */
TEST_BEGIN(test_example_counts)
{
	int (*counts)(uint64_t *, uint64_t *, uint64_t *);
	uint64_t allocs = 0, frees = 0, failed = 1;
	struct emm_stats st;
	void *h;

	h = dlopen(example_path, RTLD_NOW | RTLD_NOLOAD);
	assert_ptr_not_null(h); /* libemm loaded it */
	*(void **)&counts = dlsym(h, "emm_example_counts");
	assert_ptr_not_null(counts);
	assert_int_eq(counts(&allocs, &frees, &failed), 0);
	stats(&st);
	fprintf(stderr, "example backend: %llu segment allocations, %llu frees\n", (unsigned long long)allocs,
	        (unsigned long long)frees);
	expect_true(allocs >= 1);
	expect_u64_eq(allocs, st.backend_allocs);
	expect_u64_eq(frees, st.backend_frees);
	expect_u64_eq(failed, 0);
	dlclose(h);
}
TEST_END

/* Contexts that go under live blocks: destroyed (cuCtxDestroy), and the
 * primary context reset behind libemm's back (what cudaDeviceReset does),
 * before and after the runtime retains it again. A later free of an old
 * block gets the driver's own answer and the device has the memory back,
 * as with the driver backend (the async backend's pool outlives the
 * context: it is released with it). */
TEST_BEGIN(test_context_gone)
{
	static const size_t sizes[3] = {4096, 1 << 20, 8 << 20};
	CUdeviceptr d[3], x;
	CUcontext primary = NULL, c2, cur = NULL;
	size_t used0;

	assert_int_eq(cuCtxGetCurrent(&primary), CUDA_SUCCESS);
	used0 = fakecuda_mem_used(0);
	assert_int_eq(cuCtxCreate(&c2, NULL, 0, 0), CUDA_SUCCESS);
	for (int i = 0; i < 3; i++)
		assert_int_eq(cuMemAlloc(&d[i], sizes[i]), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(d[1]), CUDA_SUCCESS); /* cached */
	if (strcmp(kind, "managed") != 0) /* the fake counts device memory only */
		expect_true(fakecuda_mem_used(0) > used0);
	assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	assert_int_eq(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
	expect_ptr_eq(cur, primary);
	expect_int_eq(cuMemFree(d[0]), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemFree(d[2]), CUDA_ERROR_INVALID_VALUE);
	expect_u64_eq(fakecuda_mem_used(0), used0);

	for (int retain = 1; retain >= 0; retain--) {
		assert_int_eq(cuMemAlloc(&d[0], sizes[1]), CUDA_SUCCESS);
		assert_int_eq(cuMemAlloc(&d[1], sizes[2]), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(d[1]), CUDA_SUCCESS); /* cached */
		assert_int_eq(fakecuda_device_reset(0, retain), 0);
		if (!retain) {
			/* The reset context is current until the runtime retains
			 * it: the driver's answer, and it stays reset. */
			expect_int_eq(cuMemFree(d[0]), CUDA_ERROR_CONTEXT_IS_DESTROYED);
			assert_int_eq(cuDevicePrimaryCtxRetain(&cur, 0), CUDA_SUCCESS);
			expect_ptr_eq(cur, primary);
		}
		expect_int_eq(cuMemFree(d[0]), CUDA_ERROR_INVALID_VALUE);
		expect_u64_eq(fakecuda_mem_used(0), 0);
		/* The new context is served. */
		assert_int_eq(cuMemAlloc(&x, 4096), CUDA_SUCCESS);
		expect_int_eq(cuMemsetD8(x, 1, 4096), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(x), CUDA_SUCCESS);
	}
}
TEST_END

int main(int argc, char **argv)
{
	CUdevice dev;
	CUcontext ctx;

	if (argc < 2 || (strcmp(argv[1], "example") == 0 && argc < 3)) {
		fprintf(stderr, "usage: %s async|managed|example [LIB.so]\n", argv[0]);
		return 2;
	}
	kind = argv[1];
	example_path = argc > 2 ? argv[2] : NULL;
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
		fprintf(stderr, "driver setup failed\n");
		return 1;
	}
	if (strcmp(kind, "example") == 0)
		return emm_test_run(test_served_with_data, test_memory_kind, test_release_idle, test_pinned_cached,
		                    test_example_counts, test_context_gone, NULL);
	return emm_test_run(test_served_with_data, test_memory_kind, test_release_idle, test_pinned_cached,
	                    test_ipc_refused, test_context_gone, NULL);
}
