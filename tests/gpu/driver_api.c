/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/driver_api.c - a driver-API program linked with -lcuda: its
 * references to cuMemAlloc_v2, cuMemFree_v2, ... bind directly to libemm's
 * exports (LD_PRELOAD comes first in the search order). Each allocation
 * call must be served by the pool, hold its data, and answer pointer queries
 * for the block it handed out; every bad call must return exactly the code
 * the real driver returns. For that, the program runs its error-code
 * sequence once under libemm and once in a child (itself, re-executed) with
 * EMM_DISABLE=1, and compares the two lists.
 *
 *   gpu-driver-api            the tests
 *   gpu-driver-api --codes    print the error-code list (the child's mode)
 */
#include <cuda.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gpu_common.h"

extern char **environ;

#define CU(call)                                                                                             \
	do {                                                                                                 \
		CUresult r_ = (call);                                                                        \
		if (r_ != CUDA_SUCCESS) {                                                                    \
			emm_test_fail_("%s -> %s (%d)", #call, cu_name(r_), (int)r_);                        \
			return;                                                                              \
		}                                                                                            \
	} while (0)

#define CUB(call)                                                                                            \
	do {                                                                                                 \
		CUresult r_ = (call);                                                                        \
		if (r_ != CUDA_SUCCESS) {                                                                    \
			emm_test_fail_("%s -> %s (%d)", #call, cu_name(r_), (int)r_);                        \
			return 0;                                                                            \
		}                                                                                            \
	} while (0)

static CUdevice dev;
static CUcontext primary;

static const char *cu_name(CUresult r)
{
	const char *name = NULL;

	if (cuGetErrorName(r, &name) != CUDA_SUCCESS || !name)
		return "?";
	return name;
}

/* Memset the block on `stream` and check it, then write the pattern from
 * the host and check that: the memory is real and the block is whole. */
static int dcheck(const char *what, CUdeviceptr p, size_t n, unsigned seed, CUstream stream)
{
	unsigned char *h = malloc(n);
	unsigned char v = (unsigned char)(0x5a ^ seed);
	int ok = 1;

	if (!h) {
		emm_test_fail_("out of host memory");
		return 0;
	}
	if (cuMemsetD8Async(p, v, n, stream) != CUDA_SUCCESS ||
	    cuMemcpyDtoHAsync(h, p, n, stream) != CUDA_SUCCESS ||
	    cuStreamSynchronize(stream) != CUDA_SUCCESS) {
		emm_test_fail_("%s: memset/copy of %zu bytes failed", what, n);
		free(h);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		if (h[i] != v) {
			emm_test_fail_("%s: after cuMemsetD8 byte %zu of %zu is 0x%02x, expected 0x%02x",
			               what, i, n, h[i], v);
			ok = 0;
			break;
		}
	}
	gpu_fill_pattern(h, n, seed);
	if (ok && cuMemcpyHtoDAsync(p, h, n, stream) != CUDA_SUCCESS) {
		emm_test_fail_("%s: copy to the device failed", what);
		ok = 0;
	}
	memset(h, 0, n);
	if (ok && (cuMemcpyDtoHAsync(h, p, n, stream) != CUDA_SUCCESS ||
	           cuStreamSynchronize(stream) != CUDA_SUCCESS)) {
		emm_test_fail_("%s: copy back failed", what);
		ok = 0;
	}
	if (ok)
		ok = gpu_check_pattern(what, h, n, seed);
	free(h);
	return ok;
}

TEST_BEGIN(test_alloc_free)
{
	static const size_t sizes[] = {1, 256, 4096, 1u << 20, (3u << 20) + 5, 64u << 20};
	enum { N = sizeof(sizes) / sizeof(sizes[0]) };
	CUdeviceptr p[N];
	struct gpu_snap s0, s1, s2;

	assert_emm_present();
	gpu_snap_take(&s0);
	for (size_t i = 0; i < N; i++)
		CU(cuMemAlloc(&p[i], sizes[i]));
	gpu_snap_take(&s1);
	expect_served("cuMemAlloc_v2 (linked -lcuda)", GPU_SCOPE_DEVICE, &s0, &s1, N);
	expect_live_delta(GPU_SCOPE_DEVICE, &s0, &s1, N);
	for (size_t i = 0; i < N; i++)
		expect_true(dcheck("cuMemAlloc block", p[i], sizes[i], (unsigned)i, 0));
	for (size_t i = 0; i < N; i++)
		CU(cuMemFree(p[i]));
	gpu_snap_take(&s2);
	expect_freed("cuMemFree_v2 (linked -lcuda)", GPU_SCOPE_DEVICE, &s1, &s2, N);
	expect_live_delta(GPU_SCOPE_DEVICE, &s0, &s2, 0);
}
TEST_END

TEST_BEGIN(test_alloc_pitch)
{
	const size_t width = 1000, height = 37;
	CUdeviceptr p = 0;
	size_t pitch = 0;
	struct gpu_snap s0, s1, s2;
	unsigned char *h = calloc(width * height, 1);
	CUDA_MEMCPY2D cp;

	assert_emm_present();
	assert_ptr_not_null(h);
	gpu_snap_take(&s0);
	CU(cuMemAllocPitch(&p, &pitch, width, height, 4));
	gpu_snap_take(&s1);
	expect_served("cuMemAllocPitch_v2 (linked -lcuda)", GPU_SCOPE_DEVICE, &s0, &s1, 1);
	expect_true(pitch >= width);
	printf("  cuMemAllocPitch(%zu x %zu, 4): pitch %zu\n", width, height, pitch);

	CU(cuMemsetD2D8(p, pitch, 0x77, width, height));
	memset(&cp, 0, sizeof(cp));
	cp.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	cp.srcDevice = p;
	cp.srcPitch = pitch;
	cp.dstMemoryType = CU_MEMORYTYPE_HOST;
	cp.dstHost = h;
	cp.dstPitch = width;
	cp.WidthInBytes = width;
	cp.Height = height;
	CU(cuMemcpy2D(&cp));
	for (size_t i = 0; i < width * height; i++) {
		if (h[i] != 0x77) {
			emm_test_fail_("pitched block: byte %zu is 0x%02x after cuMemsetD2D8", i, h[i]);
			break;
		}
	}
	free(h);
	CU(cuMemFree(p));
	gpu_snap_take(&s2);
	expect_freed("cuMemFree_v2 of a pitched block", GPU_SCOPE_DEVICE, &s1, &s2, 1);
}
TEST_END

TEST_BEGIN(test_alloc_async)
{
	static const size_t sizes[] = {512, 200000, 5u << 20};
	CUstream blocking = NULL, nonblocking = NULL;
	struct gpu_snap s0, s1;
	uint64_t made = 0;

	assert_emm_present();
	CU(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
	CU(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
	CUstream streams[] = {blocking, nonblocking, NULL, CU_STREAM_PER_THREAD};
	const char *names[] = {"created blocking stream", "created non-blocking stream", "stream 0 (legacy)",
	                       "CU_STREAM_PER_THREAD"};

	gpu_snap_take(&s0);
	for (unsigned round = 0; round < 3; round++) {
		for (size_t k = 0; k < 4; k++) {
			for (size_t i = 0; i < 3; i++) {
				CUdeviceptr p = 0;
				CU(cuMemAllocAsync(&p, sizes[i], streams[k]));
				made++;
				if (!dcheck(names[k], p, sizes[i], round * 16 + (unsigned)(k * 4 + i),
				            streams[k]))
					fprintf(stderr, "  (cuMemAllocAsync of %zu bytes on %s, round %u)\n",
					        sizes[i], names[k], round);
				CU(cuMemFreeAsync(p, streams[k]));
			}
		}
	}
	CU(cuCtxSynchronize());
	gpu_snap_take(&s1);
	expect_served("cuMemAllocAsync (linked -lcuda)", GPU_SCOPE_DEVICE, &s0, &s1, made);
	expect_freed("cuMemFreeAsync (linked -lcuda)", GPU_SCOPE_DEVICE, &s0, &s1, made);
	CU(cuStreamDestroy(blocking));
	CU(cuStreamDestroy(nonblocking));
}
TEST_END

TEST_BEGIN(test_host_alloc)
{
	const size_t n1 = 1u << 20, n2 = 64u << 10, n3 = 12345;
	unsigned char *h1 = NULL, *h2 = NULL, *h3 = NULL;
	CUdeviceptr d = 0, mapped = 0;
	struct gpu_snap s0, s1, s2;

	assert_emm_present();
	gpu_snap_take(&s0);
	CU(cuMemHostAlloc((void **)&h1, n1, 0));
	CU(cuMemHostAlloc((void **)&h2, n2, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
	CU(cuMemAllocHost((void **)&h3, n3));
	gpu_snap_take(&s1);
	expect_served("cuMemHostAlloc + cuMemAllocHost_v2 (linked -lcuda)", GPU_SCOPE_PINNED, &s0, &s1, 3);

	CU(cuMemAlloc(&d, n1));
	gpu_fill_pattern(h1, n1, 3);
	CU(cuMemcpyHtoD(d, h1, n1));
	memset(h1, 0, n1);
	CU(cuMemcpyDtoH(h1, d, n1));
	expect_true(gpu_check_pattern("cuMemHostAlloc round trip", h1, n1, 3));
	CU(cuMemcpyDtoH(h3, d, n3));
	expect_true(gpu_check_pattern("cuMemAllocHost destination", h3, n3, 3));
	CU(cuMemFree(d));

	/* Mapped pinned memory: the device writes the host buffer directly. */
	CU(cuMemHostGetDevicePointer(&mapped, h2, 0));
	memset(h2, 0, n2);
	CU(cuMemsetD8(mapped, 0x3c, n2));
	CU(cuCtxSynchronize());
	for (size_t i = 0; i < n2; i++) {
		if (h2[i] != 0x3c) {
			emm_test_fail_("mapped pinned block: byte %zu is 0x%02x after a device memset", i,
			               h2[i]);
			break;
		}
	}

	gpu_snap_take(&s1);
	CU(cuMemFreeHost(h1));
	CU(cuMemFreeHost(h2));
	CU(cuMemFreeHost(h3));
	gpu_snap_take(&s2);
	expect_freed("cuMemFreeHost (linked -lcuda)", GPU_SCOPE_PINNED, &s1, &s2, 3);
}
TEST_END

/* The range of an interior pointer is the block the program was given: its
 * base, a size at least what was asked, and not the segment behind it. */
static void check_range(const char *what, CUdeviceptr p, size_t req, CUdeviceptr other)
{
	CUdeviceptr base = 0, attr_base = 0;
	size_t size = 0, attr_size = 0, size_only = 0;
	CUresult r;

	r = cuMemGetAddressRange(&base, &size, p + req / 2);
	if (r != CUDA_SUCCESS) {
		emm_test_fail_("%s: cuMemGetAddressRange(interior) -> %s", what, cu_name(r));
		return;
	}
	printf("  %s: asked %zu, range [0x%llx, +%zu) for block 0x%llx\n", what, req,
	       (unsigned long long)base, size, (unsigned long long)p);
	if (base != p)
		emm_test_fail_("%s: cuMemGetAddressRange base 0x%llx, the block is at 0x%llx", what,
		               (unsigned long long)base, (unsigned long long)p);
	if (size < req || size > req * 2 + 65536)
		emm_test_fail_("%s: cuMemGetAddressRange size %zu for a block of %zu bytes (the segment's?)",
		               what, size, req);
	if (other > p && base + size > other)
		emm_test_fail_("%s: range [0x%llx, +%zu) covers the next block at 0x%llx", what,
		               (unsigned long long)base, size, (unsigned long long)other);
	expect_int_eq(cuMemGetAddressRange(NULL, &size_only, p + req - 1), CUDA_SUCCESS);
	expect_u64_eq(size_only, size);
	expect_int_eq(cuPointerGetAttribute(&attr_base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + req / 2),
	              CUDA_SUCCESS);
	expect_int_eq(cuPointerGetAttribute(&attr_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + req / 2),
	              CUDA_SUCCESS);
	expect_u64_eq(attr_base, p);
	expect_u64_eq(attr_size, size);
}

TEST_BEGIN(test_address_range)
{
	CUdeviceptr a = 0, b = 0, c = 0;

	assert_emm_present();
	CU(cuMemAlloc(&a, 1000));
	CU(cuMemAlloc(&b, 1000));
	CU(cuMemAlloc(&c, (5u << 20) + 3));
	gpu_made += 3;
	check_range("small block a", a, 1000, b);
	check_range("small block b", b, 1000, a);
	check_range("large block c", c, (5u << 20) + 3, 0);
	CU(cuMemFree(a));
	CU(cuMemFree(b));
	CU(cuMemFree(c));
}
TEST_END

/* A context of the program's own (cuCtxCreate): pooled like the primary
 * one; destroying it with a block still live leaves the rest working. */
TEST_BEGIN(test_ctx_create)
{
	CUcontext ctx = NULL;
	CUdeviceptr p[3] = {0}, q = 0;
	struct gpu_snap s0, s1;

	assert_emm_present();
	CU(cuCtxCreate(&ctx, NULL, 0, dev));
	gpu_snap_take(&s0);
	for (int i = 0; i < 3; i++)
		CU(cuMemAlloc(&p[i], (size_t)(i + 1) << 20));
	gpu_snap_take(&s1);
	expect_served("cuMemAlloc_v2 in a cuCtxCreate context", GPU_SCOPE_PROCESS, &s0, &s1, 3);
	for (int i = 0; i < 3; i++)
		expect_true(
		    dcheck("block of a created context", p[i], (size_t)(i + 1) << 20, 40 + (unsigned)i, 0));
	CU(cuMemFree(p[0]));
	CU(cuMemFree(p[1]));
	CU(cuCtxDestroy(ctx)); /* p[2] still live: its pool goes with the context */
	CU(cuCtxSetCurrent(primary));
	/* The real driver answers 1 (INVALID_VALUE) for a pointer of a
	 * destroyed context (.notes/driver-facts.md). */
	expect_int_eq(cuMemFree(p[2]), CUDA_ERROR_INVALID_VALUE);
	CU(cuMemAlloc(&q, 3u << 20));
	gpu_made++;
	expect_true(dcheck("primary context after destroying another", q, 3u << 20, 44, 0));
	CU(cuMemFree(q));
}
TEST_END

TEST_BEGIN(test_mem_get_info)
{
	size_t fr = 0, total = 0;

	CU(cuMemGetInfo(&fr, &total));
	printf("  cuMemGetInfo: free %zu MiB of %zu MiB\n", fr >> 20, total >> 20);
	expect_true(total > 0);
	expect_true(fr <= total);
}
TEST_END

/* ---- error codes, under libemm and with EMM_DISABLE=1 ---- */

#define MAX_CODES 96

struct code {
	const char *name;
	int code;
};

static void add_code(struct code *c, int *n, const char *name, CUresult r)
{
	if (*n < MAX_CODES) {
		c[*n].name = name;
		c[*n].code = (int)r;
		(*n)++;
	}
}

/* Calls made before cuInit, in main() (both modes); copied into the list. */
static struct code preinit[4];
static int npreinit;

static void collect_preinit_codes(void)
{
	CUdeviceptr q = 0;
	size_t fr = 0, total = 0;

	add_code(preinit, &npreinit, "before cuInit: cuMemAlloc(1024)", cuMemAlloc(&q, 1024));
	add_code(preinit, &npreinit, "before cuInit: cuMemFree(0)", cuMemFree(0));
	add_code(preinit, &npreinit, "before cuInit: cuMemGetInfo", cuMemGetInfo(&fr, &total));
}

/*
 * The same sequence of bad (and a few good) calls in both runs; entries
 * named "value: ..." record a number the driver reports (a pitch, a range
 * size, a resolver status) rather than a CUresult. Returns the number of
 * entries, or -1 if the sequence could not be set up.
 */
static int collect_codes(struct code *c)
{
	int n = 0;
	CUdeviceptr p = 0, q = 0, r = 0;
	size_t pitch = 0, size = 0, fr = 0, total = 0;
	CUdeviceptr base = 0;
	void *h = NULL, *fn = NULL;
	unsigned char *hostbuf = malloc(4096);
	CUstream s = NULL;
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
	const CUdeviceptr bogus = (CUdeviceptr)0x10000;

	if (!hostbuf || cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
		return -1;
	for (int i = 0; i < npreinit; i++)
		add_code(c, &n, preinit[i].name, (CUresult)preinit[i].code);

	/* No current context. */
	if (cuCtxSetCurrent(NULL) != CUDA_SUCCESS)
		return -1;
	add_code(c, &n, "no context: cuMemAlloc(1024)", cuMemAlloc(&q, 1024));
	add_code(c, &n, "no context: cuMemFree(0)", cuMemFree(0));
	add_code(c, &n, "no context: cuMemGetInfo", cuMemGetInfo(&fr, &total));
	if (cuCtxSetCurrent(primary) != CUDA_SUCCESS)
		return -1;

	q = 0;
	add_code(c, &n, "cuMemAlloc(size 0)", cuMemAlloc(&q, 0));
	if (c[n - 1].code == CUDA_SUCCESS && q)
		(void)cuMemFree(q);
	add_code(c, &n, "cuMemAlloc(NULL out)", cuMemAlloc(NULL, 256));
	add_code(c, &n, "cuMemAlloc(1 PiB)", cuMemAlloc(&q, (size_t)1 << 50));
	add_code(c, &n, "cuMemAllocPitch(width 0)", cuMemAllocPitch(&q, &pitch, 0, 10, 4));
	add_code(c, &n, "cuMemAllocPitch(element size 3)", cuMemAllocPitch(&q, &pitch, 100, 10, 3));
	add_code(c, &n, "cuMemAllocPitch(NULL pitch)", cuMemAllocPitch(&q, NULL, 100, 10, 4));
	q = 0;
	add_code(c, &n, "cuMemAllocPitch(100 x 10, 4)", cuMemAllocPitch(&q, &pitch, 100, 10, 4));
	add_code(c, &n, "value: its pitch", (CUresult)pitch);
	if (q)
		(void)cuMemFree(q);
	add_code(c, &n, "cuMemFree(0)", cuMemFree(0));

	add_code(c, &n, "cuMemAlloc(4096)", cuMemAlloc(&p, 4096));
	add_code(c, &n, "cuMemFree(interior)", cuMemFree(p + 256));
	add_code(c, &n, "cuMemGetAddressRange(interior)", cuMemGetAddressRange(&base, &size, p + 256));
	add_code(c, &n, "cuMemFree(block)", cuMemFree(p));
	add_code(c, &n, "cuMemFree(double)", cuMemFree(p));
	add_code(c, &n, "cuMemGetAddressRange(freed)", cuMemGetAddressRange(&base, &size, p));
	add_code(c, &n, "cuMemFree(host address)", cuMemFree((CUdeviceptr)(uintptr_t)hostbuf));
	add_code(c, &n, "cuMemFree(unknown)", cuMemFree(bogus));
	add_code(c, &n, "cuMemGetAddressRange(unknown)", cuMemGetAddressRange(&base, &size, bogus));

	/* The range of a 1000-byte block is what was asked for (the driver
	 * reports 1000, not a rounded size) and ends there. */
	add_code(c, &n, "cuMemAlloc(1000)", cuMemAlloc(&r, 1000));
	size = 0;
	add_code(c, &n, "cuMemGetAddressRange(d + 100)", cuMemGetAddressRange(&base, &size, r + 100));
	add_code(c, &n, "value: its size", (CUresult)size);
	add_code(c, &n, "value: its base is the block", (CUresult)(base == r));
	add_code(c, &n, "cuMemGetAddressRange(d + 1024)", cuMemGetAddressRange(&base, &size, r + 1024));
	add_code(c, &n, "cuMemGetAddressRange(d + 100000)", cuMemGetAddressRange(&base, &size, r + 100000));
	add_code(c, &n, "cuMemFree(1000-byte block)", cuMemFree(r));

	q = 0;
	add_code(c, &n, "cuMemAllocAsync(size 0)", cuMemAllocAsync(&q, 0, s));
	if (c[n - 1].code == CUDA_SUCCESS && q)
		(void)cuMemFreeAsync(q, s);
	add_code(c, &n, "cuMemAllocAsync(NULL out)", cuMemAllocAsync(NULL, 256, s));
	add_code(c, &n, "cuMemFreeAsync(0)", cuMemFreeAsync(0, s));
	add_code(c, &n, "cuMemFreeAsync(unknown)", cuMemFreeAsync(bogus, s));
	q = 0;
	add_code(c, &n, "cuMemAllocAsync(4096)", cuMemAllocAsync(&q, 4096, s));
	add_code(c, &n, "cuMemFreeAsync(block)", cuMemFreeAsync(q, s));
	add_code(c, &n, "cuMemFreeAsync(double)", cuMemFreeAsync(q, s));
	add_code(c, &n, "cuStreamSynchronize after bad async calls", cuStreamSynchronize(s));

	h = NULL;
	add_code(c, &n, "cuMemHostAlloc(size 0)", cuMemHostAlloc(&h, 0, 0));
	if (c[n - 1].code == CUDA_SUCCESS && h)
		(void)cuMemFreeHost(h);
	add_code(c, &n, "cuMemHostAlloc(NULL out)", cuMemHostAlloc(NULL, 64, 0));
	add_code(c, &n, "cuMemHostAlloc(bad flags)", cuMemHostAlloc(&h, 64, 0x80));
	h = NULL;
	add_code(c, &n, "cuMemAllocHost(size 0)", cuMemAllocHost(&h, 0));
	if (c[n - 1].code == CUDA_SUCCESS && h)
		(void)cuMemFreeHost(h);
	add_code(c, &n, "cuMemFreeHost(NULL)", cuMemFreeHost(NULL));
	add_code(c, &n, "cuMemFreeHost(malloc'd)", cuMemFreeHost(hostbuf));
	add_code(c, &n, "cuMemHostAlloc(4096)", cuMemHostAlloc(&h, 4096, 0));
	add_code(c, &n, "cuMemFreeHost(interior)", cuMemFreeHost((char *)h + 64));
	add_code(c, &n, "cuMemFreeHost(block)", cuMemFreeHost(h));
	add_code(c, &n, "cuMemFreeHost(double)", cuMemFreeHost(h));

	/* The resolver: this program's cuGetProcAddress_v2 binds to libemm's. */
	fn = NULL;
	add_code(c, &n, "cuGetProcAddress(unknown name)",
	         cuGetProcAddress("cuNoSuchThing", &fn, 12000, 0, &st));
	add_code(c, &n, "value: its status", (CUresult)st);
	add_code(c, &n, "value: its pfn is NULL", (CUresult)(fn == NULL));
	add_code(c, &n, "cuGetProcAddress(cuMemAlloc, version 99000)",
	         cuGetProcAddress("cuMemAlloc", &fn, 99000, 0, &st));
	add_code(c, &n, "value: its status", (CUresult)st);
	fn = (void *)&n;
	add_code(c, &n, "cuGetProcAddress(cuMemAllocAsync, version 11000)",
	         cuGetProcAddress("cuMemAllocAsync", &fn, 11000, 0, &st));
	add_code(c, &n, "value: its status", (CUresult)st);
	add_code(c, &n, "value: its pfn is NULL", (CUresult)(fn == NULL));
	add_code(c, &n, "cuGetProcAddress(cuMemAlloc, 12000, NULL status)",
	         cuGetProcAddress("cuMemAlloc", &fn, 12000, 0, NULL));

	(void)cuStreamDestroy(s);
	free(hostbuf);
	return n;
}

/* --codes: the child's mode. */
static int print_codes(void)
{
	struct code c[MAX_CODES];
	struct emm_stats st;
	int n;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS ||
	    cuCtxSetCurrent(primary) != CUDA_SUCCESS)
		return 2;
	n = collect_codes(c);
	if (n < 0)
		return 3;
	for (int i = 0; i < n; i++)
		printf("code %d %s\n", c[i].code, c[i].name);
	(void)gpu_stats(GPU_SCOPE_PROCESS, &st);
	printf("pooled %llu\n", (unsigned long long)st.allocs);
	return 0;
}

/* Run ourselves with EMM_DISABLE=1 and --codes; read its list. */
static int run_disabled_child(struct code *c, int *n, unsigned long long *pooled, char *names,
                              size_t names_size)
{
	size_t nenv = 0, used = 0;
	int fds[2], status = 0;
	pid_t pid;
	FILE *f;
	char line[512];

	while (environ[nenv])
		nenv++;
	char **envp = calloc(nenv + 2, sizeof(char *));
	if (!envp || pipe(fds) != 0)
		return -1;
	size_t k = 0;
	for (size_t i = 0; i < nenv; i++)
		if (strncmp(environ[i], "EMM_DISABLE=", 12) != 0)
			envp[k++] = environ[i];
	envp[k++] = (char *)"EMM_DISABLE=1";
	envp[k] = NULL;

	fflush(NULL);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		char *argv[] = {(char *)"gpu-driver-api", (char *)"--codes", NULL};
		dup2(fds[1], 1);
		close(fds[0]);
		close(fds[1]);
		execve("/proc/self/exe", argv, envp);
		_exit(127);
	}
	close(fds[1]);
	free(envp);
	f = fdopen(fds[0], "r");
	if (!f)
		return -1;
	*n = 0;
	while (fgets(line, sizeof(line), f)) {
		int code, off = 0;
		unsigned long long v;
		if (sscanf(line, "code %d %n", &code, &off) == 1 && off > 0 && *n < MAX_CODES) {
			size_t len = strcspn(line + off, "\n");
			if (used + len + 1 > names_size)
				break;
			memcpy(names + used, line + off, len);
			names[used + len] = '\0';
			c[*n].name = names + used;
			c[*n].code = code;
			used += len + 1;
			(*n)++;
		} else if (sscanf(line, "pooled %llu", &v) == 1) {
			*pooled = v;
		}
	}
	fclose(f);
	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST_BEGIN(test_error_codes)
{
	struct code mine[MAX_CODES], raw[MAX_CODES];
	static char names[MAX_CODES * 64];
	int n_mine, n_raw = 0, rc;
	unsigned long long pooled = ~0ull;
	CUdeviceptr p = 0;

	assert_emm_present();
	n_mine = collect_codes(mine);
	assert_true(n_mine > 0);
	rc = run_disabled_child(raw, &n_raw, &pooled, names, sizeof(names));
	if (rc != 0) {
		emm_test_fail_("the EMM_DISABLE=1 run of this program failed (status %d)", rc);
		return;
	}
	expect_int_eq(n_raw, n_mine);
	printf("  %-52s %10s %10s\n", "call", "libemm", "driver");
	for (int i = 0; i < n_mine && i < n_raw; i++) {
		int same = strcmp(mine[i].name, raw[i].name) == 0 && mine[i].code == raw[i].code;
		printf("  %-52s %10d %10d%s\n", mine[i].name, mine[i].code, raw[i].code,
		       same ? "" : "   <-- differs");
		if (!same && strncmp(mine[i].name, "value:", 6) == 0)
			emm_test_fail_("%s: %d under libemm, %d from the driver (EMM_DISABLE=1)",
			               mine[i].name, mine[i].code, raw[i].code);
		else if (!same)
			emm_test_fail_(
			    "%s returned %d (%s) under libemm, %d (%s) from the driver (EMM_DISABLE=1)",
			    mine[i].name, mine[i].code, cu_name((CUresult)mine[i].code), raw[i].code,
			    cu_name((CUresult)raw[i].code));
	}
	if (pooled != 0)
		emm_test_fail_("with EMM_DISABLE=1 the pool still served %llu allocations", pooled);

	/* The context is still healthy after all that. */
	CU(cuMemAlloc(&p, 1u << 20));
	gpu_made++;
	expect_true(dcheck("allocation after the error sequence", p, 1u << 20, 99, 0));
	CU(cuMemFree(p));
}
TEST_END

int main(int argc, char **argv)
{
	int rc;

	collect_preinit_codes(); /* before cuInit, in both modes */
	if (argc > 1 && strcmp(argv[1], "--codes") == 0)
		return print_codes();

	rc = gpu_primary_current(&dev, &primary);
	if (rc != 0)
		return rc;
	printf("driver-api: libemm %s; cuMemAlloc_v2 resolves in %s\n",
	       gpu_emm_present() ? "loaded" : "NOT loaded", gpu_where(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")));

	emm_test_fn tests[] = {
	    test_alloc_free,   test_alloc_pitch,   test_alloc_async,
	    test_host_alloc,   test_address_range, test_ctx_create,
	    test_mem_get_info, test_error_codes,   NULL,
	};
	rc = emm_test_run_list(tests);
	if (cuCtxSynchronize() != CUDA_SUCCESS) {
		printf("FAIL: context error at the end\n");
		rc = 1;
	}
	gpu_print_served("driver-api");
	(void)cuDevicePrimaryCtxRelease(dev);
	return rc;
}
