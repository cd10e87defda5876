/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/race_first_call.cu - eight threads whose very first CUDA call is
 * cudaMalloc, released together (static cudart): cudart initialises, loads
 * the driver and resolves every entry point through libemm while libemm
 * initialises lazily and creates the context's heap, all at once. Every
 * allocation must succeed, be served by the pool, hold its own data, and the
 * threads then keep allocating concurrently for a while.
 *
 * Nothing calls CUDA before the threads start, so there is no device check
 * first: if every thread's cudaMalloc fails with "no device" or "no driver",
 * the program exits 77.
 */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdlib.h>
#include <vector>

#include "gpu_common.h"

#define NTHREADS 8
#define ROUNDS   40

__global__ void fill_kernel(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		p[i] = gpu_pattern(i, seed);
}

struct racer {
	unsigned id;
	cudaError_t first; /* result of the first cudaMalloc */
	int failures;
	char why[256];
};

static volatile int go;
static int ready;

static void *racer_main(void *argp)
{
	struct racer *r = (struct racer *)argp;
	const size_t n = 4096 + r->id * 100003; /* small and large, all different */
	std::vector<unsigned char> host(n);
	void *p = NULL;

	__atomic_add_fetch(&ready, 1, __ATOMIC_SEQ_CST);
	while (!go)
		; /* spin: all eight leave together */

	r->first = cudaMalloc(&p, n);
	if (r->first != cudaSuccess)
		return NULL;
	for (unsigned round = 0; round <= ROUNDS; round++) {
		unsigned seed = r->id * 7919 + round;
		cudaError_t e = cudaSuccess;
		if (round > 0)
			e = cudaMalloc(&p, n);
		if (e == cudaSuccess) {
			fill_kernel<<<64, 256>>>((unsigned char *)p, n, seed);
			e = cudaGetLastError();
		}
		if (e == cudaSuccess)
			e = cudaMemcpy(host.data(), p, n, cudaMemcpyDeviceToHost);
		if (e == cudaSuccess)
			e = cudaFree(p);
		if (e != cudaSuccess) {
			snprintf(r->why, sizeof(r->why), "round %u: %s", round, cudaGetErrorName(e));
			r->failures++;
			return NULL;
		}
		for (size_t i = 0; i < n; i++) {
			if (host[i] != gpu_pattern(i, seed)) {
				snprintf(r->why, sizeof(r->why), "round %u: data mismatch at byte %zu of %zu",
				         round, i, n);
				r->failures++;
				return NULL;
			}
		}
	}
	return NULL;
}

static int skip_code(cudaError_t e)
{
	return e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
	       e == cudaErrorInitializationError;
}

TEST_BEGIN(test_race_first_calls)
{
	struct racer r[NTHREADS];
	pthread_t th[NTHREADS];
	struct gpu_snap s0, s1;
	int skipped = 0;

	/* Zero, without asking libemm: even emm_stats_get could start its
	 * initialisation before the race. */
	memset(&s0, 0, sizeof(s0));
	for (unsigned i = 0; i < NTHREADS; i++) {
		r[i] = racer();
		r[i].id = i;
		assert_int_eq(pthread_create(&th[i], NULL, racer_main, &r[i]), 0);
	}
	while (__atomic_load_n(&ready, __ATOMIC_SEQ_CST) < NTHREADS)
		;
	go = 1;
	for (unsigned i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);

	for (unsigned i = 0; i < NTHREADS; i++) {
		if (skip_code(r[i].first))
			skipped++;
		else if (r[i].first != cudaSuccess)
			emm_test_fail_("thread %u: first cudaMalloc -> %s", i, cudaGetErrorName(r[i].first));
		else if (r[i].failures)
			emm_test_fail_("thread %u: %s", i, r[i].why);
	}
	if (skipped == NTHREADS) {
		emm_test_skip("no usable CUDA device (first cudaMalloc failed with no device/driver)");
		return;
	}
	if (skipped)
		emm_test_fail_("%d of %d threads saw no device, the others did", skipped, NTHREADS);
	assert_emm_present();
	gpu_snap_take(&s1);
	expect_served("8 racing first cudaMalloc calls + 40 rounds each (static cudart)", GPU_SCOPE_DEVICE,
	              &s0, &s1, NTHREADS * (ROUNDS + 1));
	expect_freed("cudaFree from 8 threads (static cudart)", GPU_SCOPE_DEVICE, &s0, &s1,
	             NTHREADS * (ROUNDS + 1));
	if (cudaDeviceSynchronize() != cudaSuccess)
		emm_test_fail_("device error after the race: %s", cudaGetErrorName(cudaGetLastError()));
}
TEST_END

int main(void)
{
	static emm_test_fn tests[] = {test_race_first_calls, NULL};
	int rc = emm_test_run_list(tests);

	if (rc != GPU_SKIP)
		gpu_print_served("race-first-call");
	return rc;
}
