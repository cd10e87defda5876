/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/bench-ptrmap.c - what the block map costs on the alloc/free
 * path: ns per insert+take pair (one of each per cached cudaMalloc+cudaFree)
 * with a realistic number of live blocks, single-threaded and with several
 * threads on disjoint blocks; and a segment-map lookup.
 *
 * Three layouts: each thread inserts and takes blocks of its own 2 MiB
 * region; blocks interleaved in shared segments; and "spread", the working
 * set of tests/gpu/bench_threads.cu: each thread keeps 64 live blocks in
 * its own 32 segments of 2 MiB, the threads' segments interleaved in the
 * address space as a driver hands them out (thread t's k-th segment at
 * (k * threads + t) * 2 MiB), and per pair takes its oldest block and
 * inserts one at a new pseudo-random place.
 *
 *   bench-ptrmap [threads]      (default: 1, 2, 4, 8, 16)
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "allocator/ptrmap.h"

#define BASE UINT64_C(0x7f0000000000)
#define LIVE 10000
#ifndef ITERS
#define ITERS 5000000
#endif

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static atomic_int start_flag;
static int dummy;

static unsigned thread_count;
static bool shared_region;

enum { SPREAD_SEGS = 32, SPREAD_LIVE = 64 };

/* Thread t's next block in the spread layout (xorshift64 state in *x). */
static uint64_t spread_addr(uint64_t t, uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	uint64_t seg = *x % SPREAD_SEGS, off = (*x >> 8) % 4096;
	return BASE + ((seg * thread_count + (t - 1)) << 21) + off * 512;
}

static void *spread_worker(void *p)
{
	uint64_t t = (uint64_t)(uintptr_t)p, x = 0x9e3779b97f4a7c15ull * t;
	uint64_t live[SPREAD_LIVE];
	double t0, t1;
	double *ns = malloc(sizeof(*ns));
	unsigned n = 0;

	for (unsigned i = 0; i < SPREAD_LIVE; i++) {
		do
			live[i] = spread_addr(t, &x);
		while (emm_blockmap_insert(live[i], &dummy) != 0);
	}
	while (!atomic_load(&start_flag))
		;
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		if (emm_blockmap_take(live[n]) != &dummy)
			abort();
		do
			live[n] = spread_addr(t, &x);
		while (emm_blockmap_insert(live[n], &dummy) != 0);
		n = (n + 1) % SPREAD_LIVE;
	}
	t1 = now_ns();
	for (unsigned i = 0; i < SPREAD_LIVE; i++)
		emm_blockmap_take(live[i]);
	*ns = (t1 - t0) / ITERS;
	return ns;
}

/* Thread t (1-based) works on 4096 blocks of 512 B: its own 2 MiB region,
 * or, with shared_region, every thread_count-th block of one common 2 MiB x
 * thread_count region (threads carving blocks from the same segments). */
static void *pair_worker(void *p)
{
	uint64_t t = (uint64_t)(uintptr_t)p;
	double t0, t1;
	double *ns = malloc(sizeof(*ns));

	while (!atomic_load(&start_flag))
		;
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		uint64_t a = shared_region ? BASE + ((i & 4095) * thread_count + t) * 512
		                           : BASE + t * (UINT64_C(1) << 34) + (i & 4095) * 512;

		emm_blockmap_insert(a, &dummy);
		if (emm_blockmap_take(a) != &dummy)
			abort();
	}
	t1 = now_ns();
	*ns = (t1 - t0) / ITERS;
	return ns;
}

static void run_pairs(unsigned threads, int layout)
{
	bool shared = layout == 1;
	pthread_t tids[64];
	double sum = 0;

	thread_count = threads;
	shared_region = shared;
	atomic_store(&start_flag, 0);
	for (unsigned t = 0; t < threads; t++)
		pthread_create(&tids[t], NULL, layout == 2 ? spread_worker : pair_worker, (void *)(uintptr_t)(t + 1));
	atomic_store(&start_flag, 1);
	for (unsigned t = 0; t < threads; t++) {
		void *r;

		pthread_join(tids[t], &r);
		sum += *(double *)r;
		free(r);
	}
	printf("blockmap insert+take: %2u thread(s), %s: %.1f ns per pair per thread\n", threads,
	       layout == 2 ? "spread (64 live in 32 own segments, interleaved)"
	       : shared    ? "blocks interleaved in shared segments"
	                   : "each thread its own segment",
	       sum / threads);
}

int main(int argc, char **argv)
{
	unsigned only = argc > 1 ? (unsigned)atoi(argv[1]) : 0;
	double t0, t1;

	/* A live population, as a program holding LIVE blocks would have. */
	for (uint64_t i = 0; i < LIVE; i++)
		emm_blockmap_insert(BASE + (UINT64_C(1) << 40) + i * 8192, &dummy);

	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		if (emm_blockmap_get(BASE + (UINT64_C(1) << 40) + (i % LIVE) * 8192) != &dummy)
			abort();
	}
	t1 = now_ns();
	printf("blockmap get (hit): %.1f ns\n", (t1 - t0) / ITERS);

	for (unsigned t = only ? only : 1; t <= (only ? only : 16); t *= 2)
		run_pairs(t, 0);
	for (unsigned t = only ? only : 2; t <= (only ? only : 16); t *= 2)
		run_pairs(t, 1);
	for (unsigned t = only ? only : 1; t <= (only ? only : 16); t *= 2)
		run_pairs(t, 2);

	for (uint64_t i = 0; i < 1000; i++)
		emm_segmap_insert(BASE + i * (UINT64_C(4) << 20), UINT64_C(2) << 20, &dummy);
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		if (emm_segmap_find(BASE + (i % 1000) * (UINT64_C(4) << 20) + 4096, NULL, NULL, NULL) != 0)
			abort();
	}
	t1 = now_ns();
	printf("segmap find (1000 segments, hit): %.1f ns\n", (t1 - t0) / ITERS);
	t0 = now_ns();
	for (uint64_t i = 0; i < ITERS; i++) {
		if (emm_segmap_find(0x1000 + i * 512, NULL, NULL, NULL) == 0)
			abort();
	}
	t1 = now_ns();
	printf("segmap find (outside every segment): %.1f ns\n", (t1 - t0) / ITERS);
	return 0;
}
