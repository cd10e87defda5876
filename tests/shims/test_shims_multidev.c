/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_multidev.c - one process, two devices: libemm's
 * bookkeeping per device over the test-double driver (FAKECUDA_DEVICES=2,
 * LD_PRELOAD=libemm.so). The GPU counterpart is tests/race/multidevice.cu.
 *
 * Without arguments, the main suite:
 *   - each device's primary context gets its own heap; allocations count on
 *     their device only (emm_stats_get per device) and the segments behind
 *     them are the fake's memory of that device;
 *   - a free made while the other device's context is current goes back to
 *     the owner's heap: counted there, never passed to the driver, the block
 *     reused there and not on the freeing device;
 *   - cuPointerGetAttribute(s) and cuMemGetAddressRange name the owner's
 *     device and context and the block, whichever context is current;
 *   - cuMemGetInfo per device: idle memory libemm holds on device 0 counts
 *     as free on device 0 only; emm_release_idle(0) leaves device 1 alone;
 *   - a context destroyed on device 1 leaves device 0's blocks alone;
 *   - peer copies of pool blocks (cuMemcpyPeer, cuMemcpyPeerAsync) carry
 *     the data, and the peer-access calls answer as without libemm;
 *   - the VMM calls with location id 1: counted and cached on device 1,
 *     never served to a device-0 request, released per device;
 *   - one thread per device churning with cross-device frees: counters exact;
 *   - EMM_STATS=1 prints a row for each device.
 * Modes (argv[1]), each in a fresh process:
 *   peer-codes  the answers of the peer-access and peer-copy calls, one
 *               "name code" line each (compared with EMM_DISABLE=1)
 *   stats-exit  allocate on both devices and exit (stderr to stdout)
 *   threshold   EMM_RELEASE_THRESHOLD=0, EMM_EPOCH_BLOCKS=1: what a VMM
 *               release or a cross-device free makes idle goes back to the
 *               owner device at once
 */
#include <pthread.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_run.h"
#include "shims_common.h"
#include "vmm_calls.h"

#define MIB ((size_t)1 << 20)
#define NDEV 2

static CUcontext g_ctx[NDEV];

static void use(int d)
{
	if (cuCtxSetCurrent(g_ctx[d]) != CUDA_SUCCESS) {
		fprintf(stderr, "cuCtxSetCurrent(device %d) failed\n", d);
		exit(1);
	}
}

static struct emm_stats st(int d)
{
	struct emm_stats s;

	shims_stats(d, &s);
	return s;
}

/* cuInit and the primary context of every device (device 0 current). */
static void setup_devices(void)
{
	int n = 0;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGetCount(&n) != CUDA_SUCCESS || n < NDEV) {
		fprintf(stderr, "needs FAKECUDA_DEVICES=%d (found %d devices)\n", NDEV, n);
		exit(1);
	}
	for (int d = 0; d < NDEV; d++) {
		CUdevice dev;
		if (cuDeviceGet(&dev, d) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&g_ctx[d], dev) != CUDA_SUCCESS) {
			fprintf(stderr, "primary context of device %d failed\n", d);
			exit(1);
		}
	}
	use(0);
}

static int ordinal_of(CUdeviceptr p)
{
	int ord = -99;

	if (cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != CUDA_SUCCESS)
		return -98;
	return ord;
}

/* What cuMemGetInfo must say on device d: the driver's free memory plus
 * what libemm holds idle there (heaps and VMM cache), at most the total. */
static size_t expected_free(int d, size_t total)
{
	struct emm_stats s = st(d);
	size_t used = fakecuda_mem_used(d);
	size_t idle = (size_t)(s.reserved_bytes - s.allocated_bytes + s.vmm_idle_bytes);
	size_t drv = used < total ? total - used : 0;

	return idle >= total - drv ? total : drv + idle;
}

/* --- heaps, frees, queries ----------------------------------------------- */

TEST_BEGIN(test_heaps_per_device)
{
	struct emm_stats a[NDEV], b[NDEV];
	CUdeviceptr p[NDEV][8];

	for (int d = 0; d < NDEV; d++)
		a[d] = st(d);
	for (int d = 0; d < NDEV; d++) {
		use(d);
		for (int i = 0; i < 8; i++) {
			assert_int_eq(cuMemAlloc(&p[d][i], (size_t)(i + 1) * 4096 + (size_t)d * 512), CUDA_SUCCESS);
			expect_int_eq(ordinal_of(p[d][i]), d);
		}
	}
	for (int d = 0; d < NDEV; d++) {
		b[d] = st(d);
		expect_u64_eq(b[d].allocs - a[d].allocs, 8);
		expect_u64_eq(b[d].live_blocks - a[d].live_blocks, 8);
		expect_u64_eq(b[d].passthrough_allocs, a[d].passthrough_allocs);
		/* Every segment behind device d's heap is device d's memory
		 * (nothing else in this process allocates device memory). */
		expect_u64_eq(b[d].reserved_bytes, fakecuda_mem_used(d));
		expect_true(b[d].reserved_bytes > 0);
	}
	for (int d = 0; d < NDEV; d++) {
		use(d);
		for (int i = 0; i < 8; i++)
			expect_int_eq(cuMemFree(p[d][i]), CUDA_SUCCESS);
	}
	for (int d = 0; d < NDEV; d++) {
		struct emm_stats c = st(d);
		expect_u64_eq(c.frees - a[d].frees, 8);
		expect_u64_eq(c.live_blocks, a[d].live_blocks);
	}
	use(0);
}
TEST_END

TEST_BEGIN(test_cross_device_free_goes_to_owner)
{
	const size_t size = 6 * MIB + 100; /* large pool: the first block of a new segment */
	struct emm_stats a0, a1, b0, b1, all0, all1;
	struct fakecuda_stats f0, f1;
	CUdeviceptr p, q, r;
	CUstream s1;

	use(0);
	assert_int_eq(cuMemAlloc(&p, size), CUDA_SUCCESS);
	assert_int_eq(cuMemsetD8(p, 0x5a, size), CUDA_SUCCESS);
	a0 = st(0);
	a1 = st(1);
	shims_stats(-1, &all0);
	f0 = fake_stats();
	use(1);
	assert_int_eq(cuMemFree(p), CUDA_SUCCESS);
	f1 = fake_stats();
	b0 = st(0);
	b1 = st(1);
	shims_stats(-1, &all1);
	expect_u64_eq(b0.frees - a0.frees, 1);
	expect_u64_eq(b0.live_blocks, a0.live_blocks - 1);
	expect_u64_eq(b1.frees, a1.frees);
	expect_u64_eq(b1.live_blocks, a1.live_blocks);
	expect_u64_eq(all1.passthrough_frees, all0.passthrough_frees);
	expect_u64_eq(all1.bad_frees, all0.bad_frees);
	expect_u64_eq(f1.device_frees, f0.device_frees); /* the driver saw no free */
	expect_u64_eq(f1.device_syncs, f0.device_syncs);
	/* A second free of it, from either device, is the driver's double free. */
	expect_int_eq(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);

	/* Device 1's heap never hands out device 0's block... */
	assert_int_eq(cuMemAlloc(&q, size), CUDA_SUCCESS);
	expect_true(q != p);
	expect_int_eq(ordinal_of(q), 1);
	expect_int_eq(cuMemFree(q), CUDA_SUCCESS);
	/* ...and device 0's heap does, from its cache, once its epoch of
	 * frees is closed (emm_release_idle closes it; so would 31 more
	 * frees, as for a free made on device 0 itself). */
	use(0);
	(void)shims_release_idle(0, SIZE_MAX);
	a0 = st(0);
	assert_int_eq(cuMemAlloc(&r, size), CUDA_SUCCESS);
	b0 = st(0);
	expect_ptr_eq(r, p);
	expect_u64_eq(b0.hits - a0.hits, 1);
	expect_u64_eq(b0.backend_allocs, a0.backend_allocs);

	/* Stream-ordered, on a stream of device 1: still device 0's. */
	use(1);
	assert_int_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	a0 = st(0);
	a1 = st(1);
	f0 = fake_stats();
	expect_int_eq(cuMemFreeAsync(r, s1), CUDA_SUCCESS);
	f1 = fake_stats();
	b0 = st(0);
	b1 = st(1);
	expect_u64_eq(b0.frees - a0.frees, 1);
	expect_u64_eq(b1.frees, a1.frees);
	expect_u64_eq(f1.device_frees, f0.device_frees);
	expect_int_eq(cuStreamSynchronize(s1), CUDA_SUCCESS);
	expect_int_eq(cuStreamDestroy(s1), CUDA_SUCCESS);
	use(0);
	assert_int_eq(cuCtxSynchronize(), CUDA_SUCCESS);
	(void)shims_release_idle(-1, SIZE_MAX); /* closes the epochs, keeps everything */
	a0 = st(0);
	assert_int_eq(cuMemAlloc(&r, size), CUDA_SUCCESS);
	b0 = st(0);
	expect_int_eq(ordinal_of(r), 0);
	expect_u64_eq(b0.hits - a0.hits, 1);
	expect_int_eq(cuMemFree(r), CUDA_SUCCESS);
	/* Nothing of device 0 stays tied to the destroyed stream of device 1:
	 * all its idle memory can go back. */
	(void)shims_release_idle(0, 0);
	b0 = st(0);
	expect_u64_eq(b0.reserved_bytes, b0.allocated_bytes);
	expect_u64_eq(fakecuda_mem_used(0), b0.reserved_bytes);
}
TEST_END

TEST_BEGIN(test_pointer_queries_name_owner)
{
	CUdeviceptr a, b, c, base = 0;
	CUcontext c2, got = NULL;
	size_t size = 0;

	use(1);
	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 5000), CUDA_SUCCESS); /* not at its segment's start */
	for (int cur = 0; cur < NDEV; cur++) {
		CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		                               CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
		                               CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE};
		CUcontext actx = NULL;
		int aord = -1;
		CUdeviceptr astart = 0;
		size_t asize = 0;
		unsigned int atype = 0;
		void *data[] = {&actx, &aord, &astart, &asize, &atype};

		use(cur);
		expect_int_eq(ordinal_of(b + 100), 1);
		got = NULL;
		expect_int_eq(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_CONTEXT, b + 100), CUDA_SUCCESS);
		expect_ptr_eq(got, g_ctx[1]);
		base = 0;
		expect_int_eq(cuPointerGetAttribute(&base, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, b + 100),
		              CUDA_SUCCESS);
		expect_u64_eq(base, b);
		size = 0;
		expect_int_eq(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, b + 100), CUDA_SUCCESS);
		expect_u64_eq(size, 5000);
		expect_int_eq(cuPointerGetAttributes(5, attrs, data, b + 100), CUDA_SUCCESS);
		expect_ptr_eq(actx, g_ctx[1]);
		expect_int_eq(aord, 1);
		expect_u64_eq(astart, b);
		expect_u64_eq(asize, 5000);
		expect_int_eq(atype, CU_MEMORYTYPE_DEVICE);
		base = 0;
		size = 0;
		expect_int_eq(cuMemGetAddressRange(&base, &size, b + 100), CUDA_SUCCESS);
		expect_u64_eq(base, b);
		expect_u64_eq(size, 5000);
	}
	/* A created context on device 1: its own heap, named as its own. */
	use(0);
	assert_int_eq(cuCtxCreate(&c2, NULL, 0, 1), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&c, 700), CUDA_SUCCESS);
	assert_int_eq(cuCtxPopCurrent(NULL), CUDA_SUCCESS);
	use(0);
	got = NULL;
	expect_int_eq(cuPointerGetAttribute(&got, CU_POINTER_ATTRIBUTE_CONTEXT, c), CUDA_SUCCESS);
	expect_ptr_eq(got, c2);
	expect_int_eq(ordinal_of(c), 1);
	expect_int_eq(cuMemGetAddressRange(&base, &size, c + 1), CUDA_SUCCESS);
	expect_u64_eq(base, c);
	expect_u64_eq(size, 700);
	expect_int_eq(cuMemFree(c), CUDA_SUCCESS); /* from device 0: goes to c2's heap */
	expect_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	use(1);
	expect_int_eq(cuMemFree(a), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(b), CUDA_SUCCESS);
	use(0);
}
TEST_END

/* --- memory information, release, teardown ------------------------------ */

TEST_BEGIN(test_meminfo_per_device)
{
	CUdeviceptr live1, big0;
	size_t f[NDEV], t[NDEV], f1_again = 0, t1_again = 0, used1;
	struct emm_stats s1, s0;
	long long released;

	use(1);
	assert_int_eq(cuMemAlloc(&live1, 8 * MIB), CUDA_SUCCESS);
	use(0);
	assert_int_eq(cuMemAlloc(&big0, 64 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(big0), CUDA_SUCCESS);
	(void)shims_release_idle(-1, SIZE_MAX); /* closes the epochs, keeps everything */
	for (int d = 0; d < NDEV; d++) {
		use(d);
		assert_int_eq(cuMemGetInfo(&f[d], &t[d]), CUDA_SUCCESS);
		expect_u64_eq(f[d], expected_free(d, t[d]));
	}
	/* Device 0 holds 64 MiB idle: all its memory is free to the program;
	 * device 1 has a live block, and none of device 0's idle memory. */
	expect_u64_eq(f[0], t[0]);
	expect_true(f[1] < t[1]);
	expect_true(f[1] + 8 * MIB <= t[1]);

	/* More idle memory on device 0 changes nothing on device 1. */
	use(0);
	assert_int_eq(cuMemAlloc(&big0, 128 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(big0), CUDA_SUCCESS);
	(void)shims_release_idle(-1, SIZE_MAX);
	use(1);
	assert_int_eq(cuMemGetInfo(&f1_again, &t1_again), CUDA_SUCCESS);
	expect_u64_eq(f1_again, f[1]);
	expect_u64_eq(t1_again, t[1]);

	/* emm_release_idle(0) gives device 0's memory back, not device 1's. */
	s1 = st(1);
	used1 = fakecuda_mem_used(1);
	released = shims_release_idle(0, 0);
	expect_true(released >= (long long)(192 * MIB));
	s0 = st(0);
	expect_u64_eq(s0.reserved_bytes, s0.allocated_bytes);
	expect_u64_eq(fakecuda_mem_used(0), s0.reserved_bytes);
	expect_u64_eq(st(1).reserved_bytes, s1.reserved_bytes);
	expect_u64_eq(fakecuda_mem_used(1), used1);
	expect_int_eq(cuMemFree(live1), CUDA_SUCCESS); /* device 0 current */
	use(1);
	assert_int_eq(cuMemGetInfo(&f1_again, &t1_again), CUDA_SUCCESS);
	expect_u64_eq(f1_again, expected_free(1, t1_again));
	expect_u64_eq(f1_again, t1_again);
	use(0);
}
TEST_END

TEST_BEGIN(test_context_destroy_leaves_other_device)
{
	CUdeviceptr keep0, keep1, in_c2[4];
	struct emm_stats a0, b0, a1, b1;
	size_t used0, used1;
	CUcontext c2;
	unsigned char buf[4096];

	use(0);
	assert_int_eq(cuMemAlloc(&keep0, 4096), CUDA_SUCCESS);
	memset((void *)(uintptr_t)keep0, 0xa0, 4096);
	use(1);
	assert_int_eq(cuMemAlloc(&keep1, 4096), CUDA_SUCCESS);
	memset((void *)(uintptr_t)keep1, 0xa1, 4096);
	a0 = st(0);
	a1 = st(1);
	used0 = fakecuda_mem_used(0);
	used1 = fakecuda_mem_used(1);

	assert_int_eq(cuCtxCreate(&c2, NULL, 0, 1), CUDA_SUCCESS);
	for (int i = 0; i < 4; i++)
		assert_int_eq(cuMemAlloc(&in_c2[i], (size_t)(i + 1) * MIB), CUDA_SUCCESS);
	expect_u64_eq(st(1).allocs - a1.allocs, 4);
	expect_true(fakecuda_mem_used(1) > used1);
	assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);

	/* Device 1's own memory and device 0's are as they were. */
	expect_u64_eq(fakecuda_mem_used(1), used1);
	expect_u64_eq(fakecuda_mem_used(0), used0);
	b0 = st(0);
	b1 = st(1);
	expect_u64_eq(b0.live_blocks, a0.live_blocks);
	expect_u64_eq(b0.reserved_bytes, a0.reserved_bytes);
	expect_u64_eq(b1.reserved_bytes, a1.reserved_bytes);
	expect_u64_eq(b1.live_blocks, a1.live_blocks);
	/* A block of the dead context is the driver's to refuse. */
	use(0);
	expect_int_eq(cuMemFree(in_c2[0]), CUDA_ERROR_INVALID_VALUE);
	memset(buf, 0xa0, sizeof(buf));
	expect_int_eq(memcmp((void *)(uintptr_t)keep0, buf, sizeof(buf)), 0);
	memset(buf, 0xa1, sizeof(buf));
	expect_int_eq(memcmp((void *)(uintptr_t)keep1, buf, sizeof(buf)), 0);
	a0 = st(0);
	expect_int_eq(cuMemFree(keep1), CUDA_SUCCESS); /* cross-device, after the teardown */
	expect_int_eq(cuMemFree(keep0), CUDA_SUCCESS);
	expect_u64_eq(st(0).frees - a0.frees, 1);
	expect_u64_eq(st(1).frees - b1.frees, 1);
}
TEST_END

/* A device-0 block freed on a stream of device 1, then that stream's
 * context goes (a created context destroyed, then device 1's primary
 * context reset): the block is device 0's to reuse and give back, not tied
 * to a dead stream. */
TEST_BEGIN(test_context_destroy_frees_foreign_stream_blocks)
{
	for (int reset = 0; reset < 2; reset++) {
		CUdeviceptr big0;
		CUcontext c2 = NULL;
		CUstream s2;
		struct emm_stats a0, b0;
		size_t used0;

		use(0);
		(void)shims_release_idle(0, 0);
		used0 = fakecuda_mem_used(0);
		assert_int_eq(cuMemAlloc(&big0, 6 * MIB), CUDA_SUCCESS);
		if (reset)
			use(1);
		else
			assert_int_eq(cuCtxCreate(&c2, NULL, 0, 1), CUDA_SUCCESS);
		assert_int_eq(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
		a0 = st(0);
		expect_int_eq(cuMemFreeAsync(big0, s2), CUDA_SUCCESS);
		expect_u64_eq(st(0).frees - a0.frees, 1);
		if (reset) {
			assert_int_eq(cuDevicePrimaryCtxReset(1), CUDA_SUCCESS);
			assert_int_eq(cuDevicePrimaryCtxRetain(&g_ctx[1], 1), CUDA_SUCCESS);
		} else {
			assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
		}
		use(0);
		(void)shims_release_idle(0, 0);
		b0 = st(0);
		expect_u64_eq(b0.reserved_bytes, b0.allocated_bytes);
		expect_u64_eq(fakecuda_mem_used(0), used0);
	}
}
TEST_END

/* --- peer access and peer copies ----------------------------------------- */

#define P(name, expr) printf("%-28s %d\n", name, (int)(expr))

static int mode_peer_codes(void)
{
	CUdeviceptr a = 0, b = 0;
	CUcontext c2;
	CUstream s = NULL;
	int can = -1;

	setup_devices();
	P("can_0_1", cuDeviceCanAccessPeer(&can, 0, 1));
	P("can_0_1_value", can);
	P("can_0_0", cuDeviceCanAccessPeer(&can, 0, 0));
	P("can_0_0_value", can);
	P("can_0_99", cuDeviceCanAccessPeer(&can, 0, 99));
	P("can_99_0", cuDeviceCanAccessPeer(&can, 99, 0));
	P("enable_flags", cuCtxEnablePeerAccess(g_ctx[1], 1));
	P("enable_self", cuCtxEnablePeerAccess(g_ctx[0], 0));
	P("enable_null", cuCtxEnablePeerAccess(NULL, 0));
	P("disable_not_enabled", cuCtxDisablePeerAccess(g_ctx[1]));
	P("enable", cuCtxEnablePeerAccess(g_ctx[1], 0));
	P("enable_again", cuCtxEnablePeerAccess(g_ctx[1], 0));
	use(1);
	P("enable_reverse", cuCtxEnablePeerAccess(g_ctx[0], 0));
	P("alloc_1", cuMemAlloc(&b, 4096));
	use(0);
	P("alloc_0", cuMemAlloc(&a, 4096));
	P("copy_peer", cuMemcpyPeer(b, g_ctx[1], a, g_ctx[0], 4096));
	P("copy_peer_interior", cuMemcpyPeer(b + 256, g_ctx[1], a + 512, g_ctx[0], 1024));
	P("copy_peer_zero", cuMemcpyPeer(b, g_ctx[1], a, g_ctx[0], 0));
	P("copy_peer_bad_ctx", cuMemcpyPeer(b, NULL, a, g_ctx[0], 4096));
	P("copy_peer_async", cuMemcpyPeerAsync(a, g_ctx[0], b, g_ctx[1], 4096, NULL));
	P("stream_create", cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	P("copy_peer_async_stream", cuMemcpyPeerAsync(a, g_ctx[0], b, g_ctx[1], 4096, s));
	P("stream_sync", cuStreamSynchronize(s));
	P("stream_destroy", cuStreamDestroy(s));
	P("disable", cuCtxDisablePeerAccess(g_ctx[1]));
	P("disable_again", cuCtxDisablePeerAccess(g_ctx[1]));
	/* A created context on device 1: access ends with it. */
	P("ctx_create", cuCtxCreate(&c2, NULL, 0, 1));
	P("pop", cuCtxPopCurrent(NULL));
	P("enable_created", cuCtxEnablePeerAccess(c2, 0));
	P("destroy_created", cuCtxDestroy(c2));
	P("disable_destroyed", cuCtxDisablePeerAccess(c2));
	P("copy_peer_destroyed", cuMemcpyPeer(b, c2, a, g_ctx[0], 16));
	P("free_0", cuMemFree(a));
	P("free_1_from_0", cuMemFree(b));
	fflush(stdout);
	return 0;
}

#undef P

TEST_BEGIN(test_peer_codes_match_driver)
{
	static char with[8192], without[8192];
	const char *const env_on[] = {"EMM_DISABLE", NULL, NULL};
	const char *const env_off[] = {"EMM_DISABLE", "1", NULL};

	assert_int_eq(run_self("peer-codes", env_on, with, sizeof(with)), 0);
	assert_int_eq(run_self("peer-codes", env_off, without, sizeof(without)), 0);
	if (strcmp(with, without) != 0) {
		fprintf(stderr, "--- with libemm:\n%s--- EMM_DISABLE=1:\n%s", with, without);
		expect_true(false);
	}
	/* The documented codes (cuda.h; tests/fakecuda/README.md). */
#define HAS(line) expect_true(strstr(with, line "\n") != NULL)
	HAS("can_0_1_value                1");
	HAS("can_0_0_value                0");
	HAS("can_0_99                     101");
	HAS("can_99_0                     101");
	HAS("enable_flags                 1");
	HAS("enable_self                  217"); /* measured on 2 H200 */
	HAS("enable_null                  201");
	HAS("disable_not_enabled          705");
	HAS("enable                       0");
	HAS("enable_again                 704");
	HAS("enable_reverse               0");
	HAS("copy_peer                    0");
	HAS("copy_peer_interior           0");
	HAS("copy_peer_bad_ctx            0"); /* by address: measured on 2 H200 */
	HAS("copy_peer_async_stream       0");
	HAS("disable                      0");
	HAS("disable_again                705");
	HAS("enable_created               0");
	HAS("disable_destroyed            201");
	HAS("copy_peer_destroyed          0"); /* by address, as the NULL context */
	HAS("free_1_from_0                0");
#undef HAS
}
TEST_END

TEST_BEGIN(test_peer_copies_of_pool_blocks)
{
	const size_t n = 10000;
	CUdeviceptr a0, pad, b1, c0;
	unsigned char *host = malloc(n), *back = malloc(n);
	struct emm_stats a, b;
	struct fakecuda_stats f0, f1;
	CUstream s1;

	assert_ptr_not_null(host);
	assert_ptr_not_null(back);
	for (size_t i = 0; i < n; i++)
		host[i] = (unsigned char)(i * 7 + 3);
	use(0);
	assert_int_eq(cuMemAlloc(&a0, n), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&c0, n), CUDA_SUCCESS);
	assert_int_eq(cuMemcpyHtoD(a0, host, n), CUDA_SUCCESS);
	use(1);
	assert_int_eq(cuMemAlloc(&pad, 3000), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b1, n), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	expect_int_eq(cuCtxEnablePeerAccess(g_ctx[0], 0), CUDA_SUCCESS);
	use(0);
	expect_int_eq(cuCtxEnablePeerAccess(g_ctx[1], 0), CUDA_SUCCESS);

	shims_stats(-1, &a);
	f0 = fake_stats();
	/* device 0 -> device 1, synchronous; device 1 -> device 0 on a
	 * stream of device 1. */
	expect_int_eq(cuMemcpyPeer(b1, g_ctx[1], a0, g_ctx[0], n), CUDA_SUCCESS);
	use(1);
	expect_int_eq(cuMemcpyPeerAsync(c0, g_ctx[0], b1, g_ctx[1], n, s1), CUDA_SUCCESS);
	expect_int_eq(cuStreamSynchronize(s1), CUDA_SUCCESS);
	memset(back, 0, n);
	expect_int_eq(cuMemcpyDtoH(back, b1, n), CUDA_SUCCESS);
	expect_int_eq(memcmp(back, host, n), 0);
	use(0);
	memset(back, 0, n);
	expect_int_eq(cuMemcpyDtoH(back, c0, n), CUDA_SUCCESS);
	expect_int_eq(memcmp(back, host, n), 0);
	f1 = fake_stats();
	shims_stats(-1, &b);
	/* Copies allocate and free nothing. */
	expect_u64_eq(b.allocs, a.allocs);
	expect_u64_eq(b.frees, a.frees);
	expect_u64_eq(b.passthrough_allocs, a.passthrough_allocs);
	expect_u64_eq(f1.device_allocs, f0.device_allocs);

	expect_int_eq(cuCtxDisablePeerAccess(g_ctx[1]), CUDA_SUCCESS);
	use(1);
	expect_int_eq(cuCtxDisablePeerAccess(g_ctx[0]), CUDA_SUCCESS);
	expect_int_eq(cuStreamDestroy(s1), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(a0), CUDA_SUCCESS); /* device 1 current */
	expect_int_eq(cuMemFree(c0), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(pad), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(b1), CUDA_SUCCESS);
	use(0);
	free(host);
	free(back);
}
TEST_END

/* --- the VMM calls on device 1 -------------------------------------------- */

/* XLA's allocation of `size` bytes on device `dev`, readable and writable
 * from both devices (the owner first). */
static CUresult vmm_alloc(struct vmm_buf *b, int dev, size_t size)
{
	CUmemAllocationProp p = vmm_call_prop(dev, CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d[NDEV];

	for (int i = 0; i < NDEV; i++)
		d[i] = vmm_call_access((dev + i) % NDEV);
	return vmm_call_alloc(b, size, &p, d, NDEV);
}

/* XLA on two GPUs: one cuMemSetAccess call per device (the owner first,
 * then the peer). The accesses accumulate: the buffer is cached, the
 * owner's call of a reuse is served from the cache, the peer's goes to
 * the driver (the mapping has it already). Failed before: the second call
 * kept every buffer out of the cache (py-jax-vmm on two H200: 1 of 7617). */
TEST_BEGIN(test_vmm_access_per_device_calls)
{
	const size_t size = 2 * MIB;
	CUmemAllocationProp p = vmm_call_prop(0, CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d0 = vmm_call_access(0), d1 = vmm_call_access(1);
	struct vmm_buf b;
	CUdeviceptr first = 0;

	use(0);
	(void)shims_release_idle(-1, 0);
	for (int round = 0; round < 3; round++) {
		if (round == 1)
			fakecuda_reset_counters();
		assert_int_eq(vmm_call_alloc(&b, size, &p, &d0, 1), CUDA_SUCCESS);
		assert_int_eq(cuMemSetAccess(b.va, size, &d1, 1), CUDA_SUCCESS);
		if (round == 0)
			first = b.va;
		else
			expect_u64_eq(b.va, first);
		memset((void *)(uintptr_t)b.va, round + 1, size);
		assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	}
	/* Rounds 1 and 2 from the cache: no create or map; only the peer's
	 * access call reached the driver. */
	expect_u64_eq(fakecuda_calls("cuMemCreate"), 0);
	expect_u64_eq(fakecuda_calls("cuMemMap"), 0);
	expect_u64_eq(fakecuda_calls("cuMemSetAccess"), 2);
	(void)shims_release_idle(-1, 0);
}
TEST_END

static int handle_device(CUmemGenericAllocationHandle h)
{
	CUmemAllocationProp p;

	memset(&p, 0, sizeof(p));
	if (cuMemGetAllocationPropertiesFromHandle(&p, h) != CUDA_SUCCESS)
		return -98;
	return p.location.id;
}

TEST_BEGIN(test_vmm_per_device)
{
	const size_t size = 4 * MIB;
	struct emm_stats a0, a1, b0, b1;
	struct vmm_buf v, w;
	size_t used0, used1, f = 0, t = 0;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp p1 = vmm_call_prop(1, CU_MEM_HANDLE_TYPE_NONE);
	CUdeviceptr dp;

	for (int cur = 0; cur < NDEV; cur++) {
		/* cur: the context current during the VMM calls (0: the
		 * other device's, as NCCL or JAX may have it). */
		use(cur);
		(void)shims_release_idle(-1, 0);
		a0 = st(0);
		a1 = st(1);
		used0 = fakecuda_mem_used(0);
		used1 = fakecuda_mem_used(1);
		assert_int_eq(vmm_alloc(&v, 1, size), CUDA_SUCCESS);
		expect_int_eq(handle_device(v.h), 1);
		expect_u64_eq(fakecuda_mem_used(1), used1 + size);
		memset((void *)(uintptr_t)v.va, 0x11, size);
		assert_int_eq(vmm_call_free(&v), CUDA_SUCCESS);
		/* Idle on device 1: counted there, free memory there only. */
		expect_u64_eq(st(1).vmm_idle_bytes, size);
		expect_u64_eq(st(0).vmm_idle_bytes, 0);
		for (int d = 0; d < NDEV; d++) {
			use(d);
			assert_int_eq(cuMemGetInfo(&f, &t), CUDA_SUCCESS);
			expect_u64_eq(f, expected_free(d, t));
		}
		use(cur);
		/* The same shape again: from the cache, on device 1. */
		fakecuda_reset_counters();
		assert_int_eq(vmm_alloc(&w, 1, size), CUDA_SUCCESS);
		expect_u64_eq(fakecuda_calls("cuMemCreate"), 0);
		expect_u64_eq(w.va, v.va);
		expect_int_eq(handle_device(w.h), 1);
		assert_int_eq(vmm_call_free(&w), CUDA_SUCCESS);
		b0 = st(0);
		b1 = st(1);
		expect_u64_eq(b1.vmm_allocs - a1.vmm_allocs, 2);
		expect_u64_eq(b1.vmm_hits - a1.vmm_hits, 1);
		expect_u64_eq(b1.vmm_misses - a1.vmm_misses, 1);
		expect_u64_eq(b1.vmm_frees - a1.vmm_frees, 2);
		expect_u64_eq(b0.vmm_allocs, a0.vmm_allocs);
		expect_u64_eq(b0.vmm_frees, a0.vmm_frees);

		/* Device 0 asks for the same size: never device 1's buffer. */
		assert_int_eq(vmm_alloc(&w, 0, size), CUDA_SUCCESS);
		expect_int_eq(handle_device(w.h), 0);
		expect_u64_eq(fakecuda_mem_used(0), used0 + size);
		assert_int_eq(vmm_call_free(&w), CUDA_SUCCESS);

		/* emm_release_idle(0) leaves device 1's idle buffer alone. */
		(void)shims_release_idle(0, 0);
		expect_u64_eq(st(0).vmm_idle_bytes, 0);
		expect_u64_eq(fakecuda_mem_used(0), used0);
		if (st(1).vmm_idle_bytes) { /* the reaper may have given it back (1 s) */
			expect_u64_eq(fakecuda_mem_used(1), used1 + size);
			(void)shims_release_idle(1, 0);
		}
		expect_u64_eq(st(1).vmm_idle_bytes, 0);
		expect_u64_eq(fakecuda_mem_used(1), used1);

		/* A handle of device 1 released unmapped (the driver's release):
		 * a free on device 1, whichever context is current (and
		 * whichever heap this thread used last: an allocation on the
		 * current one first). */
		assert_int_eq(cuMemAlloc(&dp, 4096), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(dp), CUDA_SUCCESS);
		a0 = st(0);
		a1 = st(1);
		assert_int_eq(cuMemCreate(&h, 2 * MIB, &p1, 0), CUDA_SUCCESS);
		assert_int_eq(cuMemRelease(h), CUDA_SUCCESS);
		b0 = st(0);
		b1 = st(1);
		expect_u64_eq(b1.vmm_allocs - a1.vmm_allocs, 1);
		expect_u64_eq(b1.vmm_frees - a1.vmm_frees, 1);
		expect_u64_eq(b0.vmm_allocs, a0.vmm_allocs);
		expect_u64_eq(b0.vmm_frees, a0.vmm_frees);
	}
	use(0);
}
TEST_END

/* --- threads ----------------------------------------------------------------- */

#define CHURN_ITERS 3000
#define CHURN_LIVE 8

struct inbox {
	pthread_mutex_t lock;
	CUdeviceptr p[CHURN_ITERS];
	size_t n;
};

static struct inbox g_inbox[NDEV] = {{PTHREAD_MUTEX_INITIALIZER, {0}, 0},
                                     {PTHREAD_MUTEX_INITIALIZER, {0}, 0}};
static int g_churn_errors;

static uint32_t tag(int d, CUdeviceptr p)
{
	return 0x5a000000u | ((uint32_t)d << 20) | (uint32_t)(p & 0xfffff);
}

/* Check the tag of p (made on device d), then free it. */
static void check_free(int d, CUdeviceptr p)
{
	if (*(volatile uint32_t *)(uintptr_t)p != tag(d, p) || cuMemFree(p) != CUDA_SUCCESS)
		__atomic_add_fetch(&g_churn_errors, 1, __ATOMIC_RELAXED);
}

static size_t drain(int d)
{
	struct inbox *in = &g_inbox[d];
	CUdeviceptr mine[64];
	size_t n, total = 0;

	do {
		pthread_mutex_lock(&in->lock);
		n = in->n < 64 ? in->n : 64;
		in->n -= n;
		memcpy(mine, in->p + in->n, n * sizeof(*mine));
		pthread_mutex_unlock(&in->lock);
		for (size_t i = 0; i < n; i++)
			check_free(1 - d, mine[i]); /* made on the other device */
		total += n;
	} while (n == 64);
	return total;
}

static void *churn(void *arg)
{
	int d = (int)(intptr_t)arg;
	CUdeviceptr live[CHURN_LIVE] = {0};
	unsigned seed = 12345u + (unsigned)d;

	if (cuCtxSetCurrent(g_ctx[d]) != CUDA_SUCCESS) {
		__atomic_add_fetch(&g_churn_errors, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	for (int i = 0; i < CHURN_ITERS; i++) {
		int slot = i % CHURN_LIVE;
		size_t size = (size_t)256 << (rand_r(&seed) % 14); /* 256 B .. 2 MiB */
		CUdeviceptr p;

		if (live[slot]) {
			if (i % 3 == 0) { /* the other device's thread frees it */
				struct inbox *out = &g_inbox[1 - d];
				pthread_mutex_lock(&out->lock);
				out->p[out->n++] = live[slot];
				pthread_mutex_unlock(&out->lock);
			} else {
				check_free(d, live[slot]);
			}
			live[slot] = 0;
		}
		(void)drain(d);
		if (cuMemAlloc(&p, size) != CUDA_SUCCESS || ordinal_of(p) != d) {
			__atomic_add_fetch(&g_churn_errors, 1, __ATOMIC_RELAXED);
			continue;
		}
		*(volatile uint32_t *)(uintptr_t)p = tag(d, p);
		live[slot] = p;
	}
	for (int i = 0; i < CHURN_LIVE; i++)
		if (live[i])
			check_free(d, live[i]);
	return NULL;
}

TEST_BEGIN(test_threads_per_device_with_cross_frees)
{
	struct emm_stats a[NDEV], b[NDEV], all0, all1;
	pthread_t th[NDEV];

	for (int d = 0; d < NDEV; d++)
		a[d] = st(d);
	shims_stats(-1, &all0);
	for (int d = 0; d < NDEV; d++)
		assert_int_eq(pthread_create(&th[d], NULL, churn, (void *)(intptr_t)d), 0);
	for (int d = 0; d < NDEV; d++)
		pthread_join(th[d], NULL);
	/* What is left in the inboxes: freed here, device 0 current. */
	use(0);
	for (int d = 0; d < NDEV; d++)
		(void)drain(d);
	expect_int_eq(g_churn_errors, 0);
	shims_stats(-1, &all1);
	for (int d = 0; d < NDEV; d++) {
		b[d] = st(d);
		expect_u64_eq(b[d].allocs - a[d].allocs, CHURN_ITERS);
		expect_u64_eq(b[d].frees - a[d].frees, CHURN_ITERS);
		expect_u64_eq(b[d].live_blocks, a[d].live_blocks);
		expect_u64_eq(b[d].allocated_bytes, a[d].allocated_bytes);
		expect_u64_eq(b[d].reserved_bytes, fakecuda_mem_used(d));
	}
	expect_u64_eq(all1.passthrough_allocs, all0.passthrough_allocs);
	expect_u64_eq(all1.passthrough_frees, all0.passthrough_frees);
	expect_u64_eq(all1.bad_frees, all0.bad_frees);
}
TEST_END

/* --- EMM_STATS at exit ------------------------------------------------------- */

static int mode_stats_exit(void)
{
	CUdeviceptr p;

	dup2(1, 2); /* libemm's exit table goes to the parent's pipe */
	setup_devices();
	for (int d = 0; d < NDEV; d++) {
		use(d);
		for (int i = 0; i < 3 + 4 * d; i++) { /* 3 on device 0, 7 on device 1 */
			if (cuMemAlloc(&p, 4096) != CUDA_SUCCESS || cuMemFree(p) != CUDA_SUCCESS)
				return 1;
		}
	}
	return 0;
}

/* The row of `label` in the table: its allocation count, or -1. */
static long long stats_row_allocs(const char *out, const char *label)
{
	char want[32];
	const char *line = out;

	snprintf(want, sizeof(want), "emm: %s ", label);
	while ((line = strstr(line, want)) != NULL) {
		if (line == out || line[-1] == '\n')
			return strtoll(line + strlen(want), NULL, 10);
		line++;
	}
	return -1;
}

TEST_BEGIN(test_stats_exit_lists_both_devices)
{
	static char out[16384];
	const char *const env[] = {"EMM_STATS", "1", NULL};

	assert_int_eq(run_self("stats-exit", env, out, sizeof(out)), 0);
	fprintf(stderr, "%s", out);
	expect_int_eq(stats_row_allocs(out, "0"), 3);
	expect_int_eq(stats_row_allocs(out, "1"), 7);
	expect_int_eq(stats_row_allocs(out, "all"), 10);
}
TEST_END

/* --- EMM_RELEASE_THRESHOLD=0 --------------------------------------------------- */

static int mode_threshold(void)
{
	CUdeviceptr p;
	struct vmm_buf v;
	size_t used0, used1;
	int bad = 0;

	setup_devices();
	/* A device-1 VMM buffer freed while device 0's context is current
	 * (device 0 holds nothing idle): nothing may stay idle on device 1. */
	used0 = fakecuda_mem_used(0);
	used1 = fakecuda_mem_used(1);
	if (vmm_alloc(&v, 1, 4 * MIB) != CUDA_SUCCESS)
		return 1;
	bad |= vmm_call_free(&v) != CUDA_SUCCESS;
	fprintf(stderr, "threshold: after the VMM free device 1 holds %llu idle VMM bytes, uses %zu (was %zu)\n",
	        (unsigned long long)st(1).vmm_idle_bytes, fakecuda_mem_used(1), used1);
	bad |= st(1).vmm_idle_bytes != 0;
	bad |= fakecuda_mem_used(1) != used1;
	/* And the same with device 1's context current. */
	use(1);
	if (vmm_alloc(&v, 1, 4 * MIB) != CUDA_SUCCESS)
		return 1;
	bad |= vmm_call_free(&v) != CUDA_SUCCESS;
	bad |= st(1).vmm_idle_bytes != 0;
	bad |= fakecuda_mem_used(1) != used1;

	/* A cross-device free of device 0's block (EMM_EPOCH_BLOCKS=1: the
	 * free closes its epoch, so the block is idle at once): device 0's
	 * heap gives the segment back, device 1 is untouched. */
	use(0);
	if (cuMemAlloc(&p, 8 * MIB) != CUDA_SUCCESS)
		return 1;
	bad |= fakecuda_mem_used(0) <= used0;
	use(1);
	bad |= cuMemFree(p) != CUDA_SUCCESS;
	fprintf(stderr, "threshold: after the cross-device free device 0 uses %zu (was %zu), device 1 %zu (was %zu)\n",
	        fakecuda_mem_used(0), used0, fakecuda_mem_used(1), used1);
	bad |= fakecuda_mem_used(0) != used0;
	bad |= fakecuda_mem_used(1) != used1;
	return bad;
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		if (!strcmp(argv[1], "peer-codes"))
			return mode_peer_codes();
		if (!strcmp(argv[1], "stats-exit"))
			return mode_stats_exit();
		if (!strcmp(argv[1], "threshold"))
			return mode_threshold();
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	setup_devices();
	return emm_test_run(test_heaps_per_device, test_cross_device_free_goes_to_owner,
	                    test_pointer_queries_name_owner, test_meminfo_per_device,
	                    test_context_destroy_leaves_other_device,
	                    test_context_destroy_frees_foreign_stream_blocks, test_peer_codes_match_driver,
	                    test_peer_copies_of_pool_blocks, test_vmm_per_device, test_vmm_access_per_device_calls,
	                    test_threads_per_device_with_cross_frees, test_stats_exit_lists_both_devices, NULL);
}
