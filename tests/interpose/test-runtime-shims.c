/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/test-runtime-shims.c - libemm's runtime-API shims for
 * programs linked to shared cudart, against the test-double cudart
 * (fakecudart/) and driver. fakecudart_calls(name) tells whether a call
 * reached cudart (delegated) or was served by libemm's fast path.
 *
 * argv[1] is the configuration the harness ran us in:
 *   ref      no libemm: every call is cudart's
 *   emm      libemm preloaded: the fast path serves the common case
 *   noshims  libemm with EMM_RUNTIME_SHIMS=0: every call delegates
 *   disabled libemm with EMM_DISABLE=1: every call delegates
 * Results and cudaGetLastError must be the same in every configuration.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "emm/emm.h"
#include "emm_test.h"

cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream);
cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream);
cudaError_t cudaGetDriverEntryPoint_ptsz(const char *symbol, void **funcPtr, unsigned long long flags,
                                         enum cudaDriverEntryPointQueryResult *driverStatus);
cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **funcPtr,
                                                  unsigned int cudaVersion, unsigned long long flags,
                                                  enum cudaDriverEntryPointQueryResult *driverStatus);
/* Weak: absent when the program runs against the real cudart (the
 * test-runtime-shims-cudart build for the GPU machine); then which path
 * served a call is not observable, and only results are checked. */
__attribute__((weak)) uint64_t fakecudart_calls(const char *name);

static const char *config = "ref";
static bool fast;    /* the fast path is expected to serve */
static bool shimmed; /* libemm is loaded and enabled (resolvers substitute) */

static int (*stats_get)(int, struct emm_stats *);
static void *(*real_dlsym)(void *, const char *);
static void *libcuda;

/* --- helpers --------------------------------------------------------------------- */

static uint64_t calls_before;
static const char *calls_name;

static bool fake_cudart(void)
{
	return fakecudart_calls != NULL;
}

static void calls_mark(const char *name)
{
	calls_name = name;
	calls_before = fake_cudart() ? fakecudart_calls(name) : 0;
}

/* 1 if the call since calls_mark reached cudart, 0 if libemm served it
 * (-1: not observable with the real cudart). */
static int calls_delta(void)
{
	return fake_cudart() ? (int)(fakecudart_calls(calls_name) - calls_before) : -1;
}

#define EXPECT_DELEGATED()                                                                                   \
	do {                                                                                                 \
		if (fake_cudart())                                                                           \
			expect_int_eq(calls_delta(), 1);                                                     \
	} while (0)
#define EXPECT_SERVED_BY_LIBEMM(served)                                                                      \
	do {                                                                                                 \
		if (fake_cudart())                                                                           \
			expect_int_eq(calls_delta(), (served) ? 0 : 1);                                      \
	} while (0)

/* Touch memory the runtime handed out (host memory in the test double). */
static void touch(void *p, size_t n, bool device)
{
	if (!device || fake_cudart())
		memset(p, 0x5a, n);
	else
		expect_int_eq(cudaMemset(p, 0x5a, n), cudaSuccess);
}

static struct emm_stats stats_now(void)
{
	struct emm_stats s;

	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	if (stats_get)
		stats_get(-1, &s);
	return s;
}

static const char *owner(const void *p, const char **ret_name)
{
	Dl_info info;
	const char *slash;

	*ret_name = "?";
	if (!p || !dladdr(p, &info) || !info.dli_fname)
		return "?";
	if (info.dli_sname && info.dli_saddr == p)
		*ret_name = info.dli_sname;
	slash = strrchr(info.dli_fname, '/');
	return slash ? slash + 1 : info.dli_fname;
}

/* Pointers the runtime API handed out, for check-runtime-trace.py: each
 * must appear in the EMM_LOG trace, whichever path served it. */
static void *noted[256];
static size_t noted_count;

static void note(void *p)
{
	if (p && noted_count < sizeof(noted) / sizeof(noted[0]))
		noted[noted_count++] = p;
}

/* The driver's own export, bypassing libemm's dlsym. */
static void *driver_raw(const char *name)
{
	return real_dlsym(libcuda, name);
}

/* --- tests ----------------------------------------------------------------------- */

TEST_BEGIN(test_setup)
{
	static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};

	for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]) && !real_dlsym; i++)
		real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_DEFAULT, "dlsym", versions[i]);
	assert_ptr_not_null(real_dlsym);
	libcuda = dlopen("libcuda.so.1", RTLD_NOW);
	assert_ptr_not_null(libcuda);
	stats_get = (int (*)(int, struct emm_stats *))dlsym(RTLD_DEFAULT, "emm_stats_get");
	if (strcmp(config, "ref") == 0)
		expect_ptr_null(stats_get);
	else
		expect_ptr_not_null(stats_get);
}
TEST_END

/* The first call finds no context: cudart must make it. */
TEST_BEGIN(test_first_call_delegates)
{
	struct emm_stats before = stats_now(), after;
	void *p = NULL;

	calls_mark("cudaMalloc");
	assert_int_eq(cudaMalloc(&p, 1000), cudaSuccess);
	EXPECT_DELEGATED();
	assert_ptr_not_null(p);
	note(p);
	after = stats_now();
	/* ...and cudart's driver call landed in the driver shim (the real
	 * cudart may allocate for itself on the way). */
	if (shimmed && fake_cudart())
		expect_int_eq(after.allocs - before.allocs, 1);
	else if (shimmed)
		expect_true(after.allocs - before.allocs >= 1);
	calls_mark("cudaFree");
	expect_int_eq(cudaFree(p), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
}
TEST_END

TEST_BEGIN(test_malloc_free)
{
	struct emm_stats before = stats_now(), after;
	void *p = NULL, *q = NULL;

	calls_mark("cudaMalloc");
	assert_int_eq(cudaMalloc(&p, 4096), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	assert_ptr_not_null(p);
	note(p);
	touch(p, 4096, true);
	calls_mark("cudaMalloc");
	assert_int_eq(cudaMalloc(&q, 3 << 20), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	note(q);
	after = stats_now();
	if (shimmed) {
		expect_int_eq(after.allocs - before.allocs, 2);
		expect_int_eq(after.passthrough_allocs - before.passthrough_allocs, 0);
	}
	calls_mark("cudaFree");
	expect_int_eq(cudaFree(p), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	calls_mark("cudaFree");
	expect_int_eq(cudaFree(q), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	if (shimmed)
		expect_int_eq(stats_now().frees - before.frees, 2);
	expect_int_eq(cudaGetLastError(), cudaSuccess);
}
TEST_END

/* Errors and foreign pointers go to cudart, which records them. */
TEST_BEGIN(test_errors_delegate)
{
	CUresult (*raw_alloc)(CUdeviceptr *, size_t) =
	    (CUresult(*)(CUdeviceptr *, size_t))driver_raw("cuMemAlloc_v2");
	void *p = NULL, *q = NULL;
	CUdeviceptr foreign = 0;

	expect_int_eq(cudaGetLastError(), cudaSuccess);

	calls_mark("cudaFree");
	expect_int_eq(cudaFree(NULL), cudaSuccess);
	EXPECT_DELEGATED();

	calls_mark("cudaMalloc");
	expect_int_eq(cudaMalloc(NULL, 16), cudaErrorInvalidValue);
	EXPECT_DELEGATED();
	expect_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
	expect_int_eq(cudaGetLastError(), cudaSuccess);

	calls_mark("cudaMalloc");
	expect_int_eq(cudaMalloc(&q, 0), cudaSuccess);
	EXPECT_DELEGATED();

	assert_int_eq(cudaMalloc(&p, 8192), cudaSuccess);
	/* Interior pointer: refused by the driver shim, recorded by cudart. */
	calls_mark("cudaFree");
	expect_int_eq(cudaFree((char *)p + 512), cudaErrorInvalidValue);
	EXPECT_DELEGATED();
	expect_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
	expect_int_eq(cudaFree(p), cudaSuccess);
	/* Double free. */
	calls_mark("cudaFree");
	expect_int_eq(cudaFree(p), cudaErrorInvalidValue);
	EXPECT_DELEGATED();
	expect_int_eq(cudaGetLastError(), cudaErrorInvalidValue);

	/* Memory libemm never handed out goes to the driver unchanged. */
	assert_ptr_not_null((void *)raw_alloc);
	assert_int_eq(raw_alloc(&foreign, 4096), CUDA_SUCCESS);
	calls_mark("cudaFree");
	expect_int_eq(cudaFree((void *)(uintptr_t)foreign), cudaSuccess);
	EXPECT_DELEGATED();
	expect_int_eq(cudaGetLastError(), cudaSuccess);
}
TEST_END

TEST_BEGIN(test_async)
{
	CUresult (*stream_create)(CUstream *, unsigned int) =
	    (CUresult(*)(CUstream *, unsigned int))dlsym(libcuda, "cuStreamCreate");
	CUresult (*stream_destroy)(CUstream) = (CUresult(*)(CUstream))dlsym(libcuda, "cuStreamDestroy_v2");
	cudaStream_t streams[] = {NULL, cudaStreamLegacy, cudaStreamPerThread, NULL};
	CUstream s = NULL;

	assert_true(stream_create && stream_destroy);
	assert_int_eq(stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	streams[3] = (cudaStream_t)s;
	for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
		void *p = NULL, *q = NULL;

		calls_mark("cudaMallocAsync");
		assert_int_eq(cudaMallocAsync(&p, 2048, streams[i]), cudaSuccess);
		EXPECT_SERVED_BY_LIBEMM(fast);
		note(p);
		calls_mark("cudaFreeAsync");
		expect_int_eq(cudaFreeAsync(p, streams[i]), cudaSuccess);
		EXPECT_SERVED_BY_LIBEMM(fast);
		calls_mark("cudaMallocAsync_ptsz");
		assert_int_eq(cudaMallocAsync_ptsz(&q, 2048, streams[i]), cudaSuccess);
		EXPECT_SERVED_BY_LIBEMM(fast);
		note(q);
		calls_mark("cudaFreeAsync_ptsz");
		expect_int_eq(cudaFreeAsync_ptsz(q, streams[i]), cudaSuccess);
		EXPECT_SERVED_BY_LIBEMM(fast);
	}
	/* Bad arguments: cudart's answer. */
	calls_mark("cudaMallocAsync");
	expect_int_eq(cudaMallocAsync(NULL, 16, NULL), cudaErrorInvalidValue);
	EXPECT_DELEGATED();
	expect_int_eq(cudaGetLastError(), cudaErrorInvalidValue);
	calls_mark("cudaFreeAsync");
	expect_int_ne(cudaFreeAsync((void *)(uintptr_t)0x1000, NULL), cudaSuccess);
	EXPECT_DELEGATED();
	(void)cudaGetLastError();
	expect_int_eq(stream_destroy(s), CUDA_SUCCESS);
}
TEST_END

/* A capturing stream: the allocation must become the driver's (a graph
 * node), so libemm leaves it to cudart and the driver shim. */
TEST_BEGIN(test_async_capture_delegates)
{
	CUresult (*stream_create)(CUstream *, unsigned int) =
	    (CUresult(*)(CUstream *, unsigned int))dlsym(libcuda, "cuStreamCreate");
	CUresult (*begin)(CUstream, CUstreamCaptureMode) =
	    (CUresult(*)(CUstream, CUstreamCaptureMode))dlsym(libcuda, "cuStreamBeginCapture_v2");
	CUresult (*end)(CUstream, CUgraph *) =
	    (CUresult(*)(CUstream, CUgraph *))dlsym(libcuda, "cuStreamEndCapture");
	CUresult (*stream_destroy)(CUstream) = (CUresult(*)(CUstream))dlsym(libcuda, "cuStreamDestroy_v2");
	CUstream s = NULL;
	CUgraph graph = NULL;
	void *p = NULL;

	assert_true(stream_create && begin && end && stream_destroy);
	assert_int_eq(stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	calls_mark("cudaMallocAsync");
	expect_int_eq(cudaMallocAsync(&p, 4096, (cudaStream_t)s), cudaSuccess);
	EXPECT_DELEGATED();
	calls_mark("cudaFreeAsync");
	expect_int_eq(cudaFreeAsync(p, (cudaStream_t)s), cudaSuccess);
	EXPECT_DELEGATED();
	expect_int_eq(end(s, &graph), CUDA_SUCCESS);
	expect_int_eq(stream_destroy(s), CUDA_SUCCESS);

	/* This thread's default stream capturing: the _ptsz null stream and
	 * cudaStreamPerThread are that stream. */
	assert_int_eq(begin(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	calls_mark("cudaMallocAsync_ptsz");
	expect_int_eq(cudaMallocAsync_ptsz(&p, 4096, NULL), cudaSuccess);
	EXPECT_DELEGATED();
	calls_mark("cudaFreeAsync");
	expect_int_eq(cudaFreeAsync(p, cudaStreamPerThread), cudaSuccess);
	EXPECT_DELEGATED();
	expect_int_eq(end(CU_STREAM_PER_THREAD, &graph), CUDA_SUCCESS);
	/* Capture over: served again. */
	calls_mark("cudaMallocAsync_ptsz");
	expect_int_eq(cudaMallocAsync_ptsz(&p, 4096, NULL), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	expect_int_eq(cudaFreeAsync_ptsz(p, NULL), cudaSuccess);
}
TEST_END

TEST_BEGIN(test_pinned)
{
	void *h = NULL, *m = NULL, *d = NULL;

	calls_mark("cudaMallocHost");
	assert_int_eq(cudaMallocHost(&h, 1000), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	note(h);
	touch(h, 1000, false);
	calls_mark("cudaHostAlloc");
	assert_int_eq(cudaHostAlloc(&m, 5000, cudaHostAllocMapped | cudaHostAllocPortable), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	note(m);
	assert_int_eq(cudaMalloc(&d, 1024), cudaSuccess);

	/* The wrong free for the kind of memory: cudart (and the driver
	 * shim) decide; the block stays live. */
	calls_mark("cudaFree");
	(void)cudaFree(h);
	EXPECT_DELEGATED();
	calls_mark("cudaFreeHost");
	(void)cudaFreeHost(d);
	EXPECT_DELEGATED();
	(void)cudaGetLastError();

	calls_mark("cudaFreeHost");
	expect_int_eq(cudaFreeHost(h), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	calls_mark("cudaFreeHost");
	expect_int_eq(cudaFreeHost(m), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);
	calls_mark("cudaFree");
	expect_int_eq(cudaFree(d), cudaSuccess);
	EXPECT_SERVED_BY_LIBEMM(fast);

	calls_mark("cudaHostAlloc");
	expect_int_ne(cudaHostAlloc(&m, 64, 0x80), cudaSuccess); /* unknown flag */
	EXPECT_DELEGATED();
	(void)cudaGetLastError();
	calls_mark("cudaFreeHost");
	expect_int_eq(cudaFreeHost(NULL), cudaSuccess);
	EXPECT_DELEGATED();
}
TEST_END

/* Calls libemm only forwards. */
TEST_BEGIN(test_pass_through)
{
	static char page[8192] __attribute__((aligned(4096)));
	size_t pitch = 0, free_bytes = 0, total = 0;
	void *p = NULL, *m = NULL;

	calls_mark("cudaMallocPitch");
	expect_int_eq(cudaMallocPitch(&p, &pitch, 1000, 10), cudaSuccess);
	EXPECT_DELEGATED();
	expect_true(pitch >= 1000);
	expect_int_eq(cudaFree(p), cudaSuccess);
	calls_mark("cudaMallocManaged");
	expect_int_eq(cudaMallocManaged(&m, 4096, cudaMemAttachGlobal), cudaSuccess);
	EXPECT_DELEGATED();
	expect_int_eq(cudaFree(m), cudaSuccess);
	calls_mark("cudaHostRegister");
	expect_int_eq(cudaHostRegister(page, sizeof(page), 0), cudaSuccess);
	EXPECT_DELEGATED();
	calls_mark("cudaHostUnregister");
	expect_int_eq(cudaHostUnregister(page), cudaSuccess);
	EXPECT_DELEGATED();
	calls_mark("cudaMemGetInfo");
	expect_int_eq(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
	EXPECT_DELEGATED();
	expect_true(total > 0 && free_bytes <= total);
}
TEST_END

/* cudaGetDriverEntryPoint*: the driver's choice of ABI, libemm's shim for
 * it when libemm is on. */
TEST_BEGIN(test_entry_points)
{
	struct {
		const char *what, *symbol;
		int api; /* 0 plain, 1 _ptsz, 2 ByVersion, 3 ByVersion_ptsz */
		unsigned version;
		unsigned long long flags;
		const char *expect_name;
		bool shim;
	} cases[] = {
	    {"plain", "cuMemAlloc", 0, 0, 0, "cuMemAlloc_v2", true},
	    {"plain legacy", "cuMemAllocAsync", 0, 0, cudaEnableLegacyStream, "cuMemAllocAsync", true},
	    {"plain ptds", "cuMemAllocAsync", 0, 0, cudaEnablePerThreadDefaultStream, "cuMemAllocAsync_ptsz",
	     true},
	    {"ptsz default", "cuMemAllocAsync", 1, 0, 0, "cuMemAllocAsync_ptsz", true},
	    {"ptsz legacy", "cuMemFreeAsync", 1, 0, cudaEnableLegacyStream, "cuMemFreeAsync", true},
	    {"by-version v1", "cuMemAlloc", 2, 2000, 0, "cuMemAlloc", false},
	    {"by-version v2", "cuMemAlloc", 2, 12000, 0, "cuMemAlloc_v2", true},
	    {"by-version-ptsz", "cuMemFreeAsync", 3, 12000, 0, "cuMemFreeAsync_ptsz", true},
	    {"no shim", "cuInit", 2, 12000, 0, "cuInit", false},
	    {"resolver", "cuGetProcAddress", 2, 12000, 0, "cuGetProcAddress_v2", true},
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		enum cudaDriverEntryPointQueryResult st = (enum cudaDriverEntryPointQueryResult)7;
		void *fn = NULL;
		const char *name, *file;
		cudaError_t err;

		switch (cases[i].api) {
		case 0:
			calls_mark("cudaGetDriverEntryPoint");
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* deprecated in 13.0, still served */
			err = cudaGetDriverEntryPoint(cases[i].symbol, &fn, cases[i].flags, &st);
#pragma GCC diagnostic pop
			break;
		case 1:
			calls_mark("cudaGetDriverEntryPoint_ptsz");
			err = cudaGetDriverEntryPoint_ptsz(cases[i].symbol, &fn, cases[i].flags, &st);
			break;
		case 2:
			calls_mark("cudaGetDriverEntryPointByVersion");
			err = cudaGetDriverEntryPointByVersion(cases[i].symbol, &fn, cases[i].version,
			                                       cases[i].flags, &st);
			break;
		default:
			calls_mark("cudaGetDriverEntryPointByVersion_ptsz");
			err = cudaGetDriverEntryPointByVersion_ptsz(cases[i].symbol, &fn, cases[i].version,
			                                            cases[i].flags, NULL);
			st = cudaDriverEntryPointSuccess;
			break;
		}
		EXPECT_DELEGATED();
		expect_int_eq(err, cudaSuccess);
		expect_int_eq(st, cudaDriverEntryPointSuccess);
		file = owner(fn, &name);
		if (strcmp(name, cases[i].expect_name) != 0 ||
		    strncmp(file, shimmed && cases[i].shim ? "libemm" : "libcuda.so", 6) != 0)
			emm_test_fail_("%s: %s came back as %s:%s", cases[i].what, cases[i].symbol, file,
			               name);
	}
	/* Not found, and a version above the driver's: the driver's answers. */
	{
		enum cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSuccess;
		void *fn = (void *)1;

		expect_int_eq(cudaGetDriverEntryPointByVersion("cuNoSuchFunction", &fn, 12000, 0, &st),
		              cudaSuccess);
		expect_int_eq(st, cudaDriverEntryPointSymbolNotFound);
		expect_ptr_null(fn);
		expect_int_ne(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 99000, 0, &st),
		              cudaSuccess);
		(void)cudaGetLastError();
	}
}
TEST_END

TEST_BEGIN(test_report_pointers)
{
	expect_true(noted_count >= 12);
	for (size_t i = 0; i < noted_count; i++)
		printf("ptr\t%#llx\n", (unsigned long long)(uintptr_t)noted[i]);
}
TEST_END

int main(int argc, char **argv)
{
	if (argc > 1)
		config = argv[1];
	if (!fake_cudart() && !dlopen("libcuda.so.1", RTLD_NOW)) {
		/* The real-cudart build on a machine without a driver. */
		printf("0 passed, 0 failed, 1 skipped\n");
		return 77;
	}
	fast = strcmp(config, "emm") == 0;
	shimmed = strcmp(config, "emm") == 0 || strcmp(config, "noshims") == 0;
	return emm_test_run(test_setup, test_first_call_delegates, test_malloc_free, test_errors_delegate,
	                    test_async, test_async_capture_delegates, test_pinned, test_pass_through,
	                    test_entry_points, test_report_pointers, NULL);
}
