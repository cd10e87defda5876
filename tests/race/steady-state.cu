/* SPDX-License-Identifier: MIT */
/*
 * tests/race/steady-state.cu - the fenced free in steady state: a loop of
 * cudaMalloc(1 MiB) / small kernel / cudaFree must not cost an event per
 * pair, must never block the host, and must be served from the cache.
 *
 * Each kernel writes its iteration's tag over the whole block, waits ~2 us,
 * and re-reads: any word not equal to its tag means another kernel wrote the
 * same block at the same time (a block reused too early); the count goes to
 * a device counter read at the end.
 *
 * Variants (--variant):
 *   legacy       every kernel on the legacy default stream, no other stream.
 *                Asserts (over the loop): events_recorded / pairs < 0.1,
 *                host_waits == 0, hits >= 0.9 * pairs, and correctness.
 *   nonblocking  one non-blocking stream alive, every kernel on it.
 *                Asserts correctness; prints the counters.
 *   mixed        one non-blocking stream alive, kernels alternate between it
 *                and the legacy stream (cross-stream reuse every pair).
 *                Asserts correctness; prints the counters.
 * --assert-rates applies the legacy variant's rate assertions to any variant.
 *
 * Usage: steady-state [--variant legacy|nonblocking|mixed] [--pairs 10000]
 *                     [--size 1M] [--assert-rates] [--allow-no-emm]
 */
#include <string>

#include "race_util.h"

__global__ void tag_and_check(uint32_t *p, size_t n, uint32_t tag, uint64_t hold_ns, unsigned long long *errors)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	volatile uint32_t *vp = p;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		vp[i] = tag;
	uint64_t t0 = race_gtimer();
	while (race_gtimer() - t0 < hold_ns) {
	}
	unsigned bad = 0;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		bad += vp[i] != tag;
	if (bad)
		atomicAdd(errors, (unsigned long long)bad);
}

static void usage(void)
{
	fprintf(stderr, "usage: steady-state [--variant legacy|nonblocking|mixed] [--pairs N] [--size S]\n"
			"                    [--assert-rates] [--allow-no-emm]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	std::string variant = "legacy";
	unsigned pairs = 10000;
	size_t size = 1 << 20;
	bool assert_rates = false, allow_no_emm = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		auto next = [&]() -> const char * {
			if (i + 1 >= argc)
				usage();
			return argv[++i];
		};
		if (a == "--variant") variant = next();
		else if (a == "--pairs") pairs = (unsigned)race_parse_size(next());
		else if (a == "--size") size = (size_t)race_parse_size(next());
		else if (a == "--assert-rates") assert_rates = true;
		else if (a == "--allow-no-emm") allow_no_emm = true;
		else usage();
	}
	if (variant != "legacy" && variant != "nonblocking" && variant != "mixed")
		usage();
	if (variant == "legacy")
		assert_rates = true;
	if (!pairs || size < 4)
		usage();

	race_require_gpu();
	bool emm = race_require_emm(allow_no_emm);
	bool active = emm && race_emm_active();
	printf("steady-state: variant %s, %u pairs of cudaMalloc(%zu) / kernel / cudaFree, EMM_FREE_MODE=%s\n",
	       variant.c_str(), pairs, size, race_free_mode());

	unsigned long long *errors;
	CK(cudaMalloc((void **)&errors, sizeof(*errors)));
	CK(cudaMemset(errors, 0, sizeof(*errors)));
	cudaStream_t nb = 0;
	if (variant != "legacy")
		CK(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));

	size_t n = size / 4;
	unsigned blocks = (unsigned)std::min<size_t>((n + 4 * 256 - 1) / (4 * 256), 1024);
	if (!blocks)
		blocks = 1;
	const uint64_t hold_ns = 2000;

	auto stream_of = [&](unsigned i) -> cudaStream_t {
		if (variant == "legacy")
			return (cudaStream_t)0;
		if (variant == "nonblocking")
			return nb;
		return (i & 1) ? nb : (cudaStream_t)0;
	};
	auto one_pair = [&](unsigned i) {
		uint32_t *p;
		CK(cudaMalloc((void **)&p, size));
		tag_and_check<<<blocks, 256, 0, stream_of(i)>>>(p, n, 0x5EED0000u ^ i, hold_ns, errors);
		CK_LAUNCH();
		CK(cudaFree(p));
	};

	/* Warm up (not counted): load the kernel, fill the cache. */
	for (unsigned i = 0; i < 100; i++)
		one_pair(i);
	CK(cudaDeviceSynchronize());

	struct emm_stats s0 = race_stats(0);
	uint64_t t0 = race_now_ns();
	for (unsigned i = 0; i < pairs; i++)
		one_pair(i);
	uint64_t t1 = race_now_ns();
	CK(cudaDeviceSynchronize());
	uint64_t t2 = race_now_ns();
	struct emm_stats d = race_stats_delta(s0, race_stats(0));

	unsigned long long errs = 0;
	CK(cudaMemcpy(&errs, errors, sizeof(errs), cudaMemcpyDeviceToHost));
	printf("host time per pair %.2f us (loop issue), %.2f us including the final sync\n",
	       (double)(t1 - t0) / 1000.0 / pairs, (double)(t2 - t0) / 1000.0 / pairs);
	race_print_stats("device 0, during the loop", d);
	double ev_rate = (double)d.events_recorded / pairs;
	printf("per pair: events_recorded %.4f, event_queries %.4f, epochs_closed %.4f, hits %.4f, "
	       "host_waits %llu\n",
	       ev_rate, (double)d.event_queries / pairs, (double)d.epochs_closed / pairs, (double)d.hits / pairs,
	       (unsigned long long)d.host_waits);
	printf("words seen overwritten by a concurrent kernel: %llu\n", errs);

	int rc = 0;
	if (errs) {
		printf("FAIL: %llu words were overwritten while their kernel owned the block: a block was reused "
		       "while earlier work still ran\n",
		       errs);
		rc = 1;
	}
	if (active) {
		if (d.allocs < pairs) {
			printf("FAIL: libemm served %llu allocations for %u pairs: not through the pool\n",
			       (unsigned long long)d.allocs, pairs);
			rc = 1;
		}
		if (assert_rates) {
			/* A free epoch closes after 64 frees by default; vmm's
			 * page-granular heaps close theirs after 8 (memory over
			 * events: issue 9's peak), unless EMM_EPOCH_BLOCKS says. */
			double max_rate = 0.1;
			std::string quota_from;
			race_setting("EMM_EPOCH_BLOCKS", &quota_from);
			if (race_setting("EMM_BACKEND") == "vmm" && quota_from != "env")
				max_rate = 0.25;
			if (!(ev_rate < max_rate)) {
				printf("FAIL: events_recorded / pairs = %.4f, want < %.2f (not an event per pair)\n",
				       ev_rate, max_rate);
				rc = 1;
			}
			if (d.host_waits != 0) {
				printf("FAIL: host_waits = %llu, want 0 (the host blocked on a fence in steady state)\n",
				       (unsigned long long)d.host_waits);
				rc = 1;
			}
			if ((double)d.hits < 0.9 * pairs) {
				printf("FAIL: hits = %llu, want >= %.0f (0.9 x pairs)\n", (unsigned long long)d.hits,
				       0.9 * pairs);
				rc = 1;
			}
		}
	}
	/* Cases: the data check, and the pool counters (only with libemm active). */
	struct emm_partial part = {};
	emm_partial_ran(&part);
	if (active)
		emm_partial_ran(&part);
	else
		emm_partial_skip(&part, "pool counters not checked: libemm %s", emm ? "disabled (EMM_DISABLE)" : "not loaded");

	if (nb)
		CK(cudaStreamDestroy(nb));
	CK(cudaFree(errors));
	if (rc == 0) {
		printf("ok\n");
		rc = emm_partial_finish(&part);
	}
	return rc;
}
