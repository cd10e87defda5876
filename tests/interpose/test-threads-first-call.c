/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/test-threads-first-call.c - eight threads make their first
 * CUDA calls at the same moment, each the way cudart does: dlopen the
 * driver, dlsym cuGetProcAddress_v2, resolve cuInit, the context calls and
 * the allocation calls through it, then allocate. libemm's lazy
 * initialisation, the real-dlsym lookup, the driver-table once and the
 * name caches all race here. Every call must succeed, every allocation
 * function must be libemm's, and libemm's counters must show every
 * allocation served by the pool.
 *
 * Run with LD_PRELOAD=libemm.so and the test-double driver.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "emm/emm.h"
#include "emm_test.h"

#define THREADS 8
#define ALLOCS  64

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static pthread_barrier_t start;

struct worker {
	int index;
	int failures;
	char why[256];
	bool all_libemm;
	bool fake;
};

static bool owned_by_libemm(const void *p)
{
	Dl_info info;
	const char *base;

	if (!p || !dladdr(p, &info) || !info.dli_fname)
		return false;
	base = strrchr(info.dli_fname, '/');
	return strncmp(base ? base + 1 : info.dli_fname, "libemm", 6) == 0;
}

#define WORKER_CHECK(w, cond)                                                                                \
	do {                                                                                                 \
		if (!(cond)) {                                                                               \
			if (!(w)->failures++)                                                                \
				snprintf((w)->why, sizeof((w)->why), "%s", #cond);                           \
			return NULL;                                                                         \
		}                                                                                            \
	} while (0)

static void *resolve(gpa2_fn gpa, const char *name, int version, cuuint64_t flags)
{
	void *p = NULL;

	return gpa(name, &p, version, flags, NULL) == CUDA_SUCCESS ? p : NULL;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	CUresult (*init)(unsigned int);
	CUresult (*device_get)(CUdevice *, int);
	CUresult (*retain)(CUcontext *, CUdevice);
	CUresult (*set_current)(CUcontext);
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream);
	CUresult (*free_async)(CUdeviceptr, CUstream);
	CUdeviceptr ptrs[ALLOCS];
	void *libcuda;
	gpa2_fn gpa;
	CUcontext ctx;
	CUdevice dev;

	pthread_barrier_wait(&start);
	libcuda = dlopen("libcuda.so.1", RTLD_NOW);
	WORKER_CHECK(w, libcuda != NULL);
	w->fake = dlsym(libcuda, "fakecuda_calls") != NULL;
	gpa = (gpa2_fn)dlsym(libcuda, "cuGetProcAddress_v2");
	WORKER_CHECK(w, gpa != NULL);
	init = (CUresult(*)(unsigned int))resolve(gpa, "cuInit", 2000, 0);
	device_get = (CUresult(*)(CUdevice *, int))resolve(gpa, "cuDeviceGet", 2000, 0);
	retain = (CUresult(*)(CUcontext *, CUdevice))resolve(gpa, "cuDevicePrimaryCtxRetain", 7000, 0);
	set_current = (CUresult(*)(CUcontext))resolve(gpa, "cuCtxSetCurrent", 4000, 0);
	mem_alloc = (CUresult(*)(CUdeviceptr *, size_t))resolve(gpa, "cuMemAlloc", 3020, 0);
	mem_free = (CUresult(*)(CUdeviceptr))resolve(gpa, "cuMemFree", 3020, 0);
	alloc_async = (CUresult(*)(CUdeviceptr *, size_t, CUstream))resolve(gpa, "cuMemAllocAsync", 11020, 2);
	free_async = (CUresult(*)(CUdeviceptr, CUstream))resolve(gpa, "cuMemFreeAsync", 11020, 2);
	WORKER_CHECK(w, init && device_get && retain && set_current && mem_alloc && mem_free && alloc_async &&
	                    free_async);
	w->all_libemm = owned_by_libemm((void *)gpa) && owned_by_libemm((void *)mem_alloc) &&
	                owned_by_libemm((void *)mem_free) && owned_by_libemm((void *)alloc_async) &&
	                owned_by_libemm((void *)free_async);
	WORKER_CHECK(w, init(0) == CUDA_SUCCESS);
	WORKER_CHECK(w, device_get(&dev, 0) == CUDA_SUCCESS);
	WORKER_CHECK(w, retain(&ctx, dev) == CUDA_SUCCESS);
	WORKER_CHECK(w, set_current(ctx) == CUDA_SUCCESS);
	for (int round = 0; round < 2; round++) {
		for (int i = 0; i < ALLOCS; i++) {
			size_t size = (size_t)(w->index * ALLOCS + i + 1) * 256;

			if (i % 2)
				WORKER_CHECK(w, alloc_async(&ptrs[i], size, NULL) == CUDA_SUCCESS);
			else
				WORKER_CHECK(w, mem_alloc(&ptrs[i], size) == CUDA_SUCCESS);
			WORKER_CHECK(w, ptrs[i] != 0);
			if (w->fake) /* the test double's device memory is host memory */
				memset((void *)(uintptr_t)ptrs[i], w->index, size);
		}
		for (int i = 0; i < ALLOCS; i++) {
			if (i % 2)
				WORKER_CHECK(w, free_async(ptrs[i], NULL) == CUDA_SUCCESS);
			else
				WORKER_CHECK(w, mem_free(ptrs[i]) == CUDA_SUCCESS);
		}
	}
	return NULL;
}

TEST_BEGIN(test_first_calls_race)
{
	int (*stats_get)(int, struct emm_stats *);
	struct worker workers[THREADS];
	pthread_t threads[THREADS];
	struct emm_stats stats;

	assert_int_eq(pthread_barrier_init(&start, NULL, THREADS), 0);
	for (int i = 0; i < THREADS; i++) {
		workers[i] = (struct worker){.index = i};
		assert_int_eq(pthread_create(&threads[i], NULL, worker_main, &workers[i]), 0);
	}
	for (int i = 0; i < THREADS; i++)
		pthread_join(threads[i], NULL);
	for (int i = 0; i < THREADS; i++) {
		if (workers[i].failures)
			emm_test_fail_("thread %d: %s", i, workers[i].why);
		else
			expect_true(workers[i].all_libemm);
	}

	stats_get = (int (*)(int, struct emm_stats *))dlsym(RTLD_DEFAULT, "emm_stats_get");
	assert_ptr_not_null(stats_get); /* libemm must be preloaded */
	memset(&stats, 0, sizeof(stats));
	stats.struct_size = sizeof(stats);
	assert_int_eq(stats_get(-1, &stats), 0);
	fprintf(stderr, "allocs %llu frees %llu hits %llu misses %llu passthrough %llu backend allocs %llu\n",
	        (unsigned long long)stats.allocs, (unsigned long long)stats.frees,
	        (unsigned long long)stats.hits, (unsigned long long)stats.misses,
	        (unsigned long long)stats.passthrough_allocs, (unsigned long long)stats.backend_allocs);
	expect_int_eq(stats.allocs, THREADS * ALLOCS * 2);
	expect_int_eq(stats.frees, THREADS * ALLOCS * 2);
	expect_int_eq(stats.passthrough_allocs, 0);
	expect_int_eq(stats.passthrough_frees, 0);
	expect_int_eq(stats.live_blocks, 0);
	expect_true(stats.backend_allocs < THREADS * ALLOCS);
	pthread_barrier_destroy(&start);
}
TEST_END

int main(void)
{
	return emm_test_run(test_first_calls_race, NULL);
}
