/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/bench_threads.cu - allocation throughput with 1..16 threads, each
 * keeping a live working set (a measurement, not a test).
 *
 * Every thread keeps 64 live buffers of random sizes (256 B - 8 MiB,
 * log-uniform, from a per-thread seed) and, per iteration, frees one at
 * random and allocates a new one of a new random size: a working set, not
 * LIFO pairs. Paths: cudaMalloc/cudaFree (under libemm: its pool; raw: the
 * driver), and cudaMallocAsync/cudaFreeAsync on a per-thread non-blocking
 * stream from CUDA's default pool (release threshold raised so it keeps its
 * memory). Prints one table: million pairs per second (all threads) and the
 * per-thread median ns per pair, and "THREADS\t..." lines for scripts.
 *
 *   bench_threads [--iters N] [--warmup N] [--threads 1,2,4,8,16] [--api malloc|async|both]
 *                 [--inline-rng]
 *
 * Each thread first runs --warmup untimed iterations (default a tenth of
 * --iters, at least 256): the arenas' growth, backend allocations the
 * driver serialises across threads, is not what the loop measures
 * (tests/bench/RESULTS.md section 33).
 *
 * The timed loop reads its slots and sizes from a schedule each thread
 * draws before the start (4 bytes an iteration, read in order): the pair is
 * what is timed, not the random numbers (a Mersenne twister draw twice and
 * an exp() an iteration, about 130 instructions). --inline-rng draws them
 * inside the timed loop instead, as this benchmark did up to section 37 of
 * RESULTS.md; both draw the same sequence, so both loops do the same pairs.
 */
#include <cuda_runtime.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

enum { LIVE = 64 };

static inline long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

struct worker_result {
	long long ns;
	bool ok;
};

static size_t random_size(std::mt19937_64 &rng)
{
	std::uniform_real_distribution<double> d(std::log(256.0), std::log(8.0 * 1024 * 1024));
	return (size_t)std::exp(d(rng));
}

static int warmup = -1;         /* --warmup; -1 until main settles it (iters / 10, at least LIVE * 4) */
static bool inline_rng = false; /* --inline-rng */

/* One iteration of the schedule: the slot in the top 6 bits, the size
 * (at most 8 MiB, under 2^24) below. */
enum { SLOT_SHIFT = 26 };
static uint32_t draw(std::mt19937_64 &rng)
{
	uint32_t k = (uint32_t)(rng() % LIVE);
	return k << SLOT_SHIFT | (uint32_t)random_size(rng);
}

static void worker(int id, bool async, int iters, std::atomic<int> *go, worker_result *out)
{
	cudaSetDevice(0);
	cudaStream_t s = NULL;
	if (async && cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
		out->ok = false;
		return;
	}
	std::mt19937_64 rng(1000 + id);
	void *live[LIVE];
	bool ok = true;
	auto alloc = [&](void **p, size_t n) {
		return async ? cudaMallocAsync(p, n, s) == cudaSuccess : cudaMalloc(p, n) == cudaSuccess;
	};
	auto release = [&](void *p) { return async ? cudaFreeAsync(p, s) == cudaSuccess : cudaFree(p) == cudaSuccess; };
	for (int i = 0; i < LIVE; i++)
		ok &= alloc(&live[i], random_size(rng));
	/* Free an iteration's slot, allocate its new size there. */
	auto step = [&](uint32_t e) {
		uint32_t k = e >> SLOT_SHIFT;
		return release(live[k]) && alloc(&live[k], e & ((1u << SLOT_SHIFT) - 1));
	};
	/* Warm-up, untimed. */
	for (int i = 0; i < warmup && ok; i++)
		ok &= step(draw(rng));
	std::vector<uint32_t> plan;
	if (!inline_rng) {
		plan.resize((size_t)iters);
		for (int i = 0; i < iters; i++)
			plan[(size_t)i] = draw(rng);
	}
	go->fetch_add(1);
	while (go->load() >= 0 && go->load() < 1000)
		std::this_thread::yield();
	long long t0 = now_ns();
	for (int i = 0; i < iters && ok; i++)
		ok &= step(inline_rng ? draw(rng) : plan[(size_t)i]);
	long long t1 = now_ns();
	for (int i = 0; i < LIVE; i++)
		release(live[i]);
	if (async) {
		cudaStreamSynchronize(s);
		cudaStreamDestroy(s);
	}
	out->ns = t1 - t0;
	out->ok = ok;
}

static bool run(int threads, bool async, int iters, double *mpairs, double *median_ns)
{
	std::atomic<int> go(0);
	std::vector<worker_result> res(threads);
	std::vector<std::thread> ts;
	for (int t = 0; t < threads; t++)
		ts.emplace_back(worker, t, async, iters, &go, &res[t]);
	while (go.load() < threads)
		std::this_thread::yield();
	long long t0 = now_ns();
	go.store(1000);
	for (auto &t : ts)
		t.join();
	long long wall = now_ns() - t0;
	std::vector<double> per;
	for (auto &r : res) {
		if (!r.ok)
			return false;
		per.push_back((double)r.ns / iters);
	}
	std::sort(per.begin(), per.end());
	*median_ns = per[per.size() / 2];
	*mpairs = (double)threads * iters / (wall / 1e9) / 1e6;
	return true;
}

int main(int argc, char **argv)
{
	int iters = 20000;
	std::vector<int> threads = {1, 2, 4, 8, 16};
	std::string api = "both";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
			iters = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) {
			warmup = atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
			threads.clear();
			for (char *p = strtok(argv[++i], ","); p; p = strtok(NULL, ","))
				threads.push_back(atoi(p));
		} else if (!strcmp(argv[i], "--api") && i + 1 < argc) {
			api = argv[++i];
		} else if (!strcmp(argv[i], "--inline-rng")) {
			inline_rng = true;
		} else {
			fprintf(stderr, "usage: bench_threads [--iters N] [--warmup N] [--threads 1,2,4] "
			                "[--api malloc|async|both] [--inline-rng]\n");
			return 2;
		}
	}
	warmup = std::max((int)LIVE * 4, warmup >= 0 ? warmup : iters / 10);
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		printf("SKIP: no GPU\n");
		return 77;
	}
	cudaSetDevice(0);
	cudaFree(0);
	cudaMemPool_t pool;
	cudaDeviceGetDefaultMemPool(&pool, 0);
	unsigned long long keep = ~0ull;
	cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
	bool emm = getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "libemm");

	printf("bench_threads: %d timed iterations per thread after %d untimed, %d live buffers of 256 B-8 MiB each, "
	       "%s, random numbers %s\n", iters, warmup, LIVE,
	       emm ? "libemm preloaded" : "no libemm", inline_rng ? "drawn in the timed loop" : "drawn before it");
	printf("| path | threads | Mpairs/s (all threads) | median ns per pair (per thread) |\n|---|---|---|---|\n");
	for (int a = 0; a < 2; a++) {
		bool async = a == 1;
		if ((async && api == "malloc") || (!async && api == "async"))
			continue;
		const char *name = async ? "cudaMallocAsync (per-thread stream)" : "cudaMalloc";
		for (int t : threads) {
			double mp = 0, med = 0;
			if (!run(t, async, iters, &mp, &med)) {
				printf("| %s | %d | FAILED | |\n", name, t);
				return 1;
			}
			printf("| %s | %d | %.2f | %.0f |\n", name, t, mp, med);
			printf("THREADS\t%s\t%s\t%d\t%.4f\t%.1f\n", emm ? "emm" : "raw", async ? "async" : "malloc", t, mp,
			       med);
			fflush(stdout);
		}
	}
	return 0;
}
