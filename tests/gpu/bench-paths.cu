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
 * size): 0.3 s of untimed pairs through every path first, then three
 * rounds over the sizes, the paths in a rotated order at each (the median
 * round kept), each time a warm-up,
 * then the median (and p10, p90) of --iters individually timed pairs. Prints
 * which mode it ran in (whether emm_stats_get is present, where cudaMalloc
 * and cuMemAlloc_v2 resolve), a table, and "BENCH\t..." lines that
 * tests/gpu/run-bench-paths.sh merges. With $OUT set (and no --no-out) the
 * table also goes to $OUT/bench-paths-<mode>.md.
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

static const size_t sizes[] = {256, 64u << 10, 1u << 20, 4u << 20, 16u << 20, 64u << 20, 256u << 20};
static const char *size_names[] = {"256 B", "64 KiB", "1 MiB", "4 MiB", "16 MiB", "64 MiB", "256 MiB"};
enum { NSIZES = sizeof(sizes) / sizeof(sizes[0]) };
enum { ROUNDS = 3 };

enum api { API_CUDA_MALLOC, API_CU_MEM_ALLOC, API_CUDA_MALLOC_ASYNC, NAPIS };
static const char *api_names[] = {"cudaMalloc+cudaFree", "cuMemAlloc+cuMemFree",
                                  "cudaMallocAsync+cudaFreeAsync"};

struct result {
	double median_us, p10_us, p90_us;
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
	default: {
		void *p = NULL;
		return cudaMallocAsync(&p, size, stream) == cudaSuccess &&
		       cudaFreeAsync(p, stream) == cudaSuccess;
	}
	}
}

static struct result measure(int api, size_t size, int iters, int warmup)
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
	std::sort(t.begin(), t.end());
	r.median_us = t[t.size() / 2] / 1000.0;
	r.p10_us = t[t.size() / 10] / 1000.0;
	r.p90_us = t[t.size() * 9 / 10] / 1000.0;
	r.hits = b.hits - a.hits;
	r.misses = b.misses - a.misses;
	r.backend = b.backend_allocs - a.backend_allocs;
	r.ok = true;
	return r;
}

/* The round whose median is the median of the rounds' (any failure wins). */
static struct result median_round(struct result (*rounds)[NAPIS][NSIZES], int a, int s)
{
	int order[ROUNDS];

	for (int r = 0; r < ROUNDS; r++) {
		if (!rounds[r][a][s].ok)
			return rounds[r][a][s];
		order[r] = r;
	}
	std::sort(order, order + ROUNDS, [&](int x, int y) { return rounds[x][a][s].median_us < rounds[y][a][s].median_us; });
	return rounds[order[ROUNDS / 2]][a][s];
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
		else {
			fprintf(stderr, "usage: %s [--iters N] [--warmup N] [--no-out]\n", argv[0]);
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

	char head[1024];
	snprintf(head, sizeof(head),
	         "bench-paths mode: %s (emm_stats_get %s; EMM_RUNTIME_SHIMS=%s; EMM_DISABLE=%s)\n"
	         "  cudaMalloc resolves in %s\n  cuMemAlloc_v2 resolves in %s\n"
	         "  %d timed pairs after %d warm-up pairs, host time per pair, median [p10, p90];\n"
	         "  %d rounds, paths in rotated order per size, the median round kept\n",
	         mode.c_str(), gpu_emm_present() ? "present" : "absent", shims ? shims : "(unset)",
	         disable ? disable : "(unset)", gpu_where(dlsym(RTLD_DEFAULT, "cudaMalloc")),
	         gpu_where(dlsym(RTLD_DEFAULT, "cuMemAlloc_v2")), iters, warmup, (int)ROUNDS);
	fputs(head, stdout);

	/* Every path warm before any is timed: the paths are timed one after
	 * the other, and a cold start (CPU clock, caches, the driver's lazy
	 * set-up) would otherwise be charged to whichever comes first
	 * (cudaMalloc). Untimed: 0.3 s of small pairs through every path. */
	long long warm_until = now_ns() + 300000000ll;
	while (now_ns() < warm_until) {
		for (int a = 0; a < NAPIS; a++)
			for (int s = 0; s < 4; s++)
				(void)pair(a, sizes[s]);
		cudaStreamSynchronize(stream); /* keep the queue short */
	}

	/* ROUNDS rounds, each size in turn, the paths in a rotated order (each
	 * path comes first, second and last once at every size): a path's
	 * time must not depend on what ran before it (the heap's large blocks
	 * and pending fences, which the previous path left). Kept per path
	 * and size: the round with the median time. */
	static struct result rounds[ROUNDS][NAPIS][NSIZES];
	for (int r = 0; r < ROUNDS; r++)
		for (int s = 0; s < NSIZES; s++)
			for (int k = 0; k < NAPIS; k++) {
				int a = (k + r) % NAPIS;
				rounds[r][a][s] = measure(a, sizes[s], iters, warmup);
			}
	struct result res[NAPIS][NSIZES];
	for (int a = 0; a < NAPIS; a++)
		for (int s = 0; s < NSIZES; s++)
			res[a][s] = median_round(rounds, a, s);

	std::string table =
	    "| path | size | median µs | p10 µs | p90 µs | pool hits | misses | backend allocs |\n"
	    "|---|---|---|---|---|---|---|---|\n";
	for (int a = 0; a < NAPIS; a++) {
		for (int s = 0; s < NSIZES; s++) {
			char row[256];
			const struct result *r = &res[a][s];
			if (!r->ok)
				snprintf(row, sizeof(row), "| %s | %s | FAILED | | | | | |\n", api_names[a],
				         size_names[s]);
			else if (gpu_emm_present())
				snprintf(row, sizeof(row),
				         "| %s | %s | %.2f | %.2f | %.2f | %llu | %llu | %llu |\n",
				         api_names[a], size_names[s], r->median_us, r->p10_us, r->p90_us,
				         r->hits, r->misses, r->backend);
			else
				snprintf(row, sizeof(row), "| %s | %s | %.2f | %.2f | %.2f | - | - | - |\n",
				         api_names[a], size_names[s], r->median_us, r->p10_us, r->p90_us);
			table += row;
		}
	}
	fputs(table.c_str(), stdout);
	for (int a = 0; a < NAPIS; a++)
		for (int s = 0; s < NSIZES; s++)
			printf("BENCH\t%s\t%d\t%zu\t%.3f\t%.3f\t%.3f\t%d\n", mode.c_str(), a, sizes[s],
			       res[a][s].median_us, res[a][s].p10_us, res[a][s].p90_us, res[a][s].ok ? 1 : 0);
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
	bool all_ok = true;
	for (int a = 0; a < NAPIS; a++)
		for (int s = 0; s < NSIZES; s++)
			all_ok = all_ok && res[a][s].ok;
	return all_ok ? 0 : 1;
}
