/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/test-fakecuda.c - the test double's own behaviour: the
 * control API, event delays and stream order, capture refusals, entry-point
 * resolution, memory, threads, fork. The error codes shared with the real
 * driver are checked by probe-driver (which runs against both).
 *
 * Linked against the fake (link_with), so cuda.h's names call it directly.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>

#include "emm_test.h"
#include "fakecuda.h"

/* Entry points cuda.h hides behind its macros (cuMemAlloc means
 * cuMemAlloc_v2 there): the old ABIs, by their exported names. */
extern CUresult v1_cuMemAlloc(unsigned int *dptr, unsigned int bytesize) __asm__("cuMemAlloc");
extern CUresult v1_cuMemFree(unsigned int dptr) __asm__("cuMemFree");
extern CUresult v1_cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) __asm__("cuCtxCreate");
extern CUresult v1_cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
	__asm__("cuGetProcAddress");

/* Fresh driver, cuInit, primary context of device 0 current. */
static CUcontext fresh(void)
{
	CUcontext ctx = NULL;
	fakecuda_reset();
	if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
	    cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		return NULL;
	return ctx;
}

static const char *name_of(void *fn)
{
	Dl_info info;
	if (!fn)
		return "(null)";
	return dladdr(fn, &info) && info.dli_sname ? info.dli_sname : "(unnamed)";
}

/* --- control API --- */

TEST_BEGIN(test_counters_and_injection)
{
	CUdeviceptr p = 0;
	assert_ptr_not_null(fresh());
	expect_int_eq(fakecuda_calls("cuInit"), 1);
	expect_true(fakecuda_known_function("cuMemAlloc_v2"));
	expect_false(fakecuda_known_function("cuMemAlloc_v9"));
	expect_int_eq(fakecuda_fail_next_call("cuMemAlloc_v9", CUDA_ERROR_UNKNOWN, 1), -1);

	assert_int_eq(fakecuda_fail_next_call("cuMemAlloc_v2", CUDA_ERROR_ECC_UNCORRECTABLE, 2), 0);
	expect_int_eq(cuMemAlloc_v2(&p, 64), CUDA_ERROR_ECC_UNCORRECTABLE);
	expect_int_eq(cuMemAlloc_v2(&p, 64), CUDA_ERROR_ECC_UNCORRECTABLE);
	expect_int_eq(cuMemAlloc_v2(&p, 64), CUDA_SUCCESS);
	expect_int_eq(fakecuda_calls("cuMemAlloc_v2"), 3);
	struct fakecuda_stats st;
	fakecuda_get_stats(&st);
	expect_int_eq(st.failures_injected, 2);
	expect_int_eq(st.device_allocs, 1);
	expect_int_eq(st.live_device_allocations, 1);

	fakecuda_fail_next_alloc(1);
	CUdeviceptr q = 0;
	expect_int_eq(cuMemAlloc_v2(&q, 0), CUDA_ERROR_INVALID_VALUE); /* argument checks first */
	expect_int_eq(cuMemAlloc_v2(&q, 64), CUDA_ERROR_OUT_OF_MEMORY);
	expect_int_eq(cuMemAlloc_v2(&q, 64), CUDA_SUCCESS);
	expect_int_eq(cuMemFree_v2(q), CUDA_SUCCESS);
	expect_int_eq(cuMemFree_v2(p), CUDA_SUCCESS);

	fakecuda_reset_counters();
	expect_int_eq(fakecuda_calls("cuMemAlloc_v2"), 0);
	fakecuda_get_stats(&st);
	expect_int_eq(st.device_allocs, 0);
	expect_int_eq(st.live_device_allocations, 0);
}
TEST_END

TEST_BEGIN(test_capacity)
{
	CUdeviceptr a = 0, b = 0;
	size_t free_b = 0, total = 0;
	assert_ptr_not_null(fresh());
	expect_int_eq(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
	expect_u64_eq(total, (uint64_t)80 << 30);
	expect_u64_eq(free_b, total);
	/* 4 GiB does not cost 4 GiB: memory is mapped lazily. */
	assert_int_eq(cuMemAlloc_v2(&a, (size_t)4 << 30), CUDA_SUCCESS);
	expect_int_eq(cuMemsetD8_v2(a + ((size_t)4 << 30) - 1, 1, 1), CUDA_SUCCESS);
	expect_int_eq(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
	expect_u64_eq(free_b, total - ((size_t)4 << 30));
	expect_int_eq(cuMemAlloc_v2(&b, total - ((size_t)4 << 30) + 1), CUDA_ERROR_OUT_OF_MEMORY);
	expect_int_eq(cuMemFree_v2(a), CUDA_SUCCESS);

	fakecuda_set_mem_capacity(1 << 20);
	expect_int_eq(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
	expect_u64_eq(total, 1 << 20);
	expect_int_eq(cuMemAlloc_v2(&a, 1000), CUDA_SUCCESS);
	expect_u64_eq(fakecuda_mem_used(0), 1024); /* 256-byte units */
	expect_int_eq(cuMemGetInfo_v2(&free_b, &total), CUDA_SUCCESS);
	expect_u64_eq(free_b, (1 << 20) - 1024);
	expect_int_eq(cuMemAlloc_v2(&b, (1 << 20) - 1024), CUDA_SUCCESS);
	CUdeviceptr c = 0;
	expect_int_eq(cuMemAlloc_v2(&c, 1), CUDA_ERROR_OUT_OF_MEMORY);
	expect_int_eq(cuMemAllocAsync(&c, 1, NULL), CUDA_ERROR_OUT_OF_MEMORY);
	void *h = NULL;
	expect_int_eq(cuMemAllocHost(&h, 4096), CUDA_SUCCESS); /* host memory is not device memory */
	expect_int_eq(cuMemFreeHost(h), CUDA_SUCCESS);
	expect_int_eq(cuMemFree_v2(a), CUDA_SUCCESS);
	expect_int_eq(cuMemFree_v2(b), CUDA_SUCCESS);
	expect_u64_eq(fakecuda_mem_used(0), 0);
}
TEST_END

TEST_BEGIN(test_reset)
{
	CUdeviceptr p = 0;
	CUstream s = NULL;
	assert_ptr_not_null(fresh());
	expect_int_eq(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
	expect_int_eq(cuStreamCreate(&s, 0), CUDA_SUCCESS);
	fakecuda_reset();
	CUcontext c = (CUcontext)1;
	expect_int_eq(cuCtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
	expect_int_eq(cuInit(0), CUDA_SUCCESS);
	expect_int_eq(cuCtxGetCurrent(&c), CUDA_SUCCESS);
	expect_ptr_null(c); /* the thread's stack went with the reset */
	assert_ptr_not_null(fresh());
	expect_int_eq(cuMemFree_v2(p), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(cuStreamDestroy_v2(s), CUDA_ERROR_INVALID_HANDLE);
}
TEST_END

/* --- events: delays and stream order --- */

TEST_BEGIN(test_event_delay)
{
	CUevent e;
	CUstream s;
	struct fakecuda_stats st;
	assert_ptr_not_null(fresh());
	assert_int_eq(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);

	/* Default: complete at once. */
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);

	fakecuda_set_event_delay(3);
	fakecuda_reset_counters();
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	fakecuda_get_stats(&st);
	expect_int_eq(st.pending_events, 1);
	expect_int_eq(cuEventQuery(e), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(e), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(e), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);
	fakecuda_get_stats(&st);
	expect_int_eq(st.event_records, 1);
	expect_int_eq(st.event_queries, 5);
	expect_int_eq(st.event_queries_not_ready, 3);
	expect_int_eq(st.pending_events, 0);
	expect_int_eq(fakecuda_calls("cuEventQuery"), 5);
	expect_int_eq(fakecuda_calls("cuEventRecord"), 1);

	/* Each way of waiting completes it. */
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuEventSynchronize(e), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuStreamSynchronize(s), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuCtxSynchronize(), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	fakecuda_complete_all();
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);
	fakecuda_get_stats(&st);
	expect_int_eq(st.event_syncs, 1);
	expect_int_eq(st.stream_syncs, 1);
	expect_int_eq(st.ctx_syncs, 1);

	/* The synchronous free waits for the whole device; the stream-ordered
	 * one does not. */
	CUdeviceptr p = 0;
	expect_int_eq(cuMemAllocAsync(&p, 64, s), CUDA_SUCCESS);
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuMemFreeAsync(p, s), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuMemAlloc_v2(&p, 64), CUDA_SUCCESS);
	expect_int_eq(cuMemFree_v2(p), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);
	fakecuda_get_stats(&st);
	expect_int_eq(st.device_syncs, 1);

	/* cuStreamQuery polls the stream's events. */
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuStreamQuery(s), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuStreamQuery(s), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_SUCCESS);

	/* A destroyed event's work still completes. */
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuEventDestroy_v2(e), CUDA_SUCCESS);
	expect_int_eq(cuStreamQuery(s), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
	expect_int_eq(cuStreamDestroy_v2(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_event_order)
{
	CUevent a, b, c;
	CUstream s1, s2;
	assert_ptr_not_null(fresh());
	assert_int_eq(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	cuEventCreate(&a, 0);
	cuEventCreate(&b, 0);
	cuEventCreate(&c, 0);
	fakecuda_set_event_delay(2);

	/* In stream order: b done means a done. */
	cuEventRecord(a, s1);
	cuEventRecord(b, s1);
	expect_int_eq(cuEventSynchronize(b), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(a), CUDA_SUCCESS);

	/* a later event may complete first only on its own terms */
	cuEventRecord(a, s1);
	cuEventRecord(b, s1);
	expect_int_eq(cuEventQuery(a), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(a), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(a), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(b), CUDA_ERROR_NOT_READY);
	fakecuda_complete_all();

	/* ... but never before the work ahead of it: an event of no delay
	 * behind a pending one stays pending, and cuStreamQuery answers for
	 * all of the stream's work (a busy stream stays busy whatever is
	 * recorded after). */
	fakecuda_set_event_delay(3);
	cuEventRecord(a, s1);
	fakecuda_set_event_delay(0);
	cuEventRecord(b, s1);
	expect_int_eq(cuEventQuery(b), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuStreamQuery(s1), CUDA_ERROR_NOT_READY); /* polls a: 2 left */
	expect_int_eq(cuEventQuery(a), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(a), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(b), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(a), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(b), CUDA_SUCCESS);
	expect_int_eq(cuStreamQuery(s1), CUDA_SUCCESS);
	fakecuda_set_event_delay(2);

	/* A waited-for event holds back later work on the waiting stream. */
	cuEventRecord(a, s1);
	expect_int_eq(cuStreamWaitEvent(s2, a, 0), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	cuEventRecord(c, s2);
	expect_int_eq(cuEventQuery(c), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(c), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventSynchronize(a), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(c), CUDA_SUCCESS);

	/* Synchronizing the waiter completes what it waited for. */
	fakecuda_set_event_delay(5);
	cuEventRecord(a, s1);
	cuStreamWaitEvent(s2, a, 0);
	cuEventRecord(c, s2);
	expect_int_eq(cuEventSynchronize(c), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(a), CUDA_SUCCESS);
	struct fakecuda_stats st;
	fakecuda_get_stats(&st);
	expect_int_eq(st.stream_waits, 2);
}
TEST_END

/* The legacy stream is a barrier for blocking streams (and per-thread
 * streams), in both directions; non-blocking streams take no part. */
TEST_BEGIN(test_legacy_barrier)
{
	CUevent eb, en, el, e2;
	CUstream blocking, nonblocking;
	assert_ptr_not_null(fresh());
	cuStreamCreate(&blocking, CU_STREAM_DEFAULT);
	cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING);
	cuEventCreate(&eb, 0);
	cuEventCreate(&en, 0);
	cuEventCreate(&el, 0);
	cuEventCreate(&e2, 0);

	fakecuda_set_event_delay(100);
	cuEventRecord(eb, blocking);
	cuEventRecord(en, nonblocking);
	fakecuda_set_event_delay(0);
	cuEventRecord(el, CU_STREAM_LEGACY);
	expect_int_eq(cuEventQuery(el), CUDA_ERROR_NOT_READY); /* waits for eb */
	expect_int_eq(cuEventSynchronize(eb), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(el), CUDA_SUCCESS);         /* not for en */
	expect_int_eq(cuEventQuery(en), CUDA_ERROR_NOT_READY);

	/* Work on a blocking stream after legacy work waits for it. */
	fakecuda_set_event_delay(100);
	cuEventRecord(el, NULL);
	fakecuda_set_event_delay(0);
	cuEventRecord(eb, blocking);
	cuEventRecord(e2, CU_STREAM_PER_THREAD);
	cuEventRecord(en, nonblocking);
	expect_int_eq(cuEventQuery(eb), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(e2), CUDA_ERROR_NOT_READY);
	expect_int_eq(cuEventQuery(en), CUDA_SUCCESS);
	expect_int_eq(cuStreamSynchronize(NULL), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(eb), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e2), CUDA_SUCCESS);
}
TEST_END

/* --- stream capture --- */

TEST_BEGIN(test_capture_refusals)
{
	CUstream s;
	CUevent e, other;
	CUgraph g = NULL;
	CUdeviceptr p = 0;
	struct fakecuda_stats st;
	assert_ptr_not_null(fresh());
	cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
	cuEventCreate(&e, 0);
	cuEventCreate(&other, 0);
	cuEventRecord(other, s);

	expect_int_eq(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS); /* a graph node */
	expect_int_eq(cuMemAllocAsync(&p, 256, s), CUDA_SUCCESS);
	expect_int_eq(cuMemFreeAsync(p, s), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(other), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	expect_int_eq(cuMemAlloc_v2(&p, 256), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	expect_int_eq(cuEventRecord(e, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	expect_int_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	expect_ptr_null(g);
	fakecuda_get_stats(&st);
	expect_int_eq(st.captures_begun, 1);
	expect_int_eq(st.captures_invalidated, 1);
	expect_int_eq(st.event_records_captured, 1);
	expect_int_eq(st.capture_violations, 3);
	/* Both refused calls ran while a GLOBAL capture was active. */
	expect_int_eq(st.fence_calls_in_global_capture, 1);
	expect_int_eq(st.relaxed_unsafe_calls, 0);

	/* The same allocation from a thread switched to relaxed mode passes,
	 * counted; an event record on another stream during the capture is a
	 * fence call. */
	CUstream other_s;
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	cuStreamCreate(&other_s, CU_STREAM_NON_BLOCKING);
	expect_int_eq(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	expect_int_eq(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
	expect_int_eq(mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
	expect_int_eq(cuMemAlloc_v2(&p, 256), CUDA_SUCCESS);
	expect_int_eq(cuMemFree_v2(p), CUDA_SUCCESS);
	expect_int_eq(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
	expect_int_eq(mode, CU_STREAM_CAPTURE_MODE_RELAXED);
	expect_int_eq(cuEventRecord(other, other_s), CUDA_SUCCESS);
	expect_int_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
	expect_ptr_not_null(g);
	cuGraphDestroy(g);
	g = NULL;
	fakecuda_get_stats(&st);
	expect_int_eq(st.relaxed_unsafe_calls, 2);
	expect_int_eq(st.fence_calls_in_global_capture, 2);
	expect_int_eq(st.captures_invalidated, 1);
	cuStreamDestroy_v2(other_s);

	/* Relaxed: the allocation is allowed; a captured event still is not
	 * queryable. */
	expect_int_eq(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	expect_int_eq(cuMemAlloc_v2(&p, 256), CUDA_SUCCESS);
	expect_int_eq(cuMemFree_v2(p), CUDA_SUCCESS);
	expect_int_eq(cuEventRecord(e, s), CUDA_SUCCESS);
	expect_int_eq(cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
	expect_int_eq(cuStreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

	/* A free captured into a graph happens when the graph runs. */
	CUdeviceptr q = 0;
	CUgraphExec x = NULL;
	expect_int_eq(cuMemAlloc_v2(&q, 256), CUDA_SUCCESS);
	expect_int_eq(cuStreamBeginCapture_v2(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	expect_int_eq(cuMemFreeAsync(q, s), CUDA_SUCCESS);
	expect_int_eq(cuStreamEndCapture(s, &g), CUDA_SUCCESS);
	CUdeviceptr base = 0;
	expect_int_eq(cuMemGetAddressRange_v2(&base, NULL, q), CUDA_SUCCESS);
	expect_int_eq(cuGraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
	expect_int_eq(cuGraphLaunch(x, s), CUDA_SUCCESS);
	expect_int_eq(cuMemGetAddressRange_v2(&base, NULL, q), CUDA_ERROR_NOT_FOUND);
	expect_int_eq(cuGraphExecDestroy(x), CUDA_SUCCESS);
	expect_int_eq(cuGraphDestroy(g), CUDA_SUCCESS);
}
TEST_END

/* --- entry points --- */

TEST_BEGIN(test_proc_address_matrix)
{
	static const int versions[] = {2000, 3020, 11020, 12000, 13000};
	fakecuda_reset(); /* works before cuInit */
	for (size_t v = 0; v < sizeof(versions) / sizeof(versions[0]); v++) {
		int ver = versions[v];
		for (unsigned flags = 0; flags <= 2; flags++) {
			for (int with_status = 0; with_status < 2; with_status++) {
				CUdriverProcAddressQueryResult st = 99, *pst = with_status ? &st : NULL;
				void *fn = NULL;
				expect_int_eq(cuGetProcAddress_v2("cuMemAlloc", &fn, ver, flags, pst), CUDA_SUCCESS);
				expect_str_eq(name_of(fn), ver >= 3020 ? "cuMemAlloc_v2" : "cuMemAlloc");
				expect_int_eq(cuGetProcAddress_v2("cuMemFree", &fn, ver, flags, pst), CUDA_SUCCESS);
				expect_str_eq(name_of(fn), ver >= 3020 ? "cuMemFree_v2" : "cuMemFree");
				expect_int_eq(cuGetProcAddress_v2("cuMemAllocAsync", &fn, ver, flags, pst), CUDA_SUCCESS);
				expect_str_eq(name_of(fn), ver < 11020 ? "(null)"
							   : flags == 2 ? "cuMemAllocAsync_ptsz" : "cuMemAllocAsync");
				if (with_status)
					expect_int_eq(st, ver < 11020 ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
								     : CU_GET_PROC_ADDRESS_SUCCESS);
				expect_int_eq(cuGetProcAddress_v2("cuGetProcAddress", &fn, ver, flags, pst), CUDA_SUCCESS);
				expect_str_eq(name_of(fn), ver >= 12000 ? "cuGetProcAddress_v2"
							   : ver >= 11030 ? "cuGetProcAddress" : "(null)");
			}
		}
	}
	/* The pointers handed out are the exported functions themselves. */
	void *fn = NULL;
	expect_int_eq(cuGetProcAddress_v2("cuMemAlloc", &fn, 13000, 0, NULL), CUDA_SUCCESS);
	expect_ptr_eq(fn, (void *)cuMemAlloc_v2);
	expect_int_eq(v1_cuGetProcAddress("cuMemFreeAsync", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
		      CUDA_SUCCESS);
	expect_str_eq(name_of(fn), "cuMemFreeAsync_ptsz");
	expect_int_eq(fakecuda_calls("cuGetProcAddress"), 1);
}
TEST_END

/* --- memory --- */

TEST_BEGIN(test_memory_contents)
{
	CUdeviceptr p = 0, q = 0, base = 0;
	size_t size = 0;
	unsigned char buf[4096];
	assert_ptr_not_null(fresh());
	assert_int_eq(cuMemAlloc_v2(&p, 3000), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc_v2(&q, 3000), CUDA_SUCCESS);
	expect_u64_eq(p % 256, 0);
	expect_int_eq(cuMemsetD8_v2(p, 0x11, 3000), CUDA_SUCCESS);
	expect_int_eq(cuMemsetD8_v2(p + 2999, 0x22, 2), CUDA_ERROR_INVALID_VALUE); /* past the end */
	expect_int_eq(cuMemcpyDtoD_v2(q, p, 3000), CUDA_SUCCESS);
	expect_int_eq(cuMemcpyDtoH_v2(buf, q + 1000, 2000), CUDA_SUCCESS);
	expect_true(buf[0] == 0x11 && buf[1999] == 0x11);
	expect_true(((unsigned char *)(uintptr_t)q)[5] == 0x11); /* plain host memory underneath */
	expect_int_eq(cuMemGetAddressRange_v2(&base, &size, q + 2999), CUDA_SUCCESS);
	expect_u64_eq(base, q);
	expect_u64_eq(size, 3000);
	expect_int_eq(cuMemFree_v2(p), CUDA_SUCCESS);
	expect_int_eq(cuMemcpyHtoD_v2(p, buf, 16), CUDA_ERROR_INVALID_VALUE); /* freed */
	expect_int_eq(cuMemFree_v2(q), CUDA_SUCCESS);

	/* The 32-bit ABI in a context made by cuCtxCreate (v1). */
	CUcontext v1ctx = NULL;
	unsigned int p32 = 0;
	expect_int_eq(v1_cuMemAlloc(&p32, 64), CUDA_ERROR_INVALID_CONTEXT);
	expect_int_eq(v1_cuCtxCreate(&v1ctx, 0, 0), CUDA_SUCCESS);
	expect_int_eq(v1_cuMemAlloc(&p32, 64), CUDA_SUCCESS);
	expect_true(p32 != 0);
	expect_int_eq(v1_cuMemFree(p32), CUDA_SUCCESS);
	expect_int_eq(fakecuda_calls("cuMemAlloc"), 2);
	expect_int_eq(cuCtxDestroy_v2(v1ctx), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_pinned_and_registered)
{
	void *h = NULL;
	static char page[3 * 4096] __attribute__((aligned(4096)));
	struct fakecuda_stats st;
	assert_ptr_not_null(fresh());
	expect_int_eq(cuMemHostAlloc(&h, 5000, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP), CUDA_SUCCESS);
	unsigned flags = 0;
	expect_int_eq(cuMemHostGetFlags(&flags, h), CUDA_SUCCESS);
	expect_int_eq(flags, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
	CUdeviceptr d = 0;
	expect_int_eq(cuMemHostGetDevicePointer_v2(&d, (char *)h + 10, 0), CUDA_SUCCESS);
	expect_u64_eq(d, (uintptr_t)h + 10);
	memset(h, 7, 5000);
	expect_int_eq(cuMemHostRegister_v2(page, sizeof(page), 0), CUDA_SUCCESS);
	expect_int_eq(cuMemcpy((CUdeviceptr)(uintptr_t)page, (CUdeviceptr)(uintptr_t)h, 100), CUDA_SUCCESS);
	expect_int_eq(page[99], 7);
	fakecuda_get_stats(&st);
	expect_int_eq(st.live_host_allocations, 2);
	expect_int_eq(st.host_allocs, 1);
	expect_int_eq(st.host_registers, 1);
	expect_int_eq(cuMemHostUnregister(page), CUDA_SUCCESS);
	expect_int_eq(cuMemFreeHost(h), CUDA_SUCCESS);
	fakecuda_get_stats(&st);
	expect_int_eq(st.live_host_allocations, 0);
}
TEST_END

/* --- threads --- */

static CUcontext shared_ctx;

static void *alloc_worker(void *arg)
{
	long fails = 0;
	(void)arg;
	if (cuCtxSetCurrent(shared_ctx) != CUDA_SUCCESS)
		return (void *)1;
	for (int i = 0; i < 500; i++) {
		CUdeviceptr p = 0;
		CUevent e;
		fails += cuMemAlloc_v2(&p, 64 + (size_t)i) != CUDA_SUCCESS;
		fails += cuMemsetD8_v2(p, (unsigned char)i, 64) != CUDA_SUCCESS;
		fails += cuEventCreate(&e, 0) != CUDA_SUCCESS;
		fails += cuEventRecord(e, CU_STREAM_PER_THREAD) != CUDA_SUCCESS;
		fails += cuEventQuery(e) != CUDA_SUCCESS;
		fails += cuEventDestroy_v2(e) != CUDA_SUCCESS;
		fails += cuMemFree_v2(p) != CUDA_SUCCESS;
	}
	return (void *)fails;
}

static void *stream_id_worker(void *arg)
{
	unsigned long long *id = arg;
	cuCtxSetCurrent(shared_ctx);
	cuStreamGetId(CU_STREAM_PER_THREAD, id);
	return NULL;
}

TEST_BEGIN(test_threads)
{
	pthread_t t[8];
	shared_ctx = fresh();
	assert_ptr_not_null(shared_ctx);
	for (int i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, alloc_worker, NULL);
	for (int i = 0; i < 8; i++) {
		void *fails = NULL;
		pthread_join(t[i], &fails);
		expect_ptr_null(fails);
	}
	struct fakecuda_stats st;
	fakecuda_get_stats(&st);
	expect_int_eq(st.live_device_allocations, 0);
	expect_int_eq(st.device_allocs, 4000);

	/* The current context is per thread; so is the per-thread stream. */
	unsigned long long id1 = 0, id2 = 0, mine = 0;
	pthread_create(&t[0], NULL, stream_id_worker, &id1);
	pthread_create(&t[1], NULL, stream_id_worker, &id2);
	pthread_join(t[0], NULL);
	pthread_join(t[1], NULL);
	expect_int_eq(cuStreamGetId(CU_STREAM_PER_THREAD, &mine), CUDA_SUCCESS);
	expect_true(id1 && id2 && id1 != id2 && mine != id1 && mine != id2);
	unsigned long long legacy = 0, legacy_again = 0;
	cuStreamGetId(CU_STREAM_LEGACY, &legacy);
	cuStreamGetId(NULL, &legacy_again);
	expect_u64_eq(legacy, legacy_again);
}
TEST_END

/* --- fork --- */

TEST_BEGIN(test_fork)
{
	CUdeviceptr p = 0;
	assert_ptr_not_null(fresh());
	assert_int_eq(cuMemAlloc_v2(&p, 4096), CUDA_SUCCESS);
	assert_int_eq(cuMemsetD8_v2(p, 0x42, 4096), CUDA_SUCCESS);
	pid_t pid = fork();
	if (pid == 0) {
		/* CUDA is unusable in the child until a reset; the reset leaves
		 * the parent's memory alone. */
		CUdeviceptr q = 0;
		int bad = cuMemAlloc_v2(&q, 64) != CUDA_ERROR_NOT_INITIALIZED;
		bad |= cuInit(0) != CUDA_ERROR_NOT_INITIALIZED;
		fakecuda_reset();
		bad |= fresh() == NULL;
		bad |= cuMemAlloc_v2(&q, 64) != CUDA_SUCCESS;
		bad |= cuMemFree_v2(q) != CUDA_SUCCESS;
		_exit(bad);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	expect_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	unsigned char b = 0;
	expect_int_eq(cuMemcpyDtoH_v2(&b, p + 4095, 1), CUDA_SUCCESS);
	expect_int_eq(b, 0x42);
	expect_int_eq(cuMemFree_v2(p), CUDA_SUCCESS);
}
TEST_END

int main(void)
{
	return emm_test_run(test_counters_and_injection, test_capacity, test_reset, test_event_delay,
			    test_event_order, test_legacy_barrier, test_capture_refusals, test_proc_address_matrix,
			    test_memory_contents, test_pinned_and_registered, test_threads, test_fork, NULL);
}
