/* SPDX-License-Identifier: MIT */
/*
 * bench-shims: alloc/free pairs through libemm's driver shims over the
 * test-double driver (tests/fakecuda), on 1..N threads: the whole hot path a
 * program pays (shim, context lookup, guard, heap, block table, statistics),
 * the device replaced by host memory. Run it with LD_PRELOAD=libemm.so and
 * the fake's folder first in LD_LIBRARY_PATH (tests/bench/run-shims.sh).
 *
 *   bench-shims [--pattern ws|lifo] [--api sync|async|rt|rt-async|vmm] [--threads 1,2,4]
 *               [--pairs N] [--size BYTES] [--nb-streams N]
 *
 * --nb-streams N creates N idle non-blocking streams first: every epoch
 * close then asks each of them whether it is idle (cuStreamQuery), records
 * the legacy event and polls it (what closing an epoch costs, in driver
 * calls and instructions, with them alive).
 * --pinned keeps one pinned host block (cuMemAllocHost) live throughout, as
 * a program that pins memory (PyTorch's data loaders) has: every device free
 * then also checks that the block is not a pinned one.
 * --pre-size BYTES makes 1000 untimed pairs of that size (same API, legacy
 * stream) before the timed ones: the heap's history, which decides how
 * often a large request finds a completed block (FAKECUDA_EVENT_DELAY=N
 * makes each event complete only at its N-th query, as a device would a
 * few microseconds after the record).
 *
 * Patterns (the GPU's tests/gpu/bench_threads.cu does the same on a GPU):
 *   ws   - every thread keeps 64 live buffers of random sizes (256 B - 8 MiB,
 *          log-uniform, per-thread seed) and per iteration frees one at
 *          random and allocates one of a new random size
 *   lifo - allocate --size bytes (64 KiB) and free it at once
 * APIs: sync (cuMemAlloc_v2/cuMemFree_v2) or async (cuMemAllocAsync/
 * cuMemFreeAsync on a per-thread non-blocking stream); rt (cudaMalloc/
 * cudaFree) or rt-async (cudaMallocAsync/cudaFreeAsync on a per-thread
 * non-blocking stream) through the test-double shared cudart
 * (tests/interpose/fakecudart, which the program links): libemm's runtime
 * shims serve them (interpose/shims_runtime.c), or with EMM_RUNTIME_SHIMS=0
 * the fake cudart calls libemm's driver shims, as a real one would.
 * vmm (LIFO only, --size rounded up to the 2 MiB granularity): one buffer
 * of XLA's platform allocator per pair (issue 10), made and freed in XLA's
 * order and with its properties - cuMemCreate (POSIX file descriptor
 * handle type requested), cuMemAddressReserve (granularity alignment),
 * cuMemMap, cuMemSetAccess, then cuMemUnmap, cuMemRelease,
 * cuMemAddressFree - served by libemm's VMM cache: its own host work per
 * cached buffer without a real driver under it; with --nb-streams 18
 * (XLA's non-blocking streams per GPU) the fence's calls - one
 * cuStreamQuery per stream and the legacy event at each free (an event
 * only on a busy stream), the event queries at each reuse - are among the
 * counted driver calls.
 *
 * Prints per thread count: million pairs per second (all threads), and the
 * driver calls per pair that reached the fake in the timed section (the
 * shims' own calls subtracted: context lookup, events, segments). With
 * --threads 1 and two values of --pairs under `valgrind --tool=callgrind`,
 * the difference of the instruction counts over the difference of the pairs
 * is the instructions per pair (run-shims.sh does it).
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fakecuda.h"

#define LIVE 64

enum api { API_SYNC, API_ASYNC, API_RT, API_RT_ASYNC, API_VMM };
static const char *const api_names[] = {"sync", "async", "rt", "rt-async", "vmm"};
static enum api api;
static bool lifo;
static size_t lifo_size = 64 << 10;
static unsigned long long pairs_per_thread = 200000;
static CUcontext g_ctx;
static unsigned nb_streams;
static size_t pre_size; /* --pre-size: untimed pairs of this size first */
static bool pinned_block; /* --pinned: one live pinned host block (as PyTorch's pinned memory) */
static pthread_barrier_t start; /* the workers' fill done: the clock starts */

/* Driver calls the shims make on their own behalf (counted per pair). */
static const char *const counted[] = {
	"cuCtxGetId", "cuCtxGetCurrent", "cuEventRecord", "cuEventRecordWithFlags", "cuEventQuery",
	"cuEventCreate", "cuEventDestroy_v2", "cuStreamWaitEvent", "cuMemAlloc_v2", "cuMemFree_v2",
	"cuStreamGetCaptureInfo_v3", "cuStreamIsCapturing", "cuStreamQuery", "cuCtxPushCurrent_v2",
	"cuCtxPopCurrent_v2", "cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
	"cuMemRelease", "cuMemAddressFree",
};
#define NCOUNTED (sizeof(counted) / sizeof(counted[0]))

/* Runtime calls that reached the fake cudart (not served by libemm's
 * runtime shims), counted per pair the same way. */
uint64_t fakecudart_calls(const char *name);
static const char *const counted_rt[] = {"cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync"};
#define NCOUNTED_RT (sizeof(counted_rt) / sizeof(counted_rt[0]))

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

static size_t random_size(uint64_t *rng)
{
	double u = (double)(xorshift(rng) >> 11) * (1.0 / 9007199254740992.0);
	return (size_t)exp(log(256.0) + u * (log(8.0 * 1024 * 1024) - log(256.0)));
}

struct worker {
	pthread_t tid;
	int id;
	bool ok;
	double t0, t1; /* its timed section (the main thread's clock may start late) */
};

/* One XLA platform-allocator buffer, made and freed (API_VMM). */
static bool vmm_pair(size_t n)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	const size_t gran = 2u << 20;
	bool ok;

	memset(&prop, 0, sizeof(prop));
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	n = (n + gran - 1) / gran * gran;
	if (cuMemCreate(&h, n, &prop, 0) != CUDA_SUCCESS)
		return false;
	if (cuMemAddressReserve(&va, n, gran, 0, 0) != CUDA_SUCCESS) {
		(void)cuMemRelease(h);
		return false;
	}
	ok = cuMemMap(va, n, 0, h, 0) == CUDA_SUCCESS;
	ok = ok && cuMemSetAccess(va, n, &acc, 1) == CUDA_SUCCESS;
	ok = ok && cuMemUnmap(va, n) == CUDA_SUCCESS;
	ok = cuMemRelease(h) == CUDA_SUCCESS && ok;
	return cuMemAddressFree(va, n) == CUDA_SUCCESS && ok;
}

static bool do_alloc(CUdeviceptr *p, size_t n, CUstream s)
{
	void *v = NULL;

	switch (api) {
	case API_SYNC:
		return cuMemAlloc(p, n) == CUDA_SUCCESS;
	case API_ASYNC:
		return cuMemAllocAsync(p, n, s) == CUDA_SUCCESS;
	case API_RT:
		if (cudaMalloc(&v, n) != cudaSuccess)
			return false;
		break;
	default:
		if (cudaMallocAsync(&v, n, (cudaStream_t)s) != cudaSuccess)
			return false;
		break;
	}
	*p = (CUdeviceptr)(uintptr_t)v;
	return true;
}

static bool do_free(CUdeviceptr p, CUstream s)
{
	switch (api) {
	case API_SYNC:
		return cuMemFree(p) == CUDA_SUCCESS;
	case API_ASYNC:
		return cuMemFreeAsync(p, s) == CUDA_SUCCESS;
	case API_RT:
		return cudaFree((void *)(uintptr_t)p) == cudaSuccess;
	default:
		return cudaFreeAsync((void *)(uintptr_t)p, (cudaStream_t)s) == cudaSuccess;
	}
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	CUstream s = NULL;
	CUdeviceptr live[LIVE];
	uint64_t rng = 0x9e3779b97f4a7c15ull * (uint64_t)(w->id + 1);
	bool ok = cuCtxSetCurrent(g_ctx) == CUDA_SUCCESS;

	if (api == API_ASYNC || api == API_RT_ASYNC)
		ok = ok && cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS;
	if (!lifo)
		for (int i = 0; ok && i < LIVE; i++)
			ok = do_alloc(&live[i], random_size(&rng), s);
	pthread_barrier_wait(&start);
	w->t0 = now_s();
	for (unsigned long long i = 0; ok && i < pairs_per_thread; i++) {
		if (api == API_VMM) {
			ok = vmm_pair(lifo_size);
		} else if (lifo) {
			CUdeviceptr p;
			ok = do_alloc(&p, lifo_size, s) && do_free(p, s);
		} else {
			unsigned k = (unsigned)(xorshift(&rng) % LIVE);
			ok = do_free(live[k], s) && do_alloc(&live[k], random_size(&rng), s);
		}
	}
	w->t1 = now_s();
	if (!lifo)
		for (int i = 0; i < LIVE; i++)
			(void)do_free(live[i], s);
	if (s)
		cuStreamDestroy(s);
	w->ok = ok;
	return NULL;
}

static int run(unsigned nthreads)
{
	struct worker *w = calloc(nthreads, sizeof(*w));
	uint64_t before[NCOUNTED], before_rt[NCOUNTED_RT];
	double t0, t1;

	if (!w)
		return 1;
	pthread_barrier_init(&start, NULL, nthreads + 1);
	for (unsigned i = 0; i < nthreads; i++) {
		w[i].id = (int)i;
		if (pthread_create(&w[i].tid, NULL, worker_main, &w[i]))
			return 1;
	}
	for (unsigned i = 0; i < NCOUNTED; i++)
		before[i] = fakecuda_calls(counted[i]);
	for (unsigned i = 0; i < NCOUNTED_RT; i++)
		before_rt[i] = fakecudart_calls(counted_rt[i]);
	pthread_barrier_wait(&start);
	for (unsigned i = 0; i < nthreads; i++)
		pthread_join(w[i].tid, NULL);
	t0 = w[0].t0;
	t1 = w[0].t1;
	for (unsigned i = 1; i < nthreads; i++) {
		t0 = w[i].t0 < t0 ? w[i].t0 : t0;
		t1 = w[i].t1 > t1 ? w[i].t1 : t1;
	}
	pthread_barrier_destroy(&start);
	double pairs = (double)pairs_per_thread * nthreads;
	int bad = 0;
	for (unsigned i = 0; i < nthreads; i++)
		bad += !w[i].ok;
	printf("%-4s %-8s nb %u threads %2u: %8.3f M pairs/s, %7.1f ns per pair per thread; driver calls per pair:",
	       lifo ? "lifo" : "ws", api_names[api], nb_streams, nthreads, pairs / (t1 - t0) / 1e6,
	       (t1 - t0) * 1e9 * nthreads / pairs);
	for (unsigned i = 0; i < NCOUNTED; i++) {
		uint64_t d = fakecuda_calls(counted[i]) - before[i];
		if (d)
			printf(" %s %.4f", counted[i], (double)d / pairs);
	}
	for (unsigned i = 0; i < NCOUNTED_RT; i++) {
		uint64_t d = fakecudart_calls(counted_rt[i]) - before_rt[i];
		if (d)
			printf(" cudart:%s %.4f", counted_rt[i], (double)d / pairs);
	}
	printf("%s\n", bad ? " (FAILED CALLS)" : "");
	free(w);
	return bad != 0;
}

static bool parse_api(const char *name)
{
	for (unsigned i = 0; i < sizeof(api_names) / sizeof(api_names[0]); i++)
		if (!strcmp(name, api_names[i])) {
			api = (enum api)i;
			return true;
		}
	return false;
}

int main(int argc, char **argv)
{
	char threads[256] = "1,2,4";
	CUdevice dev;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--pattern") && i + 1 < argc)
			lifo = !strcmp(argv[++i], "lifo");
		else if (!strcmp(argv[i], "--api") && i + 1 < argc && parse_api(argv[++i]))
			continue;
		else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
			snprintf(threads, sizeof(threads), "%s", argv[++i]);
		else if (!strcmp(argv[i], "--pairs") && i + 1 < argc)
			pairs_per_thread = strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--size") && i + 1 < argc)
			lifo_size = (size_t)strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--pre-size") && i + 1 < argc)
			pre_size = (size_t)strtoull(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--nb-streams") && i + 1 < argc)
			nb_streams = (unsigned)strtoul(argv[++i], NULL, 0);
		else if (!strcmp(argv[i], "--pinned"))
			pinned_block = true;
		else {
			fprintf(stderr, "usage: %s [--pattern ws|lifo] [--api sync|async|rt|rt-async|vmm] [--threads 1,2,4] "
			                "[--pairs N] [--size BYTES] [--nb-streams N] [--pre-size BYTES] [--pinned]\n",
			        argv[0]);
			return 2;
		}
	}
	if (api == API_VMM) { /* one buffer made and freed per pair */
		lifo = true;
		pre_size = 0;
	}
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&g_ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) {
		fprintf(stderr, "driver setup failed\n");
		return 1;
	}
	for (unsigned i = 0; i < nb_streams; i++) {
		CUstream s;
		if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
			return 1;
	}
	void *host = NULL;
	if (pinned_block && cuMemAllocHost(&host, 4096) != CUDA_SUCCESS) {
		fprintf(stderr, "--pinned: cuMemAllocHost failed\n");
		return 1;
	}
	for (int i = 0; pre_size && i < 1000; i++) {
		CUdeviceptr p;
		if (!do_alloc(&p, pre_size, NULL) || !do_free(p, NULL)) {
			fprintf(stderr, "--pre-size pairs failed\n");
			return 1;
		}
	}
	int rc = 0;
	for (char *save = NULL, *t = strtok_r(threads, ",", &save); t; t = strtok_r(NULL, ",", &save))
		rc |= run((unsigned)strtoul(t, NULL, 10));
	return rc;
}
