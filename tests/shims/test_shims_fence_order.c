/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_fence_order.c - a block freed while GPU work may
 * still use it is never handed to new work that the driver could run
 * before that work, in the corners of the fence rules (DESIGN.md section
 * 4), over the test-double driver (run with LD_PRELOAD=libemm.so,
 * LD_LIBRARY_PATH=<fakecuda>, EMM_ARENAS=1 and FAKECUDA_DEVICES=2; once
 * with EMM_EPOCH_BLOCKS=1, where every free closes an epoch, and once with
 * the default epochs, where a free waits in the open one). "Work" is an event of the test's own recorded with a
 * long completion delay (fakecuda_set_event_delay): the fake runs a stream's
 * later operations after it, so new work that the driver would order after
 * the old shows as an event that is not complete either. Each test checks
 * that either the block is not reused, or the new owner's work on it waits
 * for the old work.
 *
 *   - a non-blocking stream destroyed with work in flight, the block freed
 *     before or after the destroy (process/carrier.c), and when its work
 *     cannot be carried (one device wait instead);
 *   - a block freed with cuMemFreeAsync on a stream of another context, and
 *     an allocation on one (the driver's, on that stream's device);
 *   - a new non-blocking stream whose wait for the last legacy marker fails;
 *   - two epochs of one arena closing at once, the one that recorded first
 *     publishing last (the last legacy marker must not go back);
 *   - the block's context destroyed while such a free carries (the destroy
 *     waits for it), and such a free after exit began (no driver call:
 *     mode "exit").
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_common.h"

#define BIG ((size_t)32 << 20) /* a segment each: reuse shows as the address */

static CUcontext g_ctx;

/* Did `mine`, recorded on the new owner's stream, complete while the old
 * work was still pending? Then the new work ran unordered after it. */
static bool unordered(CUevent mine, CUevent old)
{
	return cuEventQuery(mine) == CUDA_SUCCESS && cuEventQuery(old) == CUDA_ERROR_NOT_READY;
}

/* An allocation on a new stream after the old work: not the old block, or
 * its new owner's work waits for the old work. */
static void expect_reuse_ordered(CUdeviceptr old_block, CUevent old_work)
{
	CUstream s;
	CUdeviceptr b;
	CUevent mine;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuEventCreate(&mine, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	assert_int_eq(cuMemAllocAsync(&b, BIG, s), CUDA_SUCCESS);
	assert_int_eq(cuEventRecord(mine, s), CUDA_SUCCESS); /* "a kernel on s writing b" */
	expect_false(b == old_block && unordered(mine, old_work));
	assert_int_eq(cuMemFreeAsync(b, s), CUDA_SUCCESS);
	assert_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	assert_int_eq(cuEventDestroy(mine), CUDA_SUCCESS);
}

/* The end of each test: all old work done, and no idle block left for the
 * next test's allocations to take instead of the one it watches. */
static void settle(CUevent work)
{
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuCtxSynchronize(), CUDA_SUCCESS);
	assert_int_eq(cuEventDestroy(work), CUDA_SUCCESS);
	expect_true(shims_release_idle(-1, 0) >= 0);
}

/* "A kernel on s reading the block": *work, recorded on s, pending until
 * the test settles. */
static void begin_work(CUevent *work, CUstream s)
{
	assert_int_eq(cuEventCreate(work, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(cuEventRecord(*work, s), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
}

/* Block a, freed while `work` runs: neither a synchronous allocation (used
 * at once by any stream) nor a stream-ordered one gets it unordered; then
 * settle. */
static void expect_safe_reuse(CUdeviceptr a, CUevent work)
{
	CUdeviceptr b;

	assert_int_eq(cuMemAlloc(&b, BIG), CUDA_SUCCESS);
	expect_false(b == a && cuEventQuery(work) == CUDA_ERROR_NOT_READY);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	expect_reuse_ordered(a, work);
	settle(work);
}

static void destroyed_stream_case(bool free_first)
{
	CUstream s;
	CUevent work;
	CUdeviceptr a;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	begin_work(&work, s);
	if (free_first)
		assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS); /* its work runs on */
	if (!free_first)
		assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	expect_safe_reuse(a, work);
}

TEST_BEGIN(test_free_then_destroy)
{
	destroyed_stream_case(true);
}
TEST_END

TEST_BEGIN(test_destroy_then_free)
{
	destroyed_stream_case(false);
}
TEST_END

/* A stream of device 1's primary context (retained), which is current
 * on return. */
static void device1_stream(unsigned flags, CUcontext *c1, CUstream *x)
{
	CUdevice d1;

	assert_int_eq(cuDeviceGet(&d1, 1), CUDA_SUCCESS);
	assert_int_eq(cuDevicePrimaryCtxRetain(c1, d1), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(*c1), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(x, flags), CUDA_SUCCESS);
}

/* Its end: x destroyed, device 1's primary context released, g_ctx
 * current again. */
static void device1_done(CUcontext c1, CUstream x)
{
	CUdevice d1;

	assert_int_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(x), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	assert_int_eq(cuDeviceGet(&d1, 1), CUDA_SUCCESS);
	assert_int_eq(cuDevicePrimaryCtxRelease(d1), CUDA_SUCCESS);
}

/* Device 0's block freed on a stream of device 1's context (peer access),
 * blocking or not, from either context. */
static void foreign_stream_case(unsigned flags, bool from_device1)
{
	CUcontext c1;
	CUstream x;
	CUevent work;
	CUdeviceptr a;

	device1_stream(flags, &c1, &x);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	begin_work(&work, x); /* an event of x's context */
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	if (from_device1)
		assert_int_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	assert_int_eq(cuMemFreeAsync(a, x), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	expect_safe_reuse(a, work);
	device1_done(c1, x);
}

/* The destroyed stream's work cannot be carried (the carrier's wait is
 * refused once): the next close waits for the device instead, once, and
 * later closes record as before. */
TEST_BEGIN(test_uncarried_work_waits_once)
{
	CUstream s;
	CUevent work;
	CUdeviceptr a, b;
	struct fakecuda_stats f0, f1;

	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	begin_work(&work, s);
	assert_int_eq(fakecuda_fail_next_call("cuStreamWaitEvent", CUDA_ERROR_INVALID_VALUE, 1), 0);
	assert_int_eq(cuStreamDestroy(s), CUDA_SUCCESS);
	f0 = fake_stats();
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&b, BIG), CUDA_SUCCESS);
	f1 = fake_stats();
	expect_false(b == a && cuEventQuery(work) == CUDA_ERROR_NOT_READY);
	expect_u64_eq(f1.ctx_syncs - f0.ctx_syncs, 1);
	assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	/* Recorded again: no more device waits. */
	f0 = fake_stats();
	for (int i = 0; i < 4; i++) {
		assert_int_eq(cuMemAlloc(&b, BIG), CUDA_SUCCESS);
		assert_int_eq(cuMemFree(b), CUDA_SUCCESS);
	}
	f1 = fake_stats();
	expect_u64_eq(f1.ctx_syncs - f0.ctx_syncs, 0);
	settle(work);
}
TEST_END

TEST_BEGIN(test_free_on_another_contexts_stream)
{
	foreign_stream_case(CU_STREAM_NON_BLOCKING, false);
	foreign_stream_case(CU_STREAM_DEFAULT, false);
	foreign_stream_case(CU_STREAM_NON_BLOCKING, true);
}
TEST_END

static CUcontext g_doomed;
static CUstream g_x;
static CUdeviceptr g_a;

static void *free_on_x(void *arg)
{
	(void)arg;
	return cuMemFreeAsync(g_a, g_x) == CUDA_SUCCESS ? NULL : (void *)1;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The block's context destroyed while a free on another context's stream
 * carries that stream's work (the thread held in the carry's event
 * create): the free runs inside the heap guard, so the destroy waits for
 * it (EMM_TEARDOWN_WAIT, 200 ms here) instead of freeing the heap under it
 * (a use after free, seen by the ASan pass). */
TEST_BEGIN(test_context_destroyed_during_a_carry)
{
	CUdevice d0;
	CUcontext c1;
	CUevent work;
	pthread_t t;
	void *ret = (void *)1;

	assert_int_eq(cuDeviceGet(&d0, 0), CUDA_SUCCESS);
	device1_stream(CU_STREAM_NON_BLOCKING, &c1, &g_x);
	begin_work(&work, g_x); /* x busy: its work must be carried */
	assert_int_eq(cuCtxCreate(&g_doomed, NULL, 0, d0), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&g_a, BIG), CUDA_SUCCESS);
	assert_int_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	assert_int_eq(fakecuda_hold_next_call("cuEventCreate"), 0);
	assert_int_eq(pthread_create(&t, NULL, free_on_x, NULL), 0);
	for (int ms = 0; !fakecuda_held_waiting() && ms < 5000; ms++)
		usleep(1000);
	assert_true(fakecuda_held_waiting());
	double t0 = now_ms();
	assert_int_eq(cuCtxDestroy(g_doomed), CUDA_SUCCESS);
	expect_true(now_ms() - t0 >= 150); /* it waited for the free inside */
	fakecuda_release_held();
	assert_int_eq(pthread_join(t, &ret), 0);
	expect_ptr_null(ret);
	assert_int_eq(cuCtxSetCurrent(c1), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuEventDestroy(work), CUDA_SUCCESS);
	device1_done(c1, g_x);
}
TEST_END

/* "exit": a free on another context's stream after exit began (an atexit
 * handler registered before the first CUDA call runs after libemm's)
 * makes no driver call. */
static const char *const fence_calls[] = {"cuStreamQuery", "cuEventCreate", "cuEventRecord", "cuStreamWaitEvent",
                                          "cuStreamCreate", "cuCtxPushCurrent_v2"};

static uint64_t fence_call_count(void)
{
	uint64_t n = 0;

	for (size_t i = 0; i < sizeof(fence_calls) / sizeof(fence_calls[0]); i++)
		n += fakecuda_calls(fence_calls[i]);
	return n;
}

static void late_free(void)
{
	uint64_t before = fence_call_count();
	CUresult r = cuMemFreeAsync(g_a, g_x);
	uint64_t after = fence_call_count();

	fprintf(stderr, "late cuMemFreeAsync: %d, driver calls %llu\n", (int)r, (unsigned long long)(after - before));
	if (r != CUDA_SUCCESS || after != before)
		_exit(1);
}

static int mode_exit(void)
{
	CUdevice d0, d1;
	CUcontext c0, c1;
	CUevent work;

	if (cuDeviceGet(&d0, 0) || cuDeviceGet(&d1, 1) || cuDevicePrimaryCtxRetain(&c1, d1) ||
	    cuCtxSetCurrent(c1) || cuStreamCreate(&g_x, CU_STREAM_NON_BLOCKING) ||
	    cuEventCreate(&work, CU_EVENT_DISABLE_TIMING))
		return 2;
	fakecuda_set_event_delay(1000000);
	if (cuEventRecord(work, g_x))
		return 2;
	fakecuda_set_event_delay(0);
	if (cuDevicePrimaryCtxRetain(&c0, d0) || cuCtxSetCurrent(c0) || cuMemAlloc(&g_a, BIG))
		return 2;
	return 0; /* late_free runs at exit */
}

/* An allocation on a stream of another context comes from that stream's
 * device, as the driver makes it: libemm leaves it to the driver. */
TEST_BEGIN(test_alloc_on_another_contexts_stream)
{
	CUcontext c1;
	CUstream x;
	CUdeviceptr p;
	int ordinal = -1;

	device1_stream(CU_STREAM_NON_BLOCKING, &c1, &x);
	assert_int_eq(cuCtxSetCurrent(g_ctx), CUDA_SUCCESS);
	assert_int_eq(cuMemAllocAsync(&p, 4096, x), CUDA_SUCCESS);
	expect_int_eq(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p), CUDA_SUCCESS);
	expect_int_eq(ordinal, 1);
	assert_int_eq(cuMemFreeAsync(p, x), CUDA_SUCCESS);
	assert_int_eq(cuStreamSynchronize(x), CUDA_SUCCESS);
	device1_done(c1, x);
}
TEST_END

/* A block made ready by a fast-path close (no non-blocking stream alive)
 * while the legacy work on it runs; a new non-blocking stream cannot wait
 * for the legacy marker (the driver refuses the wait once). */
TEST_BEGIN(test_new_stream_whose_wait_fails)
{
	CUevent work;
	CUdeviceptr a;

	assert_int_eq(cuMemAlloc(&a, BIG), CUDA_SUCCESS);
	begin_work(&work, CU_STREAM_LEGACY);
	assert_int_eq(cuMemFree(a), CUDA_SUCCESS); /* closes now: the fast path */
	assert_int_eq(fakecuda_fail_next_call("cuStreamWaitEvent", CUDA_ERROR_INVALID_VALUE, 1), 0);
	expect_reuse_ordered(a, work);
	settle(work);
}
TEST_END

static CUdeviceptr g_first;

static void *free_first(void *arg)
{
	(void)arg;
	if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS || cuMemFree(g_first) != CUDA_SUCCESS)
		return (void *)1;
	return NULL;
}

/* Close 1 records its legacy marker, then waits (held in its query of a
 * non-blocking stream); close 2 records after later legacy work and
 * publishes; close 1 publishes last. */
TEST_BEGIN(test_overlapping_closes_keep_the_newer_marker)
{
	CUstream idle;
	CUevent work;
	CUdeviceptr x;
	pthread_t t;
	void *ret = (void *)1;

	assert_int_eq(cuStreamCreate(&idle, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuEventCreate(&work, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&g_first, BIG), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&x, BIG), CUDA_SUCCESS);
	fakecuda_hold_next_call("cuStreamQuery");
	assert_int_eq(pthread_create(&t, NULL, free_first, NULL), 0);
	for (int ms = 0; !fakecuda_held_waiting() && ms < 5000; ms++)
		usleep(1000);
	assert_true(fakecuda_held_waiting()); /* its close waits in the query */
	fakecuda_set_event_delay(1000000);
	assert_int_eq(cuEventRecord(work, CU_STREAM_LEGACY), CUDA_SUCCESS); /* "a kernel reading x" */
	assert_int_eq(cuMemFree(x), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	fakecuda_release_held();
	assert_int_eq(pthread_join(t, &ret), 0);
	expect_ptr_null(ret);
	assert_int_eq(cuStreamDestroy(idle), CUDA_SUCCESS);
	expect_reuse_ordered(x, work);
	settle(work);
}
TEST_END

/* "open-epoch": only the tests whose frees the default epochs keep open
 * (the other two need a close at each free). */
int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "exit") == 0) {
		atexit(late_free); /* before the first CUDA call */
		shims_setup();
		return mode_exit();
	}
	g_ctx = shims_setup();
	if (argc > 1 && strcmp(argv[1], "open-epoch") == 0)
		return emm_test_run(test_free_then_destroy, test_destroy_then_free,
		                    test_free_on_another_contexts_stream, NULL);
	return emm_test_run(test_free_then_destroy, test_destroy_then_free, test_uncarried_work_waits_once,
	                    test_free_on_another_contexts_stream, test_alloc_on_another_contexts_stream,
	                    test_context_destroyed_during_a_carry, test_new_stream_whose_wait_fails,
	                    test_overlapping_closes_keep_the_newer_marker, NULL);
}
