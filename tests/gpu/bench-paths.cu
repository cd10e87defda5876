/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/bench-paths.cu - host time of one cached allocation + free pair,
 * per path and size (a measurement, not a test; nothing is installed).
 *
 * Built with shared cudart and linked with -lcuda, so one binary measures
 * every path; the environment picks the mode:
 *
 *   LD_PRELOAD=libemm.so                      cudaMalloc served by libemm's
 *                                             runtime shim (the fast path)
 *   LD_PRELOAD=libemm.so EMM_RUNTIME_SHIMS=0  cudaMalloc through cudart to
 *                                             libemm's driver shim
 *   (no LD_PRELOAD)                           the raw driver; and
 *                                             cudaMallocAsync on CUDA's
 *                                             default pool (kept)
 *
 * For each of cudaMalloc+cudaFree, cuMemAlloc+cuMemFree and
 * cudaMallocAsync+cudaFreeAsync, and 256 B to 256 MiB (project issue 11's
 * range: the target is a cached pair at most 1/7 of cudaMallocAsync's at every
 * size; --sizes 16M,48M,... measures those instead, without the VMM rows); and for XLA's platform-allocator buffer (issue 10: cuMemCreate +
 * cuMemAddressReserve + cuMemMap + cuMemSetAccess, freed with cuMemUnmap +
 * cuMemRelease + cuMemAddressFree, in XLA's order and with its properties:
 * a POSIX file descriptor handle type requested, the granularity as the
 * reservation's alignment), alone, with the cuCtxSynchronize XLA makes
 * before each unmap, and with XLA's 18 idle non-blocking streams alive
 * (libemm's fence asks each with cuStreamQuery at every cached free and
 * records an event only on busy ones), at 2, 8
 * and 64 MiB (under libemm the sequence is served by its VMM cache; the
 * "hits" columns then count VMM cache hits):
 * 0.3 s of untimed pairs through every path first, then three
 * rounds over the sizes, the paths in a rotated order at each (the median
 * round kept), each time a warm-up,
 * then the median (and p10, p90) of --iters individually timed pairs. Prints
 * which mode it ran in (whether emm_stats_get is present, where cudaMalloc
 * and cuMemAlloc_v2 resolve), a table, and "BENCH\t..." lines that
 * tests/gpu/run-bench-paths.sh merges. With $OUT set (and no --no-out) the
 * table also goes to $OUT/bench-paths-<mode>.md.
 *
 * Run under libemm, the VMM rows show what one cached buffer costs libemm
 * on the host; without it, what the driver costs (the cuCtxSynchronize rows
 * add only the synchronisation's fixed cost: the device is idle here, while
 * in XLA it waits for all queued work).
 *
 *   bench-paths [--iters N] [--warmup N] [--no-out]
 */
#include <cuda.h>
#include <cuda_runtime.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_common.h"
#include "vmm_calls.h"

enum { NSIZES = 16 }; /* at most, with --sizes */
static size_t sizes[NSIZES] = {256, 64u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20, 256u << 20};
static const char *size_names[NSIZES] = {"256 B", "64 KiB", "1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB"};
static int nsizes = 7;
static bool vmm_rows = true; /* off with --sizes */

/* --sizes LIST: comma-separated sizes in bytes, or with a K or M suffix
 * (binary); false on a bad list. Named "N MiB", "N KiB" or "N B". */
static bool parse_sizes(char *list)
{
	static char names[NSIZES][24];
	int n = 0;

	for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
		char *end;
		unsigned long long v = strtoull(t, &end, 10);
		unsigned shift = *end == 'K' ? 10 : *end == 'M' ? 20 : 0;
		if (n == NSIZES || v == 0 || (shift && *++end) || *end)
			return false;
		sizes[n] = (size_t)v << shift;
		snprintf(names[n], sizeof(names[n]), "%llu %s", v, shift == 20 ? "MiB" : shift ? "KiB" : "B");
		size_names[n] = names[n];
		n++;
	}
	nsizes = n;
	return n > 0;
}
enum { ROUNDS = 3 };

enum api { API_CUDA_MALLOC, API_CU_MEM_ALLOC, API_CUDA_MALLOC_ASYNC, NAPIS };
/* The VMM sequences, numbered after the pairs (their BENCH lines' api
 * field), measured at their own sizes (multiples of the granularity). */
enum vmm_api { API_VMM = NAPIS, API_VMM_SYNC, API_VMM_STREAMS, NALL };
enum { NVMM = NALL - NAPIS };
static const char *api_names[] = {"cudaMalloc+cudaFree", "cuMemAlloc+cuMemFree",
                                  "cudaMallocAsync+cudaFreeAsync",
                                  "VMM create+reserve+map+access / unmap+release+free",
                                  "the same + cuCtxSynchronize before the unmap (XLA's free)",
                                  "VMM sequence with XLA's idle non-blocking streams alive"};
static const size_t vmm_sizes[] = {2u << 20, 8u << 20, 64u << 20};
/* Non-blocking streams XLA keeps per GPU (pjrt/local_device_state.h: the
 * compute and host-to-device streams, 4 device-to-host, 4 device-to-device,
 * 4 fixed-size-pool usage, 4 external-ready; callback streams besides):
 * libemm asks each live non-blocking stream at a cached VMM free and fences
 * the busy ones. */
enum { XLA_STREAMS = 18 };
static CUstream xla_streams[XLA_STREAMS];
static const char *vmm_size_names[] = {"2 MiB", "8 MiB", "64 MiB"};
enum { NVSIZES = sizeof(vmm_sizes) / sizeof(vmm_sizes[0]) };

struct result {
	double median_us, p10_us, p90_us, mean_us;
	unsigned long long hits, misses, backend;
	bool ok;
};

static inline long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static cudaStream_t stream;

/* XLA's buffer properties (stream_executor/cuda/cuda_device_allocator.cc):
 * pinned device memory with a POSIX file descriptor handle type requested
 * (CU_MEM_HANDLE_TYPE_NONE where the driver refuses it, as XLA falls back),
 * reserved at the recommended granularity. */
static CUmemAllocationProp vmm_prop;
static CUmemAccessDesc vmm_access;
static size_t vmm_granularity;
static const char *vmm_handle_type = "unset";

static bool vmm_setup(int dev)
{
	CUmemGenericAllocationHandle h;

	vmm_prop = vmm_call_prop(dev, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	vmm_handle_type = "POSIX_FILE_DESCRIPTOR";
	if (cuMemCreate(&h, 2u << 20, &vmm_prop, 0) == CUDA_SUCCESS) {
		(void)cuMemRelease(h);
	} else {
		vmm_prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
		vmm_handle_type = "NONE";
	}
	vmm_access = vmm_call_access(dev);
	return cuMemGetAllocationGranularity(&vmm_granularity, &vmm_prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) ==
	           CUDA_SUCCESS &&
	       vmm_granularity > 0;
}

/* One XLA buffer: made and freed in XLA's order; with sync, the
 * cuCtxSynchronize XLA makes before every unmap (on an idle device here,
 * so only its fixed cost). false on any error (what was made is undone). */
static bool vmm_pair(size_t size, bool sync)
{
	CUmemGenericAllocationHandle h;
	CUdeviceptr va = 0;
	bool ok;

	if (cuMemCreate(&h, size, &vmm_prop, 0) != CUDA_SUCCESS)
		return false;
	if (cuMemAddressReserve(&va, size, vmm_granularity, 0, 0) != CUDA_SUCCESS) {
		(void)cuMemRelease(h);
		return false;
	}
	if (cuMemMap(va, size, 0, h, 0) != CUDA_SUCCESS) {
		(void)cuMemRelease(h);
		(void)cuMemAddressFree(va, size);
		return false;
	}
	ok = cuMemSetAccess(va, size, &vmm_access, 1) == CUDA_SUCCESS;
	if (sync)
		ok = cuCtxSynchronize() == CUDA_SUCCESS && ok;
	ok = cuMemUnmap(va, size) == CUDA_SUCCESS && ok;
	ok = cuMemRelease(h) == CUDA_SUCCESS && ok;
	return cuMemAddressFree(va, size) == CUDA_SUCCESS && ok;
}

/* One pair; false on any error. */
static bool pair(int api, size_t size)
{
	switch (api) {
	case API_CUDA_MALLOC: {
		void *p = NULL;
		return cudaMalloc(&p, size) == cudaSuccess && cudaFree(p) == cudaSuccess;
	}
	case API_CU_MEM_ALLOC: {
		CUdeviceptr p = 0;
		return cuMemAlloc(&p, size) == CUDA_SUCCESS && cuMemFree(p) == CUDA_SUCCESS;
	}
	case API_CUDA_MALLOC_ASYNC: {
		void *p = NULL;
		return cudaMallocAsync(&p, size, stream) == cudaSuccess &&
		       cudaFreeAsync(p, stream) == cudaSuccess;
	}
	default: /* API_VMM_STREAMS: the same calls, more streams alive */
		return vmm_pair(size, api == API_VMM_SYNC);
	}
}

static struct result measure_pairs(int api, size_t size, int iters, int warmup);

/* One path at one size; API_VMM_STREAMS with XLA's streams made (driver
 * API, non-blocking, as XLA makes them) around it and destroyed after. */
static struct result measure(int api, size_t size, int iters, int warmup)
{
	struct result r = {};
	int made = 0;

	if (api == API_VMM_STREAMS)
		for (; made < XLA_STREAMS; made++)
			if (cuStreamCreate(&xla_streams[made], CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
				break;
	if (api != API_VMM_STREAMS || made == XLA_STREAMS)
		r = measure_pairs(api, size, iters, warmup);
	while (made > 0)
		(void)cuStreamDestroy(xla_streams[--made]);
	return r;
}

static struct result measure_pairs(int api, size_t size, int iters, int warmup)
{
	struct result r = {};
	std::vector<long long> t((size_t)iters);
	struct emm_stats a, b;

	for (int i = 0; i < warmup; i++) {
		if (!pair(api, size))
			return r;
	}
	cudaStreamSynchronize(stream);
	(void)gpu_stats(GPU_SCOPE_PROCESS, &a);
	for (int i = 0; i < iters; i++) {
		long long t0 = now_ns();
		bool ok = pair(api, size);
		t[(size_t)i] = now_ns() - t0;
		if (!ok)
			return r;
		if (api == API_CUDA_MALLOC_ASYNC && (i & 255) == 255)
			cudaStreamSynchronize(stream); /* untimed: keep the queue short */
	}
	cudaStreamSynchronize(stream);
	(void)gpu_stats(GPU_SCOPE_PROCESS, &b);
	long long sum = 0;
	for (long long x : t)
		sum += x;
	r.mean_us = (double)sum / (double)t.size() / 1000.0;
	std::sort(t.begin(), t.end());
	r.median_us = t[t.size() / 2] / 1000.0;
	r.p10_us = t[t.size() / 10] / 1000.0;
	r.p90_us = t[t.size() * 9 / 10] / 1000.0;
	if (api >= NAPIS) { /* the VMM cache's counters */
		r.hits = b.vmm_hits - a.vmm_hits;
		r.misses = b.vmm_misses - a.vmm_misses;
		r.backend = b.vmm_allocs - a.vmm_allocs;
	} else {
		r.hits = b.hits - a.hits;
		r.misses = b.misses - a.misses;
		r.backend = b.backend_allocs - a.backend_allocs;
	}
	r.ok = true;
	return r;
}

/* Of one path's and size's rounds, the round whose median is the median of
 * the rounds' (any failure wins). */
static struct result median_round(const struct result *rounds)
{
	int order[ROUNDS];

	for (int r = 0; r < ROUNDS; r++) {
		if (!rounds[r].ok)
			return rounds[r];
		order[r] = r;
	}
	std::sort(order, order + ROUNDS, [&](int x, int y) { return rounds[x].median_us < rounds[y].median_us; });
	return rounds[order[ROUNDS / 2]];
}

/* One table row, and its BENCH line: "BENCH\tmode\tapi\tsize\tmedian\tp10\t
 * p90\tok\thits\tmisses\tmean" (hits and misses: the pool's, or for the VMM
 * sequences the VMM cache's; 0 without libemm; mean: all the pairs' time over
 * their count, which counts the few slow pairs a median passes over). */
static void report_row(std::string *table, std::string *bench, const std::string &mode, int api, size_t size,
                       const char *size_name, const struct result *r)
{
	char row[320];

	if (!r->ok)
		snprintf(row, sizeof(row), "| %s | %s | FAILED | | | | | |\n", api_names[api], size_name);
	else if (gpu_emm_present())
		snprintf(row, sizeof(row), "| %s | %s | %.2f | %.2f | %.2f | %llu | %llu | %llu |\n", api_names[api],
		         size_name, r->median_us, r->p10_us, r->p90_us, r->hits, r->misses, r->backend);
	else
		snprintf(row, sizeof(row), "| %s | %s | %.2f | %.2f | %.2f | - | - | - |\n", api_names[api], size_name,
		         r->median_us, r->p10_us, r->p90_us);
	*table += row;
	snprintf(row, sizeof(row), "BENCH\t%s\t%d\t%zu\t%.3f\t%.3f\t%.3f\t%d\t%llu\t%llu\t%.3f\n", mode.c_str(), api,
	         size, r->median_us, r->p10_us, r->p90_us, r->ok ? 1 : 0, r->hits, r->misses, r->mean_us);
	*bench += row;
}

int main(int argc, char **argv)
{
	int iters = 2000, warmup = 200, count = 0;
	bool no_out = false;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
			iters = atoi(argv[++i]);
		else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
			warmup = atoi(argv[++i]);
		else if (strcmp(argv[i], "--no-out") == 0)
			no_out = true;
		else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc && parse_sizes(argv[++i]))
			vmm_rows = false;
		else {
			fprintf(stderr, "usage: %s [--iters N] [--warmup N] [--no-out] [--sizes 256,64K,48M]\n", argv[0]);
			return 2;
		}
	}
	if (iters < 2000)
		fprintf(stderr, "bench-paths: note: %d iterations (< 2000)\n", iters);
	if (iters < 10)
		iters = 10;

	cudaError_t e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		printf("skip: no usable CUDA device (cudaGetDeviceCount: %s)\n", cudaGetErrorName(e));
		return GPU_SKIP;
	}
	if (cudaSetDevice(0) != cudaSuccess || cudaFree(NULL) != cudaSuccess ||
	    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
		printf("FAIL: cannot initialise device 0\n");
		return 1;
	}
	CUdevice cudev;
	if (cuDeviceGet(&cudev, 0) != CUDA_SUCCESS || !vmm_setup((int)cudev)) {
		printf("FAIL: cannot set up VMM allocations on device 0\n");
		return 1;
	}
	/* CUDA's default pool keeps what it has (the "pool kept" column). */
	cudaMemPool_t pool;
	if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) {
		unsigned long long keep = ~0ull;
		cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
	}

	const char *shims = getenv("EMM_RUNTIME_SHIMS");
	const char *disable = getenv("EMM_DISABLE");
	std::string mode;
	if (!gpu_emm_present())
		mode = "raw";
	else if (disable && strcmp(disable, "0") != 0 && *disable)
		mode = "emm-disabled";
	else if (shims && (strcmp(shims, "0") == 0 || strcasecmp(shims, "off") == 0 ||
	                   strcasecmp(shims, "no") == 0 || strcasecmp(shims, "false") == 0))
		mode = "emm-noshims";
	else
		mode = "emm";

	char head[1536];
	snprintf(head, sizeof(head),
	         "bench-paths mode: %s (emm_stats_get %s; EMM_RUNTIME_SHIMS=%s; EMM_DISABLE=%s)\n"
	         "  cudaMalloc resolves in %s\n  cuMemAlloc_v2 resolves in %s\n"
	         "  cuMemCreate resolves in %s\n"
	         "  VMM buffers: handle type %s requested, granularity %zu B (the reservation's alignment)\n"
	         "  %d timed pairs after %d warm-up pairs, host time per pair, median [p10, p90];\n"
	         "  %d rounds, paths in rotated order per size, the median round kept;\n"
	         "  VMM rows: hits, misses and allocs are the VMM cache's (vmm_hits, vmm_misses, vmm_allocs)\n",
	         mode.c_str(), gpu_emm_present() ? "present" : "absent", shims ? shims : "(unset)",
	         disable ? disable : "(unset)", gpu_where(dlsym(RTLD_DEFAULT, "cudaMalloc")),
	         gpu_where(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")), gpu_where(dlsym(RTLD_DEFAULT, "cuMemCreate")),
	         vmm_handle_type, vmm_granularity, iters, warmup, (int)ROUNDS);
	fputs(head, stdout);

	/* Every path warm before any is timed: the paths are timed one after
	 * the other, and a cold start (CPU clock, caches, the driver's lazy
	 * set-up) would otherwise be charged to whichever comes first
	 * (cudaMalloc). Untimed: 0.3 s of small pairs through every path. */
	const int nv = vmm_rows ? (int)NVSIZES : 0; /* VMM rows: none with --sizes */
	long long warm_until = now_ns() + 300000000ll;
	while (now_ns() < warm_until) {
		for (int a = 0; a < NAPIS; a++)
			for (int s = 0; s < 4 && s < nsizes; s++)
				(void)pair(a, sizes[s]);
		for (int a = NAPIS; a < NALL && vmm_rows; a++)
			(void)pair(a, vmm_sizes[0]);
		cudaStreamSynchronize(stream); /* keep the queue short */
	}

	/* ROUNDS rounds, each size in turn, the paths in a rotated order (each
	 * path comes first, second and last once at every size): a path's
	 * time must not depend on what ran before it (the heap's large blocks
	 * and pending fences, which the previous path left). Kept per path
	 * and size: the round with the median time. */
	static struct result rounds[NAPIS][NSIZES][ROUNDS];
	static struct result vrounds[NVMM][NVSIZES][ROUNDS];
	for (int r = 0; r < ROUNDS; r++) {
		for (int s = 0; s < nsizes; s++)
			for (int k = 0; k < NAPIS; k++) {
				int a = (k + r) % NAPIS;
				rounds[a][s][r] = measure(a, sizes[s], iters, warmup);
			}
		for (int s = 0; s < nv; s++)
			for (int k = 0; k < NVMM; k++) {
				int v = (k + r) % NVMM;
				vrounds[v][s][r] = measure(NAPIS + v, vmm_sizes[s], iters, warmup);
			}
	}
	struct result res[NAPIS][NSIZES], vres[NVMM][NVSIZES];
	bool all_ok = true;
	for (int a = 0; a < NAPIS; a++)
		for (int s = 0; s < nsizes; s++) {
			res[a][s] = median_round(rounds[a][s]);
			all_ok = all_ok && res[a][s].ok;
		}
	for (int v = 0; v < NVMM; v++)
		for (int s = 0; s < nv; s++) {
			vres[v][s] = median_round(vrounds[v][s]);
			all_ok = all_ok && vres[v][s].ok;
		}

	std::string table =
	    "| path | size | median µs | p10 µs | p90 µs | pool hits | misses | backend allocs |\n"
	    "|---|---|---|---|---|---|---|---|\n";
	std::string bench;
	for (int a = 0; a < NAPIS; a++)
		for (int s = 0; s < nsizes; s++)
			report_row(&table, &bench, mode, a, sizes[s], size_names[s], &res[a][s]);
	for (int v = 0; v < NVMM; v++)
		for (int s = 0; s < nv; s++)
			report_row(&table, &bench, mode, NAPIS + v, vmm_sizes[s], vmm_size_names[s], &vres[v][s]);
	fputs(table.c_str(), stdout);
	fputs(bench.c_str(), stdout);
	fflush(stdout);

	const char *out = getenv("OUT");
	if (out && *out && !no_out) {
		std::string path = std::string(out) + "/bench-paths-" + mode + ".md";
		FILE *f = fopen(path.c_str(), "w");
		if (f) {
			fputs(head, f);
			fputs("\n", f);
			fputs(table.c_str(), f);
			fclose(f);
			printf("written to %s\n", path.c_str());
		} else {
			fprintf(stderr, "bench-paths: cannot write %s\n", path.c_str());
		}
	}
	cudaStreamDestroy(stream);
	return all_ok ? 0 : 1;
}
