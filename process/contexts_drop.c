/* SPDX-License-Identifier: MIT */
/*
 * process/contexts_drop.c - a context's heaps when the context goes: its
 * destroy or reset through our shims (shims_stream.c), a primary context
 * released to inactive, or a reset noticed behind our back (contexts.c, and
 * st_drop_inactive_primaries before a release of idle memory).
 * The entry is unlinked from the registry, its heaps are destroyed without
 * driver calls under the heap guard (guard.c), its streams, captures and
 * IPC state are forgotten, and every thread's context cache is emptied
 * (the entry itself stays allocated: stale caches may still read it).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/log.h"
#include "process/annotate.h"
#include "process/process_internal.h"
#include "process/process.h"

/* Unlink one entry matching `match`, destroy its heaps without driver calls
 * and forget its streams, events, captures and graphs. Returns false when
 * none matched. After exit has begun nothing is torn down (other threads
 * may still be using the heaps; the process is about to end anyway). */
static bool drop_one(st_ctx_match_fn match, const void *arg)
{
	struct ctx_entry *e = NULL;
	emm_heap_t *heaps[ST_CONTEXT_HEAPS];
	struct gone_segment *gone = NULL;
	size_t n = 0, ngone = 0;
	bool any = false, all_out;

	if (st_is_exiting())
		return false;
	st_lock(&st_ctx_lock);
	any = st_ctx_find_locked(match, arg, false) != NULL;
	st_unlock(&st_ctx_lock);
	if (!any)
		return false;

	st_guard_step_out();
	pthread_rwlock_wrlock(&st_heap_life_lock);
	/* No other thread inside a heap from here to st_guard_end - unless one
	 * stayed inside past EMM_TEARDOWN_WAIT: its heaps are then unlinked but
	 * left alive for it (leaked; the driver frees the context's memory). */
	all_out = st_guard_begin(st_opts->teardown_wait);
	st_lock(&st_ctx_lock);
	e = st_ctx_find_locked(match, arg, true);
	if (e) {
		atomic_fetch_add(&st_ctx_generation, 1);
		if (e->heap)
			heaps[n++] = e->heap;
		if (e->retired)
			heaps[n++] = atomic_exchange(&e->retired, NULL);
		for (unsigned f = 0; f < PINNED_FLAG_SETS; f++) {
			emm_heap_t *p = atomic_exchange(&e->pinned[f], NULL);
			if (p)
				heaps[n++] = p;
		}
		e->heap = NULL;
		e->failed = true;
	}
	st_unlock(&st_ctx_lock);
	if (!e) {
		st_guard_end();
		pthread_rwlock_unlock(&st_heap_life_lock);
		st_guard_step_in();
		return false;
	}

	emm_debug("dropping the heaps of context %p (device %d)", (void *)e->ctx, e->device);
	emm_fence_pool_drop(e->ctx);
	if (!all_out)
		emm_warn("context %p: a thread is still inside libemm after %u ms (EMM_TEARDOWN_WAIT); its %zu "
		         "heap(s) are left to it, not freed",
		         (void *)e->ctx, st_opts->teardown_wait, n);
	/* Their segments went with the context: a memory checker forgets
	 * them (after the locks), or it refuses the addresses' reuse. */
	if (all_out)
		ngone = st_annotate_collect(heaps, n, &gone);
	for (size_t i = 0; i < n; i++) {
		st_stats_retire(heaps[i]);
		if (all_out)
			emm_heap_destroy(heaps[i], false);
	}
	st_guard_end();
	pthread_rwlock_unlock(&st_heap_life_lock);
	st_guard_step_in();
	st_annotate_gone(gone, ngone);
	/* The backend state goes too - unless a thread inside may still be
	 * calling the backend with it. */
	if (all_out) {
		if (e->backend_state && st_backend.table->fini)
			st_backend.table->fini(e->backend_state, false);
		e->backend_state = NULL;
		st_host_backend_fini(e, false);
	}
	st_stream_remove_context(e->ctx);
	/* Its captures and graphs went with it; quarantined blocks of these
	 * heaps are forgotten (the pointers are only compared). */
	emm_capture_context_dropped(e->ctx, heaps, n);
	/* Its IPC exports and imports went with its memory. */
	st_ipc_context_dropped(e->ctx, e);
	/* e stays allocated: stale thread caches may still read it. */
	return true;
}

static bool match_ctx(const struct ctx_entry *e, const void *arg)
{
	return e->ctx == (CUcontext)arg;
}

static bool match_entry(const struct ctx_entry *e, const void *arg)
{
	return e == arg;
}

bool st_drop_entry(struct ctx_entry *stale)
{
	return drop_one(match_entry, stale);
}

static bool match_primary(const struct ctx_entry *e, const void *arg)
{
	return e->primary && e->device == *(const CUdevice *)arg;
}

void emm_state_context_destroyed(CUcontext ctx)
{
	while (drop_one(match_ctx, ctx))
		;
	/* A context libemm never kept a heap for leaves streams, captures and
	 * IPC mappings here too (a capture that stayed recorded would keep
	 * every epoch from closing): forgotten as for one it had (a second
	 * time is nothing). */
	if (ctx && !st_is_exiting()) {
		st_stream_remove_context(ctx);
		emm_capture_context_dropped(ctx, NULL, 0);
		st_ipc_context_dropped(ctx, NULL);
	}
	/* It may have been current here or elsewhere without an entry of
	 * ours (a failed one, or none yet): every cache asks again. */
	emm_state_current_changed(true);
}

void emm_state_primary_reset(CUdevice dev)
{
	while (drop_one(match_primary, &dev))
		;
	emm_state_current_changed(true);
}

int st_primary_state(CUdevice dev)
{
	const struct emm_real_driver_table *real = st_real_table();
	unsigned int flags = 0;
	int active = 0;

	if (!real->cuDevicePrimaryCtxGetState || real->cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
		return -1;
	return active ? 1 : 0;
}

/* Dead contexts a thread may still have current, remembered under a tool
 * only: primaries reset through our shims (the runtime leaves a reset
 * primary current until its next call retains it; dev is its device) and
 * contexts the program destroyed (dev -1: current on another thread, or
 * left under the top of a thread's stack, they stay so). A lookup meanwhile
 * must not ask the driver for the dead context's id: the tool would report
 * the failed call as the program's. */
static struct {
	CUcontext ctx;
	CUdevice dev;
} dead_contexts[16];
static pthread_mutex_t reset_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_dead(CUcontext ctx, CUdevice dev)
{
	pthread_mutex_lock(&reset_lock);
	for (unsigned i = 0; i < sizeof(dead_contexts) / sizeof(dead_contexts[0]); i++) {
		if (!dead_contexts[i].ctx || dead_contexts[i].ctx == ctx) {
			dead_contexts[i].ctx = ctx;
			dead_contexts[i].dev = dev;
			break;
		}
	}
	pthread_mutex_unlock(&reset_lock);
}

void emm_state_context_gone(CUcontext ctx)
{
	if (ctx && st_tool_injected)
		note_dead(ctx, -1);
}

void emm_state_context_made(CUcontext ctx)
{
	if (!ctx || !st_tool_injected)
		return;
	pthread_mutex_lock(&reset_lock);
	for (unsigned i = 0; i < sizeof(dead_contexts) / sizeof(dead_contexts[0]); i++)
		if (dead_contexts[i].ctx == ctx && dead_contexts[i].dev < 0)
			dead_contexts[i].ctx = NULL; /* the handle is a live context again */
	pthread_mutex_unlock(&reset_lock);
}

bool st_context_known_dead(CUcontext ctx)
{
	CUdevice dev = -1;
	int state;
	unsigned i, n = sizeof(dead_contexts) / sizeof(dead_contexts[0]);

	pthread_mutex_lock(&reset_lock);
	for (i = 0; i < n && dead_contexts[i].ctx != ctx; i++)
		;
	if (i < n)
		dev = dead_contexts[i].dev;
	pthread_mutex_unlock(&reset_lock);
	if (i < n && dev < 0)
		return true; /* destroyed by the program */
	if (i == n) {
		/* A reset no shim saw (shared cudart's cudaDeviceReset passed
		 * none, measured under compute-sanitizer: the failed cuCtxGetId
		 * was reported): one of our primaries, now inactive, is dead. */
		bool primary;

		return st_ctx_lookup(ctx, &dev, &primary) && primary && st_primary_state(dev) == 0;
	}
	if ((state = st_primary_state(dev)) < 0)
		return false;
	if (state == 1) { /* retained again: the same handle, a live context */
		pthread_mutex_lock(&reset_lock);
		if (dead_contexts[i].ctx == ctx)
			dead_contexts[i].ctx = NULL;
		pthread_mutex_unlock(&reset_lock);
	}
	return state == 0;
}

CUcontext emm_state_primary_resetting(CUdevice dev)
{
	struct ctx_entry *e;
	CUcontext ctx;

	if (!st_is_enabled() || st_is_exiting())
		return NULL;
	st_lock(&st_ctx_lock);
	e = st_ctx_find_locked(match_primary, &dev, false);
	ctx = e ? e->ctx : NULL;
	st_unlock(&st_ctx_lock);
	if (ctx && st_tool_injected)
		note_dead(ctx, dev);
	emm_state_context_destroying(ctx);
	return ctx;
}

struct primary_before {
	CUdevice dev;
	uint64_t births; /* entries begun before the state was read */
};

static bool match_primary_before(const struct ctx_entry *e, const void *arg)
{
	const struct primary_before *b = arg;

	return e->primary && e->device == b->dev && e->born <= b->births;
}

/* An inactive primary context has no memory: the heaps of entries made
 * before it was seen inactive are stale. Not those begun after: another
 * thread may have retained it and made its entry between the state read
 * and the drop (eight threads making their first calls at once lost a
 * live heap that way, test-threads-first-call). */
void emm_state_primary_released(CUdevice dev)
{
	struct primary_before b = {dev, atomic_load(&st_ctx_births)};

	if (st_is_exiting() || st_primary_state(dev) != 0)
		return;
	while (drop_one(match_primary_before, &b))
		;
	emm_state_current_changed(true);
}

/* Primary entries whose device is not yet in the list. */
struct dev_list {
	CUdevice dev[64];
	unsigned n;
};

static bool match_primary_unlisted(const struct ctx_entry *e, const void *arg)
{
	const struct dev_list *l = arg;

	if (!e->primary)
		return false;
	for (unsigned i = 0; i < l->n; i++)
		if (l->dev[i] == e->device)
			return false;
	return true;
}

void st_drop_inactive_primaries(void)
{
	struct dev_list l = {.n = 0};
	struct ctx_entry *e;

	if (!st_is_enabled() || st_is_exiting())
		return;
	while (l.n < sizeof(l.dev) / sizeof(l.dev[0])) {
		st_lock(&st_ctx_lock);
		e = st_ctx_find_locked(match_primary_unlisted, &l, false);
		if (e)
			l.dev[l.n++] = e->device;
		st_unlock(&st_ctx_lock);
		if (!e)
			break;
	}
	for (unsigned i = 0; i < l.n; i++)
		emm_state_primary_released(l.dev[i]);
}

void emm_state_primary_retaining(CUdevice dev)
{
	/* A heap we keep for an inactive primary is left from before a reset
	 * we did not see. */
	emm_state_primary_released(dev);
}
