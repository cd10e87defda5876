/* SPDX-License-Identifier: MIT */
/*
 * bench-core: the host cost of a cached allocation + free pair in the
 * allocator core over the host-simulation backend (no driver; fence ops that
 * record and complete for free, or none), so the numbers are libemm's own
 * overhead. For each size and path: warm up, then time batches of pairs and
 * report the median batch's cost per pair (and the 10th/90th percentile).
 * Then the same loop on 1, 2, 4, 8 threads sharing one heap (each thread
 * on its own per-thread stream key for the stream-ordered path).
 *
 *   bench-core [--quick] [--threads] [--private] [--arenas N]
 *              [--working-set [--iters N] [--min-threads N] [--max-threads N]]
 *
 * --threads runs only the thread table; --private gives each thread its own
 * heap (the segment map stays shared), to tell heap sharing from the rest.
 * --working-set runs only the working-set table: each thread keeps 64 live
 * blocks of random sizes (256 B - 8 MiB, log-uniform: tests/gpu/bench-threads'
 * loop) and replaces one per iteration (--iters, default 301 000 pairs a
 * thread; 31 000 with --quick; slots and sizes drawn before the timing),
 * on 1..16 threads sharing one heap, with the fence work per pair from the
 * heap's counters; --min-threads
 * starts the doubling at N (a profile of one thread count), and --private
 * gives each thread its own heap there too.
 * --arenas N sets the heap's arena count (default: one per CPU, as libemm).
 *
 * Paths:
 *   sync/fence   - alloc(SYNC) + free(SYNC), FENCE mode with fence ops: the
 *                  free joins the open epoch, which closes every 16 frees
 *                  (one event record) on the no-non-blocking-stream fast path
 *   sync/nofence - the same with NULL fence ops (frees are ready at once)
 *   stream       - alloc(S) + free(S) on a per-thread stream key: same-stream
 *                  reuse
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocator/backend_loader.h"
#include "allocator/heap.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static unsigned batch = 1000, batches = 301, warmup = 20000;
static bool private_heaps; /* --private: one heap per thread (isolates heap sharing) */
static unsigned arenas;     /* --arenas: 0 = one per CPU */
static unsigned ws_iters, ws_min_threads = 1, ws_max_threads = 16; /* --iters, --min/max-threads (working set) */

/* --- doubles -------------------------------------------------------------- */

/* Segments come from the host-simulation backend, the same one libemm
 * loads with EMM_BACKEND=hostsim (one instance per heap). */
static const struct emm_backend *hostsim;

static void hostsim_log(enum emm_backend_log_level level, const char *msg)
{
	if (level >= EMM_BACKEND_LOG_WARNING)
		fprintf(stderr, "hostsim: %s\n", msg);
}

static const struct emm_backend_host hostsim_host = {
	.interface_version = EMM_BACKEND_INTERFACE_VERSION,
	.struct_size = sizeof(struct emm_backend_host),
	.driver_proc = NULL,
	.log = hostsim_log,
	.options = "capacity=64G",
};

static int src_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret)
{
	return hostsim->segment_alloc(state, size, stream, ret);
}

static int src_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	return hostsim->segment_free(state, addr, size, stream);
}

static atomic_uint_fast64_t next_event = 1;

static int f_record(void *ctx, emm_stream_t s, uint64_t *ret)
{
	(void)ctx;
	(void)s;
	*ret = atomic_fetch_add_explicit(&next_event, 1, memory_order_relaxed);
	return 0;
}

static int f_query(void *ctx, uint64_t ev)
{
	(void)ctx;
	(void)ev;
	return 0;
}

static int f_wait(void *ctx, emm_stream_t s, uint64_t ev)
{
	(void)ctx;
	(void)s;
	(void)ev;
	return 0;
}

static void f_release(void *ctx, uint64_t ev)
{
	(void)ctx;
	(void)ev;
}

static const struct emm_fence_ops fence_ops = {
    .record = f_record,
    .query = f_query,
    .stream_wait = f_wait,
    .release = f_release,
};

/* --- timing --------------------------------------------------------------- */

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

enum path { PATH_SYNC_FENCE, PATH_SYNC_NOFENCE, PATH_STREAM, NPATHS };
static const char *path_name[NPATHS] = {"sync/fence", "sync/nofence", "stream"};

struct job {
	emm_heap_t *heap;
	size_t size;
	emm_stream_t stream;
	double *samples; /* ns per pair, one per batch */
	pthread_barrier_t *barrier;
	uint64_t wall_ns;
	int err;
};

static void *loop(void *arg)
{
	struct job *j = arg;
	emm_addr_t a;

	/* Keep one block live so the segment never becomes whole and idle:
	 * the steady state of a program holding memory. */
	emm_addr_t anchor = 0;
	if (emm_heap_alloc(j->heap, j->size, j->stream, &anchor)) {
		j->err = 1;
		return NULL;
	}
	for (unsigned i = 0; i < warmup; i++) {
		if (emm_heap_alloc(j->heap, j->size, j->stream, &a) || emm_heap_free(a, j->stream, NULL)) {
			j->err = 1;
			return NULL;
		}
	}
	if (j->barrier)
		pthread_barrier_wait(j->barrier);
	uint64_t t0 = now_ns();
	for (unsigned b = 0; b < batches; b++) {
		uint64_t s = now_ns();
		for (unsigned i = 0; i < batch; i++) {
			emm_heap_alloc(j->heap, j->size, j->stream, &a);
			emm_heap_free(a, j->stream, NULL);
		}
		j->samples[b] = (double)(now_ns() - s) / batch;
	}
	j->wall_ns = now_ns() - t0;
	emm_heap_free(anchor, j->stream, NULL);
	return NULL;
}

static emm_heap_t *make_heap(enum path p)
{
	struct emm_heap_params params;
	struct emm_segment_source src = {NULL, src_alloc, src_free};
	emm_heap_t *h = NULL;
	uint32_t version = EMM_BACKEND_INTERFACE_VERSION;
	if (!hostsim && emm_backend_builtin_hostsim(&version, &hostsim) != 0) {
		fprintf(stderr, "hostsim backend unavailable\n");
		exit(1);
	}
	if (hostsim->init(&hostsim_host, 0, 0, &src.state) != 0) {
		fprintf(stderr, "hostsim init failed\n");
		exit(1);
	}
	emm_heap_params_default(&params);
	params.arenas = arenas;
	if (emm_heap_create(&params, &src, p == PATH_SYNC_NOFENCE ? NULL : &fence_ops, 0, &h)) {
		fprintf(stderr, "heap create failed\n");
		exit(1);
	}
	return h;
}

/* Run `threads` loops on one heap; fill the median, p10, p90 of all
 * threads' batch samples (ns per pair) and the aggregate pairs/s. */
static void run(enum path p, size_t size, unsigned threads, double *med, double *p10, double *p90,
                double *mops)
{
	emm_heap_t *h = make_heap(p), *priv[8] = {NULL};
	struct job jobs[8];
	pthread_t th[8];
	pthread_barrier_t bar;
	double *all = calloc((size_t)batches * threads, sizeof(double));

	pthread_barrier_init(&bar, NULL, threads);
	for (unsigned t = 0; t < threads; t++) {
		if (private_heaps && t > 0)
			priv[t] = make_heap(p);
		jobs[t] = (struct job){
		    .heap = priv[t] ? priv[t] : h,
		    .size = size,
		    .stream = p == PATH_STREAM ? EMM_STREAM_PER_THREAD_KEY(t) : EMM_STREAM_SYNC,
		    .samples = all + (size_t)t * batches,
		    .barrier = threads > 1 ? &bar : NULL,
		};
	}
	if (threads == 1) {
		loop(&jobs[0]);
	} else {
		for (unsigned t = 0; t < threads; t++)
			pthread_create(&th[t], NULL, loop, &jobs[t]);
		for (unsigned t = 0; t < threads; t++)
			pthread_join(th[t], NULL);
	}
	uint64_t wall = 0;
	for (unsigned t = 0; t < threads; t++) {
		if (jobs[t].err) {
			fprintf(stderr, "allocation failed\n");
			exit(1);
		}
		if (jobs[t].wall_ns > wall)
			wall = jobs[t].wall_ns;
	}
	size_t n = (size_t)batches * threads;
	qsort(all, n, sizeof(double), cmp_double);
	*med = all[n / 2];
	*p10 = all[n / 10];
	*p90 = all[n * 9 / 10];
	*mops = (double)batches * batch * threads / ((double)wall / 1e9) / 1e6;
	if (emm_heap_check(h) != 0) {
		fprintf(stderr, "heap check failed\n");
		exit(1);
	}
	free(all);
	pthread_barrier_destroy(&bar);
	emm_heap_destroy(h, true);
	for (unsigned t = 0; t < threads; t++)
		emm_heap_destroy(priv[t], true);
}

/* --- the working set ------------------------------------------------------- */

#define WS_LIVE 64
#define WS_SLOT_SHIFT 26 /* a schedule entry: the slot above, the size below */

static size_t ws_size(uint64_t *rng)
{
	/* xorshift64*, log-uniform over [256 B, 8 MiB) */
	*rng ^= *rng >> 12;
	*rng ^= *rng << 25;
	*rng ^= *rng >> 27;
	double u = (double)((*rng * 2685821657736338717ull) >> 11) / 9007199254740992.0;
	return (size_t)(256.0 * pow(32768.0, u));
}

/* One iteration: the slot in the top bits, the size (under 2^23) below. */
static uint32_t ws_draw(uint64_t *rng)
{
	unsigned k = (unsigned)(*rng % WS_LIVE);

	return (uint32_t)k << WS_SLOT_SHIFT | (uint32_t)ws_size(rng);
}

/* Free the iteration's slot and allocate its new size there: 0, or 1 on an
 * error. */
static inline int ws_step(emm_heap_t *heap, emm_addr_t *live, uint32_t e)
{
	unsigned k = e >> WS_SLOT_SHIFT;

	return emm_heap_free(live[k], EMM_STREAM_SYNC, NULL) ||
	       emm_heap_alloc(heap, e & ((1u << WS_SLOT_SHIFT) - 1), EMM_STREAM_SYNC, &live[k]);
}

struct ws_job {
	emm_heap_t *heap;
	unsigned id, iters;
	pthread_barrier_t *barrier;
	uint64_t ns;
	int err;
};

static void *ws_loop(void *arg)
{
	struct ws_job *j = arg;
	uint64_t rng = 0x9e3779b97f4a7c15ull * (j->id + 1);
	emm_addr_t live[WS_LIVE];

	for (unsigned i = 0; i < WS_LIVE; i++)
		if (emm_heap_alloc(j->heap, ws_size(&rng), EMM_STREAM_SYNC, &live[i]))
			j->err = 1;
	for (unsigned i = 0; i < WS_LIVE * 4 && !j->err; i++)
		if (ws_step(j->heap, live, ws_draw(&rng)))
			j->err = 1;
	/* The timed pairs' slots and sizes, drawn before the start (the slot
	 * in the top 6 bits, the size below 2^23): the pair is timed, not
	 * pow() (about 130 instructions, a fifth of the pair before). */
	uint32_t *plan = malloc((size_t)j->iters * sizeof(*plan) + 1);
	if (!plan)
		j->err = 1;
	for (unsigned i = 0; plan && i < j->iters; i++)
		plan[i] = ws_draw(&rng);
	pthread_barrier_wait(j->barrier);
	uint64_t t0 = now_ns();
	for (unsigned i = 0; i < j->iters && !j->err; i++)
		if (ws_step(j->heap, live, plan[i]))
			j->err = 1;
	j->ns = now_ns() - t0;
	free(plan);
	for (unsigned i = 0; i < WS_LIVE; i++)
		emm_heap_free(live[i], EMM_STREAM_SYNC, NULL);
	return NULL;
}

static void working_set(void)
{
	/* Long enough for steady state: at 30 100 pairs the arenas were still
	 * growing (RESULTS.md section 33: 16 threads 440 ns a pair there,
	 * 297-370 at 300 000). */
	unsigned iters = ws_iters ? ws_iters : batches * batch;

	printf("Working set (%d live blocks of 256 B - 8 MiB per thread, one replaced per pair), "
	       "%u pairs per thread, sync/fence path\n\n", WS_LIVE, iters);
	printf("| threads | ns per pair per thread | aggregate Mpairs/s | per pair: events recorded | "
	       "epochs closed | backend allocs | backend frees | reserved peak MiB |\n"
	       "|---|---|---|---|---|---|---|---|\n");
	for (unsigned threads = ws_min_threads; threads <= ws_max_threads; threads *= 2) {
		emm_heap_t *h = make_heap(PATH_SYNC_FENCE), *priv[16] = {NULL};
		struct ws_job jobs[16];
		pthread_t th[16];
		pthread_barrier_t bar;
		struct emm_stats before = {0}, after = {0};
		uint64_t wall = 0;

		pthread_barrier_init(&bar, NULL, threads + 1);
		for (unsigned t = 0; t < threads; t++) {
			if (private_heaps && t > 0)
				priv[t] = make_heap(PATH_SYNC_FENCE);
			jobs[t] = (struct ws_job){.heap = priv[t] ? priv[t] : h, .id = t, .iters = iters, .barrier = &bar};
			pthread_create(&th[t], NULL, ws_loop, &jobs[t]);
		}
		pthread_barrier_wait(&bar);
		for (unsigned t = 0; t < threads; t++)
			emm_heap_add_stats(priv[t] ? priv[t] : (t ? NULL : h), &before);
		for (unsigned t = 0; t < threads; t++)
			pthread_join(th[t], NULL);
		for (unsigned t = 0; t < threads; t++)
			emm_heap_add_stats(priv[t] ? priv[t] : (t ? NULL : h), &after);
		for (unsigned t = 0; t < threads; t++) {
			if (jobs[t].err) {
				fprintf(stderr, "allocation failed\n");
				exit(1);
			}
			if (jobs[t].ns > wall)
				wall = jobs[t].ns;
		}
		double pairs = (double)iters * threads;
		printf("| %u | %.1f | %.2f | %.4f | %.4f | %.5f | %.5f | %.0f |\n", threads, (double)wall / iters,
		       pairs / ((double)wall / 1e9) / 1e6, (after.events_recorded - before.events_recorded) / pairs,
		       (after.epochs_closed - before.epochs_closed) / pairs,
		       (after.backend_allocs - before.backend_allocs) / pairs,
		       (after.backend_frees - before.backend_frees) / pairs, (double)after.reserved_bytes_peak / MIB);
		fflush(stdout);
		if (emm_heap_check(h) != 0) {
			fprintf(stderr, "heap check failed\n");
			exit(1);
		}
		pthread_barrier_destroy(&bar);
		emm_heap_destroy(h, true);
		for (unsigned t = 0; t < threads; t++)
			if (priv[t])
				emm_heap_destroy(priv[t], true);
	}
}

int main(int argc, char **argv)
{
	static const size_t sizes[] = {256, 64 * KIB, 1 * MIB, 16 * MIB};
	static const char *size_names[] = {"256 B", "64 KiB", "1 MiB", "16 MiB"};
	double med, p10, p90, mops;

	bool threads_only = false, ws_only = false;
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--quick") == 0) {
			batches = 31;
			warmup = 2000;
		} else if (strcmp(argv[i], "--private") == 0) {
			private_heaps = true;
		} else if (strcmp(argv[i], "--threads") == 0) {
			threads_only = true;
		} else if (strcmp(argv[i], "--working-set") == 0) {
			ws_only = true;
		} else if (strcmp(argv[i], "--arenas") == 0 && i + 1 < argc) {
			arenas = (unsigned)atoi(argv[++i]);
		} else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
			ws_iters = (unsigned)atoi(argv[++i]);
		} else if (strcmp(argv[i], "--min-threads") == 0 && i + 1 < argc) {
			ws_min_threads = (unsigned)atoi(argv[++i]);
			if (ws_min_threads < 1 || ws_min_threads > 16)
				ws_min_threads = 1;
		} else if (strcmp(argv[i], "--max-threads") == 0 && i + 1 < argc) {
			ws_max_threads = (unsigned)atoi(argv[++i]);
			if (ws_max_threads > 16)
				ws_max_threads = 16;
		} else {
			fprintf(stderr, "usage: bench-core [--quick] [--threads] [--private] [--arenas N] "
			                "[--working-set [--iters N] [--min-threads N] [--max-threads N]]\n");
			return 2;
		}
	}
	if (ws_only) {
		working_set();
		return 0;
	}
	if (threads_only)
		goto threads;

	printf("Cached alloc+free pair, single thread: ns per pair, median of %u batches of %u (p10-p90)\n\n",
	       batches, batch);
	printf("| size | sync/fence | sync/nofence | stream |\n|---|---|---|---|\n");
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		printf("| %s |", size_names[i]);
		for (int p = 0; p < NPATHS; p++) {
			run((enum path)p, sizes[i], 1, &med, &p10, &p90, &mops);
			printf(" %.1f (%.1f-%.1f) |", med, p10, p90);
		}
		printf("\n");
		fflush(stdout);
	}

threads:
	printf("\nThreads %s, 64 KiB: median ns per pair per thread / aggregate Mpairs/s\n\n",
	       private_heaps ? "each on its own heap" : "sharing one heap");
	printf("| threads |");
	for (int p = 0; p < NPATHS; p++)
		printf(" %s |", path_name[p]);
	printf("\n|---|---|---|---|\n");
	for (unsigned threads = 1; threads <= 8; threads *= 2) {
		printf("| %u |", threads);
		for (int p = 0; p < NPATHS; p++) {
			run((enum path)p, 64 * KIB, threads, &med, &p10, &p90, &mops);
			printf(" %.1f ns / %.2f |", med, mops);
		}
		printf("\n");
		fflush(stdout);
	}
	return 0;
}
