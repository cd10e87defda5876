/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/bench_fence_ops.cu - what the driver calls that libemm's fences
 * make cost on the host (a measurement, not a test; project issue 11's
 * "measure what closing an epoch costs"): closing an epoch asks each live
 * non-blocking stream cuStreamQuery, records one event on the legacy stream
 * (and one on each busy non-blocking stream), and a later miss polls it with
 * cuEventQuery. Each call is timed alone, the device idle, --iters times
 * (median, p10, p90 in microseconds):
 *
 *   cuStreamQuery (idle non-blocking stream)
 *   cuEventRecord (legacy stream), (non-blocking stream)
 *   cuEventQuery  (completed event), (just recorded)
 *   cuEventCreate + cuEventDestroy (DISABLE_TIMING)
 *   record + query at once (an epoch closed and polled on the fast path)
 *   cuEventRecord (legacy stream) after 256 KiB and 2 MiB of host memory
 *   were written, untimed (a record inside a program's loop finds the
 *   driver's code and data less warm than one record after another)
 *
 * Run without libemm (nothing here allocates). Exit 77 without a GPU.
 *
 *   bench-fence-ops [--iters N]
 */
#include <cuda.h>
#include <time.h>

#include <algorithm>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static double now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void report(const char *what, std::vector<double> &t)
{
	std::sort(t.begin(), t.end());
	size_t n = t.size();
	printf("| %s | %.2f | %.2f | %.2f |\n", what, t[n / 2], t[n / 10], t[n * 9 / 10]);
	printf("FENCEOP\t%s\t%.3f\n", what, t[n / 2]);
}

#define CK(x)                                                                   \
	do {                                                                    \
		CUresult r_ = (x);                                              \
		if (r_ != CUDA_SUCCESS && r_ != CUDA_ERROR_NOT_READY) {         \
			fprintf(stderr, "%s:%d: %s: %d\n", __FILE__, __LINE__, #x, (int)r_); \
			exit(1);                                                \
		}                                                               \
	} while (0)

/* Time call(i) alone for each i of t, after an untimed prep(i), then
 * report it as `what`. */
template <typename P, typename F> static void timed_after(const char *what, std::vector<double> &t, P prep, F call)
{
	for (size_t i = 0; i < t.size(); i++) {
		prep((int)i);
		double a = now_us();
		call((int)i);
		t[i] = now_us() - a;
	}
	report(what, t);
}

template <typename F> static void timed(const char *what, std::vector<double> &t, F call)
{
	timed_after(what, t, [](int) {}, call);
}

/* Write one byte in every 64 of the first `bytes` of buf (untimed). */
static void touch(std::vector<char> &buf, size_t bytes)
{
	for (size_t i = 0; i < bytes && i < buf.size(); i += 64)
		((volatile char *)buf.data())[i]++;
}

int main(int argc, char **argv)
{
	int iters = 10000;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
			iters = atoi(argv[++i]);
	}
	if (iters < 10)
		iters = 10;
	if (cuInit(0) != CUDA_SUCCESS) {
		printf("skip: no GPU\n");
		return 77;
	}
	CUdevice dev;
	CUcontext ctx;
	int n = 0;
	if (cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
		printf("skip: no GPU\n");
		return 77;
	}
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CUstream nb;
	CK(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING));
	std::vector<CUevent> ev(iters);
	for (auto &e : ev)
		CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
	std::vector<double> t(iters);

	printf("| driver call (device idle) | median us | p10 | p90 |\n|---|---|---|---|\n");
	timed("cuStreamQuery, idle non-blocking stream", t, [&](int) { CK(cuStreamQuery(nb)); });
	timed("cuEventRecord, legacy stream", t, [&](int i) { CK(cuEventRecord(ev[i], CU_STREAM_LEGACY)); });
	CK(cuCtxSynchronize());
	timed("cuEventRecord, non-blocking stream", t, [&](int i) { CK(cuEventRecord(ev[i], nb)); });
	CK(cuCtxSynchronize());
	timed("cuEventQuery, completed event", t, [&](int i) { CK(cuEventQuery(ev[i])); });

	std::vector<char> done(iters);
	timed("cuEventRecord (legacy) + cuEventQuery at once", t, [&](int i) {
		CK(cuEventRecord(ev[i], CU_STREAM_LEGACY));
		done[i] = cuEventQuery(ev[i]) == CUDA_SUCCESS;
	});
	printf("  (the event had completed at the query in %d of %d)\n", (int)std::count(done.begin(), done.end(), 1),
	       iters);
	CK(cuCtxSynchronize());

	timed("cuEventRecord (legacy) + cuEventSynchronize", t, [&](int i) {
		CK(cuEventRecord(ev[i], CU_STREAM_LEGACY));
		CK(cuEventSynchronize(ev[i]));
	});
	std::vector<char> host(2 << 20);
	CK(cuCtxSynchronize());
	timed_after("cuEventRecord, legacy stream, after 256 KiB written", t, [&](int) { touch(host, 256 << 10); },
	            [&](int i) { CK(cuEventRecord(ev[i], CU_STREAM_LEGACY)); });
	CK(cuCtxSynchronize());
	timed_after("cuEventRecord, legacy stream, after 2 MiB written", t, [&](int) { touch(host, 2 << 20); },
	            [&](int i) { CK(cuEventRecord(ev[i], CU_STREAM_LEGACY)); });
	CK(cuCtxSynchronize());
	timed("cuEventCreate + cuEventDestroy", t, [&](int) {
		CUevent e;
		CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
		CK(cuEventDestroy(e));
	});

	for (auto &e : ev)
		CK(cuEventDestroy(e));
	CK(cuStreamDestroy(nb));
	CK(cuDevicePrimaryCtxRelease(dev));
	return 0;
}
