/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/bench-ptrmap.c - what finding a block costs on the
 * alloc/free path: an arena's block table (insert + take, one of each per
 * cached cudaMalloc + cudaFree, the caller holding the arena lock) with the
 * working set of tests/gpu/bench_threads.cu (64 live blocks in 32 segments
 * of 2 MiB, each pair taking the oldest and inserting one at a new
 * pseudo-random place), and the segment map's lock-free lookup that finds
 * a freed block's arena, from 1 to 16 threads at once (nothing is written
 * on a lookup, so threads should not slow each other).
 *
 *   bench-ptrmap [threads]      (default: 1, 2, 4, 8, 16 for the lookup)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "allocator/blocktab.h"
#include "allocator/ptrmap.h"

#define BASE UINT64_C(0x7f0000000000)
#ifndef ITERS
#define ITERS 5000000
#endif
#define SEGS 1000

static int dummy;
static atomic_int start_flag;

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void bench_table(void)
{
	struct emm_blocktab t;
	uint64_t live[64], rng = 88172645463325252ull;
	unsigned oldest = 0;
	double t0, t1;

	if (emm_blocktab_init(&t))
		abort();
	for (unsigned i = 0; i < 64; i++) {
		live[i] = BASE + (uint64_t)(i % 32) * (UINT64_C(2) << 20) + (uint64_t)(i / 32) * 512;
		emm_blocktab_insert(&t, live[i], &dummy);
	}
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		if (emm_blocktab_take(&t, live[oldest]) != &dummy)
			abort();
		do {
			rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
			live[oldest] = BASE + (rng % 32) * (UINT64_C(2) << 20) + ((rng >> 8) % 4096) * 512;
		} while (emm_blocktab_insert(&t, live[oldest], &dummy) != 0);
		oldest = (oldest + 1) % 64;
	}
	t1 = now_ns();
	printf("block table insert+take (64 live in 32 segments): %.1f ns per pair\n", (t1 - t0) / ITERS);
	emm_blocktab_fini(&t);
}

static void *find_worker(void *p)
{
	uint64_t n = (uint64_t)(uintptr_t)p * 7919;
	double *ns = malloc(sizeof(*ns)), t0;

	while (!atomic_load(&start_flag))
		;
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++, n++) {
		if (emm_segmap_find(BASE + (n % SEGS) * (UINT64_C(4) << 20) + 4096, NULL, NULL, NULL) != 0)
			abort();
	}
	*ns = (now_ns() - t0) / ITERS;
	return ns;
}

static void bench_find(unsigned threads)
{
	pthread_t tids[64];
	double sum = 0;

	atomic_store(&start_flag, 0);
	for (unsigned t = 0; t < threads; t++)
		pthread_create(&tids[t], NULL, find_worker, (void *)(uintptr_t)(t + 1));
	atomic_store(&start_flag, 1);
	for (unsigned t = 0; t < threads; t++) {
		void *r;

		pthread_join(tids[t], &r);
		sum += *(double *)r;
		free(r);
	}
	printf("segmap find (%d segments, hit): %2u thread(s): %.1f ns per lookup per thread\n", SEGS, threads,
	       sum / threads);
}

int main(int argc, char **argv)
{
	unsigned only = argc > 1 ? (unsigned)atoi(argv[1]) : 0;
	double t0;

	bench_table();
	for (uint64_t i = 0; i < SEGS; i++)
		emm_segmap_insert(BASE + i * (UINT64_C(4) << 20), UINT64_C(2) << 20, &dummy);
	for (unsigned t = only ? only : 1; t <= (only ? only : 16); t *= 2)
		bench_find(t);
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		if (emm_segmap_find(0x1000 + i * 512, NULL, NULL, NULL) == 0)
			abort();
	}
	printf("segmap find (outside every segment): %.1f ns\n", (now_ns() - t0) / ITERS);
	return 0;
}
