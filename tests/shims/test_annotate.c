/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_annotate.c - the NVTX memory annotations (process/
 * annotate.c) over the test-double driver, with fake_nvtx_tool.so standing
 * in for compute-sanitizer (NVTX_INJECTION64_PATH). Modes:
 *   tool  - every device segment is a live heap while libemm holds it, each
 *           block a region of the size asked for while the program owns it
 *           (gone at its free, back at its reuse, never for a double free),
 *           pinned host segments and blocks the same (a free naming the
 *           wrong space leaves the region alone), segments given back take
 *           their heaps with them; the tool saw no misuse.
 *   exit  - a block left live and cached idle segments (device and pinned)
 *           at exit: libemm's exit handler gives them back before the tool's
 *           leak check, so only the leaked block's heap and region are
 *           live (FAKE_NVTX_EXIT_HEAPS=1: the fake tool checks at exit).
 *   vmm   - under a memory checker a freed VMM buffer goes back to the
 *           driver at once (the checker takes no VMM range as a heap, so
 *           one kept mapped would hide a use after free): no heap call, no
 *           cache hit for the next buffer.
 *   peer  - two devices, blocks on device 1 only: once device 0's context
 *           enables peer access to device 1 (the checker does not see a
 *           peer's access to another device's region), device 1's idle
 *           segments go back and its new segments are not offered as heaps;
 *           a segment with a live block keeps its heap and regions (a heap
 *           cannot be taken back while its memory lives).
 *   devices - two devices: once the second has a segment, the same for
 *           every device (cudart enables peer access unseen).
 *   multidev - race-multidevice's order of calls on two devices (kept,
 *           freed and stream-ordered blocks, frees from the other device,
 *           peer access): the tool sees no unknown region unregistered.
 *   refused - (FAKE_NVTX_REFUSE_DEVICE=1) the first device heap refused,
 *           no other device heap is offered; pinned ones still are.
 *   destroyed - a context destroyed with a live block and an idle
 *           segment: the driver freed their memory, so their heaps are
 *           unregistered (the checker refuses a heap at an address it
 *           still holds, once the driver reuses it).
 *   reset - the primary context reset behind libemm's back (as shared
 *           cudart's cudaDeviceReset does) and left current: the next
 *           allocation asks no id of the dead context (a failed call the
 *           tool would report) and reaches the driver, which refuses it.
 *   dead  - a context the program destroyed while another thread has it
 *           current: that thread's free asks no id of the dead context
 *           (the tool would report the failed call) and gets the driver's
 *           answer; a context created later with the same handle is live.
 *   gone  - the primary context released behind libemm's back (as a
 *           program using libemm's package without the preload does at
 *           exit): giving the idle cache back makes no call in it.
 *   capture - blocks served during a global-mode capture are annotated
 *           (the tool's handlers may call the driver: relaxed mode).
 *   quarantine - a block freed during a capture keeps its region while
 *           the graph lives (its replays may use it), not after.
 *   none  - the tool takes no memory call (FAKE_NVTX_SLOTS=none): libemm
 *           makes none, and serves as usual.
 * Failure is exit status 1 with a message.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shims_common.h"
#include "vmm_calls.h"

static unsigned long long (*count)(int);
static size_t (*region)(uintptr_t);
static size_t (*heap)(uintptr_t);

enum { HEAPS, REGIONS, ERRORS, HEAP_REGS, HEAP_UNREGS, REGION_REGS, REGION_UNREGS };

#define CHECK(cond)                                                                                        \
	do {                                                                                               \
		if (!(cond)) {                                                                             \
			fprintf(stderr, "test_annotate: line %d: %s (heaps %llu regions %llu errors %llu)\n", \
			        __LINE__, #cond, count(HEAPS), count(REGIONS), count(ERRORS));             \
			exit(1);                                                                           \
		}                                                                                          \
	} while (0)

static void find_tool(void)
{
	const char *path = getenv("NVTX_INJECTION64_PATH");
	void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : NULL;

	if (!h) {
		fprintf(stderr, "test_annotate: the fake tool %s was not loaded\n", path ? path : "(unset)");
		exit(1);
	}
	count = (unsigned long long (*)(int))dlsym(h, "fake_nvtx_count");
	region = (size_t (*)(uintptr_t))dlsym(h, "fake_nvtx_region");
	heap = (size_t (*)(uintptr_t))dlsym(h, "fake_nvtx_heap");
	if (!count || !region || !heap)
		exit(1);
}

static void tool_mode(void)
{
	CUdeviceptr a, b, c, big;
	void *host, *host2, *portable;
	unsigned long long unregs;

	CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
	find_tool(); /* loaded at libemm's first segment */
	CHECK(count(HEAPS) == 1);
	CHECK(region(a) == 1000);
	CHECK(cuMemAlloc(&b, 1000) == CUDA_SUCCESS);
	CHECK(region(b) == 1000 && count(REGIONS) == 2 && count(HEAPS) == 1);

	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(region(a) == 0 && count(REGIONS) == 1);
	unregs = count(REGION_UNREGS);
	CHECK(cuMemFree(a) != CUDA_SUCCESS); /* double free: the driver's error, no unregister */
	CHECK(cuMemFree(a + 8) != CUDA_SUCCESS);
	CHECK(count(REGION_UNREGS) == unregs);

	CHECK(cuMemAlloc(&c, 700) == CUDA_SUCCESS);
	CHECK(region(c) == 700);

	/* Pinned host blocks: their segment a heap (one per flag set), each
	 * block a region, as device ones. */
	CHECK(cuMemAllocHost(&host, 4096) == CUDA_SUCCESS);
	CHECK(count(HEAPS) == 2 && count(REGIONS) == 3);
	CHECK(region((uintptr_t)host) == 4096);
	CHECK(cuMemAllocHost(&host2, 1000) == CUDA_SUCCESS);
	CHECK(region((uintptr_t)host2) == 1000 && count(HEAPS) == 2 && count(REGIONS) == 4);
	CHECK(cuMemHostAlloc(&portable, 100, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS);
	CHECK(region((uintptr_t)portable) == 100 && count(HEAPS) == 3);
	/* A free naming the other space is refused and leaves the region. */
	unregs = count(REGION_UNREGS);
	CHECK(cuMemFree((CUdeviceptr)(uintptr_t)host) != CUDA_SUCCESS);
	CHECK(cuMemFreeHost((void *)(uintptr_t)c) != CUDA_SUCCESS);
	CHECK(count(REGION_UNREGS) == unregs && region((uintptr_t)host) == 4096 && region(c) == 700);
	CHECK(cuMemFreeHost(host) == CUDA_SUCCESS);
	CHECK(region((uintptr_t)host) == 0 && region((uintptr_t)host2) == 1000);
	CHECK(cuMemFreeHost(host) != CUDA_SUCCESS); /* double free: no unregister */
	CHECK(count(REGION_UNREGS) == unregs + 1);
	CHECK(cuMemFreeHost(host2) == CUDA_SUCCESS);
	CHECK(cuMemFreeHost(portable) == CUDA_SUCCESS);
	CHECK(count(REGIONS) == 2 && count(HEAPS) == 3);

	/* A large block: a segment of its own, another heap. */
	CHECK(cuMemAlloc(&big, 30u << 20) == CUDA_SUCCESS);
	CHECK(count(HEAPS) == 4 && region(big) == 30u << 20);
	CHECK(cuMemFree(big) == CUDA_SUCCESS);
	CHECK(region(big) == 0);

	CHECK(cuMemFree(b) == CUDA_SUCCESS);
	CHECK(cuMemFree(c) == CUDA_SUCCESS);
	CHECK(count(REGIONS) == 0);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	CHECK(shims_release_idle(-1, 0) >= 0);
	/* Every segment went back, pinned ones too: their heaps are gone. */
	CHECK(count(HEAPS) == 0);
	CHECK(count(HEAP_UNREGS) == count(HEAP_REGS) && count(HEAP_REGS) == 4);
	CHECK(count(ERRORS) == 0);
}

/* FAKE_NVTX_REFUSE_DEVICE=1: the tool refuses device heaps (as
 * compute-sanitizer refuses the vmm and async backends' segments): their
 * blocks get no region calls (each would be refused), unregistering skips
 * them, pinned ones stay annotated, allocation works as usual. */
static void refused_mode(void)
{
	CUdeviceptr a, b;
	void *host;

	CUdeviceptr big;

	CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(count(HEAP_REGS) == 1 && count(HEAPS) == 0);
	CHECK(cuMemAlloc(&b, 2000) == CUDA_SUCCESS);
	CHECK(count(REGION_REGS) == 0);
	/* Another segment: the kind was refused, it is not offered (each
	 * refusal is a warning in the tool's error count). */
	CHECK(cuMemAlloc(&big, 30u << 20) == CUDA_SUCCESS);
	CHECK(count(HEAP_REGS) == 1);
	CHECK(cuMemFree(big) == CUDA_SUCCESS);
	CHECK(cuMemFree(a) == CUDA_SUCCESS && cuMemFree(b) == CUDA_SUCCESS);
	CHECK(count(REGION_UNREGS) == 0);
	CHECK(cuMemAllocHost(&host, 4096) == CUDA_SUCCESS);
	CHECK(count(HEAPS) == 1 && region((uintptr_t)host) == 4096);
	CHECK(cuMemFreeHost(host) == CUDA_SUCCESS);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	CHECK(shims_release_idle(-1, 0) >= 0);
	CHECK(count(HEAPS) == 0 && count(HEAP_UNREGS) == 1 && count(HEAP_REGS) == 2);
	CHECK(count(ERRORS) == 0);
}

static void exit_mode(void)
{
	CUdeviceptr leaked, big;
	void *host;

	CHECK(cuMemAlloc(&leaked, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(cuMemAlloc(&big, 30u << 20) == CUDA_SUCCESS);
	CHECK(cuMemFree(big) == CUDA_SUCCESS);
	CHECK(cuMemAllocHost(&host, 1000) == CUDA_SUCCESS);
	CHECK(cuMemFreeHost(host) == CUDA_SUCCESS);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	CHECK(count(HEAPS) == 3 && count(REGIONS) == 1);
	/* exit: the fake tool's destructor checks 1 heap, 1 region */
}

/* The primary context released where libemm cannot see it (a program that
 * uses libemm through its package: Numba releases its context at exit):
 * giving the idle cache back, as the exit handler does under a tool, makes
 * no driver call in the dead context (the tool would report each failed
 * one as the program's error). */
static void *release_contextless(void *arg)
{
	(void)arg;
	fakecuda_reset_counters();
	CHECK(shims_release_idle(-1, 0) >= 0);
	return NULL;
}

static void gone_mode(void)
{
	CUdeviceptr a;
	pthread_t t;
	uint64_t total;

	CHECK(cuMemAlloc(&a, 30u << 20) == CUDA_SUCCESS);
	find_tool();
	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(fakecuda_device_reset(0, 0) == 0);
	/* From a thread without a context, as a finalizer or exit handler may
	 * run: the dead primary is neither used nor brought back. */
	CHECK(pthread_create(&t, NULL, release_contextless, NULL) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	/* The dead primary's heaps leave the tool: the unregister runs in
	 * relaxed capture mode (a thread-level call, no context). */
	total = fakecuda_calls_total(NULL);
	CHECK(total == fakecuda_calls("cuDevicePrimaryCtxGetState") + fakecuda_calls("cuCtxGetCurrent") +
	               fakecuda_calls("cuThreadExchangeStreamCaptureMode"));
	CHECK(count(HEAPS) == 0 && count(ERRORS) == 0);
	CHECK(fakecuda_calls("cuDevicePrimaryCtxRetain") == 0);
}

static void reset_mode(void)
{
	CUdeviceptr a, b;
	unsigned long long ids;

	CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(fakecuda_device_reset(0, 0) == 0);
	ids = fakecuda_calls("cuCtxGetId");
	CHECK(cuMemAlloc(&b, 1000) == CUDA_ERROR_CONTEXT_IS_DESTROYED);
	CHECK(fakecuda_calls("cuCtxGetId") == ids);
	CHECK(count(HEAPS) == 0 && count(ERRORS) == 0);
}

static pthread_barrier_t dead_bar;
static CUcontext dead_ctx;
static CUdeviceptr dead_blk;
static CUresult dead_rc;
static unsigned long long dead_ids;

static void *dead_thread(void *arg)
{
	(void)arg;
	CHECK(cuCtxSetCurrent(dead_ctx) == CUDA_SUCCESS);
	pthread_barrier_wait(&dead_bar); /* current here */
	pthread_barrier_wait(&dead_bar); /* destroyed by main */
	dead_ids = fakecuda_calls("cuCtxGetId");
	dead_rc = cuMemFree(dead_blk);
	dead_ids = fakecuda_calls("cuCtxGetId") - dead_ids;
	return NULL;
}

static void dead_mode(void)
{
	CUcontext again;
	CUdeviceptr a;
	pthread_t t;

	CHECK(cuCtxCreate(&dead_ctx, NULL, 0, 0) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&dead_blk, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(pthread_barrier_init(&dead_bar, NULL, 2) == 0);
	CHECK(pthread_create(&t, NULL, dead_thread, NULL) == 0);
	pthread_barrier_wait(&dead_bar);
	CHECK(cuCtxDestroy(dead_ctx) == CUDA_SUCCESS);
	pthread_barrier_wait(&dead_bar);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(dead_rc == CUDA_ERROR_CONTEXT_IS_DESTROYED && dead_ids == 0);
	/* A new context: served and annotated as usual. */
	CHECK(cuCtxCreate(&again, NULL, 0, 0) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&a, 2000) == CUDA_SUCCESS && region(a) == 2000);
	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(cuCtxDestroy(again) == CUDA_SUCCESS);
	CHECK(count(ERRORS) == 0);
}

/* A first block (*a) that loads the tool, then a capture in `mode` begun
 * on a new non-blocking stream. */
static CUstream capture_begin(CUdeviceptr *a, CUstreamCaptureMode mode)
{
	CUstream s;

	CHECK(cuMemAlloc(a, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuStreamBeginCapture(s, mode) == CUDA_SUCCESS);
	return s;
}

/* Blocks served during a global-mode capture (a miss: a new segment too)
 * are annotated like others: the tool's own driver calls are not refused. */
static void capture_mode(void)
{
	CUgraph g = NULL;
	CUdeviceptr a, b;
	CUstream s = capture_begin(&a, CU_STREAM_CAPTURE_MODE_GLOBAL);

	CHECK(cuMemAlloc(&b, 30u << 20) == CUDA_SUCCESS); /* a miss: a segment */
	CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g);
	CHECK(heap(b) != 0 && region(b) == 30u << 20);
	CHECK(count(ERRORS) == 0);
	CHECK(cuGraphDestroy(g) == CUDA_SUCCESS);
	CHECK(cuMemFree(b) == CUDA_SUCCESS && cuMemFree(a) == CUDA_SUCCESS);
	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

/* A block the program frees during a capture stays out of reach of new
 * owners while the graph lives (the quarantine, capture.c): its region
 * stays too, so the graph's replays are no error to the tool; it goes when
 * the graph is destroyed and the block returns to its heap. */
static void quarantine_mode(void)
{
	CUgraph g = NULL;
	CUdeviceptr a, b;
	CUstream s = capture_begin(&a, CU_STREAM_CAPTURE_MODE_RELAXED);

	CHECK(cuMemAlloc(&b, 4096) == CUDA_SUCCESS);
	CHECK(cuMemFree(b) == CUDA_SUCCESS); /* quarantined */
	CHECK(region(b) == 4096);
	CHECK(cuStreamEndCapture(s, &g) == CUDA_SUCCESS && g);
	CHECK(region(b) == 4096);
	CHECK(cuGraphDestroy(g) == CUDA_SUCCESS);
	CHECK(region(b) == 0);
	CHECK(cuMemFree(a) == CUDA_SUCCESS && region(a) == 0);
	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
	CHECK(count(ERRORS) == 0);
}

static void vmm_mode(void)
{
	CUmemAllocationProp p = vmm_call_prop(0, CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = vmm_call_access(0);
	size_t size = 4u << 20;
	struct vmm_buf a, b;
	struct emm_stats s0, s1;

	CHECK(vmm_call_alloc(&a, size, &p, &d, 1) == CUDA_SUCCESS);
	CHECK(vmm_call_free(&a) == CUDA_SUCCESS);
	find_tool(); /* loaded when the first buffer was freed */
	CHECK(shims_stats(-1, &s0) == 0 && s0.vmm_idle_bytes == 0);
	CHECK(vmm_call_alloc(&b, size, &p, &d, 1) == CUDA_SUCCESS);
	CHECK(shims_stats(-1, &s1) == 0 && s1.vmm_hits == s0.vmm_hits);
	CHECK(vmm_call_free(&b) == CUDA_SUCCESS);
	CHECK(count(HEAP_REGS) == 0 && count(HEAPS) == 0 && count(ERRORS) == 0);
}

static void destroyed_mode(void)
{
	CUcontext c2;
	CUdeviceptr a, b, big;

	CHECK(cuCtxCreate(&c2, NULL, 0, 0) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(cuMemAlloc(&big, 30u << 20) == CUDA_SUCCESS && cuMemFree(big) == CUDA_SUCCESS);
	CHECK(count(HEAPS) == 2 && region(a) == 1000);
	CHECK(cuCtxDestroy(c2) == CUDA_SUCCESS);
	CHECK(count(HEAPS) == 0 && count(REGIONS) == 0 && count(HEAP_UNREGS) == 2);
	/* The primary context: annotated as before. */
	CHECK(cuMemAlloc(&b, 2000) == CUDA_SUCCESS && region(b) == 2000);
	CHECK(cuMemFree(b) == CUDA_SUCCESS);
	CHECK(count(ERRORS) == 0);
}

/* FAKECUDA_DEVICES=2, first in a mode: in `ctx`, a large block kept live
 * (a segment of its own) and a small one freed (its segment idle). */
static void live_and_idle(CUcontext ctx, CUdeviceptr *keep, uint64_t *idle_seg)
{
	CUdeviceptr a;

	CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(keep, 30u << 20) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
	find_tool(); /* loaded at libemm's first segment */
	CHECK(count(HEAPS) == 2 && region(*keep) == 30u << 20 && region(a) == 1000);
	CHECK(cuMemFree(a) == CUDA_SUCCESS && cuCtxSynchronize() == CUDA_SUCCESS);
	*idle_seg = a; /* the small segment's first block: its start */
	CHECK(heap(a) != 0);
}

/* After the device went off: the idle segment went back, the live one
 * kept its heap, and its region unless peer access to the device was
 * enabled (the tool, real or fake, drops the device's regions then); a new
 * block is not annotated, and neither its free nor the live block's makes
 * a region call (the tool would refuse the unregister after a peer's
 * access: the region stays with the tool until its heap goes). */
static void check_off(CUcontext ctx, CUdeviceptr keep, uint64_t idle_seg, bool peer)
{
	CUdeviceptr b;
	unsigned long long calls;
	size_t kept = peer ? 0 : 30u << 20;

	CHECK(heap(idle_seg) == 0 && heap(keep) != 0 && region(keep) == kept);
	CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
	calls = count(HEAP_REGS) + count(REGION_REGS) + count(REGION_UNREGS);
	CHECK(cuMemAlloc(&b, 2000) == CUDA_SUCCESS && region(b) == 0);
	CHECK(cuMemFree(b) == CUDA_SUCCESS);
	/* Its segment, retired, goes back with its last block, and the
	 * region with its heap. */
	CHECK(cuMemFree(keep) == CUDA_SUCCESS && heap(keep) == 0 && region(keep) == 0);
	CHECK(count(HEAP_REGS) + count(REGION_REGS) + count(REGION_UNREGS) == calls);
}

/* FAKECUDA_DEVICES=2. */
static void peer_mode(void)
{
	CUcontext ctx[2];
	CUdeviceptr keep;
	uint64_t idle_seg;

	for (int i = 0; i < 2; i++)
		CHECK(cuDevicePrimaryCtxRetain(&ctx[i], i) == CUDA_SUCCESS);
	live_and_idle(ctx[1], &keep, &idle_seg);
	/* Device 0 reaches device 1. */
	CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS);
	CHECK(cuCtxEnablePeerAccess(ctx[1], 0) == CUDA_SUCCESS);
	CHECK(cuCtxEnablePeerAccess(ctx[1], 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	check_off(ctx[1], keep, idle_seg, true);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	CHECK(shims_release_idle(-1, 0) >= 0);
	CHECK(count(HEAPS) == 0 && count(ERRORS) == 0);
}

/* FAKECUDA_DEVICES=2. */
static void devices_mode(void)
{
	CUcontext ctx[2];
	CUdeviceptr keep, a1;
	uint64_t idle_seg;

	for (int i = 0; i < 2; i++)
		CHECK(cuDevicePrimaryCtxRetain(&ctx[i], i) == CUDA_SUCCESS);
	live_and_idle(ctx[0], &keep, &idle_seg);
	/* The second device's first segment: not offered. */
	CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&a1, 1000) == CUDA_SUCCESS);
	CHECK(region(a1) == 0 && count(HEAP_REGS) == 2);
	check_off(ctx[0], keep, idle_seg, false);
	CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuMemFree(a1) == CUDA_SUCCESS);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	CHECK(shims_release_idle(-1, 0) >= 0);
	CHECK(count(HEAPS) == 0 && count(HEAP_REGS) == 2 && count(ERRORS) == 0);
}

/* FAKECUDA_DEVICES=2. A small block of device 0 stays live when device 1
 * appears: its segment keeps its heap and the block its region, but the
 * blocks allocated after come from a segment the tool does not know (the
 * context's heap was retired: race-multidevice-strict's peers read such
 * blocks), and the old segment goes back once its last block is freed. */
static void carve_mode(void)
{
	CUcontext ctx[2];
	CUdeviceptr x, a1, b, c;
	unsigned long long unregs;

	for (int i = 0; i < 2; i++)
		CHECK(cuDevicePrimaryCtxRetain(&ctx[i], i) == CUDA_SUCCESS);
	CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&x, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(heap(x) != 0 && region(x) == 1000);
	CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&a1, 1000) == CUDA_SUCCESS && region(a1) == 0);
	CHECK(cuCtxSetCurrent(ctx[0]) == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&b, 1000) == CUDA_SUCCESS);
	CHECK(region(b) == 0 && heap(b) == 0); /* not carved from x's segment */
	CHECK(heap(x) != 0 && region(x) == 1000);
	unregs = count(HEAP_UNREGS);
	CHECK(cuMemFree(x) == CUDA_SUCCESS && region(x) == 0);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	CHECK(cuMemAlloc(&c, 1000) == CUDA_SUCCESS && region(c) == 0);
	CHECK(count(HEAP_UNREGS) == unregs + 1 && heap(x) == 0); /* drained: given back */
	CHECK(cuMemFree(b) == CUDA_SUCCESS && cuMemFree(c) == CUDA_SUCCESS);
	CHECK(cuCtxSetCurrent(ctx[1]) == CUDA_SUCCESS && cuMemFree(a1) == CUDA_SUCCESS);
	CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	CHECK(shims_release_idle(-1, 0) >= 0);
	CHECK(count(HEAPS) == 0 && count(ERRORS) == 0);
}

/* race-multidevice's order (the GPU test's third memcheck report was a
 * region unregister the tool did not know): per device a block kept to the
 * end, a block and a stream-ordered one freed at once; then blocks of each
 * device freed from the other's context, stream-ordered ones among them,
 * peer access both ways, and the kept blocks freed last. The tool must
 * see no region unregistered that it does not hold: the fake tool, like
 * compute-sanitizer, drops device 0's regions when device 1 gains access
 * to its memory, and device 0's kept block was registered before. */
static void multidev_mode(void)
{
	CUcontext ctx[2];
	CUstream st[2];
	CUdeviceptr res[2], w, w2, blk[2][12];

	for (int d = 0; d < 2; d++) {
		CHECK(cuDevicePrimaryCtxRetain(&ctx[d], d) == CUDA_SUCCESS);
		CHECK(cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
		CHECK(cuStreamCreate(&st[d], CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
		CHECK(cuMemAlloc(&res[d], 24) == CUDA_SUCCESS);
		if (d == 0)
			find_tool();
		CHECK(cuMemAlloc(&w, 4096) == CUDA_SUCCESS);
		CHECK(cuMemAllocAsync(&w2, 4096, st[d]) == CUDA_SUCCESS);
		CHECK(cuStreamSynchronize(st[d]) == CUDA_SUCCESS);
		CHECK(cuMemFreeAsync(w2, st[d]) == CUDA_SUCCESS);
		CHECK(cuMemFree(w) == CUDA_SUCCESS);
		CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
	}
	for (int d = 0; d < 2; d++) {
		CHECK(cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
		for (int i = 0; i < 12; i++) {
			size_t size = (size_t)(i + 1) * (i % 3 == 2 ? 700000 : 3000);
			if (i % 2)
				CHECK(cuMemAllocAsync(&blk[d][i], size, st[d]) == CUDA_SUCCESS);
			else
				CHECK(cuMemAlloc(&blk[d][i], size) == CUDA_SUCCESS);
		}
		CHECK(cuStreamSynchronize(st[d]) == CUDA_SUCCESS);
	}
	for (int d = 0; d < 2; d++) {
		CHECK(cuCtxSetCurrent(ctx[1 - d]) == CUDA_SUCCESS); /* the other device frees */
		for (int i = 0; i < 12; i++)
			CHECK(cuMemFree(blk[d][i]) == CUDA_SUCCESS);
	}
	for (int d = 0; d < 2; d++) { /* both ways, as the GPU test: the tool drops each device's regions */
		CHECK(cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
		CUresult pe = cuCtxEnablePeerAccess(ctx[1 - d], 0);
		CHECK(pe == CUDA_SUCCESS || pe == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
	}
	for (int d = 0; d < 2; d++) {
		CHECK(cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
		for (int i = 0; i < 40; i++) {
			CHECK(cuMemAlloc(&w, 1000 + (size_t)i * 5000) == CUDA_SUCCESS);
			CHECK(cuMemFree(w) == CUDA_SUCCESS);
		}
	}
	for (int d = 0; d < 2; d++) {
		CHECK(cuCtxSetCurrent(ctx[d]) == CUDA_SUCCESS);
		CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
		CHECK(cuStreamDestroy(st[d]) == CUDA_SUCCESS);
		CHECK(cuMemFree(res[d]) == CUDA_SUCCESS);
	}
	CHECK(count(ERRORS) == 0);
	CHECK(shims_release_idle(-1, 0) >= 0);
	CHECK(count(ERRORS) == 0);
}

static void none_mode(void)
{
	CUdeviceptr a;

	CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
	find_tool();
	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(count(HEAP_REGS) == 0 && count(REGION_REGS) == 0 && count(REGION_UNREGS) == 0);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "tool";

	shims_setup();
	if (strcmp(mode, "none") == 0)
		none_mode();
	else if (strcmp(mode, "exit") == 0)
		exit_mode();
	else if (strcmp(mode, "vmm") == 0)
		vmm_mode();
	else if (strcmp(mode, "peer") == 0)
		peer_mode();
	else if (strcmp(mode, "devices") == 0)
		devices_mode();
	else if (strcmp(mode, "multidev") == 0)
		multidev_mode();
	else if (strcmp(mode, "carve") == 0)
		carve_mode();
	else if (strcmp(mode, "destroyed") == 0)
		destroyed_mode();
	else if (strcmp(mode, "gone") == 0)
		gone_mode();
	else if (strcmp(mode, "reset") == 0)
		reset_mode();
	else if (strcmp(mode, "dead") == 0)
		dead_mode();
	else if (strcmp(mode, "capture") == 0)
		capture_mode();
	else if (strcmp(mode, "quarantine") == 0)
		quarantine_mode();
	else if (strcmp(mode, "refused") == 0)
		refused_mode();
	else
		tool_mode();
	printf("test_annotate %s: ok\n", mode);
	return 0;
}
