/* SPDX-License-Identifier: MIT */
/*
 * process/capture.c - the registry of active stream captures (stream, mode,
 * thread, context) that the fence ops and the stream-ordered shims consult:
 * may an event be recorded or queried now, must a stream-ordered call go to
 * the driver. Each capture owns a quarantine set (quarantine.c, which
 * explains why and how): at its end the set passes to the graph it made.
 *
 * Locking: st_capture_lock, shared with quarantine.c, over captures, sets,
 * blocks and graph objects; a leaf. Heap and driver calls are made without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/compiler.h"
#include "common/log.h"
#include "process/process.h"
#include "process/process_internal.h"

struct capture {
	struct capture *next;
	emm_stream_t key;
	CUstreamCaptureMode mode;
	pthread_t thread;
	CUcontext ctx;
	struct st_qset *qs; /* NULL without memory: its frees are leaked instead */
};

pthread_mutex_t st_capture_lock = PTHREAD_MUTEX_INITIALIZER;
atomic_uint st_capture_count;
static struct capture *captures;
static unsigned capture_unknown; /* captures without a record (no memory): be conservative */

bool st_captures_listed_locked(void)
{
	return captures != NULL;
}

bool st_captures_active_locked(void)
{
	return captures || capture_unknown;
}

void st_capture_each_set_locked(void (*fn)(struct st_qset *qs, void *arg), void *arg)
{
	for (struct capture *c = captures; c; c = c->next)
		fn(c->qs, arg);
}

/* --- the capture registry ------------------------------------------------ */

static CUcontext capture_context(emm_stream_t key)
{
	const struct emm_real_driver_table *real = emm_state_real();
	CUcontext ctx = NULL;

	if (EMM_STREAM_IS_HANDLE(key)) {
		ctx = emm_state_stream_context(key);
		if (ctx)
			return ctx;
	}
	if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
		return NULL;
	return ctx;
}

void emm_state_capture_begin(CUstream stream, bool per_thread_default, CUstreamCaptureMode mode)
{
	emm_stream_t key = emm_state_stream_key(stream, per_thread_default);
	struct capture *c = calloc(1, sizeof(*c));
	CUcontext ctx = capture_context(key);

	if (c) {
		c->key = key;
		c->mode = mode;
		c->thread = pthread_self();
		c->ctx = ctx;
	}
	st_lock(&st_capture_lock);
	if (c) {
		c->qs = st_qset_new_locked();
		c->next = captures;
		captures = c;
	} else {
		capture_unknown++;
	}
	atomic_fetch_add(&st_capture_count, 1);
	st_unlock(&st_capture_lock);
}

static void flush_one(emm_heap_t *heap, int device, void *arg)
{
	(void)device;
	(void)arg;
	(void)emm_heap_flush(heap);
}

void emm_state_capture_end(CUstream stream, bool per_thread_default, CUgraph graph)
{
	emm_stream_t key = emm_state_stream_key(stream, per_thread_default);
	struct st_release rel = {0};
	struct capture *c = NULL;
	bool found = false;

	st_lock(&st_capture_lock);
	for (struct capture **link = &captures; *link; link = &(*link)->next) {
		if ((*link)->key == key) {
			c = *link;
			*link = c->next;
			found = true;
			break;
		}
	}
	if (!found && capture_unknown) {
		capture_unknown--;
		found = true;
	}
	if (found)
		atomic_fetch_sub(&st_capture_count, 1);
	if (c && c->qs)
		st_qset_capture_ended_locked(c->qs, graph, c->ctx, &rel);
	st_unlock(&st_capture_lock);
	free(c);
	st_release_run(&rel);
	/* Frees kept pending during the capture can be fenced now. */
	if (found && !emm_state_exiting())
		emm_state_for_each_heap(flush_one, NULL, true);
}

void emm_capture_stream_destroyed(CUstream stream)
{
	emm_stream_t key = emm_state_stream_key(stream, false);
	struct st_release rel = {0};
	struct capture *c = NULL;

	if (!EMM_STREAM_IS_HANDLE(key) || atomic_load_explicit(&st_capture_count, memory_order_acquire) == 0)
		return;
	st_lock(&st_capture_lock);
	for (struct capture **link = &captures; *link; link = &(*link)->next) {
		if ((*link)->key == key) {
			c = *link;
			*link = c->next;
			atomic_fetch_sub(&st_capture_count, 1);
			break;
		}
	}
	/* Its capture can no longer make a graph. */
	if (c && c->qs)
		st_qset_put_locked(c->qs, &rel);
	st_unlock(&st_capture_lock);
	free(c);
	st_release_run(&rel);
}

bool emm_state_capture_forbids(emm_stream_t key)
{
	pthread_t self;
	bool forbid = false;

	if (EMM_LIKELY(atomic_load_explicit(&st_capture_count, memory_order_acquire) == 0))
		return false;
	/* Anything but a real stream (the legacy stream, a per-thread stream,
	 * "any query at all") may implicitly join a capture of a blocking
	 * stream, and a global-mode capture forbids queries process-wide:
	 * be conservative while any capture is active. */
	if (!EMM_STREAM_IS_HANDLE(key))
		return true;
	self = pthread_self();
	st_lock(&st_capture_lock);
	forbid = capture_unknown > 0;
	for (struct capture *c = captures; c && !forbid; c = c->next) {
		if (c->key == key || c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
		    (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(c->thread, self)))
			forbid = true;
	}
	st_unlock(&st_capture_lock);
	return forbid;
}

bool emm_state_stream_capturing(CUstream stream, bool per_thread_default)
{
	const struct emm_real_driver_table *real;
	emm_stream_t key;
	CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
	CUstream handle = stream;
	bool tracked = false;

	if (EMM_LIKELY(atomic_load_explicit(&st_capture_count, memory_order_acquire) == 0))
		return false;
	key = emm_state_stream_key(stream, per_thread_default);
	st_lock(&st_capture_lock);
	for (struct capture *c = captures; c; c = c->next)
		if (c->key == key)
			tracked = true;
	st_unlock(&st_capture_lock);
	if (tracked)
		return true;
	/* A stream can join a capture through an event wait: ask the driver. */
	real = emm_state_real();
	if (per_thread_default && stream == NULL)
		handle = CU_STREAM_PER_THREAD;
	if (!real->cuStreamIsCapturing || real->cuStreamIsCapturing(handle, &status) != CUDA_SUCCESS)
		return false;
	return status != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* --- context teardown, fork ------------------------------------------------- */

void emm_capture_context_dropped(CUcontext ctx, emm_heap_t *const *heaps, size_t nheaps)
{
	struct st_release rel = {0};

	st_lock(&st_capture_lock);
	st_quarantine_context_dropped_locked(ctx, heaps, nheaps, &rel);
	/* Its captures went too. */
	for (struct capture **link = &captures; *link;) {
		struct capture *c = *link;
		if (c->ctx == ctx) {
			*link = c->next;
			atomic_fetch_sub(&st_capture_count, 1);
			if (c->qs)
				st_qset_put_locked(c->qs, &rel);
			free(c);
		} else {
			link = &c->next;
		}
	}
	st_unlock(&st_capture_lock);
	/* Blocks of other contexts freed during this context's captures. */
	st_release_run(&rel);
}

void emm_capture_fork_child(void)
{
	/* The parent's captures and graphs are not the child's (leaked: the
	 * lock may have been held by a thread that does not exist here). */
	pthread_mutex_init(&st_capture_lock, NULL);
	captures = NULL;
	capture_unknown = 0;
	atomic_store(&st_capture_count, 0);
	st_quarantine_fork_child();
}
