/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/probe-driver.c - the driver's observable contract, as cases
 * that run against whichever libcuda.so.1 the loader finds: the fake in the
 * unit suite (LD_LIBRARY_PATH=fakecuda_dir), the real driver in the gpu
 * suite. Each expectation is what the real CUDA 13.0 driver (580, H200)
 * answered; the fake must answer the same. README.md tabulates them.
 *
 *   probe-driver            run every case, each in a fresh process
 *   probe-driver CASE...    run these cases in this process
 *   probe-driver --list     list the cases
 *
 * Output: one line per check, "ok" or "FAIL", then a summary line. Exit 0 if
 * every check passed, 1 if one failed, 77 if no driver or no device.
 *
 * The program never links libcuda: it dlopens libcuda.so.1 and dlsyms every
 * entry point by its exported name. cuda.h is read with
 * __CUDA_API_VERSION_INTERNAL so that each exported name (cuMemAlloc,
 * cuMemAlloc_v2, cuGetProcAddress, ...) has its own prototype.
 */
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define DRIVER_FUNCTIONS(X)                                                                   \
	X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                 \
	X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuGetExportTable)                        \
	X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute)                            \
	X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease_v2)                           \
	X(cuDevicePrimaryCtxReset_v2) X(cuDevicePrimaryCtxGetState)                           \
	X(cuCtxCreate) X(cuCtxCreate_v4) X(cuCtxDestroy_v2) X(cuCtxGetCurrent) X(cuCtxSetCurrent)            \
	X(cuCtxPushCurrent_v2) X(cuCtxPopCurrent_v2) X(cuCtxGetDevice) X(cuCtxGetDevice_v2)   \
	X(cuCtxGetId)                                                                         \
	X(cuCtxSynchronize) X(cuCtxSynchronize_v2) X(cuCtxGetStreamPriorityRange)            \
	X(cuMemAlloc) X(cuMemAlloc_v2) X(cuMemFree) X(cuMemFree_v2) X(cuMemAllocPitch_v2) X(cuMemGetInfo)     \
	X(cuMemAllocAsync) X(cuMemFreeAsync) X(cuMemAllocHost_v2) X(cuMemHostAlloc)           \
	X(cuMemFreeHost) X(cuMemHostRegister_v2) X(cuMemHostUnregister) X(cuMemAllocManaged)  \
	X(cuMemGetInfo_v2) X(cuMemGetAddressRange_v2) X(cuPointerGetAttribute)                \
	X(cuPointerGetAttributes) X(cuMemsetD8_v2) X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2)     \
	X(cuMemcpy) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle_v2) X(cuIpcCloseMemHandle)      \
	X(cuStreamCreate) X(cuStreamCreateWithPriority) X(cuStreamDestroy_v2)                 \
	X(cuStreamGetFlags) X(cuStreamGetPriority) X(cuStreamGetCtx) X(cuStreamSynchronize)  \
	X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamBeginCapture)                         \
	X(cuStreamBeginCapture_v2) X(cuStreamEndCapture) X(cuStreamIsCapturing)               \
	X(cuStreamGetCaptureInfo_v3) X(cuThreadExchangeStreamCaptureMode)                     \
	X(cuEventCreate) X(cuEventRecord) X(cuEventRecordWithFlags) X(cuEventQuery)           \
	X(cuEventSynchronize) X(cuEventDestroy_v2) X(cuGraphDestroy)                          \
	X(cuGraphInstantiateWithFlags) X(cuGraphLaunch) X(cuGraphExecDestroy)                 \
	X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemCreate) X(cuMemRelease)             \
	X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess) X(cuMemGetAccess)                         \
	X(cuMemGetAllocationGranularity) X(cuMemGetAllocationPropertiesFromHandle)            \
	X(cuMemRetainAllocationHandle)                                                         \
	X(cuDeviceCanAccessPeer) X(cuCtxEnablePeerAccess) X(cuCtxDisablePeerAccess)            \
	X(cuMemcpyPeer) X(cuMemcpyPeerAsync)

#define DECLARE(name) static __typeof__(name) *p_##name;
DRIVER_FUNCTIONS(DECLARE)
#undef DECLARE

static void *lib;
static const char *self_path;
static const char *case_name = "?";
static int checks, failures;

/* --- reporting --- */

static const char *rc_name(CUresult r)
{
	const char *s = NULL;
	if (p_cuGetErrorName && p_cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
		return s;
	return "?";
}

static void report(bool ok, const char *label, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void report(bool ok, const char *label, const char *fmt, ...)
{
	va_list ap;
	checks++;
	failures += !ok;
	printf("%s %s/%s: ", ok ? "ok  " : "FAIL", case_name, label);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
}

static void check_rc(const char *label, CUresult got, CUresult want)
{
	report(got == want, label, "got %s (%d), want %s (%d)", rc_name(got), (int)got, rc_name(want), (int)want);
}

static void check_u64(const char *label, uint64_t got, uint64_t want)
{
	report(got == want, label, "got %" PRIu64 " (0x%" PRIx64 "), want %" PRIu64, got, got, want);
}

static void check_true(const char *label, bool cond, const char *what)
{
	report(cond, label, "%s", what);
}

static const char *sym_name(void *p)
{
	Dl_info info;
	if (!p)
		return "(null)";
	if (!dladdr(p, &info) || !info.dli_sname)
		return "(unnamed)";
	return info.dli_sname;
}

static void check_name(const char *label, void *p, const char *want)
{
	const char *got = sym_name(p);
	bool ok = want ? strcmp(got, want) == 0 : p == NULL;
	report(ok, label, "got %s, want %s", got, want ? want : "(null)");
}

/* Calls that set up a case must work; if one does not, the case stops. */
#define MUST(call)                                                                  \
	do {                                                                        \
		CUresult r_ = (call);                                               \
		if (r_ != CUDA_SUCCESS) {                                           \
			report(false, #call, "setup failed: %s (%d)", rc_name(r_), (int)r_); \
			return;                                                     \
		}                                                                   \
	} while (0)

#define CALL(name) p_##name

static CUcontext primary;

/* cuInit, the primary context of device 0, current. */
static CUresult setup(void)
{
	CUresult r = CALL(cuInit)(0);
	if (r == CUDA_SUCCESS)
		r = CALL(cuDevicePrimaryCtxRetain)(&primary, 0);
	if (r == CUDA_SUCCESS)
		r = CALL(cuCtxSetCurrent)(primary);
	return r;
}

#define SETUP() MUST(setup())

/* Runs fn on a new thread with the primary context current. */
struct thread_call {
	void (*fn)(void *);
	void *arg;
};

static void *thread_main(void *p)
{
	struct thread_call *tc = p;
	CALL(cuCtxSetCurrent)(primary);
	tc->fn(tc->arg);
	return NULL;
}

static void on_thread(void (*fn)(void *), void *arg)
{
	struct thread_call tc = {fn, arg};
	pthread_t t;
	pthread_create(&t, NULL, thread_main, &tc);
	pthread_join(t, NULL);
}

/* --- cases: initialisation and contexts --- */

static void case_before_init(void)
{
	int v = 0;
	CUdeviceptr p = 0;
	CUcontext c = (CUcontext)1;
	CUevent e;
	int n;
	check_rc("cuDriverGetVersion", CALL(cuDriverGetVersion)(&v), CUDA_SUCCESS);
	check_true("version >= 13000", v >= 13000, "driver version is CUDA 13 or newer");
	check_rc("cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
	check_rc("cuMemFree_v2(0)", CALL(cuMemFree_v2)(0), CUDA_ERROR_NOT_INITIALIZED);
	check_rc("cuDeviceGetCount", CALL(cuDeviceGetCount)(&n), CUDA_ERROR_NOT_INITIALIZED);
	check_rc("cuCtxGetCurrent", CALL(cuCtxGetCurrent)(&c), CUDA_ERROR_NOT_INITIALIZED);
	check_rc("cuEventCreate", CALL(cuEventCreate)(&e, 0), CUDA_ERROR_NOT_INITIALIZED);
	void *fn = NULL;
	CUdriverProcAddressQueryResult st = 99;
	check_rc("cuGetProcAddress_v2", CALL(cuGetProcAddress_v2)("cuMemAlloc", &fn, 13000, 0, &st), CUDA_SUCCESS);
	check_name("cuGetProcAddress_v2 name", fn, "cuMemAlloc_v2");
	const char *s = NULL;
	check_rc("cuGetErrorName", CALL(cuGetErrorName)(CUDA_ERROR_INVALID_VALUE, &s), CUDA_SUCCESS);
	check_true("cuGetErrorName text", s && strcmp(s, "CUDA_ERROR_INVALID_VALUE") == 0, s ? s : "(null)");
	check_rc("cuInit(1)", CALL(cuInit)(1), CUDA_ERROR_INVALID_VALUE);
	check_rc("cuInit(0)", CALL(cuInit)(0), CUDA_SUCCESS);
}

static void case_no_context(void)
{
	MUST(CALL(cuInit)(0));
	CUdeviceptr p = 0;
	size_t f, t;
	CUstream s;
	CUevent e;
	void *h;
	CUcontext c = (CUcontext)1;
	CUdevice d;
	int n = 0;
	check_rc("cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuMemFree_v2(0)", CALL(cuMemFree_v2)(0), CUDA_SUCCESS);
	check_rc("cuMemFreeHost(NULL)", CALL(cuMemFreeHost)(NULL), CUDA_SUCCESS);
	check_rc("cuMemGetInfo_v2", CALL(cuMemGetInfo_v2)(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuStreamCreate", CALL(cuStreamCreate)(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuEventCreate", CALL(cuEventCreate)(&e, 0), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuMemAllocHost_v2", CALL(cuMemAllocHost_v2)(&h, 64), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuCtxGetCurrent", CALL(cuCtxGetCurrent)(&c), CUDA_SUCCESS);
	check_true("current is NULL", c == NULL, "no current context");
	check_rc("cuCtxPopCurrent_v2", CALL(cuCtxPopCurrent_v2)(&c), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuCtxSynchronize", CALL(cuCtxSynchronize)(), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuStreamSynchronize(0)", CALL(cuStreamSynchronize)(NULL), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuDeviceGet(99)", CALL(cuDeviceGet)(&d, 99), CUDA_ERROR_INVALID_DEVICE);
	check_rc("cuDeviceGetCount", CALL(cuDeviceGetCount)(&n), CUDA_SUCCESS);
	check_true("device count", n >= 1, "at least one device");
	check_rc("cuDevicePrimaryCtxRelease_v2 unretained", CALL(cuDevicePrimaryCtxRelease_v2)(0),
		 CUDA_ERROR_INVALID_CONTEXT);
	unsigned flags = 0;
	int active = 1;
	check_rc("cuDevicePrimaryCtxGetState", CALL(cuDevicePrimaryCtxGetState)(0, &flags, &active), CUDA_SUCCESS);
	check_u64("primary not active", (uint64_t)active, 0);
}

static void case_context_stack(void)
{
	SETUP();
	CUcontext c = NULL, cur = NULL, popped = NULL;
	CUdevice d = -1;
	check_rc("cuCtxCreate_v4", CALL(cuCtxCreate_v4)(&c, NULL, 0, 0), CUDA_SUCCESS);
	CALL(cuCtxGetCurrent)(&cur);
	check_true("created is current", cur == c && c != NULL, "cuCtxCreate pushes the new context");
	check_rc("cuCtxGetDevice", CALL(cuCtxGetDevice)(&d), CUDA_SUCCESS);
	check_u64("device", (uint64_t)d, 0);
	check_rc("cuCtxGetDevice_v2(NULL)", CALL(cuCtxGetDevice_v2)(&d, NULL), CUDA_SUCCESS);
	check_rc("cuCtxSynchronize_v2(NULL)", CALL(cuCtxSynchronize_v2)(NULL), CUDA_SUCCESS);
	check_rc("cuCtxPopCurrent_v2", CALL(cuCtxPopCurrent_v2)(&popped), CUDA_SUCCESS);
	check_true("popped the created one", popped == c, "pop returns the top");
	CALL(cuCtxGetCurrent)(&cur);
	check_true("primary current again", cur == primary, "the stack had the primary below");
	check_rc("cuCtxPushCurrent_v2", CALL(cuCtxPushCurrent_v2)(c), CUDA_SUCCESS);
	check_rc("cuCtxDestroy_v2", CALL(cuCtxDestroy_v2)(c), CUDA_SUCCESS);
	CALL(cuCtxGetCurrent)(&cur);
	check_true("destroy pops", cur == primary, "cuCtxDestroy pops the destroyed current context");
	check_rc("cuCtxSetCurrent(NULL)", CALL(cuCtxSetCurrent)(NULL), CUDA_SUCCESS);
	CALL(cuCtxGetCurrent)(&cur);
	check_true("set NULL empties", cur == NULL, "no current context");
}

static void case_ctx_destroy_twice(void)
{
	SETUP();
	CUcontext c = NULL;
	MUST(CALL(cuCtxCreate_v4)(&c, NULL, 0, 0));
	MUST(CALL(cuCtxDestroy_v2)(c));
	/* The real driver (580, H200) answered 709 in a fresh process and 201
	 * after other contexts had come and gone (the stale handle is then no
	 * longer recognised at all): either is the driver's; the fake gives 709. */
	CUresult r = CALL(cuCtxDestroy_v2)(c);
	report(r == CUDA_ERROR_CONTEXT_IS_DESTROYED || r == CUDA_ERROR_INVALID_CONTEXT, "second cuCtxDestroy_v2",
	       "got %s (%d), want CUDA_ERROR_CONTEXT_IS_DESTROYED (709) or CUDA_ERROR_INVALID_CONTEXT (201)",
	       rc_name(r), (int)r);
}

static void case_ctx_destroy_primary(void)
{
	SETUP();
	check_rc("cuCtxDestroy_v2(primary)", CALL(cuCtxDestroy_v2)(primary), CUDA_ERROR_INVALID_CONTEXT);
}

static void case_ctx_destroy_frees(void)
{
	SETUP();
	CUcontext c = NULL;
	CUdeviceptr p = 0;
	MUST(CALL(cuCtxCreate_v4)(&c, NULL, 0, 0));
	MUST(CALL(cuMemAlloc_v2)(&p, 4096));
	MUST(CALL(cuCtxDestroy_v2)(c));
	CUcontext cur = NULL;
	CALL(cuCtxGetCurrent)(&cur);
	check_true("primary current", cur == primary, "back to the primary context");
	check_rc("cuMemFree_v2 of a destroyed context's memory", CALL(cuMemFree_v2)(p), CUDA_ERROR_INVALID_VALUE);
	size_t size = 0;
	CUdeviceptr base = 0;
	check_rc("cuMemGetAddressRange_v2 of it", CALL(cuMemGetAddressRange_v2)(&base, &size, p),
		 CUDA_ERROR_NOT_FOUND);
}

static void case_primary_refcount(void)
{
	MUST(CALL(cuInit)(0));
	CUcontext a = NULL, b = NULL;
	MUST(CALL(cuDevicePrimaryCtxRetain)(&a, 0));
	MUST(CALL(cuDevicePrimaryCtxRetain)(&b, 0));
	check_true("same handle", a == b && a != NULL, "the primary context is one per device");
	unsigned flags;
	int active = 0;
	CALL(cuDevicePrimaryCtxGetState)(0, &flags, &active);
	check_u64("active", (uint64_t)active, 1);
	check_rc("release 1", CALL(cuDevicePrimaryCtxRelease_v2)(0), CUDA_SUCCESS);
	check_rc("release 2", CALL(cuDevicePrimaryCtxRelease_v2)(0), CUDA_SUCCESS);
	check_rc("release 3", CALL(cuDevicePrimaryCtxRelease_v2)(0), CUDA_ERROR_INVALID_CONTEXT);
	CALL(cuDevicePrimaryCtxGetState)(0, &flags, &active);
	check_u64("inactive", (uint64_t)active, 0);
}

/* Resetting kills the handle: calls with it current answer 709; the next
 * retain gives a live context. */
static void case_primary_reset(void)
{
	SETUP();
	CUdeviceptr p = 0, q = 0;
	CUcontext a = primary, b = NULL, cur = NULL;
	MUST(CALL(cuMemAlloc_v2)(&p, 4096));
	check_rc("cuDevicePrimaryCtxReset_v2", CALL(cuDevicePrimaryCtxReset_v2)(0), CUDA_SUCCESS);
	unsigned flags;
	int active = 9;
	CALL(cuDevicePrimaryCtxGetState)(0, &flags, &active);
	check_u64("inactive after reset", (uint64_t)active, 0);
	CALL(cuCtxGetCurrent)(&cur);
	check_true("handle still current", cur == a, "reset leaves the thread's stack alone");
	check_rc("cuMemFree_v2 after reset", CALL(cuMemFree_v2)(p), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	check_rc("cuMemAlloc_v2 after reset", CALL(cuMemAlloc_v2)(&q, 4096), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	check_rc("retain after reset", CALL(cuDevicePrimaryCtxRetain)(&b, 0), CUDA_SUCCESS);
	check_true("same handle after reset", b == a, "the primary context keeps its handle");
	CALL(cuDevicePrimaryCtxGetState)(0, &flags, &active);
	check_u64("active again", (uint64_t)active, 1);
	check_rc("set current", CALL(cuCtxSetCurrent)(b), CUDA_SUCCESS);
	check_rc("cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&q, 4096), CUDA_SUCCESS);
	check_rc("cuMemFree_v2", CALL(cuMemFree_v2)(q), CUDA_SUCCESS);
	check_rc("cuMemFree_v2 of memory from before the reset", CALL(cuMemFree_v2)(p), CUDA_ERROR_INVALID_VALUE);
	check_rc("release 1", CALL(cuDevicePrimaryCtxRelease_v2)(0), CUDA_SUCCESS);
	check_rc("release 2", CALL(cuDevicePrimaryCtxRelease_v2)(0), CUDA_SUCCESS);
	check_rc("release 3", CALL(cuDevicePrimaryCtxRelease_v2)(0), CUDA_ERROR_INVALID_CONTEXT);
}

/* cuCtxGetId: unique per context, and a reset primary context comes back
 * as a new context (new id) under the same handle: libemm keys its heaps by
 * the id because cudaDeviceReset resets without calling any shim. */
static void case_ctx_id(void)
{
	MUST(CALL(cuInit)(0));
	unsigned long long id0 = 0, id1 = 0, id2 = 0, idc = 0, idn = 0;
	CUcontext cur = NULL;
	CALL(cuCtxGetCurrent)(&cur);
	if (cur == NULL)
		check_rc("cuCtxGetId(NULL) without a current context", CALL(cuCtxGetId)(NULL, &idn),
			 CUDA_ERROR_INVALID_CONTEXT);
	SETUP();
	check_rc("cuCtxGetId(NULL, NULL)", CALL(cuCtxGetId)(NULL, NULL), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuCtxGetId)(primary, &id0));
	MUST(CALL(cuCtxGetId)(NULL, &idn));
	check_u64("cuCtxGetId(NULL) is the current context's", idn, id0);
	CUcontext c = NULL;
	MUST(CALL(cuCtxCreate_v4)(&c, NULL, 0, 0));
	MUST(CALL(cuCtxGetId)(c, &idc));
	check_true("created context: another id", idc != id0 && idc != 0, "ids are unique");
	MUST(CALL(cuCtxDestroy_v2)(c));
	check_rc("cuCtxGetId of a destroyed context", CALL(cuCtxGetId)(c, &idn), CUDA_ERROR_CONTEXT_IS_DESTROYED);
	MUST(CALL(cuCtxSetCurrent)(primary));
	MUST(CALL(cuDevicePrimaryCtxReset_v2)(0));
	check_rc("cuCtxGetId(NULL) with the reset primary context current", CALL(cuCtxGetId)(NULL, &id1),
		 CUDA_ERROR_CONTEXT_IS_DESTROYED);
	CUcontext b = NULL;
	MUST(CALL(cuDevicePrimaryCtxRetain)(&b, 0));
	check_true("same handle after reset", b == primary, "the primary context keeps its handle");
	MUST(CALL(cuCtxGetId)(b, &id2));
	printf("info ctx_id: primary id %llu before the reset, %llu after; created context %llu\n", id0, id2, idc);
	check_true("new id after reset", id2 != id0 && id2 != 0 && id2 != idc,
		   "a reset primary context is a new context");
	MUST(CALL(cuCtxGetId)(NULL, &idn));
	check_u64("cuCtxGetId(NULL) after retain", idn, id2);
}

/* Releasing the last reference resets the context; retaining again. */
static void case_primary_release_reuse(void)
{
	SETUP();
	CUdeviceptr q = 0;
	CUcontext a = primary, b = NULL;
	MUST(CALL(cuDevicePrimaryCtxRelease_v2)(0));
	check_rc("cuMemAlloc_v2 with the released context current", CALL(cuMemAlloc_v2)(&q, 4096),
		 CUDA_ERROR_CONTEXT_IS_DESTROYED);
	check_rc("retain again", CALL(cuDevicePrimaryCtxRetain)(&b, 0), CUDA_SUCCESS);
	check_true("same handle", b == a, "the primary context keeps its handle");
	check_rc("cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&q, 4096), CUDA_SUCCESS);
	check_rc("cuMemFree_v2", CALL(cuMemFree_v2)(q), CUDA_SUCCESS);
}

/* --- cases: device memory --- */

static void case_mem_alloc_free(void)
{
	SETUP();
	CUdeviceptr p = 0, base = 0;
	size_t size = 0;
	char *host = malloc(4096);
	check_rc("size 0", CALL(cuMemAlloc_v2)(&p, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("NULL dptr", CALL(cuMemAlloc_v2)(NULL, 16), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemAlloc_v2)(&p, 1000));
	check_u64("aligned to 256", p & 255, 0);
	check_rc("range of interior", CALL(cuMemGetAddressRange_v2)(&base, &size, p + 100), CUDA_SUCCESS);
	check_u64("range base", base, p);
	check_u64("range size", size, 1000);
	check_rc("range NULL outputs", CALL(cuMemGetAddressRange_v2)(NULL, NULL, p), CUDA_SUCCESS);
	check_rc("free interior", CALL(cuMemFree_v2)(p + 16), CUDA_ERROR_INVALID_VALUE);
	check_rc("free host pointer", CALL(cuMemFree_v2)((CUdeviceptr)(uintptr_t)host), CUDA_ERROR_INVALID_VALUE);
	check_rc("free 0", CALL(cuMemFree_v2)(0), CUDA_SUCCESS);
	check_rc("free", CALL(cuMemFree_v2)(p), CUDA_SUCCESS);
	check_rc("double free", CALL(cuMemFree_v2)(p), CUDA_ERROR_INVALID_VALUE);
	check_rc("range of freed", CALL(cuMemGetAddressRange_v2)(&base, &size, p), CUDA_ERROR_NOT_FOUND);
	check_rc("range of host", CALL(cuMemGetAddressRange_v2)(&base, &size, (CUdeviceptr)(uintptr_t)host),
		 CUDA_ERROR_NOT_FOUND);
	check_rc("1 PiB", CALL(cuMemAlloc_v2)(&p, (size_t)1 << 50), CUDA_ERROR_OUT_OF_MEMORY);
	free(host);
}

static void case_mem_info(void)
{
	SETUP();
	size_t f0 = 0, t0 = 0, f1 = 0, t1 = 0;
	CUdeviceptr p = 0;
	check_rc("NULL free", CALL(cuMemGetInfo_v2)(NULL, &t0), CUDA_SUCCESS);
	check_rc("NULL total", CALL(cuMemGetInfo_v2)(&f0, NULL), CUDA_SUCCESS);
	check_rc("both NULL", CALL(cuMemGetInfo_v2)(NULL, NULL), CUDA_SUCCESS);
	MUST(CALL(cuMemGetInfo_v2)(&f0, &t0));
	check_true("free <= total", f0 <= t0 && t0 > 0, "sane numbers");
	MUST(CALL(cuMemAlloc_v2)(&p, (size_t)64 << 20));
	MUST(CALL(cuMemGetInfo_v2)(&f1, &t1));
	check_u64("total unchanged", t1, t0);
	check_true("free dropped by >= 64 MiB", f0 - f1 >= ((size_t)64 << 20), "allocation is visible");
	MUST(CALL(cuMemFree_v2)(p));
}

static void case_mem_pitch(void)
{
	SETUP();
	CUdeviceptr p = 0;
	size_t pitch = 0;
	check_rc("element size 3", CALL(cuMemAllocPitch_v2)(&p, &pitch, 100, 10, 3), CUDA_ERROR_INVALID_VALUE);
	check_rc("width 0", CALL(cuMemAllocPitch_v2)(&p, &pitch, 0, 10, 4), CUDA_ERROR_INVALID_VALUE);
	check_rc("height 0", CALL(cuMemAllocPitch_v2)(&p, &pitch, 100, 0, 4), CUDA_ERROR_INVALID_VALUE);
	check_rc("pitched", CALL(cuMemAllocPitch_v2)(&p, &pitch, 100, 10, 4), CUDA_SUCCESS);
	check_u64("pitch", pitch, 512);
	CUdeviceptr base = 0;
	size_t size = 0;
	check_rc("range", CALL(cuMemGetAddressRange_v2)(&base, &size, p), CUDA_SUCCESS);
	check_u64("range size", size, 5120);
	check_rc("free", CALL(cuMemFree_v2)(p), CUDA_SUCCESS);
}

/* The CUDA 2.0 ABI (32-bit sizes and pointers) is refused in a context made
 * by the current API. */
static void case_mem_v1(void)
{
	SETUP();
	check_true("distinct entry points", (void *)p_cuMemAlloc != (void *)p_cuMemAlloc_v2,
		   "cuMemAlloc and cuMemAlloc_v2 are different functions");
	CUdeviceptr_v1 p32 = 0;
	unsigned f32 = 0, t32 = 0;
	check_rc("cuMemAlloc (v1)", CALL(cuMemAlloc)(&p32, 1024), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuMemFree (v1) of 0", CALL(cuMemFree)(0), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuMemGetInfo (v1)", CALL(cuMemGetInfo)(&f32, &t32), CUDA_ERROR_INVALID_CONTEXT);
}

static void case_mem_v1_context(void)
{
	MUST(CALL(cuInit)(0));
	CUcontext c = NULL;
	CUdeviceptr_v1 p32 = 0;
	CUdeviceptr p = 0;
	check_rc("cuCtxCreate (v1)", CALL(cuCtxCreate)(&c, 0, 0), CUDA_SUCCESS);
	check_rc("cuMemAlloc (v1) in it", CALL(cuMemAlloc)(&p32, 1024), CUDA_SUCCESS);
	check_true("32-bit pointer", p32 != 0, "a pointer");
	check_rc("cuMemFree (v1)", CALL(cuMemFree)(p32), CUDA_SUCCESS);
	check_rc("cuMemAlloc_v2 in it", CALL(cuMemAlloc_v2)(&p, 1024), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("cuMemFree_v2 in it", CALL(cuMemFree_v2)(p + 256), CUDA_ERROR_INVALID_CONTEXT);
}

static void case_mem_async(void)
{
	SETUP();
	CUstream s;
	CUdeviceptr p = 0, q = 0, base = 0;
	size_t size = 0;
	MUST(CALL(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING));
	p = 1;
	check_rc("size 0", CALL(cuMemAllocAsync)(&p, 0, s), CUDA_SUCCESS);
	check_u64("size 0 gives 0", p, 0);
	check_rc("NULL dptr", CALL(cuMemAllocAsync)(NULL, 16, s), CUDA_ERROR_INVALID_VALUE);
	check_rc("alloc", CALL(cuMemAllocAsync)(&p, 1024, s), CUDA_SUCCESS);
	check_rc("range", CALL(cuMemGetAddressRange_v2)(&base, &size, p + 8), CUDA_SUCCESS);
	check_u64("range base", base, p);
	int ipc = -1;
	check_rc("IPC capable attr", CALL(cuPointerGetAttribute)(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p),
		 CUDA_SUCCESS);
	check_u64("not IPC capable", (uint64_t)ipc, 0);
	CUipcMemHandle h;
	check_rc("cuIpcGetMemHandle", CALL(cuIpcGetMemHandle)(&h, p), CUDA_ERROR_INVALID_VALUE);
	check_rc("free async", CALL(cuMemFreeAsync)(p, s), CUDA_SUCCESS);
	MUST(CALL(cuStreamSynchronize)(s));
	check_rc("free async again", CALL(cuMemFreeAsync)(p, s), CUDA_ERROR_INVALID_VALUE);
	check_rc("free async 0", CALL(cuMemFreeAsync)(0, s), CUDA_SUCCESS);
	MUST(CALL(cuMemAlloc_v2)(&q, 1024));
	check_rc("free async of cuMemAlloc memory", CALL(cuMemFreeAsync)(q, s), CUDA_SUCCESS);
	MUST(CALL(cuStreamSynchronize)(s));
	MUST(CALL(cuMemAllocAsync)(&p, 1024, s));
	check_rc("cuMemFree_v2 of async memory", CALL(cuMemFree_v2)(p), CUDA_SUCCESS);
	check_rc("legacy stream", CALL(cuMemAllocAsync)(&p, 1024, NULL), CUDA_SUCCESS);
	check_rc("free on per-thread stream", CALL(cuMemFreeAsync)(p, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
	MUST(CALL(cuCtxSynchronize)());
	MUST(CALL(cuStreamDestroy_v2)(s));
}

static void case_mem_host(void)
{
	SETUP();
	void *h = NULL;
	CUdeviceptr d = 0;
	char *buf = aligned_alloc(4096, 4 * 4096);
	check_rc("cuMemHostAlloc bad flags", CALL(cuMemHostAlloc)(&h, 4096, 0x80), CUDA_ERROR_INVALID_VALUE);
	check_rc("cuMemHostAlloc", CALL(cuMemHostAlloc)(&h, 4096, 0), CUDA_SUCCESS);
	unsigned mt = 0;
	check_rc("memory type", CALL(cuPointerGetAttribute)(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)h),
		 CUDA_SUCCESS);
	check_u64("memory type host", mt, CU_MEMORYTYPE_HOST);
	check_rc("free interior", CALL(cuMemFreeHost)((char *)h + 8), CUDA_ERROR_INVALID_VALUE);
	check_rc("free malloc memory", CALL(cuMemFreeHost)(buf), CUDA_ERROR_INVALID_VALUE);
	check_rc("free NULL", CALL(cuMemFreeHost)(NULL), CUDA_SUCCESS);
	check_rc("free", CALL(cuMemFreeHost)(h), CUDA_SUCCESS);
	check_rc("double free", CALL(cuMemFreeHost)(h), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemAlloc_v2)(&d, 4096));
	check_rc("free device memory", CALL(cuMemFreeHost)((void *)(uintptr_t)d), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemFree_v2)(d));
	check_rc("cuMemAllocHost_v2", CALL(cuMemAllocHost_v2)(&h, 100), CUDA_SUCCESS);
	CUdeviceptr hb = 0;
	size_t hs = 0;
	check_rc("address range of pinned memory", CALL(cuMemGetAddressRange_v2)(&hb, &hs, (CUdeviceptr)(uintptr_t)h + 8),
		 CUDA_SUCCESS);
	check_u64("pinned base", hb, (CUdeviceptr)(uintptr_t)h);
	check_u64("pinned size", hs, 100);
	check_rc("free it", CALL(cuMemFreeHost)(h), CUDA_SUCCESS);
	check_rc("register", CALL(cuMemHostRegister_v2)(buf, 2 * 4096, 0), CUDA_SUCCESS);
	check_rc("register again", CALL(cuMemHostRegister_v2)(buf, 2 * 4096, 0),
		 CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	check_rc("register overlapping", CALL(cuMemHostRegister_v2)(buf + 4096, 2 * 4096, 0),
		 CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
	check_rc("unregister interior", CALL(cuMemHostUnregister)(buf + 4096), CUDA_ERROR_INVALID_VALUE);
	check_rc("unregister never registered", CALL(cuMemHostUnregister)(buf + 3 * 4096),
		 CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	check_rc("unregister", CALL(cuMemHostUnregister)(buf), CUDA_SUCCESS);
	check_rc("unregister again", CALL(cuMemHostUnregister)(buf), CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
	check_rc("unregister NULL", CALL(cuMemHostUnregister)(NULL), CUDA_ERROR_INVALID_VALUE);
	check_rc("register NULL", CALL(cuMemHostRegister_v2)(NULL, 4096, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("register 0 bytes", CALL(cuMemHostRegister_v2)(buf, 0, 0), CUDA_ERROR_INVALID_VALUE);
	free(buf);
}

static void case_mem_host_zero(void)
{
	SETUP();
	void *h = (void *)1;
	check_rc("cuMemAllocHost_v2 0 bytes", CALL(cuMemAllocHost_v2)(&h, 0), CUDA_SUCCESS);
	check_true("NULL for 0 bytes", h == NULL, "no memory for 0 bytes");
}

static void case_mem_managed(void)
{
	SETUP();
	CUdeviceptr p = 0;
	check_rc("flags 0", CALL(cuMemAllocManaged)(&p, 4096, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("size 0", CALL(cuMemAllocManaged)(&p, 0, CU_MEM_ATTACH_GLOBAL), CUDA_ERROR_INVALID_VALUE);
	check_rc("alloc", CALL(cuMemAllocManaged)(&p, 4096, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
	unsigned mt = 0, managed = 0;
	check_rc("memory type", CALL(cuPointerGetAttribute)(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CUDA_SUCCESS);
	check_u64("memory type device", mt, CU_MEMORYTYPE_DEVICE);
	check_rc("is managed", CALL(cuPointerGetAttribute)(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p), CUDA_SUCCESS);
	check_u64("managed", managed, 1);
	CUdeviceptr base = 0;
	size_t size = 0;
	check_rc("range", CALL(cuMemGetAddressRange_v2)(&base, &size, p + 4), CUDA_SUCCESS);
	check_u64("range size", size, 4096);
	check_rc("free", CALL(cuMemFree_v2)(p), CUDA_SUCCESS);
}

static void case_pointer_attributes(void)
{
	SETUP();
	CUdeviceptr p = 0, q = 0;
	MUST(CALL(cuMemAlloc_v2)(&p, 1000));
	MUST(CALL(cuMemAlloc_v2)(&q, 1000));
	CUcontext c = NULL;
	unsigned mt = 0, managed = 9;
	CUdeviceptr dp = 0, start = 0;
	void *hp = (void *)1;
	unsigned long long id1 = 0, id2 = 0;
	int ord = -1, ipc = -1, mapped = -1;
	size_t rsize = 0;
	check_rc("CONTEXT", CALL(cuPointerGetAttribute)(&c, CU_POINTER_ATTRIBUTE_CONTEXT, p + 8), CUDA_SUCCESS);
	check_true("context", c == primary, "allocating context");
	check_rc("MEMORY_TYPE", CALL(cuPointerGetAttribute)(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p + 8), CUDA_SUCCESS);
	check_u64("memory type", mt, CU_MEMORYTYPE_DEVICE);
	check_rc("DEVICE_POINTER", CALL(cuPointerGetAttribute)(&dp, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, p + 8),
		 CUDA_SUCCESS);
	check_u64("device pointer", dp, p + 8);
	check_rc("HOST_POINTER", CALL(cuPointerGetAttribute)(&hp, CU_POINTER_ATTRIBUTE_HOST_POINTER, p),
		 CUDA_ERROR_INVALID_VALUE);
	check_rc("RANGE_START_ADDR", CALL(cuPointerGetAttribute)(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p + 8),
		 CUDA_SUCCESS);
	check_u64("range start", start, p);
	check_rc("RANGE_SIZE", CALL(cuPointerGetAttribute)(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p + 8),
		 CUDA_SUCCESS);
	check_u64("range size", rsize, 1000);
	check_rc("BUFFER_ID", CALL(cuPointerGetAttribute)(&id1, CU_POINTER_ATTRIBUTE_BUFFER_ID, p), CUDA_SUCCESS);
	CALL(cuPointerGetAttribute)(&id2, CU_POINTER_ATTRIBUTE_BUFFER_ID, q);
	check_true("buffer ids differ", id1 != id2 && id1 != 0, "unique per allocation");
	check_rc("IS_MANAGED", CALL(cuPointerGetAttribute)(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p), CUDA_SUCCESS);
	check_u64("not managed", managed, 0);
	check_rc("DEVICE_ORDINAL", CALL(cuPointerGetAttribute)(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p),
		 CUDA_SUCCESS);
	check_u64("ordinal", (uint64_t)ord, 0);
	check_rc("IS_LEGACY_CUDA_IPC_CAPABLE",
		 CALL(cuPointerGetAttribute)(&ipc, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p), CUDA_SUCCESS);
	check_u64("IPC capable", (uint64_t)ipc, 1);
	check_rc("MAPPED", CALL(cuPointerGetAttribute)(&mapped, CU_POINTER_ATTRIBUTE_MAPPED, p), CUDA_SUCCESS);
	check_u64("mapped", (uint64_t)mapped, 1);
	check_rc("NULL data", CALL(cuPointerGetAttribute)(NULL, CU_POINTER_ATTRIBUTE_CONTEXT, p), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemFree_v2)(q));
	MUST(CALL(cuMemAlloc_v2)(&q, 1000));
	unsigned long long id3 = 0;
	CALL(cuPointerGetAttribute)(&id3, CU_POINTER_ATTRIBUTE_BUFFER_ID, q);
	check_true("buffer id not reused", id3 != id2, "a new allocation gets a new id");

	/* cuPointerGetAttributes: the same values; an unknown pointer gets
	 * defaults and CUDA_SUCCESS. */
	CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_CONTEXT, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
				       CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
				       CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
				       CU_POINTER_ATTRIBUTE_BUFFER_ID};
	CUcontext a_ctx = (CUcontext)1;
	unsigned a_mt = 99, a_managed = 99;
	CUdeviceptr a_start = 1;
	size_t a_size = 1;
	int a_ord = 99;
	unsigned long long a_id = 1;
	void *data[] = {&a_ctx, &a_mt, &a_start, &a_size, &a_managed, &a_ord, &a_id};
	check_rc("cuPointerGetAttributes", CALL(cuPointerGetAttributes)(7, attrs, data, p + 8), CUDA_SUCCESS);
	check_true("context", a_ctx == primary, "allocating context");
	check_u64("memory type", a_mt, CU_MEMORYTYPE_DEVICE);
	check_u64("range start", a_start, p);
	check_u64("range size", a_size, 1000);
	check_u64("buffer id", a_id, id1);
	char *host = malloc(64);
	CUdeviceptr hptr = (CUdeviceptr)(uintptr_t)host;
	check_rc("cuPointerGetAttributes of malloc memory", CALL(cuPointerGetAttributes)(7, attrs, data, hptr),
		 CUDA_SUCCESS);
	/* One attribute at a time over a sentinel: which ones an unknown
	 * pointer writes, and what. */
	static const struct {
		CUpointer_attribute attr;
		int size;        /* bytes the attribute writes */
		int written;     /* 0: left alone */
		long long value;
	} unknown[] = {
		{CU_POINTER_ATTRIBUTE_CONTEXT, 8, 1, 0},
		{CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 4, 1, 0},
		{CU_POINTER_ATTRIBUTE_DEVICE_POINTER, 8, 1, 0},
		{CU_POINTER_ATTRIBUTE_HOST_POINTER, 8, 1, -1}, /* -1: the pointer itself */
		{CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, 4, 1, 0},
		{CU_POINTER_ATTRIBUTE_BUFFER_ID, 8, 1, 0},
		{CU_POINTER_ATTRIBUTE_IS_MANAGED, 4, 1, 0},
		{CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, 4, 1, -2},
		{CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, 8, 0, 0},
		{CU_POINTER_ATTRIBUTE_RANGE_SIZE, 8, 0, 0},
		{CU_POINTER_ATTRIBUTE_MAPPED, 4, 1, 0},
		{CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, 4, 1, 0},
		{CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, 8, 1, 0},
		{CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, 8, 1, 0},
		{CU_POINTER_ATTRIBUTE_IS_HW_DECOMPRESS_CAPABLE, 4, 1, 0},
	};
	for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
		unsigned char buf[8];
		memset(buf, 0xa5, sizeof(buf));
		void *one[1] = {buf};
		CUpointer_attribute at = unknown[i].attr;
		CUresult r = CALL(cuPointerGetAttributes)(1, &at, one, hptr);
		long long v = 0;
		if (unknown[i].size == 4) {
			int32_t x;
			memcpy(&x, buf, 4);
			v = x;
		} else {
			int64_t x;
			memcpy(&x, buf, 8);
			v = x;
		}
		bool written = buf[0] != 0xa5 || buf[1] != 0xa5 || buf[2] != 0xa5 || buf[3] != 0xa5;
		long long want = unknown[i].value == -1 && unknown[i].attr == CU_POINTER_ATTRIBUTE_HOST_POINTER
					 ? (long long)hptr : unknown[i].value;
		bool ok = r == CUDA_SUCCESS && written == (unknown[i].written != 0) && (!written || v == want);
		char label[64];
		snprintf(label, sizeof(label), "unknown pointer attribute %d", (int)at);
		report(ok, label, "%s, %s, value %lld; want %s %lld", rc_name(r), written ? "written" : "left alone", v,
		       unknown[i].written ? "written" : "left alone", want);
	}
	check_rc("cuPointerGetAttribute of malloc memory",
		 CALL(cuPointerGetAttribute)(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, hptr), CUDA_ERROR_INVALID_VALUE);
	check_rc("CONTEXT of malloc memory", CALL(cuPointerGetAttribute)(&c, CU_POINTER_ATTRIBUTE_CONTEXT, hptr),
		 CUDA_ERROR_INVALID_VALUE);
	free(host);
	MUST(CALL(cuMemFree_v2)(p));
	MUST(CALL(cuMemFree_v2)(q));
}

static void case_copies(void)
{
	SETUP();
	CUdeviceptr p = 0;
	unsigned char in[256], out[256];
	for (int i = 0; i < 256; i++)
		in[i] = (unsigned char)i;
	MUST(CALL(cuMemAlloc_v2)(&p, 256));
	check_rc("HtoD", CALL(cuMemcpyHtoD_v2)(p, in, 256), CUDA_SUCCESS);
	memset(out, 0, sizeof(out));
	check_rc("DtoH", CALL(cuMemcpyDtoH_v2)(out, p, 256), CUDA_SUCCESS);
	check_true("round trip", memcmp(in, out, 256) == 0, "bytes come back");
	check_rc("memset", CALL(cuMemsetD8_v2)(p + 16, 0xab, 32), CUDA_SUCCESS);
	check_rc("cuMemcpy DtoH", CALL(cuMemcpy)((CUdeviceptr)(uintptr_t)out, p, 256), CUDA_SUCCESS);
	check_true("memset visible", out[15] == 15 && out[16] == 0xab && out[47] == 0xab && out[48] == 48,
		   "set bytes 16..47");
	check_rc("zero bytes", CALL(cuMemcpyHtoD_v2)(p, in, 0), CUDA_SUCCESS);
	MUST(CALL(cuMemFree_v2)(p));
}

/* Peer access (documented codes, cuda.h): the checks that need one device,
 * then, with two devices that can reach each other, enabling and disabling
 * between the primary contexts of devices 0 and 1 and the peer copies. */
static void case_peer(void)
{
	SETUP();
	CUcontext other = NULL;
	CUdeviceptr a = 0, b = 0;
	unsigned char in[4096], out[4096];
	int n = 0, can = -1;

	check_rc("can access self", CALL(cuDeviceCanAccessPeer)(&can, 0, 0), CUDA_SUCCESS);
	check_u64("can access self value", (uint64_t)can, 0);
	check_rc("can access bad peer", CALL(cuDeviceCanAccessPeer)(&can, 0, 99), CUDA_ERROR_INVALID_DEVICE);
	check_rc("can access bad device", CALL(cuDeviceCanAccessPeer)(&can, 99, 0), CUDA_ERROR_INVALID_DEVICE);
	check_rc("enable NULL", CALL(cuCtxEnablePeerAccess)(NULL, 0), CUDA_ERROR_INVALID_CONTEXT);
	check_rc("enable self", CALL(cuCtxEnablePeerAccess)(primary, 0), CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
	MUST(CALL(cuDeviceGetCount)(&n));
	if (n >= 2)
		MUST(CALL(cuDeviceCanAccessPeer)(&can, 0, 1));
	if (n < 2 || !can) {
		printf("EMM-PARTIAL: ran 1, skipped 1 (peer: %s)\n",
		       n < 2 ? "one device: enable/disable and peer copies not probed"
		             : "devices 0 and 1 cannot access each other");
		return;
	}
	MUST(CALL(cuDevicePrimaryCtxRetain)(&other, 1));
	check_rc("enable flags 1", CALL(cuCtxEnablePeerAccess)(other, 1), CUDA_ERROR_INVALID_VALUE);
	check_rc("disable not enabled", CALL(cuCtxDisablePeerAccess)(other), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
	check_rc("enable", CALL(cuCtxEnablePeerAccess)(other, 0), CUDA_SUCCESS);
	check_rc("enable again", CALL(cuCtxEnablePeerAccess)(other, 0), CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	for (int i = 0; i < 4096; i++)
		in[i] = (unsigned char)(i * 13 + 1);
	MUST(CALL(cuMemAlloc_v2)(&a, sizeof(in)));
	MUST(CALL(cuMemcpyHtoD_v2)(a, in, sizeof(in)));
	MUST(CALL(cuCtxSetCurrent)(other));
	check_rc("enable from the peer", CALL(cuCtxEnablePeerAccess)(primary, 0), CUDA_SUCCESS);
	MUST(CALL(cuMemAlloc_v2)(&b, sizeof(in)));
	check_rc("copy 0 -> 1", CALL(cuMemcpyPeer)(b, other, a, primary, sizeof(in)), CUDA_SUCCESS);
	memset(out, 0, sizeof(out));
	MUST(CALL(cuMemcpyDtoH_v2)(out, b, sizeof(out)));
	check_true("copy 0 -> 1 data", memcmp(in, out, sizeof(in)) == 0, "bytes arrive on device 1");
	MUST(CALL(cuMemsetD8_v2)(b, 0x3c, 100));
	check_rc("copy 1 -> 0 async", CALL(cuMemcpyPeerAsync)(a + 8, primary, b, other, 100, NULL), CUDA_SUCCESS);
	MUST(CALL(cuCtxSynchronize)());
	MUST(CALL(cuCtxSetCurrent)(primary));
	memset(out, 0, sizeof(out));
	MUST(CALL(cuMemcpyDtoH_v2)(out, a, sizeof(out)));
	check_true("copy 1 -> 0 data", out[7] == in[7] && out[8] == 0x3c && out[107] == 0x3c && out[108] == in[108],
		   "bytes 8..107 from device 1");
	check_rc("copy NULL context", CALL(cuMemcpyPeer)(b, NULL, a, primary, 16), CUDA_SUCCESS);
	check_rc("disable", CALL(cuCtxDisablePeerAccess)(other), CUDA_SUCCESS);
	check_rc("disable again", CALL(cuCtxDisablePeerAccess)(other), CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
	MUST(CALL(cuMemFree_v2)(a));
	MUST(CALL(cuMemFree_v2)(b)); /* device 1's memory, device 0 current */
	MUST(CALL(cuDevicePrimaryCtxRelease_v2)(1));
}

/* --- cases: streams and events --- */

static void case_streams(void)
{
	SETUP();
	CUstream s = NULL, t = NULL;
	unsigned flags = 99;
	int prio = 99, least = 99, greatest = 99;
	CUcontext c = NULL;
	check_rc("bad flags", CALL(cuStreamCreate)(&s, 2), CUDA_ERROR_INVALID_VALUE);
	check_rc("non-blocking", CALL(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	check_true("handle aligned", s && ((uintptr_t)s & 7) == 0, "a heap pointer");
	check_rc("get flags", CALL(cuStreamGetFlags)(s, &flags), CUDA_SUCCESS);
	check_u64("flags", flags, CU_STREAM_NON_BLOCKING);
	check_rc("legacy flags", CALL(cuStreamGetFlags)(CU_STREAM_LEGACY, &flags), CUDA_SUCCESS);
	check_u64("legacy flags value", flags, 0);
	check_rc("stream 0 flags", CALL(cuStreamGetFlags)(NULL, &flags), CUDA_SUCCESS);
	check_rc("per-thread flags", CALL(cuStreamGetFlags)(CU_STREAM_PER_THREAD, &flags), CUDA_SUCCESS);
	check_u64("per-thread flags value", flags, 0);
	check_rc("priority range", CALL(cuCtxGetStreamPriorityRange)(&least, &greatest), CUDA_SUCCESS);
	check_rc("priority stream", CALL(cuStreamCreateWithPriority)(&t, 0, -100), CUDA_SUCCESS);
	check_rc("get priority", CALL(cuStreamGetPriority)(t, &prio), CUDA_SUCCESS);
	check_u64("clamped to greatest", (uint64_t)(int64_t)prio, (uint64_t)(int64_t)greatest);
	check_rc("get ctx", CALL(cuStreamGetCtx)(s, &c), CUDA_SUCCESS);
	check_true("stream ctx", c == primary, "the creating context");
	check_rc("query legacy", CALL(cuStreamQuery)(NULL), CUDA_SUCCESS);
	check_rc("sync per-thread", CALL(cuStreamSynchronize)(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
	check_rc("destroy", CALL(cuStreamDestroy_v2)(s), CUDA_SUCCESS);
	check_rc("destroy", CALL(cuStreamDestroy_v2)(t), CUDA_SUCCESS);
}

static void case_stream_destroy_special(void)
{
	SETUP();
	check_rc("destroy stream 0", CALL(cuStreamDestroy_v2)(NULL), CUDA_ERROR_INVALID_HANDLE);
}

static void case_events(void)
{
	SETUP();
	CUevent e = NULL, f = NULL;
	CUstream s;
	MUST(CALL(cuStreamCreate)(&s, 0));
	check_rc("bad flags", CALL(cuEventCreate)(&e, 0x10), CUDA_ERROR_INVALID_VALUE);
	check_rc("interprocess without disable-timing", CALL(cuEventCreate)(&e, CU_EVENT_INTERPROCESS),
		 CUDA_ERROR_INVALID_VALUE);
	check_rc("interprocess", CALL(cuEventCreate)(&f, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
		 CUDA_SUCCESS);
	check_rc("create", CALL(cuEventCreate)(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	check_rc("query unrecorded", CALL(cuEventQuery)(e), CUDA_SUCCESS);
	check_rc("sync unrecorded", CALL(cuEventSynchronize)(e), CUDA_SUCCESS);
	check_rc("record", CALL(cuEventRecord)(e, s), CUDA_SUCCESS);
	check_rc("synchronize", CALL(cuEventSynchronize)(e), CUDA_SUCCESS);
	check_rc("query", CALL(cuEventQuery)(e), CUDA_SUCCESS);
	check_rc("record bad flags", CALL(cuEventRecordWithFlags)(e, s, 2), CUDA_ERROR_INVALID_VALUE);
	check_rc("wait bad flags", CALL(cuStreamWaitEvent)(s, e, 2), CUDA_ERROR_INVALID_VALUE);
	check_rc("wait", CALL(cuStreamWaitEvent)(NULL, e, 0), CUDA_SUCCESS);
	check_rc("record legacy", CALL(cuEventRecord)(e, CU_STREAM_LEGACY), CUDA_SUCCESS);
	check_rc("record per-thread", CALL(cuEventRecord)(e, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
	check_rc("ctx sync", CALL(cuCtxSynchronize)(), CUDA_SUCCESS);
	check_rc("destroy", CALL(cuEventDestroy_v2)(e), CUDA_SUCCESS);
	check_rc("destroy", CALL(cuEventDestroy_v2)(f), CUDA_SUCCESS);
	MUST(CALL(cuStreamDestroy_v2)(s));
}

/* --- cases: stream capture --- */

struct capture_env {
	CUstream s;      /* blocking, captured */
	CUstream nb;     /* non-blocking, not captured */
	CUevent e, e2;
	CUgraph g;
};

static bool capture_setup(struct capture_env *c)
{
	memset(c, 0, sizeof(*c));
	return setup() == CUDA_SUCCESS && CALL(cuStreamCreate)(&c->s, 0) == CUDA_SUCCESS &&
	       CALL(cuStreamCreate)(&c->nb, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS &&
	       CALL(cuEventCreate)(&c->e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS &&
	       CALL(cuEventCreate)(&c->e2, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS;
}

#define CAPTURE_SETUP(c)                                                  \
	struct capture_env c;                                             \
	if (!capture_setup(&c)) {                                         \
		report(false, "setup", "capture setup failed");           \
		return;                                                   \
	}

static void check_status(const char *label, CUstream s, CUstreamCaptureStatus want)
{
	CUstreamCaptureStatus st = 99;
	CUresult r = CALL(cuStreamIsCapturing)(s, &st);
	report(r == CUDA_SUCCESS && st == want, label, "cuStreamIsCapturing: %s, status %d, want %d", rc_name(r),
	       (int)st, (int)want);
}

static void end_and_check(struct capture_env *c, CUresult want)
{
	c->g = (CUgraph)1;
	CUresult r = CALL(cuStreamEndCapture)(c->s, &c->g);
	check_rc("end capture", r, want);
	if (want == CUDA_SUCCESS)
		check_true("graph", c->g != NULL && c->g != (CUgraph)1, "a graph comes back");
	else
		check_true("no graph", c->g == NULL, "NULL graph after an invalidated capture");
	if (r == CUDA_SUCCESS && c->g)
		CALL(cuGraphDestroy)(c->g);
}

static void case_capture_legacy(void)
{
	CAPTURE_SETUP(c);
	check_rc("begin on legacy", CALL(cuStreamBeginCapture_v2)(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
		 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
}

static void case_capture_basic(void)
{
	CAPTURE_SETUP(c);
	check_status("not capturing", c.s, CU_STREAM_CAPTURE_STATUS_NONE);
	check_rc("begin", CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
	check_status("capturing", c.s, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	check_rc("begin again", CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL),
		 CUDA_ERROR_ILLEGAL_STATE);
	CUstreamCaptureStatus st = 99;
	cuuint64_t id = 0;
	CUgraph g = NULL;
	const CUgraphNode *deps = NULL;
	const CUgraphEdgeData *edges = NULL;
	size_t nd = 99;
	check_rc("capture info", CALL(cuStreamGetCaptureInfo_v3)(c.s, &st, &id, &g, &deps, &edges, &nd), CUDA_SUCCESS);
	check_true("capture info values", st == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0 && g != NULL,
		   "active, an id, a graph");
	check_rc("legacy is capturing?", CALL(cuStreamIsCapturing)(NULL, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
	check_status("still capturing", c.s, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	check_status("other stream", c.nb, CU_STREAM_CAPTURE_STATUS_NONE);
	check_rc("record into capture", CALL(cuEventRecord)(c.e, c.s), CUDA_SUCCESS);
	check_rc("record on non-capturing", CALL(cuEventRecord)(c.e2, c.nb), CUDA_SUCCESS);
	check_rc("get info during capture", CALL(cuMemGetInfo_v2)(&nd, &nd), CUDA_SUCCESS);
	end_and_check(&c, CUDA_SUCCESS);
	check_status("ended", c.s, CU_STREAM_CAPTURE_STATUS_NONE);
	check_rc("query event recorded in an ended capture", CALL(cuEventQuery)(c.e), CUDA_ERROR_INVALID_VALUE);
	check_rc("synchronize it", CALL(cuEventSynchronize)(c.e), CUDA_ERROR_INVALID_VALUE);
	check_rc("wait for it", CALL(cuStreamWaitEvent)(c.nb, c.e, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("record it again", CALL(cuEventRecord)(c.e, c.nb), CUDA_SUCCESS);
	check_rc("then query", CALL(cuEventQuery)(c.e), CUDA_SUCCESS);
	check_rc("end without capture", CALL(cuStreamEndCapture)(c.s, &g), CUDA_ERROR_ILLEGAL_STATE);
}

static void case_capture_event_query_relaxed(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	MUST(CALL(cuEventRecord)(c.e, c.s));
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
	MUST(CALL(cuThreadExchangeStreamCaptureMode)(&mode));
	check_u64("previous mode", mode, CU_STREAM_CAPTURE_MODE_GLOBAL);
	check_rc("query captured event", CALL(cuEventQuery)(c.e), CUDA_ERROR_CAPTURED_EVENT);
	check_rc("query other event", CALL(cuEventQuery)(c.e2), CUDA_SUCCESS);
	check_status("the captured-event query invalidated", c.s, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	MUST(CALL(cuThreadExchangeStreamCaptureMode)(&mode));
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_event_query_global(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuEventRecord)(c.e2, c.nb));
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("query uncaptured event", CALL(cuEventQuery)(c.e2), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	check_status("invalidated", c.s, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	check_rc("record after invalidation", CALL(cuEventRecord)(c.e, c.s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_alloc(void)
{
	CAPTURE_SETUP(c);
	CUdeviceptr p = 0;
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&p, 1024), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	check_status("invalidated", c.s, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_free(void)
{
	CAPTURE_SETUP(c);
	CUdeviceptr p = 0;
	MUST(CALL(cuMemAlloc_v2)(&p, 1024));
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuMemFree_v2", CALL(cuMemFree_v2)(p), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	check_rc("memory still there", CALL(cuMemFree_v2)(p), CUDA_SUCCESS);
}

static void case_capture_host_alloc(void)
{
	CAPTURE_SETUP(c);
	void *h = NULL;
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuMemAllocHost_v2", CALL(cuMemAllocHost_v2)(&h, 1024), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_relaxed(void)
{
	CAPTURE_SETUP(c);
	CUdeviceptr p = 0;
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_RELAXED));
	check_rc("cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&p, 1024), CUDA_SUCCESS);
	check_rc("cuMemFree_v2", CALL(cuMemFree_v2)(p), CUDA_SUCCESS);
	check_rc("query uncaptured event", CALL(cuEventQuery)(c.e2), CUDA_SUCCESS);
	end_and_check(&c, CUDA_SUCCESS);
}

static void alloc_free_on_thread(void *arg)
{
	CUresult *out = arg;
	CUdeviceptr p = 0;
	out[0] = CALL(cuMemAlloc_v2)(&p, 1024);
	out[1] = out[0] == CUDA_SUCCESS ? CALL(cuMemFree_v2)(p) : CUDA_SUCCESS;
}

static void case_capture_thread_local(void)
{
	CAPTURE_SETUP(c);
	CUresult r[2];
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
	on_thread(alloc_free_on_thread, r);
	check_rc("other thread cuMemAlloc_v2", r[0], CUDA_SUCCESS);
	check_rc("other thread cuMemFree_v2", r[1], CUDA_SUCCESS);
	CUdeviceptr p = 0;
	check_rc("own thread cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&p, 1024), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_global_other_thread(void)
{
	CAPTURE_SETUP(c);
	CUresult r[2];
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	on_thread(alloc_free_on_thread, r);
	check_rc("other thread cuMemAlloc_v2", r[0], CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

/* cuStreamBeginCapture (v1) captures in relaxed mode. */
static void case_capture_v1_mode(void)
{
	CAPTURE_SETUP(c);
	CUresult r[2];
	MUST(CALL(cuStreamBeginCapture)(c.s));
	on_thread(alloc_free_on_thread, r);
	check_rc("other thread cuMemAlloc_v2", r[0], CUDA_SUCCESS);
	CUdeviceptr p = 0;
	check_rc("own thread cuMemAlloc_v2", CALL(cuMemAlloc_v2)(&p, 1024), CUDA_SUCCESS);
	check_rc("own thread cuMemFree_v2", CALL(cuMemFree_v2)(p), CUDA_SUCCESS);
	end_and_check(&c, CUDA_SUCCESS);
}

static void end_on_thread(void *arg)
{
	struct capture_env *c = arg;
	CUgraph g = NULL;
	check_rc("end from another thread", CALL(cuStreamEndCapture)(c->s, &g), CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
}

static void case_capture_wrong_thread(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	on_thread(end_on_thread, &c);
	check_status("the refused end still ended it", c.s, CU_STREAM_CAPTURE_STATUS_NONE);
	CUgraph g = NULL;
	check_rc("end again", CALL(cuStreamEndCapture)(c.s, &g), CUDA_ERROR_ILLEGAL_STATE);
}

static void case_capture_async(void)
{
	CAPTURE_SETUP(c);
	CUdeviceptr p = 0, q = 0;
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuMemAllocAsync on capturing stream", CALL(cuMemAllocAsync)(&p, 1024, c.s), CUDA_SUCCESS);
	check_rc("cuMemFreeAsync on capturing stream", CALL(cuMemFreeAsync)(p, c.s), CUDA_SUCCESS);
	check_status("still capturing", c.s, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	c.g = NULL;
	MUST(CALL(cuStreamEndCapture)(c.s, &c.g));
	CUgraphExec x = NULL;
	check_rc("instantiate", CALL(cuGraphInstantiateWithFlags)(&x, c.g, 0), CUDA_SUCCESS);
	check_rc("launch", CALL(cuGraphLaunch)(x, c.s), CUDA_SUCCESS);
	check_rc("sync", CALL(cuStreamSynchronize)(c.s), CUDA_SUCCESS);
	check_rc("exec destroy", CALL(cuGraphExecDestroy)(x), CUDA_SUCCESS);
	check_rc("graph destroy", CALL(cuGraphDestroy)(c.g), CUDA_SUCCESS);
	(void)q;
}

/* Stream-ordered calls on a stream that is not capturing are unsafe. */
static void case_capture_async_other_stream(void)
{
	CAPTURE_SETUP(c);
	CUdeviceptr q = 0;
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuMemAllocAsync on another stream", CALL(cuMemAllocAsync)(&q, 1024, c.nb),
		 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	check_status("invalidated", c.s, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_free_async_other_stream(void)
{
	CAPTURE_SETUP(c);
	CUdeviceptr q = 0;
	MUST(CALL(cuMemAllocAsync)(&q, 1024, c.nb));
	MUST(CALL(cuStreamSynchronize)(c.nb));
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuMemFreeAsync on another stream", CALL(cuMemFreeAsync)(q, c.nb),
		 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	check_rc("free it now", CALL(cuMemFreeAsync)(q, c.nb), CUDA_SUCCESS);
	MUST(CALL(cuStreamSynchronize)(c.nb));
}

/* What other calls do during a global capture on another stream. */
static void case_capture_other_calls(void)
{
	CAPTURE_SETUP(c);
	CUstream s2 = NULL;
	CUevent e3 = NULL;
	unsigned mt = 0;
	CUdeviceptr p = 0;
	MUST(CALL(cuMemAlloc_v2)(&p, 1024));
	MUST(CALL(cuEventRecord)(c.e2, c.nb));
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuStreamCreate", CALL(cuStreamCreate)(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	check_rc("cuEventCreate", CALL(cuEventCreate)(&e3, 0), CUDA_SUCCESS);
	check_rc("cuPointerGetAttribute", CALL(cuPointerGetAttribute)(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p),
		 CUDA_SUCCESS);
	check_rc("record on a non-capturing stream", CALL(cuEventRecord)(e3, s2), CUDA_SUCCESS);
	check_rc("wait between non-capturing streams", CALL(cuStreamWaitEvent)(s2, c.e2, 0), CUDA_SUCCESS);
	check_status("still capturing", c.s, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	check_rc("cuStreamQuery of a non-capturing stream", CALL(cuStreamQuery)(s2),
		 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	MUST(CALL(cuMemFree_v2)(p));
}

static void legacy_sync_on_thread(void *arg)
{
	CUresult *r = arg;
	r[0] = CALL(cuStreamSynchronize)(NULL);
	r[1] = CALL(cuCtxSynchronize)();
}

/* A thread-local capture on one thread; another thread synchronizes. */
static void case_capture_other_thread_sync(void)
{
	CAPTURE_SETUP(c);
	CUresult r[2];
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
	on_thread(legacy_sync_on_thread, r);
	check_rc("other thread cuStreamSynchronize(legacy)", r[0], CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
	check_rc("other thread cuCtxSynchronize", r[1], CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_stream_query(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_RELAXED));
	check_rc("query capturing stream", CALL(cuStreamQuery)(c.s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_stream_sync(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("sync capturing stream", CALL(cuStreamSynchronize)(c.s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_ctx_sync(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("cuCtxSynchronize", CALL(cuCtxSynchronize)(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_legacy_record(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_RELAXED));
	check_rc("record on legacy stream", CALL(cuEventRecord)(c.e, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
	check_status("invalidated", c.s, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_legacy_nonblocking(void)
{
	CAPTURE_SETUP(c);
	CUstream tmp = c.s;
	c.s = c.nb; /* capture the non-blocking stream */
	c.nb = tmp;
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_RELAXED));
	check_rc("record on legacy stream", CALL(cuEventRecord)(c.e, NULL), CUDA_SUCCESS);
	CUstreamCaptureStatus st = 99;
	check_rc("legacy is capturing?", CALL(cuStreamIsCapturing)(NULL, &st), CUDA_SUCCESS);
	end_and_check(&c, CUDA_SUCCESS);
}

static void case_capture_legacy_memcpy(void)
{
	CAPTURE_SETUP(c);
	CUdeviceptr p = 0;
	char buf[64] = {0};
	MUST(CALL(cuMemAlloc_v2)(&p, 64));
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("synchronous copy", CALL(cuMemcpyHtoD_v2)(p, buf, 64), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	MUST(CALL(cuMemFree_v2)(p));
}

static void case_capture_wait_uncaptured(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuEventRecord)(c.e2, c.nb));
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	check_rc("wait on uncaptured event", CALL(cuStreamWaitEvent)(c.s, c.e2, 0),
		 CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}

static void case_capture_fork_join(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	MUST(CALL(cuEventRecord)(c.e, c.s));
	check_rc("fork", CALL(cuStreamWaitEvent)(c.nb, c.e, 0), CUDA_SUCCESS);
	check_status("joined stream captures", c.nb, CU_STREAM_CAPTURE_STATUS_ACTIVE);
	MUST(CALL(cuEventRecord)(c.e2, c.nb));
	check_rc("join", CALL(cuStreamWaitEvent)(c.s, c.e2, 0), CUDA_SUCCESS);
	end_and_check(&c, CUDA_SUCCESS);
	check_status("joined stream done", c.nb, CU_STREAM_CAPTURE_STATUS_NONE);
}

static void case_capture_end_unmatched(void)
{
	CAPTURE_SETUP(c);
	MUST(CALL(cuStreamBeginCapture_v2)(c.s, CU_STREAM_CAPTURE_MODE_GLOBAL));
	MUST(CALL(cuEventRecord)(c.e, c.s));
	MUST(CALL(cuStreamWaitEvent)(c.nb, c.e, 0));
	CUgraph g = NULL;
	check_rc("end on the joined stream", CALL(cuStreamEndCapture)(c.nb, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
	check_status("invalidated", c.s, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
	end_and_check(&c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	check_status("joined stream done", c.nb, CU_STREAM_CAPTURE_STATUS_NONE);
}

/* --- cases: cuGetProcAddress --- */

struct proc_expect {
	const char *symbol;
	int version;
	unsigned flags;
	const char *name;       /* NULL: none */
	int status;             /* CUdriverProcAddressQueryResult */
};

static void case_procaddr(void)
{
	/* Before cuInit, as cudart asks. */
	static const struct proc_expect ex[] = {
		{"cuMemAlloc", 2000, 0, "cuMemAlloc", 0},
		{"cuMemAlloc", 3020, 0, "cuMemAlloc_v2", 0},
		{"cuMemAlloc", 11020, 0, "cuMemAlloc_v2", 0},
		{"cuMemAlloc", 12000, 2, "cuMemAlloc_v2", 0},
		{"cuMemAlloc", 13000, 1, "cuMemAlloc_v2", 0},
		{"cuMemFree", 2000, 0, "cuMemFree", 0},
		{"cuMemFree", 3020, 2, "cuMemFree_v2", 0},
		{"cuMemGetInfo", 3020, 0, "cuMemGetInfo_v2", 0},
		{"cuMemGetInfo", 2000, 0, "cuMemGetInfo", 0},
		{"cuMemAllocPitch", 13000, 0, "cuMemAllocPitch_v2", 0},
		{"cuMemAllocHost", 13000, 0, "cuMemAllocHost_v2", 0},
		{"cuMemGetAddressRange", 13000, 0, "cuMemGetAddressRange_v2", 0},
		{"cuCtxDestroy", 3020, 0, "cuCtxDestroy", 0},
		{"cuCtxDestroy", 4000, 0, "cuCtxDestroy_v2", 0},
		{"cuCtxCreate", 13000, 0, "cuCtxCreate_v4", 0},
		{"cuCtxCreate", 11040, 0, "cuCtxCreate_v3", 0},
		{"cuCtxSynchronize", 12000, 0, "cuCtxSynchronize", 0},
		{"cuCtxSynchronize", 13000, 0, "cuCtxSynchronize_v2", 0},
		{"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2", 0},
		{"cuEventDestroy", 4000, 0, "cuEventDestroy_v2", 0},
		{"cuEventDestroy", 2000, 0, "cuEventDestroy", 0},
		{"cuMemHostRegister", 6000, 0, "cuMemHostRegister", 0},
		{"cuMemHostRegister", 6050, 0, "cuMemHostRegister_v2", 0},
		{"cuDevicePrimaryCtxRelease", 13000, 0, "cuDevicePrimaryCtxRelease_v2", 0},
		{"cuIpcOpenMemHandle", 13000, 0, "cuIpcOpenMemHandle_v2", 0},
		{"cuGetProcAddress", 11030, 0, "cuGetProcAddress", 0},
		{"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2", 0},
		{"cuGetProcAddress", 13000, 0, "cuGetProcAddress_v2", 0},
		{"cuMemAllocAsync", 11020, 0, "cuMemAllocAsync", 0},
		{"cuMemAllocAsync", 11020, 1, "cuMemAllocAsync", 0},
		{"cuMemAllocAsync", 11020, 2, "cuMemAllocAsync_ptsz", 0},
		{"cuMemAllocAsync", 13000, 2, "cuMemAllocAsync_ptsz", 0},
		{"cuMemFreeAsync", 12000, 2, "cuMemFreeAsync_ptsz", 0},
		{"cuMemFreeAsync", 12000, 0, "cuMemFreeAsync", 0},
		{"cuEventRecord", 13000, 2, "cuEventRecord_ptsz", 0},
		{"cuEventRecord", 13000, 0, "cuEventRecord", 0},
		{"cuStreamBeginCapture", 13000, 2, "cuStreamBeginCapture_v2_ptsz", 0},
		{"cuStreamBeginCapture", 10000, 0, "cuStreamBeginCapture", 0},
		{"cuStreamGetCaptureInfo", 13000, 0, "cuStreamGetCaptureInfo_v3", 0},
		{"cuStreamGetCaptureInfo", 11030, 2, "cuStreamGetCaptureInfo_v2_ptsz", 0},
		{"cuMemcpyHtoD", 13000, 2, "cuMemcpyHtoD_v2_ptds", 0},
		{"cuMemcpyHtoD", 13000, 0, "cuMemcpyHtoD_v2", 0},
		{"cuMemsetD8", 13000, 2, "cuMemsetD8_v2_ptds", 0},
		{"cuMemcpy", 13000, 2, "cuMemcpy_ptds", 0},
		{"cuStreamSynchronize", 13000, 2, "cuStreamSynchronize_ptsz", 0},
		{"cuStreamWaitEvent", 13000, 2, "cuStreamWaitEvent_ptsz", 0},
		{"cuStreamQuery", 13000, 2, "cuStreamQuery_ptsz", 0},
		{"cuInit", 2000, 0, "cuInit", 0},
		{"cuMemAllocAsync", 11000, 0, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT},
		{"cuGetProcAddress", 11020, 0, NULL, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT},
		{"cuNoSuchFunction", 13000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND},
		{"cuMemAlloc_v2", 13000, 0, NULL, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND},
	};
	for (size_t i = 0; i < sizeof(ex) / sizeof(ex[0]); i++) {
		char label[128];
		for (int with_status = 0; with_status < 2; with_status++) {
			void *fn = (void *)1;
			CUdriverProcAddressQueryResult st = 99;
			CUresult r = CALL(cuGetProcAddress_v2)(ex[i].symbol, &fn, ex[i].version, ex[i].flags,
							       with_status ? &st : NULL);
			snprintf(label, sizeof(label), "%s@%d/flags%u%s", ex[i].symbol, ex[i].version, ex[i].flags,
				 with_status ? "/status" : "");
			check_rc(label, r, CUDA_SUCCESS);
			check_name(label, fn, ex[i].name);
			if (with_status)
				check_u64(label, st, (uint64_t)ex[i].status);
		}
		void *fn = (void *)1;
		CUresult r = CALL(cuGetProcAddress)(ex[i].symbol, &fn, ex[i].version, ex[i].flags);
		snprintf(label, sizeof(label), "v1 %s@%d/flags%u", ex[i].symbol, ex[i].version, ex[i].flags);
		/* The 4-argument form fails where the 5-argument one answers
		 * CUDA_SUCCESS with pfn NULL, and leaves *pfn alone. */
		check_rc(label, r, ex[i].name ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND);
		if (ex[i].name)
			check_name(label, fn, ex[i].name);
		else
			check_true(label, fn == (void *)1, "*pfn left alone");
	}
	void *fn = (void *)1;
	CUdriverProcAddressQueryResult st = 99;
	check_rc("version above the driver", CALL(cuGetProcAddress_v2)("cuMemAlloc", &fn, 99000, 0, &st),
		 CUDA_ERROR_INVALID_VALUE);
	fn = NULL;
	CALL(cuGetProcAddress_v2)("cuMemAlloc", &fn, 13000, 0, NULL);
	Dl_info info;
	check_true("from libcuda.so.1", fn && dladdr(fn, &info) && strstr(info.dli_fname, "libcuda.so"),
		   "the pointer lies in the driver");
}

/* Argument checks (a NULL symbol or pfn crashes the real driver: not
 * probed). */
static void case_procaddr_args(void)
{
	void *fn = (void *)1;
	CUdriverProcAddressQueryResult st = 99;
	check_rc("flags 4", CALL(cuGetProcAddress_v2)("cuMemAlloc", &fn, 13000, 4, &st), CUDA_ERROR_INVALID_VALUE);
	check_rc("flags 3", CALL(cuGetProcAddress_v2)("cuMemAllocAsync", &fn, 13000, 3, &st), CUDA_SUCCESS);
	check_name("flags 3 name", fn, "cuMemAllocAsync_ptsz");
	check_rc("v1 version above the driver", CALL(cuGetProcAddress)("cuMemAlloc", &fn, 99000, 0),
		 CUDA_ERROR_INVALID_VALUE);
}

static void case_export_table(void)
{
	CUuuid id;
	const void *table = (const void *)1;
	memset(&id, 0, sizeof(id));
	check_rc("cuGetExportTable(zero id)", CALL(cuGetExportTable)(&table, &id), CUDA_ERROR_INVALID_VALUE);
}

/* --- cases: IPC and fork --- */

static void case_ipc_local(void)
{
	SETUP();
	CUdeviceptr p = 0, q = 0;
	CUipcMemHandle h, hi, zero;
	MUST(CALL(cuMemAlloc_v2)(&p, 1 << 20));
	check_rc("get handle", CALL(cuIpcGetMemHandle)(&h, p), CUDA_SUCCESS);
	check_rc("get handle of interior", CALL(cuIpcGetMemHandle)(&hi, p + 4096), CUDA_SUCCESS);
	check_true("same handle", memcmp(&h, &hi, sizeof(h)) == 0, "a handle names the allocation");
	check_rc("NULL handle", CALL(cuIpcGetMemHandle)(NULL, p), CUDA_ERROR_INVALID_VALUE);
	check_rc("open in the exporting process", CALL(cuIpcOpenMemHandle_v2)(&q, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
		 CUDA_ERROR_INVALID_CONTEXT);
	memset(&zero, 0, sizeof(zero));
	check_rc("open a zero handle", CALL(cuIpcOpenMemHandle_v2)(&q, zero, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
		 CUDA_ERROR_INVALID_VALUE);
	check_rc("close a non-IPC pointer", CALL(cuIpcCloseMemHandle)(p), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemFree_v2)(p));
}

static int hexval(char c)
{
	return c <= '9' ? c - '0' : c - 'a' + 10;
}

/* Child side of case_ipc: probe-driver ipc-child HEX. */
static int ipc_child(const char *hex)
{
	case_name = "ipc-child";
	if (setup() != CUDA_SUCCESS)
		return 2;
	CUipcMemHandle h;
	for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
		h.reserved[i] = (char)(hexval(hex[2 * i]) << 4 | hexval(hex[2 * i + 1]));
	CUdeviceptr p = 0, p2 = 0;
	check_rc("open", CALL(cuIpcOpenMemHandle_v2)(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
	if (!p)
		return 1;
	check_rc("open again", CALL(cuIpcOpenMemHandle_v2)(&p2, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), CUDA_SUCCESS);
	check_u64("same address", p2, p);
	unsigned char buf[16];
	check_rc("read", CALL(cuMemcpyDtoH_v2)(buf, p, sizeof(buf)), CUDA_SUCCESS);
	check_true("parent's bytes", buf[0] == 0x5a && buf[15] == 0x5a, "the exported memory");
	check_rc("write", CALL(cuMemsetD8_v2)(p, 0xc3, 16), CUDA_SUCCESS);
	CUdeviceptr base = 0;
	size_t size = 0;
	check_rc("address range", CALL(cuMemGetAddressRange_v2)(&base, &size, p + 8), CUDA_SUCCESS);
	check_u64("base", base, p);
	check_u64("size", size, 1 << 20);
	unsigned mt = 0;
	check_rc("memory type", CALL(cuPointerGetAttribute)(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p), CUDA_SUCCESS);
	check_u64("device memory", mt, CU_MEMORYTYPE_DEVICE);
	check_rc("cuMemFree_v2 of imported memory", CALL(cuMemFree_v2)(p), CUDA_ERROR_INVALID_VALUE);
	check_rc("close", CALL(cuIpcCloseMemHandle)(p), CUDA_SUCCESS);
	check_rc("close again", CALL(cuIpcCloseMemHandle)(p2), CUDA_SUCCESS);
	check_rc("close once too often", CALL(cuIpcCloseMemHandle)(p), CUDA_ERROR_INVALID_VALUE);
	return failures ? 1 : 0;
}

static void case_ipc(void)
{
	SETUP();
	CUdeviceptr p = 0;
	CUipcMemHandle h;
	MUST(CALL(cuMemAlloc_v2)(&p, 1 << 20));
	MUST(CALL(cuMemsetD8_v2)(p, 0x5a, 16));
	MUST(CALL(cuIpcGetMemHandle)(&h, p));
	char hex[2 * CU_IPC_HANDLE_SIZE + 1];
	for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
		snprintf(hex + 2 * i, 3, "%02x", (unsigned char)h.reserved[i]);
	pid_t pid = fork();
	if (pid == 0) {
		execl(self_path, self_path, "ipc-child", hex, (char *)NULL);
		_exit(127);
	}
	int status = 0;
	waitpid(pid, &status, 0);
	check_true("child passed", WIFEXITED(status) && WEXITSTATUS(status) == 0, "the importer's checks");
	unsigned char buf[16];
	MUST(CALL(cuMemcpyDtoH_v2)(buf, p, sizeof(buf)));
	check_true("child's bytes", buf[0] == 0xc3 && buf[15] == 0xc3, "the importer wrote the same memory");
	MUST(CALL(cuMemFree_v2)(p));
}

static void case_fork(void)
{
	SETUP();
	int pipefd[2];
	if (pipe(pipefd) != 0)
		return;
	pid_t pid = fork();
	if (pid == 0) {
		CUresult r[2];
		CUdeviceptr p = 0;
		r[0] = CALL(cuInit)(0);
		r[1] = CALL(cuMemAlloc_v2)(&p, 1024);
		if (write(pipefd[1], r, sizeof(r)) != sizeof(r))
			_exit(1);
		_exit(0);
	}
	CUresult r[2] = {-1, -1};
	close(pipefd[1]);
	if (read(pipefd[0], r, sizeof(r)) != sizeof(r))
		r[0] = r[1] = CUDA_ERROR_UNKNOWN;
	close(pipefd[0]);
	waitpid(pid, NULL, 0);
	check_rc("cuInit in a forked child", r[0], CUDA_ERROR_NOT_INITIALIZED);
	check_rc("cuMemAlloc_v2 in a forked child", r[1], CUDA_ERROR_NOT_INITIALIZED);
}

/* --- cases: errors --- */

static void case_errors(void)
{
	const char *s = (const char *)1;
	check_rc("unknown code name", CALL(cuGetErrorName)((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
	check_true("unknown code name is NULL", s == NULL, "no name");
	static const struct {
		CUresult code;
		const char *text;
	} texts[] = {
		{CUDA_SUCCESS, "no error"},
		{CUDA_ERROR_INVALID_VALUE, "invalid argument"},
		{CUDA_ERROR_OUT_OF_MEMORY, "out of memory"},
		{CUDA_ERROR_NOT_INITIALIZED, "initialization error"},
		{CUDA_ERROR_INVALID_CONTEXT, "invalid device context"},
		{CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"},
		{CUDA_ERROR_NOT_FOUND, "named symbol not found"},
		{CUDA_ERROR_NOT_READY, "device not ready"},
		{CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing"},
		{CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture"},
	};
	for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
		const char *t = NULL;
		CALL(cuGetErrorString)(texts[i].code, &t);
		report(t && strcmp(t, texts[i].text) == 0, rc_name(texts[i].code), "\"%s\"", t ? t : "(null)");
	}
}

/* Prints every name and string the driver knows (not a check). */
static void case_error_table(void)
{
	for (int i = 0; i < 1000; i++) {
		const char *n = NULL, *t = NULL;
		if (CALL(cuGetErrorName)((CUresult)i, &n) != CUDA_SUCCESS)
			continue;
		CALL(cuGetErrorString)((CUresult)i, &t);
		printf("error %d %s \"%s\"\n", i, n ? n : "(null)", t ? t : "(null)");
	}
}

/* --- the runner --- */

/* --- cases: virtual memory management (the vmm backend's calls) --- */

static CUmemAllocationProp vmm_prop(int dev)
{
	CUmemAllocationProp prop;
	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = dev;
	return prop;
}

static void case_vmm(void)
{
	SETUP();
	CUmemAllocationProp prop = vmm_prop(0), bad = vmm_prop(99), got;
	CUmemAccessDesc access = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	CUmemGenericAllocationHandle h = 0, h2 = 0, r = 0;
	CUdeviceptr va = 0;
	size_t g = 0, rec = 0, f0 = 0, f1 = 0, t = 0;
	unsigned long long flags = 0;

	check_rc("granularity min", CALL(cuMemGetAllocationGranularity)(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_SUCCESS);
	check_u64("granularity min is 2 MiB", g, 2 << 20);
	check_rc("granularity recommended",
		 CALL(cuMemGetAllocationGranularity)(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
	check_u64("granularity recommended is 2 MiB", rec, 2 << 20);
	check_rc("granularity NULL", CALL(cuMemGetAllocationGranularity)(NULL, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_ERROR_INVALID_VALUE);
	check_rc("granularity bad option", CALL(cuMemGetAllocationGranularity)(&g, &prop, (CUmemAllocationGranularity_flags)7),
		 CUDA_ERROR_INVALID_VALUE);
	g = 2 << 20;

	check_rc("reserve NULL", CALL(cuMemAddressReserve)(NULL, 4 * g, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("reserve size 0", CALL(cuMemAddressReserve)(&va, 0, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("reserve flags", CALL(cuMemAddressReserve)(&va, 4 * g, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
	check_rc("reserve alignment 3 MiB", CALL(cuMemAddressReserve)(&va, 4 * g, 3 << 20, 0, 0), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemAddressReserve)(&va, 4 * g, g, 0, 0));
	check_u64("reservation aligned", va % g, 0);

	check_rc("create NULL handle", CALL(cuMemCreate)(NULL, g, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("create size 0", CALL(cuMemCreate)(&h, 0, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("create half granule", CALL(cuMemCreate)(&h, g / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("create flags", CALL(cuMemCreate)(&h, g, &prop, 1), CUDA_ERROR_INVALID_VALUE);
	check_rc("create device 99", CALL(cuMemCreate)(&h, g, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
	check_rc("create 1 PiB", CALL(cuMemCreate)(&h, (size_t)1 << 50, &prop, 0), CUDA_ERROR_OUT_OF_MEMORY);
	MUST(CALL(cuMemGetInfo_v2)(&f0, &t));
	MUST(CALL(cuMemCreate)(&h, 2 * g, &prop, 0));
	MUST(CALL(cuMemGetInfo_v2)(&f1, &t));
	check_true("create counts as used memory", f0 - f1 >= 2 * g, "free dropped by the allocation");
	check_rc("properties", CALL(cuMemGetAllocationPropertiesFromHandle)(&got, h), CUDA_SUCCESS);
	check_u64("properties type", got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
	check_u64("properties device", (uint64_t)got.location.id, 0);

	check_rc("map offset", CALL(cuMemMap)(va, 2 * g, g, h, 0), CUDA_ERROR_NOT_SUPPORTED);
	check_rc("map flags", CALL(cuMemMap)(va, 2 * g, 0, h, 1), CUDA_ERROR_INVALID_VALUE);
	check_rc("map unaligned", CALL(cuMemMap)(va + 4096, 2 * g, 0, h, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("map too big", CALL(cuMemMap)(va, 4 * g, 0, h, 0), CUDA_ERROR_NOT_SUPPORTED);
	MUST(CALL(cuMemMap)(va, 2 * g, 0, h, 0));
	MUST(CALL(cuMemCreate)(&h2, g, &prop, 0));
	check_rc("map over a mapping", CALL(cuMemMap)(va + g, g, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemMap)(va + 2 * g, g, 0, h2, 0));
	check_rc("get access before set", CALL(cuMemGetAccess)(&flags, &loc, va), CUDA_SUCCESS);
	check_u64("access before set", flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
	check_rc("set access NULL desc", CALL(cuMemSetAccess)(va, 3 * g, NULL, 1), CUDA_ERROR_INVALID_VALUE);
	check_rc("set access count 0", CALL(cuMemSetAccess)(va, 3 * g, &access, 0), CUDA_ERROR_INVALID_VALUE);
	check_rc("set access unmapped part", CALL(cuMemSetAccess)(va, 4 * g, &access, 1), CUDA_ERROR_INVALID_VALUE);
	check_rc("set access over two mappings", CALL(cuMemSetAccess)(va, 3 * g, &access, 1), CUDA_SUCCESS);
	check_rc("get access", CALL(cuMemGetAccess)(&flags, &loc, va + g + 100), CUDA_SUCCESS);
	check_u64("access read-write", flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	check_rc("get access unmapped", CALL(cuMemGetAccess)(&flags, &loc, va + 3 * g), CUDA_ERROR_INVALID_VALUE);

	check_rc("retain unmapped", CALL(cuMemRetainAllocationHandle)(&r, (void *)(uintptr_t)(va + 3 * g)),
		 CUDA_ERROR_INVALID_VALUE);
	check_rc("retain", CALL(cuMemRetainAllocationHandle)(&r, (void *)(uintptr_t)(va + g)), CUDA_SUCCESS);
	check_u64("retain gives the handle", r, h);
	check_rc("release the retained", CALL(cuMemRelease)(r), CUDA_SUCCESS);

	check_rc("unmap part of a mapping", CALL(cuMemUnmap)(va, g), CUDA_ERROR_INVALID_VALUE);
	check_rc("address free while mapped", CALL(cuMemAddressFree)(va, 4 * g), CUDA_ERROR_INVALID_VALUE);
	check_rc("release while mapped", CALL(cuMemRelease)(h), CUDA_SUCCESS);
	check_rc("unmap a whole mapping", CALL(cuMemUnmap)(va, 2 * g), CUDA_SUCCESS);
	check_rc("unmap twice", CALL(cuMemUnmap)(va, 2 * g), CUDA_SUCCESS);
	check_rc("unmap", CALL(cuMemUnmap)(va + 2 * g, g), CUDA_SUCCESS);
	check_rc("release", CALL(cuMemRelease)(h2), CUDA_SUCCESS);
	check_rc("address free wrong size", CALL(cuMemAddressFree)(va, 2 * g), CUDA_ERROR_INVALID_VALUE);
	check_rc("address free", CALL(cuMemAddressFree)(va, 4 * g), CUDA_SUCCESS);
	check_rc("address free twice", CALL(cuMemAddressFree)(va, 4 * g), CUDA_ERROR_INVALID_VALUE);
	MUST(CALL(cuMemGetInfo_v2)(&f1, &t));
	check_true("memory back after release and unmap", f1 + g >= f0, "free memory restored");
}

/* The calls need cuInit but (the fake assumes) no current context. */
static void case_vmm_no_context(void)
{
	CUmemAllocationProp prop = vmm_prop(0);
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr va = 0;
	size_t g = 0;

	MUST(CALL(cuInit)(0));
	check_rc("granularity", CALL(cuMemGetAllocationGranularity)(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
		 CUDA_SUCCESS);
	check_rc("reserve", CALL(cuMemAddressReserve)(&va, 2 << 20, 0, 0, 0), CUDA_SUCCESS);
	check_rc("create", CALL(cuMemCreate)(&h, 2 << 20, &prop, 0), CUDA_SUCCESS);
	check_rc("release", CALL(cuMemRelease)(h), CUDA_SUCCESS);
	check_rc("address free", CALL(cuMemAddressFree)(va, 2 << 20), CUDA_SUCCESS);
}

#define CASES(X)                                                                                       \
	X(before_init) X(no_context) X(context_stack) X(ctx_destroy_twice) X(ctx_destroy_primary)      \
	X(ctx_id)                                                                                      \
	X(ctx_destroy_frees) X(primary_refcount) X(primary_reset) X(primary_release_reuse)             \
	X(mem_alloc_free) X(mem_info) X(mem_pitch) X(mem_v1) X(mem_v1_context) X(mem_async)            \
	X(mem_host) X(mem_host_zero) X(mem_managed)                                                    \
	X(pointer_attributes) X(copies) X(peer) X(streams) X(stream_destroy_special) X(events)                \
	X(capture_legacy) X(capture_basic) X(capture_event_query_relaxed)                              \
	X(capture_event_query_global) X(capture_alloc) X(capture_free) X(capture_host_alloc)           \
	X(capture_relaxed) X(capture_thread_local) X(capture_global_other_thread) X(capture_v1_mode)   \
	X(capture_wrong_thread) X(capture_async) X(capture_async_other_stream)                         \
	X(capture_free_async_other_stream) X(capture_other_calls) X(capture_other_thread_sync)         \
	X(capture_stream_query) X(capture_stream_sync)                                                 \
	X(capture_ctx_sync) X(capture_legacy_record) X(capture_legacy_nonblocking)                     \
	X(capture_legacy_memcpy) X(capture_wait_uncaptured) X(capture_fork_join)                       \
	X(capture_end_unmatched) X(procaddr) X(procaddr_args) X(export_table) X(ipc_local) X(ipc)      \
	X(fork) X(errors) X(vmm) X(vmm_no_context)

static const struct {
	const char *name;
	void (*fn)(void);
} cases[] = {
#define CASE_ROW(n) {#n, case_##n},
	CASES(CASE_ROW)
#undef CASE_ROW
	{"error_table", case_error_table},
};

#define NCASES (sizeof(cases) / sizeof(cases[0]))

static int load_driver(void)
{
	lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "probe-driver: no libcuda.so.1: %s\n", dlerror());
		return -1;
	}
	int missing = 0;
#define LOAD(name)                                                                    \
	p_##name = (__typeof__(name) *)dlsym(lib, #name);                             \
	if (!p_##name) {                                                              \
		fprintf(stderr, "probe-driver: libcuda.so.1 lacks %s\n", #name);      \
		missing++;                                                            \
	}
	DRIVER_FUNCTIONS(LOAD)
#undef LOAD
	return missing ? -2 : 0;
}

static int run_one(const char *name)
{
	for (size_t i = 0; i < NCASES; i++) {
		if (strcmp(cases[i].name, name) == 0) {
			case_name = cases[i].name;
			cases[i].fn();
			return failures ? 1 : 0;
		}
	}
	fprintf(stderr, "probe-driver: no case %s\n", name);
	return 2;
}

int main(int argc, char **argv)
{
	self_path = "/proc/self/exe";
	int r = load_driver();
	if (r == -1)
		return 77;
	if (r < 0)
		return 1;
	if (argc > 1 && strcmp(argv[1], "--list") == 0) {
		for (size_t i = 0; i < NCASES; i++)
			puts(cases[i].name);
		return 0;
	}
	if (argc == 3 && strcmp(argv[1], "ipc-child") == 0)
		return ipc_child(argv[2]);
	if (argc > 1) {
		alarm(60); /* a case that hangs fails instead of eating the run */
		int worst = 0;
		for (int i = 1; i < argc; i++) {
			int rc = run_one(argv[i]);
			worst = rc > worst ? rc : worst;
		}
		printf("%d checks, %d failed\n", checks, failures);
		return worst;
	}

	/* Every case in a fresh process: a driver keeps state. */
	if (CALL(cuInit)(0) != CUDA_SUCCESS) {
		fprintf(stderr, "probe-driver: cuInit fails: no device\n");
		return 77;
	}
	int failed_cases = 0;
	for (size_t i = 0; i < NCASES; i++) {
		if (strcmp(cases[i].name, "error_table") == 0)
			continue;
		fflush(stdout);
		pid_t pid = fork();
		if (pid == 0) {
			execl(self_path, self_path, cases[i].name, (char *)NULL);
			_exit(127);
		}
		int status = 0;
		waitpid(pid, &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
			failed_cases++;
			if (WIFSIGNALED(status))
				printf("FAIL %s: killed by signal %d\n", cases[i].name, WTERMSIG(status));
			else
				printf("FAIL %s: exit %d\n", cases[i].name, WEXITSTATUS(status));
		}
	}
	printf("%zu cases, %d failed\n", NCASES - 1, failed_cases);
	return failed_cases ? 1 : 0;
}
