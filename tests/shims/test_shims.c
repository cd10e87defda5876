/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims.c - libemm's driver-API shims over the test-double
 * driver (run with LD_PRELOAD=libemm.so, LD_LIBRARY_PATH=<fakecuda>).
 *
 * Without arguments: the main suite (pool serving, exact error codes against
 * EMM_DISABLE=1, data, ranges, attributes, pinned memory, streams, fences,
 * steady state, capture, OOM, meminfo, IPC, fork, threads, trace, context
 * teardown). With one argument, a mode another test (or a meson test with
 * its own environment) runs in a fresh process:
 *   codes        print "name code ..." for a fixed sequence of calls
 *   compare      only the codes test, under the settings it inherits (the
 *                meson test shims-codes-async: EMM_BACKEND=async)
 *   passthrough  libemm must pass everything through (EMM_DISABLE=1)
 *   badbackend   EMM_BACKEND names no backend: a clear error, then as above
 *   strict       EMM_FREE_MODE=strict: frees wait like the driver's
 *   stream       EMM_FREE_MODE=stream: pinned blocks still wait for fences
 *   trace        allocate and free a little (EMM_LOG set by the parent)
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_codes.h"
#include "shims_common.h"

static CUcontext g_ctx;

TEST_BEGIN(test_error_codes_match_driver)
{
	static char with[16384], without[16384];
	const char *const env_on[] = {"EMM_DISABLE", NULL, NULL};
	const char *const env_off[] = {"EMM_DISABLE", "1", NULL};

	assert_int_eq(run_self("codes", env_on, with, sizeof(with)), 0);
	assert_int_eq(run_self("codes", env_off, without, sizeof(without)), 0);
	/* Every line (name and code) equal: libemm answers as the driver. */
	if (strcmp(with, without) != 0) {
		fprintf(stderr, "--- with libemm:\n%s--- EMM_DISABLE=1:\n%s", with, without);
		expect_true(false);
	}
	/* And the driver's codes are the real driver's (.notes/driver-facts.md). */
	expect_true(strstr(with, "pre_alloc                    3\n") != NULL);
	expect_true(strstr(with, "noctx_alloc                  201\n") != NULL);
	expect_true(strstr(with, "alloc_size0                  1\n") != NULL);
	expect_true(strstr(with, "alloc_null                   1\n") != NULL);
	expect_true(strstr(with, "free_interior                1\n") != NULL);
	expect_true(strstr(with, "free_double                  1\n") != NULL);
	expect_true(strstr(with, "free_unknown                 1\n") != NULL);
	expect_true(strstr(with, "pitch_value                  512\n") != NULL);
	expect_true(strstr(with, "range_size                   1000\n") != NULL);
	expect_true(strstr(with, "range_past_end               500\n") != NULL);
	expect_true(strstr(with, "free_after_ctx_destroy       1\n") != NULL);
}
TEST_END

/* --- the main suite ---------------------------------------------------- */

TEST_BEGIN(test_alloc_free_served_by_pool)
{
	struct emm_stats before, after;
	struct fakecuda_stats f0, f1;
	CUdeviceptr d, first = 0;

	assert_int_eq(shims_stats(-1, &before), 0);
	f0 = fake_stats();
	for (int i = 0; i < 100; i++) {
		assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
		if (i == 0)
			first = d;
		expect_true(d != 0);
		assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	}
	f1 = fake_stats();
	assert_int_eq(shims_stats(-1, &after), 0);
	expect_int_eq(after.allocs - before.allocs, 100);
	expect_int_eq(after.frees - before.frees, 100);
	expect_true(after.hits - before.hits >= 98);
	expect_int_eq(after.passthrough_allocs, before.passthrough_allocs);
	/* One segment at most came from the driver, and no free reached it. */
	expect_true(f1.device_allocs - f0.device_allocs <= 1);
	expect_int_eq(f1.device_frees - f0.device_frees, 0);
	expect_int_eq(f1.device_syncs - f0.device_syncs, 0);
	/* Device 0's statistics are the same here; pinned saw none of it. */
	assert_int_eq(shims_stats(0, &after), 0);
	expect_true(after.allocs >= 100);
	(void)first;
}
TEST_END

TEST_BEGIN(test_stats_api_contract)
{
	int (*get)(int, struct emm_stats *) =
	    (int (*)(int, struct emm_stats *))dlsym(RTLD_DEFAULT, "emm_stats_get");
	const char *(*version)(void) = (const char *(*)(void))dlsym(RTLD_DEFAULT, "emm_version_string");
	unsigned char buf[sizeof(struct emm_stats) + 16];
	struct emm_stats *s = (struct emm_stats *)(void *)buf;

	assert_ptr_not_null(get);
	assert_ptr_not_null(version);
	expect_true(strchr(version(), '.') != NULL);
	expect_int_eq(get(-1, NULL), -EINVAL);
	memset(buf, 0xab, sizeof(buf));
	s->struct_size = 4;
	expect_int_eq(get(-1, s), -EINVAL);
	/* An old caller's smaller struct: nothing written past it. */
	memset(buf, 0xab, sizeof(buf));
	s->struct_size = 24;
	expect_int_eq(get(-1, s), 0);
	expect_int_eq(s->struct_size, 24);
	expect_int_eq(s->version, EMM_STATS_VERSION);
	expect_int_eq(buf[24], 0xab);
	expect_int_eq(buf[sizeof(struct emm_stats)], 0xab);
	s->struct_size = sizeof(struct emm_stats);
	expect_int_eq(get(-3, s), -EINVAL);
}
TEST_END

TEST_BEGIN(test_data_integrity)
{
	enum { N = 16 };
	CUdeviceptr d[N];
	static unsigned char in[N][3000], out[3000];

	for (int i = 0; i < N; i++) {
		size_t size = 1000 + (size_t)i * 125;
		memset(in[i], i + 1, size);
		assert_int_eq(cuMemAlloc(&d[i], size), CUDA_SUCCESS);
		assert_int_eq(cuMemcpyHtoD(d[i], in[i], size), CUDA_SUCCESS);
	}
	/* Free every other one, reallocate, write a new pattern. */
	for (int i = 0; i < N; i += 2)
		assert_int_eq(cuMemFree(d[i]), CUDA_SUCCESS);
	for (int i = 0; i < N; i += 2) {
		size_t size = 1000 + (size_t)i * 125;
		memset(in[i], 0x80 + i, size);
		assert_int_eq(cuMemAlloc(&d[i], size), CUDA_SUCCESS);
		assert_int_eq(cuMemcpyHtoD(d[i], in[i], size), CUDA_SUCCESS);
	}
	for (int i = 0; i < N; i++) {
		size_t size = 1000 + (size_t)i * 125;
		assert_int_eq(cuMemcpyDtoH(out, d[i], size), CUDA_SUCCESS);
		expect_int_eq(memcmp(out, in[i], size), 0);
	}
	for (int i = 0; i < N; i++)
		assert_int_eq(cuMemFree(d[i]), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_address_range_of_blocks)
{
	CUdeviceptr a, b, base;
	size_t size;

	assert_int_eq(cuMemAlloc(&a, 1000), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 5000), CUDA_SUCCESS);
	assert_int_eq(cuMemGetAddressRange(&base, &size, a + 999), CUDA_SUCCESS);
	expect_u64_eq(base, a);
	expect_int_eq(size, 1000);
	assert_int_eq(cuMemGetAddressRange(&base, &size, b + 4096), CUDA_SUCCESS);
	expect_u64_eq(base, b);
	expect_int_eq(size, 5000);
	/* Either output may be NULL. */
	expect_int_eq(cuMemGetAddressRange(NULL, &size, b), CUDA_SUCCESS);
	expect_int_eq(size, 5000);
	expect_int_eq(cuMemGetAddressRange(&base, NULL, a + 1), CUDA_SUCCESS);
	expect_u64_eq(base, a);
	/* A freed block (its segment lives on): not found, the outputs left
	 * as they were. */
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	base = 0xdead;
	size = 0xbeef;
	expect_int_eq(cuMemGetAddressRange(&base, &size, a), CUDA_ERROR_NOT_FOUND);
	expect_u64_eq(base, 0xdead);
	expect_u64_eq(size, 0xbeef);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_pointer_attributes)
{
	CUdeviceptr a, start = 0;
	size_t size = 0;
	CUmemorytype type = 0;
	CUpointer_attribute attrs[3] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
	                                CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
	void *data[3] = {&start, &type, &size};

	assert_int_eq(cuMemAlloc(&a, 3000), CUDA_SUCCESS);
	assert_int_eq(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a + 2000),
	              CUDA_SUCCESS);
	expect_u64_eq(start, a);
	assert_int_eq(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a + 2000), CUDA_SUCCESS);
	expect_int_eq(size, 3000);
	/* Anything else is the driver's answer. */
	assert_int_eq(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a), CUDA_SUCCESS);
	expect_int_eq(type, CU_MEMORYTYPE_DEVICE);
	start = 0;
	size = 0;
	type = 0;
	assert_int_eq(cuPointerGetAttributes(3, attrs, data, a + 10), CUDA_SUCCESS);
	expect_u64_eq(start, a);
	expect_int_eq(size, 3000);
	expect_int_eq(type, CU_MEMORYTYPE_DEVICE);
	/* A freed block (its segment lives on): as for a pointer that is not
	 * CUDA memory, success with the defaults and the range left alone
	 * (probe-driver.c: the real driver's answer); the single-attribute
	 * call refuses it. */
	CUdeviceptr keep;
	assert_int_eq(cuMemAlloc(&keep, 3000), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	start = 1;
	size = 1;
	type = 1;
	expect_int_eq(cuPointerGetAttributes(3, attrs, data, a), CUDA_SUCCESS);
	expect_u64_eq(start, 1);
	expect_int_eq(size, 1);
	expect_int_eq(type, 0);
	void *host = NULL;
	CUpointer_attribute hattr = CU_POINTER_ATTRIBUTE_HOST_POINTER;
	void *hdata[1] = {&host};
	expect_int_eq(cuPointerGetAttributes(1, &hattr, hdata, a + 8), CUDA_SUCCESS);
	expect_u64_eq((uintptr_t)host, a + 8);
	expect_int_eq(cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, a), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemFree(keep), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_pinned_cached)
{
	struct emm_stats before, after;
	struct fakecuda_stats f0, f1;
	void *h, *h2;
	CUdeviceptr d;

	assert_int_eq(shims_stats(-2, &before), 0);
	f0 = fake_stats();
	for (int i = 0; i < 50; i++) {
		assert_int_eq(cuMemHostAlloc(&h, 8192, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
		memset(h, i, 8192); /* host memory: the program writes it */
		assert_int_eq(cuMemFreeHost(h), CUDA_SUCCESS);
		assert_int_eq(cuMemAllocHost(&h2, 100), CUDA_SUCCESS);
		assert_int_eq(cuMemFreeHost(h2), CUDA_SUCCESS);
	}
	f1 = fake_stats();
	assert_int_eq(shims_stats(-2, &after), 0);
	expect_int_eq(after.allocs - before.allocs, 100);
	expect_true(after.hits - before.hits >= 96);
	expect_true(f1.host_allocs - f0.host_allocs <= 2);
	expect_int_eq(f1.host_frees - f0.host_frees, 0);

	/* A pinned block freed as device memory, and the reverse: the driver
	 * refuses both, and the blocks stay valid. */
	assert_int_eq(cuMemAllocHost(&h, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	expect_int_ne(cuMemFree((CUdeviceptr)(uintptr_t)h), CUDA_SUCCESS);
	expect_int_ne(cuMemFreeHost((void *)(uintptr_t)d), CUDA_SUCCESS);
	expect_int_eq(cuMemFreeHost(h), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(d), CUDA_SUCCESS);
	/* Flags outside the three known ones go to the driver. */
	expect_int_eq(cuMemHostAlloc(&h, 4096, 0x100), cuMemHostAlloc(&h2, 4096, 0x100));
}
TEST_END

TEST_BEGIN(test_register_managed_passthrough_counted)
{
	struct emm_stats b0, b1, p0, p1;
	static char buf[8192] __attribute__((aligned(4096)));
	CUdeviceptr m;

	assert_int_eq(shims_stats(-1, &b0), 0);
	assert_int_eq(shims_stats(-2, &p0), 0);
	assert_int_eq(cuMemHostRegister(buf, sizeof(buf), 0), CUDA_SUCCESS);
	assert_int_eq(cuMemHostUnregister(buf), CUDA_SUCCESS);
	assert_int_eq(cuMemAllocManaged(&m, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(m), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &b1), 0);
	assert_int_eq(shims_stats(-2, &p1), 0);
	expect_int_eq(b1.passthrough_allocs - b0.passthrough_allocs, 2); /* register + managed */
	expect_int_eq(b1.passthrough_frees - b0.passthrough_frees, 2);   /* unregister + free */
	expect_int_eq(p1.passthrough_allocs - p0.passthrough_allocs, 1);
	expect_int_eq(b1.allocs, b0.allocs);
}
TEST_END

TEST_BEGIN(test_pitch_pooled)
{
	struct emm_stats before, after;
	CUdeviceptr d;
	size_t pitch = 0;

	assert_int_eq(shims_stats(-1, &before), 0);
	assert_int_eq(cuMemAllocPitch(&d, &pitch, 100, 10, 4), CUDA_SUCCESS);
	expect_int_eq(pitch, 512);
	assert_int_eq(cuMemAllocPitch(&d, &pitch, 100, 10, 3), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(shims_stats(-1, &after), 0);
	expect_int_eq(after.allocs - before.allocs, 1);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_streams_async)
{
	CUstream s;
	CUdeviceptr a, b, c;
	struct emm_stats before, after;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &before), 0);
	assert_int_eq(cuMemAllocAsync(&a, 70000, s), CUDA_SUCCESS);
	assert_int_eq(cuMemFreeAsync(a, s), CUDA_SUCCESS);
	/* Freed on s: reusable at once on s. */
	assert_int_eq(cuMemAllocAsync(&b, 70000, s), CUDA_SUCCESS);
	expect_u64_eq(b, a);
	assert_int_eq(cuMemFreeAsync(b, s), CUDA_SUCCESS);
	/* Per-thread default stream (the _ptsz entry points). */
	assert_int_eq(cuMemAllocAsync_ptsz(&c, 4096, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemFreeAsync_ptsz(c, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemAllocAsync_ptsz(&b, 4096, 0), CUDA_SUCCESS);
	expect_u64_eq(b, c);
	assert_int_eq(cuMemFreeAsync_ptsz(b, 0), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &after), 0);
	expect_int_eq(after.allocs - before.allocs, 4);
	expect_int_eq(after.passthrough_allocs, before.passthrough_allocs);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	/* Priority streams too. */
	assert_int_eq(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemAllocAsync(&a, 4096, s), CUDA_SUCCESS);
	assert_int_eq(cuMemFreeAsync(a, s), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

/* Large requests get a segment each, so reuse is visible as the address. */
#define BIG ((size_t)32 << 20)

/* Free `big` and then enough small blocks to close the open epoch by
 * count (EMM_EPOCH_BLOCKS, 16 by default). */
static void free_and_close_epoch(CUdeviceptr big)
{
	/* More frees than EMM_EPOCH_BLOCKS (64): the epoch closes by count. */
	CUdeviceptr small[72];

	for (int i = 0; i < 72; i++)
		assert_int_eq(cuMemAlloc(&small[i], 1024), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(big), CUDA_SUCCESS);
	for (int i = 0; i < 72; i++)
		assert_int_eq(cuMemFree(small[i]), CUDA_SUCCESS);
}

/* Make s busy (cuStreamQuery: not ready) until busy_end: an event of the
 * test's own that completes only when synchronized. */
static void busy_begin(CUstream s, CUevent *work)
{
	assert_int_eq(cuEventCreate(work, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(cuEventRecord(*work, s), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
}

static void busy_end(CUevent work)
{
	assert_int_eq(cuEventSynchronize(work), CUDA_SUCCESS);
	assert_int_eq(cuEventDestroy(work), CUDA_SUCCESS);
}

TEST_BEGIN(test_fence_blocks_reuse_until_events_complete)
{
	CUstream s;
	CUevent work;
	CUdeviceptr a, b, c;
	struct emm_stats st0, st1;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	/* Work runs on s (an idle stream would get no marker). */
	assert_int_eq(cuEventCreate(&work, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(cuEventRecord(work, s), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st0), 0);
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	free_and_close_epoch(a);
	/* Work on the non-blocking stream may still use a: the epoch's events
	 * are incomplete, so a is not handed out again. */
	assert_int_eq(cuMemAlloc(&b, BIG), CUDA_SUCCESS);
	expect_true(b != a);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	/* Once the events complete, the memory comes back. */
	fakecuda_complete_all();
	assert_int_eq(cuMemAlloc(&c, BIG), CUDA_SUCCESS);
	expect_u64_eq(c, a);
	assert_int_eq(cuMemFree(c), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.host_waits, st0.host_waits);
	expect_true(st1.events_recorded >= st0.events_recorded + 2); /* legacy + s */
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuEventDestroy(work), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

/* A destroy the driver refuses leaves the stream alive, and libemm must keep
 * fencing it: its epoch markers still guard blocks its work may touch. */
TEST_BEGIN(test_failed_stream_destroy_keeps_stream)
{
	struct emm_stats st0, st1;
	CUstream s;
	CUevent work;
	CUdeviceptr a;
	uint64_t queries;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(fakecuda_fail_next_call("cuStreamDestroy_v2", CUDA_ERROR_INVALID_HANDLE, 1), 0);
	expect_int_eq(cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
	/* s lives on: every epoch closed now asks it (cuStreamQuery) and, s
	 * being busy, records a marker on it as well as on the legacy stream
	 * (the only non-blocking stream alive is s). */
	busy_begin(s, &work);
	assert_int_eq(shims_stats(-1, &st0), 0);
	queries = fakecuda_calls("cuStreamQuery");
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	free_and_close_epoch(a);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_true(st1.epochs_closed > st0.epochs_closed);
	expect_u64_eq(st1.events_recorded - st0.events_recorded, 2 * (st1.epochs_closed - st0.epochs_closed));
	expect_u64_eq(fakecuda_calls("cuStreamQuery") - queries, st1.epochs_closed - st0.epochs_closed);
	busy_end(work);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	/* Destroyed for real: forgotten, the legacy marker alone. */
	assert_int_eq(shims_stats(-1, &st0), 0);
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	free_and_close_epoch(a);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_u64_eq(st1.events_recorded - st0.events_recorded, st1.epochs_closed - st0.epochs_closed);
}
TEST_END

TEST_BEGIN(test_fence_without_nonblocking_streams_reuses_at_once)
{
	CUdeviceptr a, b;
	struct emm_stats st0, st1;

	/* With no non-blocking stream the legacy-stream marker orders every
	 * later use: reuse without waiting for it, even while incomplete. */
	fakecuda_set_event_delay(1000000);
	assert_int_eq(shims_stats(-1, &st0), 0);
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	free_and_close_epoch(a);
	assert_int_eq(cuMemAlloc(&b, BIG), CUDA_SUCCESS);
	expect_u64_eq(b, a);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.host_waits, st0.host_waits);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
}
TEST_END

TEST_BEGIN(test_new_nonblocking_stream_waits_on_last_fence)
{
	CUstream s;
	CUdeviceptr a;
	uint64_t waits;

	/* Close an epoch (fast path: no non-blocking stream), then create one:
	 * it must be made to wait on the epoch's marker. */
	for (int i = 0; i < 40; i++) {
		assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	}
	waits = fakecuda_calls("cuStreamWaitEvent");
	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	expect_true(fakecuda_calls("cuStreamWaitEvent") > waits);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_steady_state_costs)
{
	enum { PAIRS = 20000 };
	struct emm_stats st0, st1;
	struct fakecuda_stats f0, f1;
	CUdeviceptr d;

	fakecuda_set_event_delay(3);
	assert_int_eq(shims_stats(-1, &st0), 0);
	f0 = fake_stats();
	for (int i = 0; i < PAIRS; i++) {
		assert_int_eq(cuMemAlloc(&d, 4096 + (size_t)(i % 4) * 512), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	}
	f1 = fake_stats();
	assert_int_eq(shims_stats(-1, &st1), 0);
	fprintf(stderr, "steady state: %.4f events per pair, %llu host waits, %llu segment allocations\n",
	        (double)(st1.events_recorded - st0.events_recorded) / PAIRS,
	        (unsigned long long)(st1.host_waits - st0.host_waits),
	        (unsigned long long)(f1.device_allocs - f0.device_allocs));
	expect_true((double)(st1.events_recorded - st0.events_recorded) / PAIRS < 0.1);
	expect_int_eq(st1.host_waits - st0.host_waits, 0);
	expect_int_eq(f1.ctx_syncs - f0.ctx_syncs, 0);
	expect_int_eq(f1.event_syncs - f0.event_syncs, 0);
	expect_int_eq(f1.device_syncs - f0.device_syncs, 0);
	expect_true(f1.device_allocs - f0.device_allocs <= 1);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
}
TEST_END

TEST_BEGIN(test_capture)
{
	CUstream s;
	CUdeviceptr pooled, g;
	CUgraph graph = NULL;
	struct emm_stats st0, st1;
	struct fakecuda_stats f0, f1;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&pooled, 4096), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st0), 0);
	f0 = fake_stats();
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	/* Stream-ordered calls on the capturing stream become graph nodes. */
	assert_int_eq(cuMemAllocAsync(&g, 4096, s), CUDA_SUCCESS);
	assert_int_eq(cuMemFreeAsync(g, s), CUDA_SUCCESS);
	/* A pooled free stays pending: no event may be recorded or queried. */
	assert_int_eq(cuMemFree(pooled), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_int_eq(f1.capture_violations - f0.capture_violations, 0);
	expect_int_eq(f1.event_records - f0.event_records, 0);
	expect_int_eq(f1.event_queries - f0.event_queries, 0);
	assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_int_eq(f1.captures_invalidated - f0.captures_invalidated, 0);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.passthrough_allocs - st0.passthrough_allocs, 1);
	expect_int_eq(st1.passthrough_frees - st0.passthrough_frees, 1);
	/* The pooled block freed during the capture waits for the graph
	 * (test_shims_graphs.c has the details). */
	expect_int_eq(st1.frees - st0.frees, 0);
	assert_ptr_not_null(graph);
	assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.frees - st0.frees, 1);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_meminfo_counts_idle_cache)
{
	CUdeviceptr d;
	size_t free_mem = 0, total = 0, used;

	assert_int_eq(cuMemAlloc(&d, BIG), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	(void)shims_release_idle(-1, SIZE_MAX); /* close the epoch, keep everything */
	used = fakecuda_mem_used(0);
	assert_int_eq(cuMemGetInfo(&free_mem, &total), CUDA_SUCCESS);
	/* The driver says total - used; the idle 32 MiB segment counts as free. */
	expect_true(free_mem >= total - used + BIG);
	expect_true(free_mem <= total);
}
TEST_END

TEST_BEGIN(test_release_idle)
{
	CUdeviceptr d;
	struct emm_stats st0, st1;
	struct fakecuda_stats f0, f1;
	long long released;

	assert_int_eq(cuMemAlloc(&d, BIG), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st0), 0);
	f0 = fake_stats();
	released = shims_release_idle(-1, 0);
	f1 = fake_stats();
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_true(released >= (long long)BIG);
	expect_true(f1.device_frees > f0.device_frees);
	expect_int_eq(st1.live_blocks, 0);
	expect_true(st1.reserved_bytes + BIG <= st0.reserved_bytes);
	expect_true(st1.backend_frees > st0.backend_frees);
}
TEST_END

TEST_BEGIN(test_ipc_handles_of_blocks)
{
	CUdeviceptr a, b, w, q;
	CUipcMemHandle ha, ha2, hb, hw;

	/* An empty pool: both blocks come from one fresh small segment. Each
	 * gets a libemm handle of its own (the driver's handle would name
	 * the whole segment); the same block exported twice, the same handle.
	 * tests/shims/test_shims_ipc.c opens them in other processes. */
	const char *backend = getenv("EMM_BACKEND");
	bool shareable = !backend || !*backend || strcmp(backend, "driver") == 0;
	CUresult want = shareable ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
	(void)shims_release_idle(-1, 0);
	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 4096), CUDA_SUCCESS);
	expect_int_eq(cuIpcGetMemHandle(&ha, a), want);
	expect_int_eq(cuIpcGetMemHandle(&ha2, a + 100), want); /* interior: the block's handle */
	expect_int_eq(cuIpcGetMemHandle(&hb, b), want);
	if (shareable) {
		expect_true(memcmp(ha.reserved, "libemm-ipc-blk1", 16) == 0);
		expect_true(memcmp(&ha, &ha2, sizeof(ha)) == 0);
		expect_true(memcmp(&ha, &hb, sizeof(ha)) != 0);
		/* This process exported it: the driver's answer for the segment. */
		expect_int_eq(cuIpcOpenMemHandle(&q, ha, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_ERROR_INVALID_CONTEXT);
	}
	expect_int_eq(cuIpcGetMemHandle(NULL, a), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	/* Freed (its segment still cached): the driver's answer for freed
	 * memory, never the segment's handle. */
	expect_int_eq(cuIpcGetMemHandle(&ha, a), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	/* A block that is its whole segment (12 MiB: a segment of its own,
	 * rounded to 2 MiB, nothing left over): the driver's own handle. */
	assert_int_eq(cuMemAlloc(&w, (size_t)12 << 20), CUDA_SUCCESS);
	expect_int_eq(cuIpcGetMemHandle(&hw, w), want);
	if (shareable)
		expect_true(memcmp(hw.reserved, "FAKEIPC1", 8) == 0);
	assert_int_eq(cuMemFree(w), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_oom_and_retry)
{
	CUdeviceptr a, b;
	struct emm_stats st0, st1;

	(void)shims_release_idle(-1, 0);
	fakecuda_set_mem_capacity(fakecuda_mem_used(0) + ((size_t)100 << 20));
	assert_int_eq(shims_stats(-1, &st0), 0);
	expect_int_eq(cuMemAlloc(&a, (size_t)200 << 20), CUDA_ERROR_OUT_OF_MEMORY);
	/* 60 MiB cached idle, then 80 MiB: only fits once the cache goes back. */
	assert_int_eq(cuMemAlloc(&a, (size_t)60 << 20), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, (size_t)80 << 20), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_true(st1.oom_retries > st0.oom_retries);
	expect_true(st1.ooms > st0.ooms);
	fakecuda_set_mem_capacity((size_t)80 << 30);
}
TEST_END

/* A double or interior free of ours on a capturing stream is refused as
 * outside a capture: never passed to the driver (which would free the
 * segment under the block's live neighbours), the capture left valid. */
TEST_BEGIN(test_capture_bad_frees)
{
	CUstream s;
	CUdeviceptr a, b;
	CUgraph graph = NULL;
	struct emm_stats st0, st1;
	struct fakecuda_stats f0, f1;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&a, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st0), 0);
	f0 = fake_stats();
	assert_int_eq(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	expect_int_eq(cuMemFreeAsync(a, s), CUDA_ERROR_INVALID_VALUE);     /* double */
	expect_int_eq(cuMemFreeAsync(b + 512, s), CUDA_ERROR_INVALID_VALUE); /* interior */
	f1 = fake_stats();
	expect_int_eq(f1.device_frees - f0.device_frees, 0);
	expect_int_eq(f1.capture_violations - f0.capture_violations, 0);
	assert_int_eq(cuStreamEndCapture(s, &graph), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_int_eq(f1.captures_invalidated - f0.captures_invalidated, 0);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.bad_frees - st0.bad_frees, 2);
	expect_int_eq(st1.passthrough_frees - st0.passthrough_frees, 0);
	if (graph)
		assert_int_eq(cuGraphDestroy(graph), CUDA_SUCCESS);
	/* b is whole: it is still ours and frees once. */
	expect_int_eq(cuMemsetD8(b, 7, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_bad_frees_counted)
{
	CUdeviceptr d;
	struct emm_stats st0, st1;

	assert_int_eq(shims_stats(-1, &st0), 0);
	assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(d + 512), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(d), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuMemFreeAsync(d, 0), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.bad_frees - st0.bad_frees, 3);
}
TEST_END

static void *thread_main(void *arg)
{
	uintptr_t failures = 0;
	CUdeviceptr d[8];

	(void)arg;
	if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
		return (void *)1;
	for (int i = 0; i < 2000; i++) {
		for (int j = 0; j < 8; j++)
			failures +=
			    cuMemAlloc(&d[j], 256 + (size_t)((i * 8 + j) % 64) * 1024) != CUDA_SUCCESS;
		for (int j = 0; j < 8; j++)
			failures += cuMemFree(d[j]) != CUDA_SUCCESS;
	}
	return (void *)failures;
}

TEST_BEGIN(test_threads)
{
	enum { T = 8 };
	pthread_t t[T];
	struct emm_stats st0, st1;
	void *ret;

	assert_int_eq(shims_stats(-1, &st0), 0);
	for (int i = 0; i < T; i++)
		assert_int_eq(pthread_create(&t[i], NULL, thread_main, NULL), 0);
	for (int i = 0; i < T; i++) {
		pthread_join(t[i], &ret);
		expect_int_eq((uintptr_t)ret, 0);
	}
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.allocs - st0.allocs, T * 2000 * 8);
	expect_int_eq(st1.live_blocks, st0.live_blocks);
}
TEST_END

TEST_BEGIN(test_fork_child_starts_empty)
{
	CUdeviceptr parent_block;
	pid_t pid;
	int status;

	assert_int_eq(cuMemAlloc(&parent_block, 4096), CUDA_SUCCESS);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct emm_stats st;
		CUdeviceptr d;
		int bad = 0;

		shims_stats(-1, &st);
		if (st.allocs != 0 || st.live_blocks != 0 || st.reserved_bytes != 0)
			bad |= 1;
		/* CUDA is unusable in the child of an initialised process (the
		 * fake, like the driver, says so): libemm must not serve from
		 * the parent's heaps, nor touch the parent's objects. */
		if (cuMemAlloc(&d, 4096) != CUDA_ERROR_NOT_INITIALIZED ||
		    cuMemFree(parent_block) != CUDA_ERROR_NOT_INITIALIZED)
			bad |= 2;
		/* A fresh start (the fake's reset stands for exec or a new
		 * driver): the pool works from empty. */
		fakecuda_reset();
		shims_setup();
		if (cuMemAlloc(&d, 4096) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
			bad |= 4;
		shims_stats(-1, &st);
		if (st.allocs != 1 || st.frees != 1)
			bad |= 8;
		_exit(bad);
	}
	assert_int_eq(waitpid(pid, &status, 0), pid);
	expect_true(WIFEXITED(status));
	expect_int_eq(WEXITSTATUS(status), 0);
	expect_int_eq(cuMemFree(parent_block), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_trace_file)
{
	static char out[8192];
	char path[] = "/tmp/emm-shims-trace-XXXXXX";
	int fd = mkstemp(path);
	const char *env[] = {"EMM_LOG", path, NULL};
	char buf[4096];
	ssize_t n;

	assert_true(fd >= 0);
	close(fd);
	expect_int_eq(run_self("trace", env, out, sizeof(out)), 0);
	fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	unlink(path);
	assert_true(n > 0);
	buf[n] = '\0';
	expect_true(strncmp(buf, "Thread,Time,Action,Pointer,Size,Stream", 38) == 0);
	expect_true(strstr(buf, ",allocate,") != NULL);
	expect_true(strstr(buf, ",free,") != NULL);
	expect_true(strstr(buf, ",12345,") != NULL);
}
TEST_END

static int mode_trace(void)
{
	CUdeviceptr d;

	shims_setup();
	if (cuMemAlloc(&d, 12345) != CUDA_SUCCESS || cuMemFree(d) != CUDA_SUCCESS)
		return 1;
	return 0;
}

/* Last: tears the contexts down. */
/* A thread stuck inside libemm (here: parked in the driver's cuMemAlloc,
 * under the backend's segment allocation) must not stall a context
 * teardown for ever: past EMM_TEARDOWN_WAIT (2 s by default) the teardown
 * goes on and leaves the context's heaps to that thread. */
struct stuck_arg {
	CUcontext ctx;
	CUresult result;
};

static void *stuck_alloc(void *p)
{
	struct stuck_arg *a = p;
	CUdeviceptr d;

	(void)cuCtxSetCurrent(a->ctx);
	a->result = cuMemAlloc(&d, (size_t)64 << 20); /* a miss: a new segment */
	return NULL;
}

TEST_BEGIN(test_teardown_wait_is_bounded)
{
	struct stuck_arg a = {NULL, CUDA_SUCCESS};
	CUdevice dev;
	CUdeviceptr d;
	pthread_t t;

	assert_int_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
	assert_int_eq(cuCtxCreate(&a.ctx, NULL, 0, dev), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS); /* the heap exists */
	assert_int_eq(fakecuda_hold_next_call("cuMemAlloc_v2"), 0);
	assert_int_eq(pthread_create(&t, NULL, stuck_alloc, &a), 0);
	while (!fakecuda_held_waiting())
		sched_yield();
	/* Returns (after the bound) although the other thread is inside. */
	expect_int_eq(cuCtxDestroy(a.ctx), CUDA_SUCCESS);
	fakecuda_release_held();
	pthread_join(t, NULL);
	/* The stuck call finishes on a heap that was left to it: the driver's
	 * answer for a destroyed context, no crash. */
	expect_true(a.result != CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_context_teardown)
{
	CUdevice dev;
	CUcontext c2, primary;
	CUdeviceptr d, e;
	struct emm_stats st0, st1;

	assert_int_eq(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
	assert_int_eq(cuCtxCreate(&c2, NULL, 0, dev), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&d, 4096), CUDA_SUCCESS);
	assert_int_eq(shims_stats(-1, &st0), 0);
	assert_int_eq(cuCtxDestroy(c2), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	/* The heap went with the context: the driver answers for d. */
	expect_int_eq(cuMemFree(d), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(shims_stats(-1, &st1), 0);
	expect_int_eq(st1.passthrough_frees, st0.passthrough_frees);
	/* Totals of the dropped heap are kept. */
	expect_true(st1.allocs >= st0.allocs);

	/* Primary context reset: same story, and a fresh heap afterwards. */
	assert_int_eq(cuMemAlloc(&e, 4096), CUDA_SUCCESS);
	assert_int_eq(cuDevicePrimaryCtxReset(dev), CUDA_SUCCESS);
	assert_int_eq(cuDevicePrimaryCtxRetain(&primary, dev), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(primary), CUDA_SUCCESS);
	expect_int_eq(cuMemFree(e), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemAlloc(&e, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(e), CUDA_SUCCESS);
	g_ctx = primary;
}
TEST_END

/* --- other modes ------------------------------------------------------- */

/* Everything reaches the driver; libemm's counters stay zero. */
static int mode_passthrough(void)
{
	struct fakecuda_stats f0, f1;
	struct emm_stats st;
	CUdeviceptr d;
	CUstream s;
	void *h;
	unsigned char in[256], out[256];
	int bad = 0;

	shims_setup();
	f0 = fake_stats();
	memset(in, 7, sizeof(in));
	for (int i = 0; i < 10; i++) {
		bad |= cuMemAlloc(&d, 4096) != CUDA_SUCCESS;
		bad |= cuMemcpyHtoD(d, in, sizeof(in)) != CUDA_SUCCESS;
		bad |= cuMemcpyDtoH(out, d, sizeof(out)) != CUDA_SUCCESS;
		bad |= memcmp(in, out, sizeof(in)) != 0;
		bad |= cuMemFree(d) != CUDA_SUCCESS;
		bad |= cuMemAllocHost(&h, 4096) != CUDA_SUCCESS;
		bad |= cuMemFreeHost(h) != CUDA_SUCCESS;
	}
	bad |= cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS;
	bad |= cuMemAllocAsync(&d, 4096, s) != CUDA_SUCCESS;
	bad |= cuMemFreeAsync(d, s) != CUDA_SUCCESS;
	bad |= cuStreamDestroy(s) != CUDA_SUCCESS;
	f1 = fake_stats();
	if (f1.device_allocs - f0.device_allocs != 11 || f1.host_allocs - f0.host_allocs != 10) {
		fprintf(stderr, "passthrough: the driver saw %llu device and %llu host allocations\n",
		        (unsigned long long)(f1.device_allocs - f0.device_allocs),
		        (unsigned long long)(f1.host_allocs - f0.host_allocs));
		bad = 1;
	}
	shims_stats(-1, &st);
	if (st.allocs || st.frees || st.passthrough_allocs || st.passthrough_frees ||
	    st.reserved_bytes_peak) {
		fprintf(stderr, "passthrough: libemm counted allocations\n");
		bad = 1;
	}
	printf("passthrough %s\n", bad ? "FAILED" : "ok");
	return bad;
}

static int mode_badbackend(void)
{
	char path[] = "/tmp/emm-shims-stderr-XXXXXX";
	int fd = mkstemp(path), saved = dup(2);
	char buf[4096] = "";
	CUdeviceptr d;
	ssize_t n;
	int bad = 0;

	if (fd < 0 || saved < 0)
		return 1;
	/* libemm initialises on the first CUDA call: catch what it says. */
	dup2(fd, 2);
	shims_setup();
	bad |= cuMemAlloc(&d, 100) != CUDA_SUCCESS;
	bad |= cuMemFree(d) != CUDA_SUCCESS;
	dup2(saved, 2);
	lseek(fd, 0, SEEK_SET);
	n = read(fd, buf, sizeof(buf) - 1);
	buf[n > 0 ? n : 0] = '\0';
	close(fd);
	unlink(path);
	fprintf(stderr, "libemm said:\n%s", buf);
	if (!strstr(buf, "emm: error:") || !strstr(buf, "/nonexistent/libemm-backend-none.so") ||
	    !strstr(buf, "pass")) {
		fprintf(stderr, "badbackend: no clear error message\n");
		bad = 1;
	}
	return bad | mode_passthrough();
}

/* EMM_FREE_MODE=stream: stream order orders no host write, so a pinned
 * block whose free's fence is pending (work on a non-blocking stream) is
 * not reused at once; a device block is. */
static int mode_stream(void)
{
	CUstream s;
	CUdeviceptr d, d2;
	void *h, *h2;
	int bad = 0;

	shims_setup();
	bad |= cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS;
	bad |= cuMemAlloc(&d, 1 << 20) != CUDA_SUCCESS;
	fakecuda_set_event_delay(1000000); /* nothing completes */
	bad |= cuMemAllocHost(&h, 1 << 20) != CUDA_SUCCESS;
	bad |= cuMemsetD8Async(d, 0, 1 << 20, s) != CUDA_SUCCESS; /* work in flight */
	bad |= cuMemFreeHost(h) != CUDA_SUCCESS;
	bad |= cuMemAllocHost(&h2, 1 << 20) != CUDA_SUCCESS;
	fprintf(stderr, "stream: freed pinned %p, next %p\n", h, h2);
	bad |= h2 == h;
	bad |= cuMemFree(d) != CUDA_SUCCESS || cuMemAlloc(&d2, 1 << 20) != CUDA_SUCCESS || d2 != d;
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	bad |= cuMemFreeHost(h2) != CUDA_SUCCESS || cuMemFree(d2) != CUDA_SUCCESS;
	return bad;
}

/* EMM_FREE_MODE=strict: a free waits for the device, like the driver's. */
static int mode_strict(void)
{
	struct emm_stats st0, st1;
	struct fakecuda_stats f0, f1;
	CUdeviceptr d;
	int bad = 0;

	shims_setup();
	shims_stats(-1, &st0);
	f0 = fake_stats();
	for (int i = 0; i < 10; i++) {
		bad |= cuMemAlloc(&d, 4096) != CUDA_SUCCESS;
		bad |= cuMemFree(d) != CUDA_SUCCESS;
	}
	f1 = fake_stats();
	shims_stats(-1, &st1);
	fprintf(stderr, "strict: %llu host waits, %llu context syncs\n",
	        (unsigned long long)(st1.host_waits - st0.host_waits),
	        (unsigned long long)(f1.ctx_syncs - f0.ctx_syncs));
	bad |= st1.allocs - st0.allocs != 10;
	bad |= st1.host_waits - st0.host_waits < 10;
	bad |= f1.ctx_syncs + f1.event_syncs - f0.ctx_syncs - f0.event_syncs < 1;
	return bad;
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		if (!strcmp(argv[1], "codes"))
			return mode_codes();
		if (!strcmp(argv[1], "compare"))
			return emm_test_run(test_error_codes_match_driver, NULL);
		if (!strcmp(argv[1], "passthrough"))
			return mode_passthrough();
		if (!strcmp(argv[1], "badbackend"))
			return mode_badbackend();
		if (!strcmp(argv[1], "strict"))
			return mode_strict();
		if (!strcmp(argv[1], "stream"))
			return mode_stream();
		if (!strcmp(argv[1], "trace"))
			return mode_trace();
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	/* The codes test runs its sequences in fresh processes; everything
	 * else shares device 0's primary context. */
	g_ctx = shims_setup();
	return emm_test_run(
	    test_error_codes_match_driver, test_stats_api_contract, test_alloc_free_served_by_pool,
	    test_data_integrity, test_address_range_of_blocks, test_pointer_attributes, test_pinned_cached,
	    test_register_managed_passthrough_counted, test_pitch_pooled, test_streams_async,
	    test_fence_blocks_reuse_until_events_complete,
	    test_fence_without_nonblocking_streams_reuses_at_once, test_failed_stream_destroy_keeps_stream,
	    test_new_nonblocking_stream_waits_on_last_fence, test_steady_state_costs, test_capture,
	    test_meminfo_counts_idle_cache, test_release_idle, test_ipc_handles_of_blocks,
	    test_oom_and_retry, test_capture_bad_frees, test_bad_frees_counted, test_threads, test_fork_child_starts_empty,
	    test_trace_file, test_context_teardown, test_teardown_wait_is_bounded, NULL);
}
