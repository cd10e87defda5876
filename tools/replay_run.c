/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_run.c - runs a trace on a heap over a backend: the replay
 * threads and their hand-over, one event at a time, and what a run measures
 * (contract in replay_run.h).
 *
 * Hand-over: event i belongs to the replay thread of its traced thread. The
 * thread that ran event i runs i+1 too when it owns it, else posts the
 * owner's semaphore and waits on its own. Only one thread touches the run
 * at a time, and sem_post/sem_wait order the memory between them.
 */
#include "tools/replay_run.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocator/backend_loader.h"
#include "allocator/heap_options.h"
#include "tools/replay_fence.h"
#include "tools/replay_pages.h"
#include "tools/replay_snapshot.h"

struct worker {
	struct replayer *rp;
	uint32_t index; /* the traced thread it replays */
	sem_t go;
	pthread_t thread;
	bool started;
};

/* What one run shares between its threads. */
struct run {
	const struct replay_trace *trace;
	emm_heap_t *heap;
	struct replay_result *res;
	emm_addr_t *addr;	/* per event: the block an allocate got */
	size_t next;		/* the next event to replay */
	bool stop;
	uint64_t requested;	/* live bytes as asked */
	struct replay_pages *sim; /* EMM_BACKEND=vmm: the simulated device, checked */
	size_t violation_index;   /* the event after which it saw a violation */
	struct replay_fence *fence; /* --fences: the simulated device's clock, or NULL */
};

struct replayer {
	const struct replay_trace *trace;
	struct worker *workers; /* nthreads, or NULL for one_thread */
	sem_t done;
	struct run *run;
	bool quit;
};

static double now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The heap's counters after an event: peaks, the timeline. */
static void observe(struct run *run, size_t i)
{
	struct replay_result *res = run->res;
	struct emm_stats st = {.struct_size = sizeof(st)};

	emm_heap_add_stats(run->heap, &st);
	if (run->requested > res->peak_requested)
		res->peak_requested = run->requested;
	if (st.allocated_bytes > res->peak_allocated) {
		res->peak_allocated = st.allocated_bytes;
		res->reserved_at_peak = st.reserved_bytes;
	}
	if (st.reserved_bytes > res->peak_reserved)
		res->peak_reserved = st.reserved_bytes;
	if (res->tl_requested) {
		res->tl_requested[i] = run->requested;
		res->tl_allocated[i] = st.allocated_bytes;
		res->tl_reserved[i] = st.reserved_bytes;
		res->tl_count = i + 1;
	}
}

static void record_failure(struct run *run, size_t i, int error)
{
	struct replay_result *res = run->res;
	struct emm_stats st = {.struct_size = sizeof(st)};
	size_t idle, largest;

	emm_heap_add_stats(run->heap, &st);
	emm_heap_idle_info(run->heap, &idle, &largest);
	res->ok = false;
	res->fail_index = i;
	res->fail_error = error;
	res->fail_requested = run->requested;
	res->fail_allocated = st.allocated_bytes;
	res->fail_reserved = st.reserved_bytes;
	res->fail_largest_free = largest;
	run->stop = true;
}

/* Replay event i on the calling thread. */
static void replay_event(struct run *run, size_t i)
{
	const struct replay_event *ev = &run->trace->events[i];
	struct replay_result *res = run->res;
	emm_addr_t addr = 0;
	size_t requested;
	double t0 = now_seconds();
	int r = 0;

	switch (ev->action) {
	case REPLAY_ALLOC:
		r = emm_heap_alloc(run->heap, (size_t)ev->size, ev->stream_key, &addr);
		res->call_seconds += now_seconds() - t0;
		res->calls++;
		if (r < 0) {
			record_failure(run, i, r);
			return;
		}
		run->addr[i] = addr;
		run->requested += ev->size;
		if (run->sim)
			(void)replay_pages_handed_out(run->sim, addr, (size_t)ev->size);
		break;
	case REPLAY_ALLOC_FAILURE:
		r = emm_heap_alloc(run->heap, (size_t)ev->size, ev->stream_key, &addr);
		res->call_seconds += now_seconds() - t0;
		res->calls++;
		if (r == 0) {
			res->unexpected_successes++;
			if (run->sim) {
				(void)replay_pages_handed_out(run->sim, addr, (size_t)ev->size);
				replay_pages_taken_back(run->sim, addr);
			}
			(void)emm_heap_free(addr, ev->stream_key, &requested);
		} else {
			res->expected_failures++;
		}
		break;
	case REPLAY_FREE:
		if (ev->match == REPLAY_NO_MATCH) {
			res->skipped_frees++;
			break;
		}
		if (run->sim)
			replay_pages_taken_back(run->sim, run->addr[ev->match]);
		r = emm_heap_free(run->addr[ev->match], ev->stream_key, &requested);
		res->call_seconds += now_seconds() - t0;
		res->calls++;
		if (r < 0) {
			record_failure(run, i, r);
			return;
		}
		run->requested -= run->trace->events[ev->match].size;
		break;
	}
	if (run->sim && replay_pages_violation(run->sim) && !run->stop) {
		run->violation_index = i;
		run->stop = true;
	}
	observe(run, i);
	if (run->fence)
		replay_fence_tick(run->fence);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct replayer *rp = w->rp;

	for (;;) {
		struct run *run;

		while (sem_wait(&w->go) < 0)
			;
		if (rp->quit)
			return NULL;
		run = rp->run;
		for (;;) {
			size_t i = run->next;

			if (run->stop || i >= run->trace->count) {
				sem_post(&rp->done);
				break;
			}
			if (run->trace->events[i].thread != w->index) {
				sem_post(&rp->workers[run->trace->events[i].thread].go);
				break;
			}
			replay_event(run, i);
			run->next = i + 1;
		}
	}
}

int replayer_create(const struct replay_trace *trace, bool one_thread, struct replayer **ret)
{
	struct replayer *rp = calloc(1, sizeof(*rp));
	pthread_attr_t attr;
	int r = 0;

	if (!rp)
		return -ENOMEM;
	rp->trace = trace;
	sem_init(&rp->done, 0, 0);
	*ret = rp;
	if (one_thread || trace->nthreads == 0)
		return 0;
	rp->workers = calloc(trace->nthreads, sizeof(*rp->workers));
	if (!rp->workers) {
		replayer_destroy(rp);
		return -ENOMEM;
	}
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	for (size_t i = 0; i < trace->nthreads && r == 0; i++) {
		struct worker *w = &rp->workers[i];

		w->rp = rp;
		w->index = (uint32_t)i;
		sem_init(&w->go, 0, 0);
		r = -pthread_create(&w->thread, &attr, worker_main, w);
		w->started = r == 0;
	}
	pthread_attr_destroy(&attr);
	if (r < 0) {
		replayer_destroy(rp);
		return r;
	}
	return 0;
}

void replayer_destroy(struct replayer *rp)
{
	if (!rp)
		return;
	rp->quit = true;
	for (size_t i = 0; rp->workers && i < rp->trace->nthreads; i++) {
		struct worker *w = &rp->workers[i];

		if (!w->started)
			continue;
		sem_post(&w->go);
		pthread_join(w->thread, NULL);
		sem_destroy(&w->go);
	}
	sem_destroy(&rp->done);
	free(rp->workers);
	free(rp);
}

/* --- the backend under the heap --- */

static void *no_driver_proc(const char *name)
{
	return NULL; /* no CUDA driver here */
}

static void backend_log(enum emm_backend_log_level level, const char *msg)
{
	if (level >= EMM_BACKEND_LOG_WARNING)
		fprintf(stderr, "emm-replay: %s\n", msg);
}

static void *lookup(void *handle, const char *name)
{
	return dlsym(handle, name);
}

struct backend_instance {
	struct emm_backend_loaded loaded;
	struct emm_backend_host host;
	char options[600];
	void *state;
};

static int backend_open(const struct replay_setup *s, struct backend_instance *b, char *err, size_t err_size)
{
	const char *name = s->backend && *s->backend ? s->backend : "hostsim";
	const char *opts = s->backend_options ? s->backend_options : "";
	int r;

	memset(b, 0, sizeof(*b));
	r = emm_backend_load(name, lookup, &b->loaded);
	if (r < 0) {
		snprintf(err, err_size, "cannot load backend '%s' (%s)", name, strerror(-r));
		return r;
	}
	if (s->capacity)
		snprintf(b->options, sizeof(b->options), "%s%scapacity=%llu", opts, *opts ? "," : "",
			 (unsigned long long)s->capacity);
	else
		snprintf(b->options, sizeof(b->options), "%s", opts);
	b->host = (struct emm_backend_host){
	    .interface_version = b->loaded.version,
	    .struct_size = sizeof(b->host),
	    .driver_proc = no_driver_proc,
	    .log = backend_log,
	    .options = b->options,
	};
	r = b->loaded.table->init(&b->host, 0, 0, &b->state);
	if (r < 0) {
		snprintf(err, err_size, "backend '%s' failed to start (%s)", name, strerror(-r));
		emm_backend_unload(&b->loaded);
		return r;
	}
	return 0;
}

static void backend_close(struct backend_instance *b)
{
	b->loaded.table->fini(b->state, true);
	emm_backend_unload(&b->loaded);
}

/* --- a run --- */

/* EMM_BACKEND=vmm: no driver here, so the page-granular device of
 * replay_pages.h with the vmm backend's defaults (2 MiB pages, segments of
 * 4 MiB and up growable). */
#define REPLAY_PAGES_CAPACITY (UINT64_C(80) << 30)
#define REPLAY_PAGES_PAGE     ((size_t)2 << 20)
#define REPLAY_PAGES_GROW_MIN ((size_t)4 << 20)

static bool paged(const struct replay_setup *s)
{
	return s->backend && strcmp(s->backend, "vmm") == 0;
}

static int alloc_timeline(struct replay_result *res, size_t n)
{
	n = n ? n : 1;
	res->tl_requested = calloc(n, sizeof(uint64_t));
	res->tl_allocated = calloc(n, sizeof(uint64_t));
	res->tl_reserved = calloc(n, sizeof(uint64_t));
	return res->tl_requested && res->tl_allocated && res->tl_reserved ? 0 : -ENOMEM;
}

int replayer_run(struct replayer *rp, const struct replay_setup *setup, struct replay_result *res, char *err,
		 size_t err_size)
{
	const struct replay_trace *t = rp->trace;
	struct backend_instance b;
	struct emm_segment_source src;
	struct emm_segment_pages pages;
	struct replay_pages *sim = NULL;
	struct run run = {.trace = t, .res = res};
	struct replay_fence fence;
	struct emm_fence_ops fops;
	double t0;
	int r;

	memset(res, 0, sizeof(*res));
	res->ok = true;
	res->fences = setup->fences;
	res->fence_lag = setup->fence_lag;
	res->stats.struct_size = sizeof(res->stats);
	run.addr = calloc(t->count ? t->count : 1, sizeof(*run.addr));
	if (!run.addr || (setup->timeline && alloc_timeline(res, t->count) < 0)) {
		free(run.addr);
		replay_result_free(res);
		snprintf(err, err_size, "out of memory");
		return -ENOMEM;
	}
	struct emm_heap_params params = setup->params;
	size_t dev_free = 0, dev_total = 0;
	if (paged(setup)) {
		/* The vmm backend, simulated: pages mapped, unmapped, grown. */
		dev_total = setup->capacity ? setup->capacity : REPLAY_PAGES_CAPACITY;
		r = replay_pages_create(dev_total, REPLAY_PAGES_PAGE, REPLAY_PAGES_GROW_MIN, &sim);
		if (r < 0) {
			snprintf(err, err_size, "cannot simulate the vmm backend (%s)", strerror(-r));
			goto out;
		}
		replay_pages_bind(sim, &src, &pages);
		run.sim = sim;
	} else {
		r = backend_open(setup, &b, err, err_size);
		if (r < 0)
			goto out;
		src = (struct emm_segment_source){
		    .state = b.state,
		    .alloc = b.loaded.table->segment_alloc,
		    .free = b.loaded.table->segment_free,
		};
		if (b.loaded.table->mem_info)
			(void)b.loaded.table->mem_info(b.state, &dev_free, &dev_total);
	}
	/* Segment sizes the device cannot hold are cut as libemm cuts them. */
	if (dev_total)
		emm_heap_params_fit(&params, dev_total);
	if (setup->fences) {
		fops = replay_fence_ops(&fence, setup->fence_lag);
		run.fence = &fence;
	}
	r = emm_heap_create_paged(&params, &src, sim ? &pages : NULL, run.fence ? &fops : NULL, 0, &run.heap);
	if (r < 0) {
		snprintf(err, err_size, "cannot create the heap (%s)", strerror(-r));
		goto close;
	}

	t0 = now_seconds();
	if (!rp->workers) {
		for (size_t i = 0; i < t->count && !run.stop; i++)
			replay_event(&run, i);
	} else if (t->count) {
		rp->run = &run;
		sem_post(&rp->workers[t->events[0].thread].go);
		while (sem_wait(&rp->done) < 0)
			;
		rp->run = NULL;
	}
	res->wall_seconds = now_seconds() - t0;

	emm_heap_add_stats(run.heap, &res->stats);
	if (sim && replay_pages_violation(sim)) {
		const struct replay_event *ev = &t->events[run.violation_index];

		snprintf(err, err_size,
		         "page rule broken at event %zu (line %u, %s of %llu bytes, thread %u, stream 0x%llx): %s; "
		         "heap: %llu bytes allocated, %llu mapped, %llu page unmaps, %llu maps, %llu grows",
		         run.violation_index, ev->line,
		         ev->action == REPLAY_FREE ? "free" : "allocation", (unsigned long long)ev->size,
		         ev->thread, (unsigned long long)ev->stream_key, replay_pages_violation(sim),
		         (unsigned long long)res->stats.allocated_bytes, (unsigned long long)res->stats.reserved_bytes,
		         (unsigned long long)res->stats.page_unmaps, (unsigned long long)res->stats.page_maps,
		         (unsigned long long)res->stats.segment_grows);
		r = -EFAULT;
	}
	if (setup->snapshot && (r = replay_write_snapshot(setup->snapshot, t, run.heap, run.addr, res)) < 0)
		snprintf(err, err_size, "cannot write the snapshot %s (%s)", setup->snapshot, strerror(-r));
	emm_heap_destroy(run.heap, true);
close:
	if (sim)
		replay_pages_destroy(sim);
	else
		backend_close(&b);
out:
	free(run.addr);
	if (r < 0)
		replay_result_free(res);
	return r;
}

void replay_result_free(struct replay_result *res)
{
	free(res->tl_requested);
	free(res->tl_allocated);
	free(res->tl_reserved);
	res->tl_requested = res->tl_allocated = res->tl_reserved = NULL;
	res->tl_count = 0;
}

double replay_fragmentation(const struct replay_result *res)
{
	if (res->reserved_at_peak == 0)
		return 0.0;
	return 100.0 * (1.0 - (double)res->peak_allocated / (double)res->reserved_at_peak);
}
