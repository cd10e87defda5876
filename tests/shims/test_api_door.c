/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_api_door.c - the public API's allocation door
 * (emm_device_alloc, emm_alloc/emm_free, emm_host_alloc, emm_mem_info) as a
 * framework reaches it: libemm dlopen'ed by path (argv[2]), like Python's
 * ctypes, the driver found by libemm itself. This program never links
 * libcuda; it dlopens libcuda.so.1 to make a context as a framework would.
 *
 *   test_api_door dlopen LIBEMM    without LD_PRELOAD: libemm intercepts
 *                                  nothing (the program's own driver calls
 *                                  never reach it) and serves the door
 *   test_api_door preload LIBEMM   with LD_PRELOAD=libemm as well: the
 *                                  door and the shims share one heap
 *   test_api_door nodriver LIBEMM  no libcuda.so.1 at all: every entry
 *                                  point answers -ENODEV / NULL cleanly
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "emm/emm.h"
#include "emm_test.h"

static const char *mode;
static void *libemm, *libcuda;

#define SYM(h, name) ((__typeof__(&name))dlsym(h, #name))

static struct {
	__typeof__(&emm_device_alloc) device_alloc;
	__typeof__(&emm_device_free) device_free;
	__typeof__(&emm_alloc) alloc;
	__typeof__(&emm_free) free;
	__typeof__(&emm_param_alloc) param_alloc;
	__typeof__(&emm_param_free) param_free;
	__typeof__(&emm_host_alloc) host_alloc;
	__typeof__(&emm_host_free) host_free;
	__typeof__(&emm_mem_info) mem_info;
	__typeof__(&emm_stats_get) stats_get;
} api;

static struct {
	__typeof__(&cuInit) init;
	__typeof__(&cuDevicePrimaryCtxRetain) retain;
	__typeof__(&cuCtxSetCurrent) set_current;
	__typeof__(&cuStreamCreate) stream_create;
	__typeof__(&cuStreamDestroy_v2) stream_destroy;
	__typeof__(&cuMemAlloc_v2) mem_alloc;
	__typeof__(&cuMemFree_v2) mem_free;
	__typeof__(&cuCtxCreate_v4) ctx_create;
	__typeof__(&cuCtxGetCurrent) get_current;
	__typeof__(&cuPointerGetAttribute) pointer_attribute;
} cu;

static struct emm_stats stats(void)
{
	struct emm_stats s = {.struct_size = sizeof(s)};

	api.stats_get(-1, &s);
	return s;
}

static bool preloaded(void)
{
	return strcmp(mode, "preload") == 0;
}

/* --- no driver ------------------------------------------------------------ */

TEST_BEGIN(test_no_driver)
{
	void *p = (void *)0x1234;
	size_t f = 7, t = 9;

	if (dlopen("libcuda.so.1", RTLD_NOW)) {
		emm_test_skip("a libcuda.so.1 is installed on this machine");
		break;
	}
	expect_int_eq(api.device_alloc(4096, 0, NULL, &p), -ENODEV);
	expect_ptr_eq(p, (void *)0x1234);
	expect_ptr_null(api.alloc(4096, 0, NULL));
	expect_ptr_null(api.alloc(4096, -1, EMM_STREAM_NONE));
	expect_ptr_null(api.param_alloc(EMM_STREAM_NONE, 4096, 0));
	api.param_free(EMM_STREAM_NONE, NULL, 0);
	api.free(NULL, 0, 0, NULL);
	expect_int_eq(api.device_free(NULL, 0, NULL), 0);
	expect_int_eq(api.device_free((void *)0x10000, 0, NULL), -ENODEV);
	expect_int_eq(api.host_alloc(4096, 0, &p), -ENODEV);
	expect_int_eq(api.host_free((void *)0x10000), -ENODEV);
	expect_int_eq(api.mem_info(0, &f, &t), -ENODEV);
	expect_u64_eq(f, 7);
	expect_u64_eq(t, 9);
	expect_u64_eq(stats().allocs, 0);
}
TEST_END

/* --- with the test-double driver ------------------------------------------ */

static void driver_setup(void)
{
	CUcontext ctx;

	libcuda = dlopen("libcuda.so.1", RTLD_NOW);
	if (!libcuda || !dlsym(libcuda, "fakecuda_reset")) {
		fprintf(stderr, "the test-double libcuda.so.1 is not on LD_LIBRARY_PATH\n");
		exit(1);
	}
	/* Through dlsym, as cuda-python does: under the preload libemm's
	 * dlsym hands out its shims, without it these are the driver's. */
	cu.init = SYM(libcuda, cuInit);
	cu.retain = SYM(libcuda, cuDevicePrimaryCtxRetain);
	cu.set_current = SYM(libcuda, cuCtxSetCurrent);
	cu.stream_create = SYM(libcuda, cuStreamCreate);
	cu.stream_destroy = SYM(libcuda, cuStreamDestroy_v2);
	cu.mem_alloc = SYM(libcuda, cuMemAlloc_v2);
	cu.mem_free = SYM(libcuda, cuMemFree_v2);
	cu.ctx_create = SYM(libcuda, cuCtxCreate_v4);
	cu.get_current = SYM(libcuda, cuCtxGetCurrent);
	cu.pointer_attribute = SYM(libcuda, cuPointerGetAttribute);
	if (cu.init(0) != CUDA_SUCCESS || cu.retain(&ctx, 0) != CUDA_SUCCESS || cu.set_current(ctx) != CUDA_SUCCESS) {
		fprintf(stderr, "no context on the test double\n");
		exit(1);
	}
}

TEST_BEGIN(test_alloc_free_reuse)
{
	struct emm_stats s0 = stats(), s1;
	char *p = api.alloc(1 << 20, 0, NULL), *q;

	assert_ptr_not_null(p);
	memset(p, 0xab, 1 << 20); /* the test double's device memory is host memory */
	s1 = stats();
	expect_u64_eq(s1.allocs - s0.allocs, 1);
	expect_u64_eq(s1.live_blocks - s0.live_blocks, 1);
	api.free(p, 1 << 20, 0, NULL);
	q = api.alloc(1 << 20, 0, NULL);
	expect_ptr_eq(q, p); /* reused at once on the stream it was freed on */
	expect_true(stats().hits > s1.hits);
	api.free(q, 1 << 20, 0, NULL);
	expect_u64_eq(stats().live_blocks, s0.live_blocks);
}
TEST_END

/* CuPy's CFunctionAllocator shape: the stream is the param. */
TEST_BEGIN(test_param_door)
{
	struct emm_stats s0 = stats();
	char *p = api.param_alloc(NULL, 1 << 20, 0), *q;

	assert_ptr_not_null(p);
	memset(p, 0xcd, 1 << 20);
	expect_u64_eq(stats().live_blocks - s0.live_blocks, 1);
	api.param_free(NULL, p, 0);
	q = api.param_alloc(NULL, 1 << 20, 0);
	expect_ptr_eq(q, p); /* the size and device were not swapped with the stream */
	api.param_free(NULL, q, 0);
	s0 = stats();
	api.param_free(NULL, q, 0); /* double: refused and counted, nothing to return */
	expect_u64_eq(stats().bad_frees - s0.bad_frees, 1);
	p = api.param_alloc(EMM_STREAM_NONE, 4096, 0);
	assert_ptr_not_null(p);
	api.param_free(EMM_STREAM_NONE, p, 0);
	expect_u64_eq(stats().live_blocks, s0.live_blocks);
	expect_ptr_null(api.param_alloc(EMM_STREAM_NONE, 0, 0));
	expect_ptr_null(api.param_alloc(EMM_STREAM_NONE, 4096, 5)); /* one device */
	expect_ptr_null(api.param_alloc(EMM_STREAM_NONE, (size_t)1 << 40, 0)); /* out of memory */
}
TEST_END

TEST_BEGIN(test_stream_and_none)
{
	CUstream s;
	void *a = NULL, *b = NULL;

	/* blocking: it may be destroyed behind libemm's back (not learned) */
	assert_int_eq(cu.stream_create(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
	assert_int_eq(api.device_alloc(4096, 0, (struct CUstream_st *)s, &a), 0);
	expect_int_eq(api.device_free(a, 0, (struct CUstream_st *)s), 0);
	assert_int_eq(api.device_alloc(4096, 0, (struct CUstream_st *)s, &b), 0);
	expect_ptr_eq(b, a);
	expect_int_eq(api.device_free(b, 0, (struct CUstream_st *)s), 0);
	/* No stream: cuMemAlloc / cuMemFree semantics (fenced). */
	assert_int_eq(api.device_alloc(8192, 0, EMM_STREAM_NONE, &a), 0);
	expect_int_eq(api.device_free(a, 0, EMM_STREAM_NONE), 0);
	expect_int_eq(cu.stream_destroy(s), CUDA_SUCCESS);
}
TEST_END

TEST_BEGIN(test_errors)
{
	void *p = (void *)0x1234;
	char *c = NULL;
	size_t f = 7, t = 9;

	expect_int_eq(api.device_alloc(0, 0, NULL, &p), -EINVAL);
	expect_ptr_eq(p, (void *)0x1234);
	expect_int_eq(api.device_alloc(64, 0, NULL, NULL), -EINVAL);
	expect_ptr_null(api.alloc(0, 0, NULL));
	expect_int_eq(api.device_alloc(64, 5, NULL, &p), -ENODEV); /* one device */
	expect_ptr_eq(p, (void *)0x1234);
	expect_int_eq(api.mem_info(5, &f, &t), -ENODEV);
	expect_int_eq(api.mem_info(0, NULL, &t), -EINVAL);
	expect_u64_eq(f, 7);
	assert_int_eq(api.device_alloc(4096, 0, NULL, (void **)&c), 0);
	expect_int_eq(api.device_free(c + 256, 0, NULL), -EINVAL); /* interior */
	expect_int_eq(api.device_free(c, 0, NULL), 0);
	expect_int_eq(api.device_free(c, 0, NULL), -EINVAL); /* double */
	expect_true(stats().bad_frees >= 2);
}
TEST_END

/* Markers an epoch close records (EMM_EPOCH_BLOCKS=1: each free without a
 * stream closes one). */
static uint64_t epoch_markers(void)
{
	struct emm_stats s0 = stats();
	void *p = NULL;

	if (api.device_alloc(512, 0, EMM_STREAM_NONE, &p) != 0 || api.device_free(p, 0, EMM_STREAM_NONE) != 0)
		return 0;
	return stats().events_recorded - s0.events_recorded;
}

/* A non-blocking stream that allocates through the door is fenced by the
 * epochs from then on: without the preload libemm learns it at its first
 * allocation (with the preload, at its creation). An epoch records on it
 * only while it is busy (idle, cuStreamQuery says its work is done): work
 * is an event of the test's own that the fake completes only on demand. */
TEST_BEGIN(test_nonblocking_stream_fenced)
{
	void (*set_delay)(unsigned) = (void (*)(unsigned))dlsym(libcuda, "fakecuda_set_event_delay");
	void (*complete_all)(void) = (void (*)(void))dlsym(libcuda, "fakecuda_complete_all");
	__typeof__(&cuEventCreate) event_create = SYM(libcuda, cuEventCreate);
	__typeof__(&cuEventRecord) event_record = SYM(libcuda, cuEventRecord);
	__typeof__(&cuEventDestroy_v2) event_destroy = SYM(libcuda, cuEventDestroy_v2);
	CUstream s;
	CUevent work;
	void *p = NULL;
	uint64_t before = epoch_markers();

	assert_true(set_delay && complete_all && event_create && event_record && event_destroy);
	expect_u64_eq(before, 1); /* the legacy stream only */
	assert_int_eq(cu.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(api.device_alloc(4096, 0, (struct CUstream_st *)s, &p), 0);
	expect_int_eq(api.device_free(p, 0, (struct CUstream_st *)s), 0);
	expect_u64_eq(epoch_markers(), 1); /* s is idle */
	assert_int_eq(event_create(&work, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	set_delay(1000000);
	assert_int_eq(event_record(work, s), CUDA_SUCCESS);
	expect_u64_eq(epoch_markers(), 2); /* and one on the busy stream */
	set_delay(0);
	complete_all();
	expect_int_eq(event_destroy(work), CUDA_SUCCESS);
	/* The stream is left alive, as PyTorch's are. */
}
TEST_END

/* An allocation on a capturing stream is the driver's (a graph memory node),
 * with or without the preload (then libemm asks the driver); a pool block
 * freed on a capturing stream is kept, not reused while the graph lives. */
TEST_BEGIN(test_capture)
{
	__typeof__(&cuStreamBeginCapture_v2) begin = SYM(libcuda, cuStreamBeginCapture_v2);
	__typeof__(&cuStreamEndCapture) end = SYM(libcuda, cuStreamEndCapture);
	__typeof__(&cuGraphDestroy) destroy = SYM(libcuda, cuGraphDestroy);
	struct emm_stats s0, s1;
	void *p = NULL, *q = NULL, *r = NULL;
	CUstream s;
	CUgraph g = NULL;

	assert_int_eq(cu.stream_create(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(api.device_alloc(4096, 0, (struct CUstream_st *)s, &q), 0); /* a pool block */
	assert_int_eq(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
	s0 = stats();
	assert_int_eq(api.device_alloc(4096, 0, (struct CUstream_st *)s, &p), 0);
	s1 = stats();
	expect_u64_eq(s1.allocs, s0.allocs); /* not the pool's */
	expect_int_eq(api.device_free(p, 0, (struct CUstream_st *)s), 0);
	expect_int_eq(api.device_free(q, 0, (struct CUstream_st *)s), 0); /* kept */
	assert_int_eq(end(s, &g), CUDA_SUCCESS);
	expect_int_eq(destroy(g), CUDA_SUCCESS);
	/* q is not handed out again (without the preload: ever; with it, the
	 * quarantine may release it once the graph is gone) */
	assert_int_eq(api.device_alloc(4096, 0, (struct CUstream_st *)s, &r), 0);
	if (!preloaded())
		expect_true(r != q);
	expect_int_eq(api.device_free(r, 0, (struct CUstream_st *)s), 0);
}
TEST_END

/* A pointer the driver handed out goes back to the driver; the program's
 * own driver calls reach libemm only under the preload, and then the two
 * doors share one heap. */
TEST_BEGIN(test_foreign_and_one_heap)
{
	struct emm_stats s0 = stats(), s1;
	CUdeviceptr d = 0;
	void *p = NULL;

	assert_int_eq(cu.mem_alloc(&d, 65536), CUDA_SUCCESS);
	s1 = stats();
	if (preloaded()) {
		/* served by the pool through the shim ... */
		expect_u64_eq(s1.allocs - s0.allocs, 1);
		/* ... and freed through the door into the same heap */
		expect_int_eq(api.device_free((void *)(uintptr_t)d, 0, EMM_STREAM_NONE), 0);
		expect_u64_eq(stats().frees - s1.frees, 1);
		expect_u64_eq(stats().passthrough_frees, s0.passthrough_frees);
		/* the door's block freed by cuMemFree's shim */
		assert_int_eq(api.device_alloc(65536, 0, NULL, &p), 0);
		expect_int_eq(cu.mem_free((CUdeviceptr)(uintptr_t)p), CUDA_SUCCESS);
		expect_u64_eq(stats().live_blocks, s0.live_blocks);
		/* one library: the preloaded copy's functions are the door's */
		expect_ptr_eq(dlsym(RTLD_DEFAULT, "emm_stats_get"), (void *)api.stats_get);
	} else {
		/* libemm saw nothing of it ... */
		expect_u64_eq(s1.allocs, s0.allocs);
		expect_u64_eq(s1.passthrough_allocs, s0.passthrough_allocs);
		/* ... and hands it to the driver when freed through the door */
		expect_int_eq(api.device_free((void *)(uintptr_t)d, 0, EMM_STREAM_NONE), 0);
		expect_u64_eq(stats().passthrough_frees - s1.passthrough_frees, 1);
		expect_int_eq(cu.mem_free(d), CUDA_ERROR_INVALID_VALUE); /* really freed */
	}
}
TEST_END

TEST_BEGIN(test_host)
{
	char *p = NULL;
	struct emm_stats s0 = {.struct_size = sizeof(s0)}, s1 = {.struct_size = sizeof(s1)};

	api.stats_get(-2, &s0);
	assert_int_eq(api.host_alloc(100000, 0, (void **)&p), 0);
	memset(p, 1, 100000);
	api.stats_get(-2, &s1);
	expect_u64_eq(s1.allocs - s0.allocs, 1);
	expect_int_eq(api.host_free(p), 0);
	expect_int_eq(api.host_free(p), -EINVAL);
	expect_int_eq(api.host_alloc(0, 0, (void **)&p), -EINVAL);
}
TEST_END

TEST_BEGIN(test_mem_info)
{
	size_t f = 0, t = 0, f2 = 0, t2 = 0;
	void *p = NULL;

	assert_int_eq(api.mem_info(0, &f, &t), 0);
	expect_u64_eq(t, (uint64_t)1 << 30); /* FAKECUDA_MEM_CAPACITY */
	expect_true(f <= t);
	/* A block handed out and freed: its segment stays reserved but idle,
	 * and idle cache counts as free. */
	assert_int_eq(api.device_alloc(32 << 20, 0, NULL, &p), 0);
	assert_int_eq(api.mem_info(0, &f2, &t2), 0);
	expect_true(f2 + (32 << 20) <= f);
	expect_int_eq(api.device_free(p, 0, NULL), 0);
	assert_int_eq(api.mem_info(-1, &f2, &t2), 0);
	expect_u64_eq(f2, f);
}
TEST_END

/* A thread with no current context: the device's primary context is made
 * current around the call and is not left current after it. */
static void *contextless(void *arg)
{
	__typeof__(&cuCtxGetCurrent) get_current = SYM(libcuda, cuCtxGetCurrent);
	CUcontext ctx = (CUcontext)arg;
	void *p = NULL;
	int r = api.device_alloc(4096, 0, NULL, &p);

	if (r != 0 || get_current(&ctx) != CUDA_SUCCESS || ctx != NULL || api.device_free(p, 0, NULL) != 0)
		return (void *)1;
	return NULL;
}

/* A door block of 1 MiB belongs to `current`, the current context; freed. */
static void alloc_in_current(CUcontext current)
{
	CUcontext owner = NULL;
	char *p = api.alloc(1 << 20, 0, NULL);

	assert_ptr_not_null(p);
	expect_int_eq(cu.pointer_attribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)p),
	              CUDA_SUCCESS);
	expect_ptr_eq(owner, current);
	api.free(p, 1 << 20, 0, NULL);
}

/* The program makes another context of the same device current, through
 * the driver: without the preload libemm sees no such call, so its
 * per-thread context cache (trusted by default, EMM_CONTEXT_CHECK=off) must
 * not serve the door from the previous context's heap. */
TEST_BEGIN(test_context_switch_unseen)
{
	CUcontext primary = NULL, other = NULL;
	char *p;

	assert_int_eq(cu.get_current(&primary), CUDA_SUCCESS);
	p = api.alloc(1 << 20, 0, NULL);
	assert_ptr_not_null(p);
	api.free(p, 1 << 20, 0, NULL); /* cached in the primary context's heap */
	assert_int_eq(cu.ctx_create(&other, NULL, 0, 0), CUDA_SUCCESS);
	alloc_in_current(other);
	assert_int_eq(cu.set_current(primary), CUDA_SUCCESS);
	alloc_in_current(primary);
}
TEST_END

TEST_BEGIN(test_no_current_context)
{
	pthread_t th;
	void *ret = (void *)2;

	assert_int_eq(pthread_create(&th, NULL, contextless, NULL), 0);
	pthread_join(th, &ret);
	expect_ptr_null(ret);
}
TEST_END

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s dlopen|preload|nodriver LIBEMM\n", argv[0]);
		return 2;
	}
	mode = argv[1];
	libemm = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
	if (!libemm) {
		fprintf(stderr, "dlopen %s: %s\n", argv[2], dlerror());
		return 1;
	}
	api.device_alloc = SYM(libemm, emm_device_alloc);
	api.device_free = SYM(libemm, emm_device_free);
	api.alloc = SYM(libemm, emm_alloc);
	api.free = SYM(libemm, emm_free);
	api.param_alloc = SYM(libemm, emm_param_alloc);
	api.param_free = SYM(libemm, emm_param_free);
	api.host_alloc = SYM(libemm, emm_host_alloc);
	api.host_free = SYM(libemm, emm_host_free);
	api.mem_info = SYM(libemm, emm_mem_info);
	api.stats_get = SYM(libemm, emm_stats_get);
	if (!api.device_alloc || !api.device_free || !api.alloc || !api.free || !api.param_alloc || !api.param_free || !api.host_alloc || !api.host_free ||
	    !api.mem_info || !api.stats_get) {
		fprintf(stderr, "libemm lacks the door's entry points\n");
		return 1;
	}
	if (strcmp(mode, "nodriver") == 0)
		return emm_test_run(test_no_driver, NULL);
	driver_setup();
	return emm_test_run(test_alloc_free_reuse, test_param_door, test_stream_and_none, test_errors, test_foreign_and_one_heap,
	                    test_host, test_mem_info, test_no_current_context, test_nonblocking_stream_fenced,
	                    test_capture, test_context_switch_unseen, NULL);
}
