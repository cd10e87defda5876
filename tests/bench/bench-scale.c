/* SPDX-License-Identifier: MIT */
/*
 * bench-scale: how far a CPU-bound loop that shares nothing scales with
 * threads on this host - the ceiling any allocator's thread scaling is read
 * against (project issue 11 asks for 16 threads >= 8x one). No libemm, no
 * GPU. Each thread runs one of two loops, N threads started together:
 *
 *   adds    a dependent chain of multiply-adds in a register: the core's
 *           clock and how many cores the host really gives us
 *   malloc  glibc malloc/free over 64 live buffers of random 16-4096 B,
 *           replacing one per iteration and touching it: the shape of
 *           tests/gpu/bench-threads' working set, in glibc's per-thread
 *           arenas (a scalable allocator that shares nothing either)
 *
 *   bench-scale [--threads 1,2,4,8,16] [--iters N] [--rounds R]
 *
 * Prints one Markdown table: per loop and thread count, million operations
 * per second in all (the median of R rounds, each timed from the first
 * thread's start to the last one's end), and that over one thread's. --iters
 * scales both loops (adds run 50 times as many). Exit 0, 2 on bad arguments.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LIVE        64
#define MAX_THREADS 256
#define MAX_COUNTS  16
#define MAX_ROUNDS  31

enum loop { LOOP_ADDS, LOOP_MALLOC };

struct run {
	enum loop loop;
	long iters;
	pthread_barrier_t start;
};

struct worker {
	struct run *run;
	pthread_t th;
	double t0, t1; /* the thread's own start and end */
};

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void run_loop(const struct run *run)
{
	uint64_t x = (uint64_t)(uintptr_t)&x | 1, rng = x * UINT64_C(0x9e3779b97f4a7c15);

	if (run->loop == LOOP_ADDS) {
		for (long i = 0; i < run->iters; i++) {
			x = x * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
			__asm__ volatile("" : "+r"(x)); /* one link of the chain per iteration */
		}
		return;
	}
	void *live[LIVE] = { 0 };
	for (long i = 0; i < run->iters; i++) {
		rng ^= rng << 13;
		rng ^= rng >> 7;
		rng ^= rng << 17;
		unsigned k = (unsigned)(rng & (LIVE - 1));
		free(live[k]);
		live[k] = malloc(16 + (size_t)((rng >> 20) % 4081));
		if (live[k])
			*(volatile char *)live[k] = 1;
	}
	for (unsigned k = 0; k < LIVE; k++)
		free(live[k]);
}

static void *worker(void *arg)
{
	struct worker *w = arg;

	pthread_barrier_wait(&w->run->start);
	w->t0 = now();
	run_loop(w->run);
	w->t1 = now();
	return NULL;
}

/* Seconds for `threads` threads to run the loop: from the first thread's
 * start to the last one's end, each read by the thread itself. */
static double timed(enum loop loop, long iters, int threads)
{
	struct run run = { .loop = loop, .iters = iters };
	struct worker w[MAX_THREADS];
	int n = 0;

	pthread_barrier_init(&run.start, NULL, (unsigned)threads);
	for (; n < threads; n++) {
		w[n].run = &run;
		if (pthread_create(&w[n].th, NULL, worker, &w[n]))
			break;
	}
	if (n < threads) {
		fprintf(stderr, "bench-scale: cannot start %d threads\n", threads);
		exit(1);
	}
	double t0 = 0, t1 = 0;
	for (int i = 0; i < n; i++) {
		pthread_join(w[i].th, NULL);
		if (i == 0 || w[i].t0 < t0)
			t0 = w[i].t0;
		if (w[i].t1 > t1)
			t1 = w[i].t1;
	}
	pthread_barrier_destroy(&run.start);
	return t1 - t0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static int parse_counts(const char *s, int *counts)
{
	int n = 0;

	while (*s) {
		char *end;
		long v = strtol(s, &end, 10);
		if (end == s || v < 1 || v > MAX_THREADS || n == MAX_COUNTS || (*end && *end != ','))
			return -1;
		counts[n++] = (int)v;
		s = *end ? end + 1 : end;
	}
	return n;
}

static int usage(void)
{
	fprintf(stderr, "usage: bench-scale [--threads 1,2,4,8,16] [--iters N] [--rounds R (1-%d)]\n", MAX_ROUNDS);
	return 2;
}

int main(int argc, char **argv)
{
	int counts[MAX_COUNTS] = { 1, 2, 4, 8, 16 }, ncounts = 5, rounds = 3;
	long iters = 10000000;

	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			return usage();
		char *end;
		if (!strcmp(argv[i], "--threads")) {
			if ((ncounts = parse_counts(argv[++i], counts)) <= 0)
				return usage();
		} else if (!strcmp(argv[i], "--iters")) {
			iters = strtol(argv[++i], &end, 10);
			if (*end || iters < 1 || iters > 1000000000L)
				return usage();
		} else if (!strcmp(argv[i], "--rounds")) {
			rounds = (int)strtol(argv[++i], &end, 10);
			if (*end || rounds < 1 || rounds > MAX_ROUNDS)
				return usage();
		} else {
			return usage();
		}
	}

	static const char *const names[] = { "adds (dependent chain)", "glibc malloc/free, 64 live buffers" };
	printf("| loop | threads | M ops/s, all threads (median of %d) | vs 1 thread |\n|---|---|---|---|\n", rounds);
	for (int l = LOOP_ADDS; l <= LOOP_MALLOC; l++) {
		long n = l == LOOP_ADDS ? iters * 50 : iters;
		double base = 0;
		for (int c = 0; c < ncounts; c++) {
			double rate[MAX_ROUNDS];
			for (int r = 0; r < rounds; r++)
				rate[r] = (double)n * counts[c] / timed((enum loop)l, n, counts[c]) / 1e6;
			qsort(rate, (size_t)rounds, sizeof(rate[0]), cmp_double);
			double med = rate[rounds / 2];
			if (counts[c] == 1)
				base = med;
			printf("| %s | %d | %.1f |", names[l], counts[c], med);
			if (base > 0)
				printf(" %.2fx |\n", med / base);
			else
				printf(" |\n");
		}
	}
	return 0;
}
