/* SPDX-License-Identifier: MIT */
/*
 * tests/race/free-latency.cu - how long does cudaFree of an idle buffer block
 * the host while a long kernel runs on an unrelated non-blocking stream?
 *
 * The real cudaFree waits for the whole device (DESIGN.md section 1: 59 ms
 * with a 50 ms kernel); libemm's fenced free must not (microseconds).
 *
 * Each sample: cudaMalloc an idle buffer, memset it, sync; start the kernel
 * on a non-blocking stream and wait (host side) until it reports that it is
 * running; time cudaFree(idle); note whether the kernel was still running
 * when the free returned; sync. Median of --samples per run, --runs runs.
 *
 * Usage: free-latency [--samples 20] [--runs 3] [--kernel-ms 50] [--size 1M]
 *                     [--max-median-us N] [--min-median-us N] [--allow-no-emm]
 * Prints "cudaFree while 50ms kernel runs: median X us". With
 * --max-median-us it fails if the overall median is above N (the libemm
 * test: 1000); with --min-median-us it fails if below (EMM_FREE_MODE=strict
 * must wait like the real free).
 */
#include <string>

#include "race_util.h"

/* Flags [0] = started (kernel -> host). Spins kernel_ns of wall time. */
__global__ void spin_kernel(uint64_t ns, volatile uint32_t *started)
{
	uint64_t t0 = race_gtimer();
	*started = 1;
	__threadfence_system();
	while (race_gtimer() - t0 < ns) {
	}
}

__global__ void touch(uint32_t *p, size_t n)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		p[i] = (uint32_t)i;
}

static void usage(void)
{
	fprintf(stderr, "usage: free-latency [--samples N] [--runs N] [--kernel-ms N] [--size S]\n"
			"                    [--max-median-us N] [--min-median-us N] [--allow-no-emm]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	unsigned samples = 20, runs = 3, kernel_ms = 50;
	size_t size = 1 << 20;
	double max_median_us = -1, min_median_us = -1;
	bool allow_no_emm = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		auto next = [&]() -> const char * {
			if (i + 1 >= argc)
				usage();
			return argv[++i];
		};
		if (a == "--samples") samples = (unsigned)race_parse_size(next());
		else if (a == "--runs") runs = (unsigned)race_parse_size(next());
		else if (a == "--kernel-ms") kernel_ms = (unsigned)race_parse_size(next());
		else if (a == "--size") size = (size_t)race_parse_size(next());
		else if (a == "--max-median-us") max_median_us = atof(next());
		else if (a == "--min-median-us") min_median_us = atof(next());
		else if (a == "--allow-no-emm") allow_no_emm = true;
		else usage();
	}
	if (!samples || !runs || !kernel_ms || size < 4)
		usage();

	race_require_gpu();
	bool emm = race_require_emm(allow_no_emm);
	printf("free-latency: %s, EMM_FREE_MODE=%s, %u runs x %u samples, %u ms kernel on a non-blocking "
	       "stream, idle buffer %zu bytes\n",
	       emm ? (race_emm_active() ? "libemm" : "libemm loaded but disabled") : "no libemm",
	       race_free_mode(), runs, samples, kernel_ms, size);

	struct race_mapped ctl = race_mapped_alloc(4096);
	volatile uint32_t *started_h = (volatile uint32_t *)ctl.host;
	volatile uint32_t *started_d = (volatile uint32_t *)ctl.dev;

	cudaStream_t s;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	size_t n = size / 4;
	unsigned tb = (unsigned)std::min<size_t>((n + 255) / 256, 1024);

	/* Warm up: load the kernels, prime the pool and the free path. */
	{
		uint32_t *w;
		CK(cudaMalloc((void **)&w, size));
		touch<<<tb, 256>>>(w, n);
		CK_LAUNCH();
		spin_kernel<<<1, 1, 0, s>>>(1000, started_d);
		CK_LAUNCH();
		CK(cudaDeviceSynchronize());
		CK(cudaFree(w));
		CK(cudaDeviceSynchronize());
	}

	struct emm_stats s0 = race_stats(0);
	std::vector<double> all;
	unsigned finished_before_return = 0;
	for (unsigned r = 0; r < runs; r++) {
		std::vector<double> us;
		for (unsigned k = 0; k < samples; k++) {
			uint32_t *idle;
			CK(cudaMalloc((void **)&idle, size));
			touch<<<tb, 256>>>(idle, n);
			CK_LAUNCH();
			CK(cudaDeviceSynchronize());

			*started_h = 0;
			__sync_synchronize();
			spin_kernel<<<1, 1, 0, s>>>((uint64_t)kernel_ms * 1000000ull, started_d);
			CK_LAUNCH();
			uint64_t wait0 = race_now_ns();
			while (*started_h == 0) {
				if (race_now_ns() - wait0 > 10ull * 1000000000ull)
					race_fail("the spin kernel did not start within 10 s");
			}

			uint64_t t0 = race_now_ns();
			CK(cudaFree(idle));
			uint64_t t1 = race_now_ns();
			cudaError_t q = cudaStreamQuery(s);
			if (q == cudaSuccess)
				finished_before_return++;
			else if (q != cudaErrorNotReady)
				CK(q);
			CK(cudaStreamSynchronize(s));
			us.push_back((double)(t1 - t0) / 1000.0);
		}
		double m = race_median(us);
		std::vector<double> sorted = us;
		std::sort(sorted.begin(), sorted.end());
		printf("run %u: cudaFree while %ums kernel runs: median %.1f us (min %.1f, max %.1f)\n", r, kernel_ms,
		       m, sorted.front(), sorted.back());
		all.insert(all.end(), us.begin(), us.end());
	}
	struct emm_stats d = race_stats_delta(s0, race_stats(0));
	double med = race_median(all);
	printf("cudaFree while %ums kernel runs: median %.1f us\n", kernel_ms, med);
	printf("samples where the kernel had already finished when cudaFree returned: %u of %zu\n",
	       finished_before_return, all.size());
	race_print_stats("device 0, during the samples", d);

	CK(cudaStreamDestroy(s));
	race_mapped_free(&ctl);

	int rc = 0;
	if (emm && race_emm_active() && d.frees < all.size()) {
		printf("FAIL: libemm counted %llu frees for %zu cudaFree calls: the frees did not go through the "
		       "pool\n",
		       (unsigned long long)d.frees, all.size());
		rc = 1;
	}
	if (max_median_us >= 0 && med > max_median_us) {
		printf("FAIL: median %.1f us > %.1f us: cudaFree waited for the device\n", med, max_median_us);
		rc = 1;
	}
	if (min_median_us >= 0 && med < min_median_us) {
		printf("FAIL: median %.1f us < %.1f us: cudaFree did not wait like the real free\n", med,
		       min_median_us);
		rc = 1;
	}
	if (rc == 0)
		printf("ok\n");
	return rc;
}
