/* SPDX-License-Identifier: MIT */
/*
 * process/capture.c - the registry of active stream captures (stream, mode,
 * thread, context) that the fence ops and the stream-ordered shims consult:
 * may an event be recorded or queried now, must a stream-ordered call go to
 * the driver. Each capture owns a quarantine set (quarantine.c, which
 * explains why and how): at its end the set passes to the graph it made.
 *
 * A capture is recorded before the driver's begin call (and forgotten if
 * that fails), so that no fence op of libemm's starts inside it unseen: the
 * event records and queries of the fence ops run inside a gate
 * (st_capture_gate_enter/leave, fence_cuda.c) that checks the registry, and
 * the begin waits for the records and queries that passed the gate before
 * the capture was recorded (two phases, so it never waits for later ones;
 * bounded by GATE_WAIT_MS; each thread counts its own in its guard slot,
 * guard.c, and the begin adds them up). Host waits (cuEventSynchronize,
 * cuCtxSynchronize) check the registry but are not waited for: they may
 * wait for work that waits for the capturing thread.
 *
 * Backend calls (segments.c) run with the calling thread in relaxed capture
 * mode (st_capture_relax): a segment allocated during a global capture, on
 * the capturing thread or beside it, is then neither refused nor does it
 * invalidate the capture - what PyTorch does around its own cudaMalloc
 * during a capture (the CUDA documentation of
 * cuThreadExchangeStreamCaptureMode allows it). Always, not only while a
 * capture is recorded: a check would race with a begin on another thread,
 * and the switch costs two thread-local driver calls beside a segment's.
 *
 * Locking: st_capture_lock, shared with quarantine.c, over captures, sets,
 * blocks and graph objects; a leaf. Heap and driver calls are made without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "common/compiler.h"
#include "common/log.h"
#include "process/process.h"
#include "process/process_internal.h"

struct emm_capture {
	struct emm_capture *next;
	emm_stream_t key;
	CUstreamCaptureMode mode;
	pthread_t thread;
	CUcontext ctx;
	struct st_qset *qs; /* NULL without memory: its frees are leaked instead */
};

pthread_mutex_t st_capture_lock = PTHREAD_MUTEX_INITIALIZER;
atomic_uint st_capture_count;
static struct emm_capture *captures;
static unsigned capture_unknown; /* captures without a record (no memory): be conservative */

bool st_captures_listed_locked(void)
{
	return captures != NULL;
}

bool st_captures_active_locked(void)
{
	return captures || capture_unknown;
}

bool st_capture_by_this_thread_locked(void)
{
	if (capture_unknown)
		return true;
	for (struct emm_capture *c = captures; c; c = c->next)
		if (pthread_equal(c->thread, pthread_self()))
			return true;
	return false;
}

void st_capture_each_set_locked(void (*fn)(struct st_qset *qs, void *arg), void *arg)
{
	for (struct emm_capture *c = captures; c; c = c->next)
		fn(c->qs, arg);
}

/* A capture recorded without memory for its record (see capture_unknown). */
static struct emm_capture unknown_capture;

/* --- the gate of the fence ops --------------------------------------------- */

#define GATE_WAIT_MS 2000u

static atomic_uint gate_phase;
/* A thread's ops in flight are counted in its guard slot (guard.c: no
 * cache line shared between threads); here only those of a thread that
 * could not get a slot (no memory). */
static atomic_uint gate_inflight[2];
static pthread_mutex_t gate_drain_lock = PTHREAD_MUTEX_INITIALIZER;

static atomic_uint *gate_counter(unsigned p, bool make)
{
	atomic_uint *c = st_guard_gate_counter(p, make);

	return c ? c : &gate_inflight[p];
}

static bool captures_forbid(emm_stream_t key, bool any_mode);

/* Enter the gate for an op on `key`, refused when a capture forbids it:
 * any_mode, as emm_state_capture_forbids says (records, queries); else only
 * a capture of `key` itself (cuStreamWaitEvent: not one of the calls a
 * global or thread-local capture forbids elsewhere, but on a capturing
 * stream it would join an event from outside the capture). */
static bool gate_enter(emm_stream_t key, bool any_mode, unsigned *ret_phase)
{
	unsigned p = atomic_load(&gate_phase) & 1u;
	atomic_uint *c = gate_counter(p, true);

	/* Sequentially consistent with the begin's record-then-drain: either
	 * the begin sees this op in flight and waits for it, or this op sees
	 * the capture recorded. */
	atomic_fetch_add(c, 1);
	if (atomic_load(&st_capture_count) != 0 && captures_forbid(key, any_mode)) {
		atomic_fetch_sub(c, 1);
		return false;
	}
	*ret_phase = p;
	return true;
}

bool st_capture_gate_enter(emm_stream_t key, unsigned *ret_phase)
{
	return gate_enter(key, true, ret_phase);
}

bool st_capture_gate_enter_wait(emm_stream_t key, unsigned *ret_phase)
{
	return gate_enter(key, false, ret_phase);
}

void st_capture_gate_leave(unsigned phase)
{
	atomic_fetch_sub_explicit(gate_counter(phase, false), 1, memory_order_release);
}

bool st_capture_gate_check(emm_stream_t key)
{
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load(&st_capture_count) == 0 || !emm_state_capture_forbids(key);
}

/* The capture is recorded: wait for the fence ops that passed the gate
 * before (the phase flips, so later ones are not waited for). */
static void gate_drain(void)
{
	struct timespec pause = {0, 50000};
	unsigned p, waited_us = 0;

	pthread_mutex_lock(&gate_drain_lock);
	p = atomic_fetch_add(&gate_phase, 1) & 1u;
	while (atomic_load(&gate_inflight[p]) + st_guard_gate_sum(p) != 0) {
		if (waited_us >= GATE_WAIT_MS * 1000u) {
			emm_debug("capture begin: a fence op of another thread still runs after %u ms; "
			          "the capture begins beside it",
			          GATE_WAIT_MS);
			break;
		}
		nanosleep(&pause, NULL);
		waited_us += 50;
	}
	pthread_mutex_unlock(&gate_drain_lock);
}

/* --- relaxed mode around backend calls -------------------------------------- */

int st_capture_relax(void)
{
	CUresult (*exchange)(CUstreamCaptureMode *) = st_real_extra()->cuThreadExchangeStreamCaptureMode;
	CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;

	if (!exchange || exchange(&mode) != CUDA_SUCCESS)
		return -1;
	return (int)mode;
}

void st_capture_unrelax(int previous)
{
	CUstreamCaptureMode mode = (CUstreamCaptureMode)previous;

	if (previous >= 0 && mode != CU_STREAM_CAPTURE_MODE_RELAXED)
		(void)st_real_extra()->cuThreadExchangeStreamCaptureMode(&mode);
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

struct emm_capture *emm_state_capture_begin(CUstream stream, bool per_thread_default, CUstreamCaptureMode mode)
{
	emm_stream_t key = emm_state_stream_key(stream, per_thread_default);
	struct emm_capture *c = calloc(1, sizeof(*c));
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
	gate_drain();
	return c ? c : &unknown_capture;
}

void emm_state_capture_begun(struct emm_capture *c, bool ok)
{
	struct st_release rel = {0};
	bool found = false;

	if (!c || ok)
		return;
	/* The driver refused to begin: forget the record. Frees made
	 * meanwhile went into its set and come back now. */
	st_lock(&st_capture_lock);
	if (c == &unknown_capture) {
		if (capture_unknown) {
			capture_unknown--;
			found = true;
		}
	} else {
		for (struct emm_capture **link = &captures; *link; link = &(*link)->next) {
			if (*link == c) {
				*link = c->next;
				found = true;
				if (c->qs)
					st_qset_put_locked(c->qs, &rel);
				break;
			}
		}
	}
	if (found)
		atomic_fetch_sub(&st_capture_count, 1);
	st_unlock(&st_capture_lock);
	if (found && c != &unknown_capture)
		free(c);
	st_release_run(&rel);
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
	struct emm_capture *c = NULL;
	bool found = false;

	st_lock(&st_capture_lock);
	for (struct emm_capture **link = &captures; *link; link = &(*link)->next) {
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
	struct emm_capture *c = NULL;

	if (!EMM_STREAM_IS_HANDLE(key) || atomic_load_explicit(&st_capture_count, memory_order_acquire) == 0)
		return;
	st_lock(&st_capture_lock);
	for (struct emm_capture **link = &captures; *link; link = &(*link)->next) {
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

/* Does an active capture forbid an op on `key`? any_mode: a capture of
 * key, any global-mode capture, or a thread-local one of this thread; else
 * a capture of key only. While any capture is active, unknown capturing
 * streams and keys that are not stream handles always forbid. */
static bool captures_forbid(emm_stream_t key, bool any_mode)
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
	for (struct emm_capture *c = captures; c && !forbid; c = c->next) {
		if (c->key == key ||
		    (any_mode && (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL ||
		                  (c->mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL && pthread_equal(c->thread, self)))))
			forbid = true;
	}
	st_unlock(&st_capture_lock);
	return forbid;
}

bool emm_state_capture_forbids(emm_stream_t key)
{
	return captures_forbid(key, true);
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
	for (struct emm_capture *c = captures; c; c = c->next)
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
	for (struct emm_capture **link = &captures; *link;) {
		struct emm_capture *c = *link;
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
	/* Fence ops in flight on the parent's other threads never leave. */
	pthread_mutex_init(&gate_drain_lock, NULL);
	atomic_store(&gate_inflight[0], 0);
	atomic_store(&gate_inflight[1], 0);
	st_quarantine_fork_child();
}
