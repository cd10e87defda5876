/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_stream.c - streams, events, stream capture, graphs.
 *
 * The fake runs no kernels: the only work a stream holds is its recorded
 * events. Each stream has a timeline of sequence numbers; an event completes
 * when its countdown of queries (fakecuda_set_event_delay) has run out and
 * everything its stream waited for has completed, or when something
 * synchronizes with it. See fakecuda.h and README.md for the rules.
 */
#include "fake.h"

#include <stdlib.h>
#include <string.h>

/* --- timelines --- */

static void timelines_init_locked(void)
{
	if (!g_fake.timelines.next)
		g_fake.timelines.next = g_fake.timelines.prev = &g_fake.timelines;
}

static struct fake_timeline *tl_new_locked(struct fake_ctx *ctx)
{
	timelines_init_locked();
	struct fake_timeline *tl = calloc(1, sizeof(*tl));
	if (!tl)
		return NULL;
	tl->ctx = ctx;
	tl->device = ctx->device;
	tl->refs = 1;
	tl->next = g_fake.timelines.next;
	tl->prev = &g_fake.timelines;
	tl->next->prev = tl;
	g_fake.timelines.next = tl;
	return tl;
}

static void tl_free_locked(struct fake_timeline *tl);

static void tl_unref_locked(struct fake_timeline *tl)
{
	if (tl && --tl->refs == 0)
		tl_free_locked(tl);
}

static void tl_free_locked(struct fake_timeline *tl)
{
	while (tl->waits) {
		struct fake_wait *w = tl->waits;
		tl->waits = w->next;
		tl_unref_locked(w->dep);
		free(w);
	}
	tl->prev->next = tl->next;
	tl->next->prev = tl->prev;
	free(tl);
}

static bool tl_done(const struct fake_timeline *tl, uint64_t seq)
{
	return tl->completed_seq >= seq;
}

/* Whether everything work `seq` on tl waits for has completed. */
static bool tl_deps_done(const struct fake_timeline *tl, uint64_t seq)
{
	for (const struct fake_wait *w = tl->waits; w; w = w->next)
		if (w->at_seq <= seq && !tl_done(w->dep, w->dep_seq))
			return false;
	return true;
}

/* Whether an event recorded on tl before `seq` is still pending: stream
 * order, so work `seq` cannot have completed (whatever its own delay). */
static bool tl_pending_before(const struct fake_timeline *tl, uint64_t seq)
{
	for (const struct fake_event *e = tl->pending; e; e = e->pnext)
		if (e->seq < seq && !tl_done(tl, e->seq))
			return true;
	return false;
}

static void pending_unlink(struct fake_event *e)
{
	if (!e->tl)
		return;
	if (e->pprev)
		e->pprev->pnext = e->pnext;
	else if (e->tl->pending == e)
		e->tl->pending = e->pnext;
	if (e->pnext)
		e->pnext->pprev = e->pprev;
	e->pprev = e->pnext = NULL;
}

/* Completes tl up to seq, and first everything that work waits for. Each
 * wait is removed before it is followed, so cycles end. */
void fake_timeline_complete_locked(struct fake_timeline *tl, uint64_t seq)
{
	if (seq > tl->last_seq)
		seq = tl->last_seq;
	if (tl_done(tl, seq))
		return;
	for (;;) {
		struct fake_wait **pw = &tl->waits;
		while (*pw && (*pw)->at_seq > seq)
			pw = &(*pw)->next;
		struct fake_wait *w = *pw;
		if (!w)
			break;
		*pw = w->next;
		fake_timeline_complete_locked(w->dep, w->dep_seq);
		tl_unref_locked(w->dep);
		free(w);
	}
	if (tl->completed_seq < seq)
		tl->completed_seq = seq;
	for (struct fake_event *e = tl->pending, *n; e; e = n) {
		n = e->pnext;
		if (e->seq <= tl->completed_seq)
			pending_unlink(e);
	}
}

/* Work on tl from at_seq on waits for dep up to dep_seq. */
static void tl_add_wait_locked(struct fake_timeline *tl, uint64_t at_seq, struct fake_timeline *dep,
			       uint64_t dep_seq)
{
	if (tl_done(dep, dep_seq) || dep == tl)
		return;
	struct fake_wait *w = malloc(sizeof(*w));
	if (!w) {
		/* Out of host memory: wait now instead of later. */
		fake_timeline_complete_locked(dep, dep_seq);
		return;
	}
	w->at_seq = at_seq;
	w->dep = dep;
	w->dep_seq = dep_seq;
	dep->refs++;
	w->next = tl->waits;
	tl->waits = w;
}

static void tl_complete_all_locked(struct fake_timeline *tl)
{
	fake_timeline_complete_locked(tl, tl->last_seq);
}

void fake_complete_all_locked(void)
{
	timelines_init_locked();
	for (struct fake_timeline *tl = g_fake.timelines.next; tl != &g_fake.timelines; tl = tl->next)
		tl_complete_all_locked(tl);
}

void fake_device_sync_locked(int dev)
{
	timelines_init_locked();
	g_fake.stats.device_syncs++;
	for (struct fake_timeline *tl = g_fake.timelines.next; tl != &g_fake.timelines; tl = tl->next)
		if (tl->device == dev)
			tl_complete_all_locked(tl);
}

uint64_t fake_pending_events_locked(void)
{
	timelines_init_locked();
	uint64_t n = 0;
	for (struct fake_timeline *tl = g_fake.timelines.next; tl != &g_fake.timelines; tl = tl->next)
		for (struct fake_event *e = tl->pending; e; e = e->pnext)
			n += !tl_done(tl, e->seq);
	return n;
}

/* --- stream capture --- */

static bool stream_blocking(const struct fake_stream *s)
{
	return s->kind == STREAM_PER_THREAD ||
	       (s->kind == STREAM_USER && !(s->flags & CU_STREAM_NON_BLOCKING));
}

static void capture_invalidate_locked(struct fake_capture *c)
{
	if (!c->invalidated) {
		c->invalidated = true;
		g_fake.stats.captures_invalidated++;
	}
}

static CUresult capture_refuse_locked(CUresult r)
{
	g_fake.stats.capture_violations++;
	return r;
}

/* Using the legacy stream while a blocking stream of the same context is
 * capturing would make it depend on the capture: 906, and the capture is
 * invalidated unless the call only asks about it. */
static CUresult legacy_implicit_locked(struct fake_ctx *ctx, bool invalidate)
{
	bool hit = false;
	for (struct fake_stream *s = ctx->streams; s; s = s->next) {
		if (s->capture && stream_blocking(s)) {
			hit = true;
			if (invalidate)
				capture_invalidate_locked(s->capture);
		}
	}
	return hit ? capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) : CUDA_SUCCESS;
}

/* The "potentially unsafe API call" rule of cuThreadExchangeStreamCaptureMode:
 * in GLOBAL thread mode, refused while this thread has a non-relaxed capture
 * or any other thread has a GLOBAL one; in THREAD_LOCAL mode only the first;
 * in RELAXED mode never. The offending captures are invalidated. */
CUresult fake_capture_check_unsafe_locked(void)
{
	CUstreamCaptureMode mode = *fake_thread_capture_mode();
	if (!g_fake.captures)
		return CUDA_SUCCESS;
	pthread_t self = pthread_self();
	bool bad = false;
	for (struct fake_capture *c = g_fake.captures; c; c = c->next) {
		bool own = pthread_equal(c->thread, self);
		/* What GLOBAL thread mode would refuse; RELAXED lets it pass. */
		bool global_bad = (own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
		                  (!own && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
		if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) {
			bad |= global_bad;
			continue;
		}
		if ((own && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
		    (!own && mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
			capture_invalidate_locked(c);
			bad = true;
		}
	}
	if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) {
		if (bad)
			g_fake.stats.relaxed_unsafe_calls++;
		return CUDA_SUCCESS;
	}
	return bad ? capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED) : CUDA_SUCCESS;
}

void fake_note_fence_call_locked(void)
{
	for (struct fake_capture *c = g_fake.captures; c; c = c->next) {
		if (c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
			g_fake.stats.fence_calls_in_global_capture++;
			return;
		}
	}
}

/* Waiting for or querying s: refused (900) if s is capturing, 906 for the
 * legacy stream while a blocking stream captures. */
CUresult fake_capture_check_stream_use_locked(struct fake_stream *s, bool invalidate)
{
	if (s->capture) {
		if (invalidate)
			capture_invalidate_locked(s->capture);
		return capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
	}
	if (s->kind == STREAM_LEGACY)
		return legacy_implicit_locked(s->ctx, invalidate);
	return CUDA_SUCCESS;
}

CUresult fake_stream_op_locked(struct fake_stream *s, bool *captured)
{
	*captured = false;
	if (s->capture) {
		if (s->capture->invalidated)
			return capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
		*captured = true;
		return CUDA_SUCCESS;
	}
	if (s->kind == STREAM_LEGACY) {
		fake_note_fence_call_locked();
		return legacy_implicit_locked(s->ctx, true);
	}
	return CUDA_SUCCESS;
}

struct fake_graph *fake_stream_capture_graph(struct fake_stream *s)
{
	return s->capture ? s->capture->graph : NULL;
}

static struct fake_graph *graph_new_locked(void)
{
	struct fake_graph *g = calloc(1, sizeof(*g));
	if (!g)
		return NULL;
	g->id = ++g_fake.next_id;
	if (!fake_ptrset_add(&g_fake.graph_set, g)) {
		free(g);
		return NULL;
	}
	return g;
}

static void graph_free_locked(struct fake_graph *g)
{
	fake_ptrset_del(&g_fake.graph_set, g);
	while (g->frees) {
		struct fake_deferred_free *f = g->frees;
		g->frees = f->next;
		free(f);
	}
	free(g);
}

/* Ends capture c: its streams stop capturing, events recorded in it stay
 * "captured". Frees c; returns its graph (still to be freed by the caller
 * if unwanted). */
static struct fake_graph *capture_end_locked(struct fake_capture *c)
{
	for (struct fake_capture **pc = &g_fake.captures; *pc; pc = &(*pc)->next) {
		if (*pc == c) {
			*pc = c->next;
			break;
		}
	}
	for (struct fake_ctx *ctx = g_fake.contexts; ctx; ctx = ctx->next) {
		for (struct fake_stream *s = ctx->streams; s; s = s->next)
			if (s->capture == c)
				s->capture = NULL;
		for (struct fake_event *e = ctx->events; e; e = e->next)
			if (e->capture == c)
				e->capture = NULL;
	}
	struct fake_graph *g = c->graph;
	free(c);
	return g;
}

/* --- streams --- */

struct fake_stream *fake_stream_new_locked(struct fake_ctx *ctx, enum fake_stream_kind kind, unsigned flags,
					   int priority)
{
	struct fake_stream *s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->tl = tl_new_locked(ctx);
	if (!s->tl) {
		free(s);
		return NULL;
	}
	s->ctx = ctx;
	s->kind = kind;
	s->flags = flags;
	s->priority = priority;
	s->id = ++g_fake.next_id;
	if (kind == STREAM_USER && !fake_ptrset_add(&g_fake.stream_set, s)) {
		tl_unref_locked(s->tl);
		free(s);
		return NULL;
	}
	s->next = ctx->streams;
	if (s->next)
		s->next->prev = s;
	ctx->streams = s;
	return s;
}

static void stream_free_locked(struct fake_stream *s)
{
	struct fake_ctx *ctx = s->ctx;
	if (s->capture && s->capture->origin == s)
		graph_free_locked(capture_end_locked(s->capture));
	if (s->prev)
		s->prev->next = s->next;
	else
		ctx->streams = s->next;
	if (s->next)
		s->next->prev = s->prev;
	fake_ptrset_del(&g_fake.stream_set, s);
	tl_unref_locked(s->tl);
	free(s);
}

CUresult fake_stream_resolve_locked(CUstream h, bool ptds, struct fake_stream **out)
{
	CUresult r;
	if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
		struct fake_ctx *c;
		r = fake_current_ctx_locked(&c);
		if (r != CUDA_SUCCESS)
			return r;
		bool per_thread = h == CU_STREAM_PER_THREAD || (h == NULL && ptds);
		*out = per_thread ? fake_per_thread_stream_locked(c) : c->legacy;
		return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
	}
	r = fake_check_init_locked();
	if (r != CUDA_SUCCESS)
		return r;
	if (!fake_ptrset_has(&g_fake.stream_set, h))
		return CUDA_ERROR_INVALID_HANDLE;
	*out = (struct fake_stream *)h;
	return CUDA_SUCCESS;
}

static void event_free_locked(struct fake_event *e);

void fake_ctx_drop_streams_locked(struct fake_ctx *ctx)
{
	/* Destroying a context waits for its work. */
	timelines_init_locked();
	for (struct fake_timeline *tl = g_fake.timelines.next; tl != &g_fake.timelines; tl = tl->next)
		if (tl->ctx == ctx)
			tl_complete_all_locked(tl);
	for (struct fake_capture *c = g_fake.captures, *n; c; c = n) {
		n = c->next;
		if (c->ctx == ctx)
			graph_free_locked(capture_end_locked(c));
	}
	while (ctx->events)
		event_free_locked(ctx->events);
	while (ctx->streams)
		stream_free_locked(ctx->streams);
}

void fake_streams_reset_locked(void)
{
	while (g_fake.captures)
		graph_free_locked(capture_end_locked(g_fake.captures));
	for (struct fake_ctx *c = g_fake.contexts; c; c = c->next) {
		while (c->events)
			event_free_locked(c->events);
		while (c->streams)
			stream_free_locked(c->streams);
	}
	/* Timelines still referenced by nothing live: waits of freed ones. */
	timelines_init_locked();
	while (g_fake.timelines.next != &g_fake.timelines) {
		struct fake_timeline *tl = g_fake.timelines.next;
		while (tl->waits) {
			struct fake_wait *w = tl->waits;
			tl->waits = w->next;
			free(w);
		}
		tl->prev->next = tl->next;
		tl->next->prev = tl->prev;
		free(tl);
	}
	void *x;
	while ((x = fake_ptrset_any(&g_fake.graph_set)))
		graph_free_locked(x);
	while ((x = fake_ptrset_any(&g_fake.exec_set))) {
		fake_ptrset_del(&g_fake.exec_set, x);
		free(x);
	}
	fake_ptrset_clear(&g_fake.graph_set);
	fake_ptrset_clear(&g_fake.exec_set);
	fake_ptrset_clear(&g_fake.stream_set);
	fake_ptrset_clear(&g_fake.event_set);
}

static CUresult stream_create(CUstream *phStream, unsigned int flags, int priority)
{
	if (flags & ~(unsigned)CU_STREAM_NON_BLOCKING)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	struct fake_ctx *c;
	CUresult r = fake_current_ctx_locked(&c);
	if (r == CUDA_SUCCESS && !phStream)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		if (priority > 0)
			priority = 0;
		if (priority < -5)
			priority = -5;
		struct fake_stream *s = fake_stream_new_locked(c, STREAM_USER, flags, priority);
		if (s)
			*phStream = (CUstream)s;
		else
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	FAKE_ENTER(cuStreamCreate);
	return stream_create(phStream, Flags, 0);
}

FAKE_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	FAKE_ENTER(cuStreamCreateWithPriority);
	return stream_create(phStream, flags, priority);
}

static CUresult stream_destroy(CUstream h)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !fake_ptrset_has(&g_fake.stream_set, h))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS)
		stream_free_locked((struct fake_stream *)h);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamDestroy(CUstream hStream)
{
	FAKE_ENTER(cuStreamDestroy);
	return stream_destroy(hStream);
}

FAKE_API CUresult cuStreamDestroy_v2(CUstream hStream)
{
	FAKE_ENTER(cuStreamDestroy_v2);
	return stream_destroy(hStream);
}

/* Resolves a stream under the lock for a simple query of it. */
#define STREAM_QUERY(h, ptds, s, out_null, body)                         \
	do {                                                             \
		fake_lock();                                             \
		struct fake_stream *s = NULL;                            \
		CUresult r_ = fake_stream_resolve_locked(h, ptds, &s);   \
		if (r_ == CUDA_SUCCESS && (out_null))                    \
			r_ = CUDA_ERROR_INVALID_VALUE;                   \
		if (r_ == CUDA_SUCCESS) {                                \
			body;                                            \
		}                                                        \
		fake_unlock();                                           \
		return r_;                                               \
	} while (0)

FAKE_API CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
	FAKE_ENTER(cuStreamGetFlags);
	STREAM_QUERY(hStream, false, s, !flags, *flags = s->flags);
}

FAKE_API CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags)
{
	FAKE_ENTER(cuStreamGetFlags_ptsz);
	STREAM_QUERY(hStream, true, s, !flags, *flags = s->flags);
}

FAKE_API CUresult cuStreamGetPriority(CUstream hStream, int *priority)
{
	FAKE_ENTER(cuStreamGetPriority);
	STREAM_QUERY(hStream, false, s, !priority, *priority = s->priority);
}

FAKE_API CUresult cuStreamGetPriority_ptsz(CUstream hStream, int *priority)
{
	FAKE_ENTER(cuStreamGetPriority_ptsz);
	STREAM_QUERY(hStream, true, s, !priority, *priority = s->priority);
}

FAKE_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
	FAKE_ENTER(cuStreamGetCtx);
	STREAM_QUERY(hStream, false, s, !pctx, *pctx = (CUcontext)s->ctx);
}

FAKE_API CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
	FAKE_ENTER(cuStreamGetCtx_ptsz);
	STREAM_QUERY(hStream, true, s, !pctx, *pctx = (CUcontext)s->ctx);
}

FAKE_API CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
	FAKE_ENTER(cuStreamGetCtx_v2);
	STREAM_QUERY(hStream, false, s, !pCtx || !pGreenCtx,
		     (*pCtx = (CUcontext)s->ctx, *pGreenCtx = NULL));
}

FAKE_API CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
	FAKE_ENTER(cuStreamGetCtx_v2_ptsz);
	STREAM_QUERY(hStream, true, s, !pCtx || !pGreenCtx,
		     (*pCtx = (CUcontext)s->ctx, *pGreenCtx = NULL));
}

FAKE_API CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId)
{
	FAKE_ENTER(cuStreamGetId);
	STREAM_QUERY(hStream, false, s, !streamId, *streamId = s->id);
}

FAKE_API CUresult cuStreamGetId_ptsz(CUstream hStream, unsigned long long *streamId)
{
	FAKE_ENTER(cuStreamGetId_ptsz);
	STREAM_QUERY(hStream, true, s, !streamId, *streamId = s->id);
}

/* cuStreamSynchronize: completes the stream's work (the legacy stream's
 * also waits for every blocking stream of its context). */
static CUresult stream_sync(CUstream h, bool ptds)
{
	fake_lock();
	struct fake_stream *s;
	CUresult r = fake_stream_resolve_locked(h, ptds, &s);
	if (r == CUDA_SUCCESS) {
		g_fake.stats.stream_syncs++;
		fake_note_fence_call_locked();
		r = fake_capture_check_stream_use_locked(s, true);
	}
	if (r == CUDA_SUCCESS)
		r = fake_capture_check_unsafe_locked();
	if (r == CUDA_SUCCESS) {
		if (s->kind == STREAM_LEGACY)
			for (struct fake_stream *t = s->ctx->streams; t; t = t->next)
				if (stream_blocking(t))
					tl_complete_all_locked(t->tl);
		tl_complete_all_locked(s->tl);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamSynchronize(CUstream hStream)
{
	FAKE_ENTER(cuStreamSynchronize);
	return stream_sync(hStream, false);
}

FAKE_API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	FAKE_ENTER(cuStreamSynchronize_ptsz);
	return stream_sync(hStream, true);
}

/* --- events --- */

static struct fake_event *event_lookup_locked(CUevent h)
{
	return fake_ptrset_has(&g_fake.event_set, h) ? (struct fake_event *)h : NULL;
}

/* Drops whatever the event last recorded. */
static void event_clear_locked(struct fake_event *e)
{
	pending_unlink(e);
	tl_unref_locked(e->tl);
	e->tl = NULL;
	e->capture = NULL;
	e->state = EVENT_NEVER;
}

static void event_free_locked(struct fake_event *e)
{
	event_clear_locked(e);
	struct fake_ctx *ctx = e->ctx;
	if (e->prev)
		e->prev->next = e->next;
	else
		ctx->events = e->next;
	if (e->next)
		e->next->prev = e->prev;
	fake_ptrset_del(&g_fake.event_set, e);
	free(e);
}

/* One poll of a recorded event: true once complete. */
static bool event_poll_locked(struct fake_event *e)
{
	struct fake_timeline *tl = e->tl;
	if (tl_done(tl, e->seq))
		return true;
	if (e->remaining > 0) {
		e->remaining--;
		return false;
	}
	if (!tl_deps_done(tl, e->seq) || tl_pending_before(tl, e->seq))
		return false;
	fake_timeline_complete_locked(tl, e->seq);
	return true;
}

/* The implicit barrier between the legacy stream and blocking streams: work
 * recorded on the legacy stream waits for all earlier work on the context's
 * blocking streams, and work on a blocking stream waits for earlier legacy
 * work. Non-blocking streams take no part. */
static void legacy_barrier_locked(struct fake_stream *s, uint64_t seq)
{
	struct fake_ctx *ctx = s->ctx;
	if (s->kind == STREAM_LEGACY) {
		for (struct fake_stream *t = ctx->streams; t; t = t->next)
			if (t != s && stream_blocking(t))
				tl_add_wait_locked(s->tl, seq, t->tl, t->tl->last_seq);
	} else if (stream_blocking(s) && ctx->legacy) {
		tl_add_wait_locked(s->tl, seq, ctx->legacy->tl, ctx->legacy->tl->last_seq);
	}
}

static void event_record_locked(struct fake_event *e, struct fake_stream *s)
{
	event_clear_locked(e);
	struct fake_timeline *tl = s->tl;
	uint64_t seq = ++tl->last_seq;
	legacy_barrier_locked(s, seq);
	e->state = EVENT_RECORDED;
	e->tl = tl;
	tl->refs++;
	e->seq = seq;
	e->remaining = g_fake.event_delay;
	g_fake.stats.event_records++;
	if (e->remaining == 0 && tl_deps_done(tl, seq) && !tl_pending_before(tl, seq)) {
		fake_timeline_complete_locked(tl, seq);
		return;
	}
	e->pnext = tl->pending;
	if (e->pnext)
		e->pnext->pprev = e;
	tl->pending = e;
}

FAKE_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	FAKE_ENTER(cuEventCreate);
	const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
	fake_lock();
	struct fake_ctx *c;
	CUresult r = fake_current_ctx_locked(&c);
	if (r == CUDA_SUCCESS &&
	    (!phEvent || (Flags & ~known) ||
	     ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct fake_event *e = calloc(1, sizeof(*e));
		if (!e || !fake_ptrset_add(&g_fake.event_set, e)) {
			free(e);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			e->ctx = c;
			e->flags = Flags;
			e->next = c->events;
			if (e->next)
				e->next->prev = e;
			c->events = e;
			*phEvent = (CUevent)e;
		}
	}
	fake_unlock();
	return r;
}

static CUresult event_record(CUevent h, CUstream hs, unsigned flags, bool ptds)
{
	if (flags & ~(unsigned)CU_EVENT_RECORD_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_event *e = NULL;
	struct fake_stream *s = NULL;
	bool captured = false;
	if (r == CUDA_SUCCESS && !(e = event_lookup_locked(h)))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS)
		r = fake_stream_resolve_locked(hs, ptds, &s);
	if (r == CUDA_SUCCESS && s->ctx != e->ctx)
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS)
		r = fake_stream_op_locked(s, &captured);
	if (r == CUDA_SUCCESS && captured) {
		/* A graph node: nothing runs until the graph is launched. */
		event_clear_locked(e);
		e->state = EVENT_CAPTURED;
		e->capture = s->capture;
		g_fake.stats.event_records_captured++;
	} else if (r == CUDA_SUCCESS) {
		fake_note_fence_call_locked();
		event_record_locked(e, s);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	FAKE_ENTER(cuEventRecord);
	return event_record(hEvent, hStream, 0, false);
}

FAKE_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	FAKE_ENTER(cuEventRecord_ptsz);
	return event_record(hEvent, hStream, 0, true);
}

FAKE_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	FAKE_ENTER(cuEventRecordWithFlags);
	return event_record(hEvent, hStream, flags, false);
}

FAKE_API CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
	FAKE_ENTER(cuEventRecordWithFlags_ptsz);
	return event_record(hEvent, hStream, flags, true);
}

/* Checks shared by cuEventQuery and cuEventSynchronize. */
static CUresult event_wait_checks_locked(CUevent h, struct fake_event **out)
{
	CUresult r = fake_check_init_locked();
	if (r != CUDA_SUCCESS)
		return r;
	struct fake_event *e = event_lookup_locked(h);
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	fake_note_fence_call_locked();
	r = fake_capture_check_unsafe_locked();
	if (r != CUDA_SUCCESS)
		return r;
	if (e->state == EVENT_CAPTURED && !e->capture)
		return CUDA_ERROR_INVALID_VALUE; /* its capture has ended */
	if (e->state == EVENT_CAPTURED) {
		capture_invalidate_locked(e->capture);
		return capture_refuse_locked(CUDA_ERROR_CAPTURED_EVENT);
	}
	*out = e;
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuEventQuery(CUevent hEvent)
{
	FAKE_ENTER(cuEventQuery);
	fake_lock();
	struct fake_event *e;
	CUresult r = event_wait_checks_locked(hEvent, &e);
	if (r == CUDA_SUCCESS) {
		g_fake.stats.event_queries++;
		if (e->state == EVENT_RECORDED && !event_poll_locked(e)) {
			g_fake.stats.event_queries_not_ready++;
			r = CUDA_ERROR_NOT_READY;
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuEventSynchronize(CUevent hEvent)
{
	FAKE_ENTER(cuEventSynchronize);
	fake_lock();
	struct fake_event *e;
	CUresult r = event_wait_checks_locked(hEvent, &e);
	if (r == CUDA_SUCCESS) {
		g_fake.stats.event_syncs++;
		if (e->state == EVENT_RECORDED)
			fake_timeline_complete_locked(e->tl, e->seq);
	}
	fake_unlock();
	return r;
}

static CUresult event_destroy(CUevent h)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_event *e = NULL;
	if (r == CUDA_SUCCESS && !(e = event_lookup_locked(h)))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS)
		event_free_locked(e);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuEventDestroy(CUevent hEvent)
{
	FAKE_ENTER(cuEventDestroy);
	return event_destroy(hEvent);
}

FAKE_API CUresult cuEventDestroy_v2(CUevent hEvent)
{
	FAKE_ENTER(cuEventDestroy_v2);
	return event_destroy(hEvent);
}

/* cuStreamQuery: one poll of each pending event of the stream. */
static CUresult stream_query(CUstream h, bool ptds)
{
	fake_lock();
	struct fake_stream *s;
	CUresult r = fake_stream_resolve_locked(h, ptds, &s);
	if (r == CUDA_SUCCESS) {
		g_fake.stats.stream_queries++;
		fake_note_fence_call_locked();
		r = fake_capture_check_stream_use_locked(s, true);
	}
	if (r == CUDA_SUCCESS)
		r = fake_capture_check_unsafe_locked();
	if (r == CUDA_SUCCESS) {
		struct fake_timeline *tl = s->tl;
		for (struct fake_event *e = tl->pending, *n; e; e = n) {
			n = e->pnext;
			event_poll_locked(e);
		}
		/* Work left by events destroyed or re-recorded meanwhile has no
		 * countdown of its own. */
		if (!tl->pending && tl_deps_done(tl, tl->last_seq))
			tl_complete_all_locked(tl);
		if (!tl_done(tl, tl->last_seq))
			r = CUDA_ERROR_NOT_READY;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamQuery(CUstream hStream)
{
	FAKE_ENTER(cuStreamQuery);
	return stream_query(hStream, false);
}

FAKE_API CUresult cuStreamQuery_ptsz(CUstream hStream)
{
	FAKE_ENTER(cuStreamQuery_ptsz);
	return stream_query(hStream, true);
}

static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned flags, bool ptds)
{
	if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_event *e = NULL;
	struct fake_stream *s = NULL;
	if (r == CUDA_SUCCESS && !(e = event_lookup_locked(he)))
		r = CUDA_ERROR_INVALID_HANDLE;
	if (r == CUDA_SUCCESS)
		r = fake_stream_resolve_locked(hs, ptds, &s);
	if (r == CUDA_SUCCESS && s->kind == STREAM_LEGACY) {
		fake_note_fence_call_locked();
		r = legacy_implicit_locked(s->ctx, true);
	}
	if (r == CUDA_SUCCESS && s->capture && s->capture->invalidated)
		r = capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
	if (r == CUDA_SUCCESS && e->state == EVENT_CAPTURED) {
		if (!e->capture) {
			r = CUDA_ERROR_INVALID_VALUE; /* its capture has ended */
		} else if (s->capture && s->capture != e->capture) {
			r = capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_MERGE);
		} else {
			/* Fork: the stream joins the capture. */
			s->capture = e->capture;
			g_fake.stats.stream_waits++;
		}
	} else if (r == CUDA_SUCCESS && s->capture) {
		/* Waiting for uncaptured work inside a capture: only as an
		 * explicit external wait node. */
		if (e->state == EVENT_RECORDED && !(flags & CU_EVENT_WAIT_EXTERNAL)) {
			capture_invalidate_locked(s->capture);
			r = capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
		}
	} else if (r == CUDA_SUCCESS && e->state == EVENT_RECORDED) {
		tl_add_wait_locked(s->tl, s->tl->last_seq + 1, e->tl, e->seq);
		g_fake.stats.stream_waits++;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	FAKE_ENTER(cuStreamWaitEvent);
	return stream_wait_event(hStream, hEvent, Flags, false);
}

FAKE_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	FAKE_ENTER(cuStreamWaitEvent_ptsz);
	return stream_wait_event(hStream, hEvent, Flags, true);
}

CUresult fake_ctx_sync_locked(struct fake_ctx *ctx)
{
	g_fake.stats.ctx_syncs++;
	fake_note_fence_call_locked();
	CUresult r = fake_capture_check_unsafe_locked();
	if (r != CUDA_SUCCESS)
		return r;
	/* A capture in the context: the wait would include capturing work. */
	for (struct fake_capture *c = g_fake.captures; c; c = c->next) {
		if (c->ctx == ctx) {
			capture_invalidate_locked(c);
			return capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
		}
	}
	timelines_init_locked();
	for (struct fake_timeline *tl = g_fake.timelines.next; tl != &g_fake.timelines; tl = tl->next)
		if (tl->ctx == ctx)
			tl_complete_all_locked(tl);
	return CUDA_SUCCESS;
}

/* --- capture entry points --- */

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptds)
{
	if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	struct fake_stream *s;
	CUresult r = fake_stream_resolve_locked(h, ptds, &s);
	if (r == CUDA_SUCCESS && s->kind == STREAM_LEGACY)
		r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
	else if (r == CUDA_SUCCESS && s->capture)
		r = CUDA_ERROR_ILLEGAL_STATE;
	if (r == CUDA_SUCCESS) {
		struct fake_capture *c = calloc(1, sizeof(*c));
		struct fake_graph *g = c ? graph_new_locked() : NULL;
		if (!g) {
			free(c);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			c->id = ++g_fake.next_id;
			c->mode = mode;
			c->thread = pthread_self();
			c->origin = s;
			c->ctx = s->ctx;
			c->graph = g;
			c->next = g_fake.captures;
			g_fake.captures = c;
			s->capture = c;
			g_fake.stats.captures_begun++;
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamBeginCapture(CUstream hStream)
{
	FAKE_ENTER(cuStreamBeginCapture);
	return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_RELAXED, false);
}

FAKE_API CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
	FAKE_ENTER(cuStreamBeginCapture_ptsz);
	return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_RELAXED, true);
}

FAKE_API CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
	FAKE_ENTER(cuStreamBeginCapture_v2);
	return begin_capture(hStream, mode, false);
}

FAKE_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
	FAKE_ENTER(cuStreamBeginCapture_v2_ptsz);
	return begin_capture(hStream, mode, true);
}

static CUresult end_capture(CUstream h, CUgraph *phGraph, bool ptds)
{
	if (!phGraph)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	struct fake_stream *s;
	CUresult r = fake_stream_resolve_locked(h, ptds, &s);
	struct fake_capture *c = r == CUDA_SUCCESS ? s->capture : NULL;
	if (r == CUDA_SUCCESS && !c) {
		r = CUDA_ERROR_ILLEGAL_STATE;
	} else if (r == CUDA_SUCCESS && c->origin != s) {
		/* Ending on a stream that joined: the capture is spoilt. */
		capture_invalidate_locked(c);
		r = capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
	} else if (r == CUDA_SUCCESS && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
		   !pthread_equal(c->thread, pthread_self())) {
		/* Refused, and the capture is over all the same. */
		graph_free_locked(capture_end_locked(c));
		r = capture_refuse_locked(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
	}
	if (r == CUDA_SUCCESS) {
		bool invalidated = c->invalidated;
		struct fake_graph *g = capture_end_locked(c);
		if (invalidated) {
			graph_free_locked(g);
			*phGraph = NULL;
			r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
		} else {
			*phGraph = (CUgraph)g;
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
	FAKE_ENTER(cuStreamEndCapture);
	return end_capture(hStream, phGraph, false);
}

FAKE_API CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
	FAKE_ENTER(cuStreamEndCapture_ptsz);
	return end_capture(hStream, phGraph, true);
}

/* Capture status of a stream; the legacy stream while a blocking stream of
 * its context captures answers 906 without invalidating anything. */
static CUresult capture_info_locked(CUstream h, bool ptds, struct fake_stream **out,
				    CUstreamCaptureStatus *status)
{
	struct fake_stream *s;
	CUresult r = fake_stream_resolve_locked(h, ptds, &s);
	if (r != CUDA_SUCCESS)
		return r;
	if (!status)
		return CUDA_ERROR_INVALID_VALUE;
	if (s->kind == STREAM_LEGACY) {
		r = legacy_implicit_locked(s->ctx, false);
		if (r != CUDA_SUCCESS)
			return r;
	}
	if (!s->capture)
		*status = CU_STREAM_CAPTURE_STATUS_NONE;
	else if (s->capture->invalidated)
		*status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
	else
		*status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
	*out = s;
	return CUDA_SUCCESS;
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *status, bool ptds)
{
	fake_lock();
	struct fake_stream *s;
	CUresult r = capture_info_locked(h, ptds, &s, status);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	FAKE_ENTER(cuStreamIsCapturing);
	return is_capturing(hStream, captureStatus, false);
}

FAKE_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	FAKE_ENTER(cuStreamIsCapturing_ptsz);
	return is_capturing(hStream, captureStatus, true);
}

static CUresult get_capture_info(CUstream h, bool ptds, CUstreamCaptureStatus *status, cuuint64_t *id,
				 CUgraph *graph, const CUgraphNode **deps, const CUgraphEdgeData **edges,
				 size_t *ndeps)
{
	fake_lock();
	struct fake_stream *s;
	CUresult r = capture_info_locked(h, ptds, &s, status);
	if (r == CUDA_SUCCESS && s->capture) {
		if (id)
			*id = s->capture->id;
		if (graph)
			*graph = (CUgraph)s->capture->graph;
		if (deps)
			*deps = NULL;
		if (edges)
			*edges = NULL;
		if (ndeps)
			*ndeps = 0;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
					 cuuint64_t *id_out)
{
	FAKE_ENTER(cuStreamGetCaptureInfo);
	return get_capture_info(hStream, false, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

FAKE_API CUresult cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
					      cuuint64_t *id_out)
{
	FAKE_ENTER(cuStreamGetCaptureInfo_ptsz);
	return get_capture_info(hStream, true, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

FAKE_API CUresult cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
					    cuuint64_t *id_out, CUgraph *graph_out,
					    const CUgraphNode **dependencies_out, size_t *numDependencies_out)
{
	FAKE_ENTER(cuStreamGetCaptureInfo_v2);
	return get_capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
				numDependencies_out);
}

FAKE_API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
						 cuuint64_t *id_out, CUgraph *graph_out,
						 const CUgraphNode **dependencies_out,
						 size_t *numDependencies_out)
{
	FAKE_ENTER(cuStreamGetCaptureInfo_v2_ptsz);
	return get_capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
				numDependencies_out);
}

FAKE_API CUresult cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
					    cuuint64_t *id_out, CUgraph *graph_out,
					    const CUgraphNode **dependencies_out,
					    const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
	FAKE_ENTER(cuStreamGetCaptureInfo_v3);
	return get_capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out,
				edgeData_out, numDependencies_out);
}

FAKE_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
						 cuuint64_t *id_out, CUgraph *graph_out,
						 const CUgraphNode **dependencies_out,
						 const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
	FAKE_ENTER(cuStreamGetCaptureInfo_v3_ptsz);
	return get_capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out,
				edgeData_out, numDependencies_out);
}

FAKE_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
	FAKE_ENTER(cuThreadExchangeStreamCaptureMode);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		CUstreamCaptureMode *cur = fake_thread_capture_mode();
		CUstreamCaptureMode old = *cur;
		*cur = *mode;
		*mode = old;
	}
	fake_unlock();
	return r;
}

/* --- graphs (just enough for a captured sequence to be launched, cloned,
 * nested as a child graph and instantiated through every ABI) --- */

FAKE_API CUresult cuGraphDestroy(CUgraph hGraph)
{
	FAKE_ENTER(cuGraphDestroy);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !fake_ptrset_has(&g_fake.graph_set, hGraph))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		for (struct fake_capture *c = g_fake.captures; c; c = c->next)
			if (c->graph == (struct fake_graph *)hGraph)
				r = CUDA_ERROR_INVALID_VALUE; /* still being captured into */
	}
	if (r == CUDA_SUCCESS)
		graph_free_locked((struct fake_graph *)hGraph);
	fake_unlock();
	return r;
}

static CUresult graph_instantiate(CUgraphExec *phGraphExec, CUgraph hGraph)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!phGraphExec || !fake_ptrset_has(&g_fake.graph_set, hGraph)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct fake_graph_exec *x = calloc(1, sizeof(*x));
		if (!x || !fake_ptrset_add(&g_fake.exec_set, x)) {
			free(x);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			x->graph = (struct fake_graph *)hGraph;
			*phGraphExec = (CUgraphExec)x;
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags)
{
	FAKE_ENTER(cuGraphInstantiateWithFlags);
	(void)flags;
	return graph_instantiate(phGraphExec, hGraph);
}

/* The old ABI (cuda.h now maps the name to cuGraphInstantiateWithFlags). */
static CUresult graph_instantiate_log(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
				      char *logBuffer, size_t bufferSize)
{
	CUresult r = graph_instantiate(phGraphExec, hGraph);
	if (r == CUDA_SUCCESS && phErrorNode)
		*phErrorNode = NULL;
	if (r == CUDA_SUCCESS && logBuffer && bufferSize)
		logBuffer[0] = '\0';
	return r;
}

FAKE_API CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
				     char *logBuffer, size_t bufferSize)
{
	FAKE_ENTER(cuGraphInstantiate);
	return graph_instantiate_log(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

FAKE_API CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
					char *logBuffer, size_t bufferSize)
{
	FAKE_ENTER(cuGraphInstantiate_v2);
	return graph_instantiate_log(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

static CUresult graph_instantiate_params(CUgraphExec *phGraphExec, CUgraph hGraph,
					 CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
	if (!params)
		return CUDA_ERROR_INVALID_VALUE;
	CUresult r = graph_instantiate(phGraphExec, hGraph);
	params->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
	params->hErrNode_out = NULL;
	return r;
}

FAKE_API CUresult cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
					       CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	FAKE_ENTER(cuGraphInstantiateWithParams);
	return graph_instantiate_params(phGraphExec, hGraph, instantiateParams);
}

FAKE_API CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
						    CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams)
{
	FAKE_ENTER(cuGraphInstantiateWithParams_ptsz);
	return graph_instantiate_params(phGraphExec, hGraph, instantiateParams);
}

FAKE_API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
	FAKE_ENTER(cuGraphCreate);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!phGraph || flags != 0))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct fake_graph *g = graph_new_locked();
		if (g)
			*phGraph = (CUgraph)g;
		else
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	fake_unlock();
	return r;
}

/* Copies src's captured frees into dst (a clone, or a child graph node). */
static bool graph_copy_frees_locked(struct fake_graph *dst, const struct fake_graph *src)
{
	for (const struct fake_deferred_free *f = src->frees; f; f = f->next) {
		struct fake_deferred_free *c = calloc(1, sizeof(*c));
		if (!c)
			return false;
		c->ptr = f->ptr;
		c->next = dst->frees;
		dst->frees = c;
	}
	return true;
}

FAKE_API CUresult cuGraphClone(CUgraph *phGraphClone, CUgraph originalGraph)
{
	FAKE_ENTER(cuGraphClone);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!phGraphClone || !fake_ptrset_has(&g_fake.graph_set, originalGraph)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct fake_graph *g = graph_new_locked();
		if (!g || !graph_copy_frees_locked(g, (struct fake_graph *)originalGraph)) {
			if (g)
				graph_free_locked(g);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			*phGraphClone = (CUgraph)g;
		}
	}
	fake_unlock();
	return r;
}

/* The child is cloned into the parent; nodes are opaque numbers here. */
FAKE_API CUresult cuGraphAddChildGraphNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
					   size_t numDependencies, CUgraph childGraph)
{
	FAKE_ENTER(cuGraphAddChildGraphNode);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS &&
	    (!phGraphNode || (numDependencies && !dependencies) || hGraph == childGraph ||
	     !fake_ptrset_has(&g_fake.graph_set, hGraph) || !fake_ptrset_has(&g_fake.graph_set, childGraph)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		if (graph_copy_frees_locked((struct fake_graph *)hGraph, (struct fake_graph *)childGraph))
			*phGraphNode = (CUgraphNode)(uintptr_t)++g_fake.next_id;
		else
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	fake_unlock();
	return r;
}

/* Launching runs the graph's captured frees (once: the fake keeps no other
 * node). */
static CUresult graph_launch(CUgraphExec hx, CUstream hs, bool ptds)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_stream *s = NULL;
	bool captured = false;
	if (r == CUDA_SUCCESS && !fake_ptrset_has(&g_fake.exec_set, hx))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		r = fake_stream_resolve_locked(hs, ptds, &s);
	if (r == CUDA_SUCCESS)
		r = fake_stream_op_locked(s, &captured);
	if (r == CUDA_SUCCESS && !captured) {
		struct fake_graph *g = ((struct fake_graph_exec *)hx)->graph;
		if (fake_ptrset_has(&g_fake.graph_set, g)) {
			while (g->frees) {
				struct fake_deferred_free *f = g->frees;
				g->frees = f->next;
				fake_mem_free_deferred_locked(f->ptr);
				free(f);
			}
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	FAKE_ENTER(cuGraphLaunch);
	return graph_launch(hGraphExec, hStream, false);
}

FAKE_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	FAKE_ENTER(cuGraphLaunch_ptsz);
	return graph_launch(hGraphExec, hStream, true);
}

FAKE_API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	FAKE_ENTER(cuGraphExecDestroy);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !fake_ptrset_del(&g_fake.exec_set, hGraphExec))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		free(hGraphExec);
	fake_unlock();
	return r;
}
