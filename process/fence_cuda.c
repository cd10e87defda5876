/* SPDX-License-Identifier: MIT */
/*
 * process/fence_cuda.c - the allocator's completion markers (struct
 * emm_fence_ops, allocator/heap.h) over real CUDA events.
 *
 * Each context has a pool of events created with CU_EVENT_DISABLE_TIMING
 * (the cheapest kind to record and query). A marker handed to the allocator
 * is a pointer to a small struct cuda_fence { event, pool }; released markers
 * go back to the releasing thread's few (tls_events) or to their pool's
 * free list and are recorded again later, so steady state creates no
 * events and a thread's epochs take no lock shared with other threads.
 *
 * Contexts: cuEventRecord needs an event of the stream's context, and the
 * legacy stream (CU_STREAM_LEGACY) is the one of the current context, so
 * record and device_synchronize make the pool's context current around the
 * call when another one is current (emm_heap_release_idle and stream
 * destruction can run with any context current). cuEventQuery,
 * cuEventSynchronize and cuStreamWaitEvent take the event's context from the
 * event itself. A marker recorded on a stream of another context (a
 * cuMemFreeAsync on a foreign stream) takes its event from that context's
 * pool.
 *
 * Closing an epoch first asks each non-blocking stream whether it is idle
 * (stream_idle: cuStreamQuery) and records on the busy ones only.
 *
 * Captures: every event record and query, and every stream query, passes
 * the capture gate
 * (capture.c), which refuses what an active capture forbids (a record on a
 * capturing stream, anything at all during a global-mode capture) and makes
 * a capture begun meanwhile wait for it; host waits are only checked. The
 * allocator asks `capturing` before it records or polls; the gate closes
 * the window between that question and the call.
 *
 * Pools are never freed: when a context is destroyed its pool is marked dead
 * (the driver destroyed the events with it) and every marker of it reads as
 * complete, so a marker that outlives its context is harmless. At exit
 * (emm_state_exiting) nothing here calls the driver: record hands out the
 * null marker 0, which every operation treats as complete.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/log.h"
#include "process/process.h"
#include "process/process_internal.h"

struct cuda_fence {
	CUevent event;
	emm_stream_t key; /* recorded on (the capture gate of its queries) */
	struct emm_fence_pool *pool;
	struct cuda_fence *next; /* free list */
};

struct emm_fence_pool {
	CUcontext ctx;
	atomic_bool dead;
	pthread_mutex_t lock;
	struct cuda_fence *free_list;
	struct emm_fence_pool *next; /* pool_list */
};

/* A thread's own few released fences, all of one pool (see tcache_give). */
#define TCACHE_EVENTS 16

struct event_tcache {
	struct emm_fence_pool *pool;
	struct cuda_fence *list;
	unsigned n;
};

static EMM_TLS_IE struct event_tcache tls_events;

/* Live pools by context (dead ones are unlinked but stay allocated). */
static pthread_mutex_t pool_list_lock = PTHREAD_MUTEX_INITIALIZER;
static struct emm_fence_pool *pool_list;

/* --- making the pool's context current --------------------------------- */

/* Make `ctx` current if it is not (st_push_ctx, segments.c). Returns true if
 * it pushed (st_pop_ctx later). The thread's context cache knows it when it
 * may be trusted (EMM_CONTEXT_CHECK off): no driver call then. */
static bool ctx_enter(CUcontext ctx)
{
	if (st_tls_trusted_ctx() == ctx)
		return false;
	return st_push_ctx(ctx);
}

/* --- pools ------------------------------------------------------------- */

static struct emm_fence_pool *pool_new(CUcontext ctx)
{
	struct emm_fence_pool *pool = calloc(1, sizeof(*pool));

	if (!pool)
		return NULL;
	pool->ctx = ctx;
	atomic_init(&pool->dead, false);
	pthread_mutex_init(&pool->lock, NULL);
	return pool;
}

struct emm_fence_pool *emm_fence_pool_get(CUcontext ctx)
{
	struct emm_fence_pool *pool;

	pthread_mutex_lock(&pool_list_lock);
	for (pool = pool_list; pool; pool = pool->next)
		if (pool->ctx == ctx)
			break;
	if (!pool) {
		pool = pool_new(ctx);
		if (pool) {
			pool->next = pool_list;
			pool_list = pool;
		}
	}
	pthread_mutex_unlock(&pool_list_lock);
	return pool;
}

void emm_fence_pool_drop(CUcontext ctx)
{
	struct emm_fence_pool **link, *pool = NULL;

	pthread_mutex_lock(&pool_list_lock);
	for (link = &pool_list; *link; link = &(*link)->next) {
		if ((*link)->ctx == ctx) {
			pool = *link;
			*link = pool->next;
			break;
		}
	}
	pthread_mutex_unlock(&pool_list_lock);
	if (!pool)
		return;
	atomic_store(&pool->dead, true);
	/* The driver destroyed the events with the context: drop the structs. */
	pthread_mutex_lock(&pool->lock);
	while (pool->free_list) {
		struct cuda_fence *f = pool->free_list;
		pool->free_list = f->next;
		free(f);
	}
	pthread_mutex_unlock(&pool->lock);
}

void emm_fence_fork_child(void)
{
	/* The parent's events mean nothing here; forget every pool (leaked:
	 * their locks may have been held by threads that do not exist here). */
	pthread_mutex_init(&pool_list_lock, NULL);
	pool_list = NULL;
	tls_events.pool = NULL; /* this thread's cached parent events, leaked */
	tls_events.list = NULL;
	tls_events.n = 0;
}

static bool pool_gone(const struct emm_fence_pool *pool)
{
	return emm_state_exiting() || atomic_load_explicit(&pool->dead, memory_order_acquire);
}

/* --- a thread's own few events ------------------------------------------ */

/* Each thread keeps up to TCACHE_EVENTS released fences of one pool (the
 * first it released one to while its cache was empty or held a dead
 * pool's), so that the epochs it closes take and give events without the
 * pool's mutex, which every thread of the context shares. They go back to
 * their pool when the thread exits; a dead pool's are freed (the driver
 * destroyed their events with the context). */
static pthread_key_t tcache_key;
static pthread_once_t tcache_once = PTHREAD_ONCE_INIT;
static bool tcache_keyed;

/* Back to its pool's free list (freed if the pool is dead). */
static void pool_put(struct cuda_fence *f)
{
	struct emm_fence_pool *pool = f->pool;

	if (atomic_load_explicit(&pool->dead, memory_order_acquire)) {
		free(f);
		return;
	}
	pthread_mutex_lock(&pool->lock);
	f->next = pool->free_list;
	pool->free_list = f;
	pthread_mutex_unlock(&pool->lock);
}

static void tcache_exit(void *arg)
{
	struct event_tcache *c = arg;

	while (c->list) {
		struct cuda_fence *f = c->list;
		c->list = f->next;
		pool_put(f);
	}
	c->pool = NULL;
	c->list = NULL;
	c->n = 0;
}

static void tcache_key_init(void)
{
	tcache_keyed = pthread_key_create(&tcache_key, tcache_exit) == 0;
}

static struct cuda_fence *tcache_take(struct emm_fence_pool *pool)
{
	struct event_tcache *c = &tls_events;
	struct cuda_fence *f = c->list;

	if (c->pool != pool || !f)
		return NULL;
	c->list = f->next;
	c->n--;
	return f;
}

/* True when f went into this thread's cache. */
static bool tcache_give(struct cuda_fence *f)
{
	struct event_tcache *c = &tls_events;

	if (c->pool != f->pool) {
		if (c->n && !atomic_load_explicit(&c->pool->dead, memory_order_acquire))
			return false; /* holding a live pool's: f goes to its own */
		tcache_exit(c); /* a dead pool's: freed */
		pthread_once(&tcache_once, tcache_key_init);
		if (!tcache_keyed || pthread_setspecific(tcache_key, c) != 0)
			return false; /* no way back at thread exit: never cache */
		c->pool = f->pool;
	}
	if (c->n >= TCACHE_EVENTS)
		return false;
	f->next = c->list;
	c->list = f;
	c->n++;
	return true;
}

/* A fence with an event of this pool: this thread's own, the pool's free
 * list's, or new. */
static struct cuda_fence *fence_get(struct emm_fence_pool *pool)
{
	const struct emm_real_driver_table *real = emm_state_real();
	struct cuda_fence *f;
	CUresult r;
	bool pushed;

	f = tcache_take(pool);
	if (f)
		return f;
	pthread_mutex_lock(&pool->lock);
	f = pool->free_list;
	if (f)
		pool->free_list = f->next;
	pthread_mutex_unlock(&pool->lock);
	if (f)
		return f;

	if (!real->cuEventCreate)
		return NULL;
	f = calloc(1, sizeof(*f));
	if (!f)
		return NULL;
	f->pool = pool;
	pushed = ctx_enter(pool->ctx);
	r = real->cuEventCreate(&f->event, CU_EVENT_DISABLE_TIMING);
	st_pop_ctx(pushed);
	if (r != CUDA_SUCCESS) {
		emm_debug("cuEventCreate failed (%d)", (int)r);
		if (r == CUDA_ERROR_DEINITIALIZED)
			emm_state_driver_gone();
		free(f);
		return NULL;
	}
	return f;
}

static void fence_put(struct cuda_fence *f)
{
	/* A dead pool's never goes to this thread's cache: pool_put frees it. */
	if (atomic_load_explicit(&f->pool->dead, memory_order_acquire) || !tcache_give(f))
		pool_put(f);
}

/* --- the fence ops ----------------------------------------------------- */

/* Wait for the whole context on the host (a fallback that is always
 * correct: after it every marker would be complete). */
static int ctx_sync(struct emm_fence_pool *pool)
{
	const struct emm_real_driver_table *real = emm_state_real();
	CUresult r;
	bool pushed;

	if (pool_gone(pool))
		return 0;
	if (!real->cuCtxSynchronize)
		return -ENOSYS;
	if (!st_capture_gate_check(EMM_STREAM_SYNC))
		return -EBUSY;
	pushed = ctx_enter(pool->ctx);
	r = real->cuCtxSynchronize();
	st_pop_ctx(pushed);
	if (r == CUDA_ERROR_DEINITIALIZED || r == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
		if (r == CUDA_ERROR_DEINITIALIZED)
			emm_state_driver_gone();
		return 0;
	}
	return r == CUDA_SUCCESS ? 0 : -EIO;
}

static int fence_record(void *ctx, emm_stream_t key, uint64_t *ret_event)
{
	const struct emm_real_driver_table *real = emm_state_real();
	struct emm_fence_pool *pool = ctx;
	struct cuda_fence *f;
	unsigned phase;
	CUresult r;
	bool pushed;
	int sr;

	st_assert_unlocked("cuEventRecord (a fence op)");
	if (EMM_STREAM_IS_HANDLE(key)) {
		CUcontext owner = emm_state_stream_context(key);
		if (owner && owner != pool->ctx) {
			struct emm_fence_pool *other = emm_fence_pool_get(owner);
			if (other)
				pool = other;
		}
	}
	if (pool_gone(pool) || !real->cuEventRecord) {
		*ret_event = 0;
		return 0;
	}
	if (!st_capture_gate_enter(key, &phase))
		return -EBUSY;
	f = fence_get(pool);
	if (!f) {
		st_capture_gate_leave(phase);
		goto fallback;
	}
	pushed = ctx_enter(pool->ctx);
	r = real->cuEventRecord(f->event, emm_state_stream_handle(key));
	st_pop_ctx(pushed);
	st_capture_gate_leave(phase);
	if (r == CUDA_SUCCESS) {
		f->key = key;
		*ret_event = (uint64_t)(uintptr_t)f;
		return 0;
	}
	fence_put(f);
	if (r == CUDA_ERROR_DEINITIALIZED) {
		emm_state_driver_gone();
		*ret_event = 0;
		return 0;
	}
	emm_debug("cuEventRecord on stream %#llx failed (%d): waiting for the context instead",
	          (unsigned long long)key, (int)r);
fallback:
	/* No marker: make everything before now complete, then hand out the
	 * null marker; not during a capture that forbids it (-EBUSY). */
	sr = ctx_sync(pool);
	if (sr < 0)
		return sr == -EBUSY ? -EBUSY : -EIO;
	*ret_event = 0;
	return 0;
}

static int fence_query(void *ctx, uint64_t event)
{
	const struct emm_real_driver_table *real = emm_state_real();
	struct cuda_fence *f = (struct cuda_fence *)(uintptr_t)event;
	unsigned phase;
	CUresult r;

	st_assert_unlocked("cuEventQuery (a fence op)");
	(void)ctx;
	if (!f || pool_gone(f->pool) || !real->cuEventQuery)
		return 0;
	if (!st_capture_gate_enter(f->key, &phase))
		return -EBUSY; /* not known complete: asked again after the capture */
	r = real->cuEventQuery(f->event);
	st_capture_gate_leave(phase);
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_NOT_READY:
		return -EBUSY;
	case CUDA_ERROR_DEINITIALIZED:
		emm_state_driver_gone();
		return 0;
	case CUDA_ERROR_CONTEXT_IS_DESTROYED:
		return 0; /* its work is gone with it */
	default:
		emm_debug("cuEventQuery failed (%d)", (int)r);
		return -EIO;
	}
}

static int fence_stream_wait(void *ctx, emm_stream_t key, uint64_t event)
{
	const struct emm_real_driver_table *real = emm_state_real();
	struct cuda_fence *f = (struct cuda_fence *)(uintptr_t)event;
	CUresult r;

	st_assert_unlocked("cuStreamWaitEvent (a fence op)");
	(void)ctx;
	if (!f || pool_gone(f->pool))
		return 0;
	if (!real->cuStreamWaitEvent)
		return -ENOSYS;
	/* A capture begun on the stream since the caller asked `capturing`
	 * would take the wait into its graph: refused (-EBUSY) instead. */
	unsigned phase;
	if (!st_capture_gate_enter_wait(key, &phase))
		return -EBUSY;
	r = real->cuStreamWaitEvent(emm_state_stream_handle(key), f->event, 0);
	st_capture_gate_leave(phase);
	if (r == CUDA_ERROR_DEINITIALIZED) {
		emm_state_driver_gone();
		return 0;
	}
	return r == CUDA_SUCCESS ? 0 : -EIO;
}

static int fence_synchronize(void *ctx, uint64_t event)
{
	const struct emm_real_driver_table *real = emm_state_real();
	struct cuda_fence *f = (struct cuda_fence *)(uintptr_t)event;
	CUresult r;

	st_assert_unlocked("cuEventSynchronize (a fence op)");
	(void)ctx;
	if (!f || pool_gone(f->pool) || !real->cuEventSynchronize)
		return 0;
	if (!st_capture_gate_check(f->key))
		return -EBUSY;
	r = real->cuEventSynchronize(f->event);
	if (r == CUDA_ERROR_DEINITIALIZED) {
		emm_state_driver_gone();
		return 0;
	}
	if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED)
		return 0;
	return r == CUDA_SUCCESS ? 0 : -EIO;
}

static void fence_release(void *ctx, uint64_t event)
{
	struct cuda_fence *f = (struct cuda_fence *)(uintptr_t)event;

	(void)ctx;
	if (f)
		fence_put(f);
}

static int fence_device_synchronize(void *ctx)
{
	st_assert_unlocked("cuCtxSynchronize (a fence op)");
	return ctx_sync(ctx);
}

/* Has all work on non-blocking stream `key` completed? One cuStreamQuery,
 * through the capture gate like an event query (refused: -EBUSY, so the
 * caller records an event, which the gate refuses in turn). The stream
 * names its context: none is made current. */
static int fence_stream_idle(void *ctx, emm_stream_t key)
{
	const struct emm_real_driver_table *real = emm_state_real();
	unsigned phase;
	CUresult r;

	st_assert_unlocked("cuStreamQuery (a fence op)");
	(void)ctx;
	if (emm_state_exiting())
		return 0; /* record would hand out the null marker */
	if (!real->cuStreamQuery || !EMM_STREAM_IS_HANDLE(key))
		return -EBUSY;
	if (!st_capture_gate_enter(key, &phase))
		return -EBUSY;
	r = real->cuStreamQuery(emm_state_stream_handle(key));
	st_capture_gate_leave(phase);
	switch (r) {
	case CUDA_SUCCESS:
		return 0;
	case CUDA_ERROR_NOT_READY:
		return -EBUSY;
	case CUDA_ERROR_DEINITIALIZED:
		emm_state_driver_gone();
		return 0;
	default:
		emm_debug("cuStreamQuery on stream %#llx failed (%d): recording an event instead",
		          (unsigned long long)key, (int)r);
		return -EIO;
	}
}

static bool fence_capturing(void *ctx, emm_stream_t key)
{
	(void)ctx;
	return emm_state_capture_forbids(key);
}

void emm_fence_ops_init(struct emm_fence_pool *pool, struct emm_fence_ops *ops)
{
	ops->ctx = pool;
	ops->record = fence_record;
	ops->query = fence_query;
	ops->stream_wait = fence_stream_wait;
	ops->synchronize = fence_synchronize;
	ops->release = fence_release;
	ops->device_synchronize = fence_device_synchronize;
	ops->capturing = fence_capturing;
	ops->stream_idle = fence_stream_idle;
}
