/* SPDX-License-Identifier: MIT */
/*
 * process/streams.c - stream keys and the registry of live streams.
 *
 * A stream key is what the allocator orders frees by: the legacy stream,
 * this thread's per-thread default stream, or a real CUstream. The
 * registry remembers the context and the blocking flag of every stream
 * created through the shims, so that a heap created later learns of the
 * streams already alive in its context (it records fences on them), and
 * so that a context's teardown forgets its streams.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "process/carrier.h"
#include "process/process_internal.h"
#include "process/process.h"

#define STREAM_BUCKETS 256

/* --- stream keys ------------------------------------------------------- */

static atomic_uint_fast64_t next_thread_index = 1;
static EMM_TLS_IE uint64_t tls_thread_index;

static emm_stream_t per_thread_key(void)
{
	if (EMM_UNLIKELY(!tls_thread_index))
		tls_thread_index = atomic_fetch_add(&next_thread_index, 1);
	return EMM_STREAM_PER_THREAD_KEY(tls_thread_index);
}

emm_stream_t emm_state_stream_key(CUstream stream, bool per_thread_default)
{
	if (stream == NULL)
		return per_thread_default ? per_thread_key() : EMM_STREAM_LEGACY;
	if (stream == CU_STREAM_LEGACY)
		return EMM_STREAM_LEGACY;
	if (stream == CU_STREAM_PER_THREAD)
		return per_thread_key();
	return (emm_stream_t)(uintptr_t)stream;
}

CUstream emm_state_stream_handle(emm_stream_t key)
{
	if (key == EMM_STREAM_SYNC || key == EMM_STREAM_LEGACY)
		return CU_STREAM_LEGACY;
	if (EMM_STREAM_IS_PER_THREAD(key))
		/* Our own per-thread stream exactly; another thread's is ordered
		 * by the legacy stream (a barrier for every per-thread stream). */
		return key == per_thread_key() ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
	return (CUstream)(uintptr_t)key;
}

/* --- stream registry --------------------------------------------------- */

struct stream_node {
	emm_stream_t key;
	CUcontext ctx;
	bool nonblocking;
	struct stream_node *next;
};

static pthread_rwlock_t stream_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct stream_node *stream_buckets[STREAM_BUCKETS];
/* Bumped under stream_lock by every insert and removal (st_publish_heap). */
static atomic_uint_fast64_t stream_generation;

static unsigned stream_bucket(emm_stream_t key)
{
	return (unsigned)(((key >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 56) % STREAM_BUCKETS;
}

static void stream_insert(emm_stream_t key, CUcontext ctx, bool nonblocking)
{
	struct stream_node *n, **head = &stream_buckets[stream_bucket(key)];

	st_note_context(ctx);
	st_wrlock(&stream_lock);
	for (n = *head; n; n = n->next)
		if (n->key == key)
			break;
	if (!n) {
		n = calloc(1, sizeof(*n));
		if (n) {
			n->key = key;
			n->next = *head;
			*head = n;
		}
	}
	if (n) {
		n->ctx = ctx;
		n->nonblocking = nonblocking;
	}
	atomic_fetch_add(&stream_generation, 1);
	st_rwunlock(&stream_lock);
}

/* Is the stream registered; its blocking flag. */
static bool stream_lookup(emm_stream_t key, bool *ret_nonblocking)
{
	bool found = false;

	st_rdlock(&stream_lock);
	for (struct stream_node *n = stream_buckets[stream_bucket(key)]; n; n = n->next) {
		if (n->key == key) {
			*ret_nonblocking = n->nonblocking;
			found = true;
			break;
		}
	}
	st_rwunlock(&stream_lock);
	return found;
}

/* Remove a stream; its context (NULL if unknown). */
static CUcontext stream_remove(emm_stream_t key)
{
	struct stream_node **link, *n = NULL;
	CUcontext ctx = NULL;

	st_wrlock(&stream_lock);
	for (link = &stream_buckets[stream_bucket(key)]; *link; link = &(*link)->next) {
		if ((*link)->key == key) {
			n = *link;
			*link = n->next;
			break;
		}
	}
	atomic_fetch_add(&stream_generation, 1);
	st_rwunlock(&stream_lock);
	if (n) {
		ctx = n->ctx;
		free(n);
	}
	return ctx;
}

void st_stream_remove_context(CUcontext ctx)
{
	st_wrlock(&stream_lock);
	for (unsigned b = 0; b < STREAM_BUCKETS; b++) {
		struct stream_node **link = &stream_buckets[b];
		while (*link) {
			struct stream_node *n = *link;
			if (n->ctx == ctx) {
				*link = n->next;
				free(n);
			} else {
				link = &n->next;
			}
		}
	}
	st_rwunlock(&stream_lock);
}

CUcontext emm_state_stream_context(emm_stream_t key)
{
	struct stream_node *n;
	CUcontext ctx = NULL;

	if (!EMM_STREAM_IS_HANDLE(key))
		return NULL;
	st_rdlock(&stream_lock);
	for (n = stream_buckets[stream_bucket(key)]; n; n = n->next) {
		if (n->key == key) {
			ctx = n->ctx;
			break;
		}
	}
	st_rwunlock(&stream_lock);
	return ctx;
}

/* The live streams of ctx (caller frees *ret_keys). 0 or -ENOMEM. */
struct stream_snapshot {
	size_t n;
	emm_stream_t *keys;
	bool *nonblocking;
};

static int snapshot_streams(CUcontext ctx, struct stream_snapshot *ret)
{
	struct stream_snapshot s = {0, NULL, NULL};
	size_t cap = 0;

	st_rdlock(&stream_lock);
	for (unsigned b = 0; b < STREAM_BUCKETS; b++)
		for (struct stream_node *n = stream_buckets[b]; n; n = n->next)
			cap += n->ctx == ctx;
	if (cap) {
		s.keys = malloc(cap * (sizeof(*s.keys) + sizeof(*s.nonblocking)));
		if (!s.keys) {
			st_rwunlock(&stream_lock);
			return -ENOMEM;
		}
		s.nonblocking = (bool *)(s.keys + cap);
		for (unsigned b = 0; b < STREAM_BUCKETS; b++)
			for (struct stream_node *n = stream_buckets[b]; n; n = n->next)
				if (n->ctx == ctx) {
					s.keys[s.n] = n->key;
					s.nonblocking[s.n++] = n->nonblocking;
				}
	}
	st_rwunlock(&stream_lock);
	*ret = s;
	return 0;
}

static bool snapshot_has(const struct stream_snapshot *s, emm_stream_t key)
{
	for (size_t i = 0; i < s->n; i++)
		if (s->keys[i] == key)
			return true;
	return false;
}

int st_publish_heap(emm_heap_t *heap, CUcontext ctx, void (*publish_locked)(void *arg), void *arg)
{
	struct stream_snapshot prev = {0, NULL, NULL}, cur;

	for (;;) {
		uint64_t gen = atomic_load(&stream_generation);

		if (snapshot_streams(ctx, &cur) < 0) {
			free(prev.keys);
			return -ENOMEM;
		}
		/* Heap calls with no lock held: streams gone since the last
		 * round are forgotten, the live ones announced (idempotent). */
		st_assert_unlocked("announcing streams to a new heap");
		for (size_t i = 0; i < prev.n; i++)
			if (!snapshot_has(&cur, prev.keys[i]))
				emm_heap_stream_destroyed(heap, prev.keys[i]);
		for (size_t i = 0; i < cur.n; i++)
			emm_heap_stream_created(heap, cur.keys[i], cur.nonblocking[i]);
		free(prev.keys);
		prev = cur;
		/* emm_state_stream_created inserts under st_ctx_lock too: a
		 * stream inserted before this point changed the generation, one
		 * inserted after finds the heap published. */
		st_lock(&st_ctx_lock);
		if (atomic_load(&stream_generation) == gen) {
			publish_locked(arg);
			st_unlock(&st_ctx_lock);
			break;
		}
		st_unlock(&st_ctx_lock);
	}
	free(prev.keys);
	return 0;
}

/* The keys of ctx's live streams (only non-blocking ones if asked): how
 * many there are (only the first `cap` are written). */
static size_t context_stream_keys(CUcontext ctx, bool nonblocking_only, emm_stream_t *keys, size_t cap)
{
	size_t n = 0;

	st_rdlock(&stream_lock);
	for (unsigned b = 0; b < STREAM_BUCKETS; b++)
		for (struct stream_node *s = stream_buckets[b]; s; s = s->next)
			if (s->ctx == ctx && (s->nonblocking || !nonblocking_only)) {
				if (n < cap)
					keys[n] = s->key;
				n++;
			}
	st_rwunlock(&stream_lock);
	return n;
}

size_t st_stream_nonblocking_keys(CUcontext ctx, emm_stream_t *keys, size_t cap)
{
	return context_stream_keys(ctx, true, keys, cap);
}

void st_streams_fork_child(void)
{
	pthread_rwlock_init(&stream_lock, NULL);
	memset(stream_buckets, 0, sizeof(stream_buckets));
}

/* --- streams created and destroyed -------------------------------------- */

static CUcontext current_context(void)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUcontext ctx = NULL;

	if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
		return NULL;
	return ctx;
}

void emm_state_stream_created(CUstream stream, bool nonblocking)
{
	emm_heap_t *heaps[ST_CONTEXT_HEAPS];
	emm_stream_t key = emm_state_stream_key(stream, false);
	CUcontext ctx;
	size_t n;

	if (!st_is_enabled() || !EMM_STREAM_IS_HANDLE(key))
		return;
	ctx = current_context();
	if (!ctx)
		return;
	st_enter();
	/* Insert and look up under st_ctx_lock, so a heap created concurrently
	 * either sees the stream in its announcement or is seen here (never
	 * both). */
	st_lock(&st_ctx_lock);
	stream_insert(key, ctx, nonblocking);
	n = st_heaps_of_context_locked(ctx, heaps);
	st_unlock(&st_ctx_lock);
	/* A new non-blocking stream is not ordered by the legacy-stream
	 * markers of epochs already closed: the heap makes it wait on the
	 * latest one as it learns of it, so blocks released before the stream
	 * existed are safe on it. */
	for (size_t i = 0; i < n; i++)
		emm_heap_stream_created(heaps[i], key, nonblocking);
	st_leave();
}

/* The heaps of the context `stream` belongs to (its registry entry, else
 * the current context); 0 when none. */
static size_t heaps_of_stream(emm_stream_t key, emm_heap_t **heaps)
{
	CUcontext ctx = emm_state_stream_context(key);
	size_t n;

	if (!ctx)
		ctx = current_context();
	if (!ctx)
		return 0;
	st_lock(&st_ctx_lock);
	n = st_heaps_of_context_locked(ctx, heaps);
	st_unlock(&st_ctx_lock);
	return n;
}

struct destroying {
	emm_stream_t key;
	CUcontext ctx; /* the stream's (NULL: not in the registry) */
	bool nonblocking;
};

static void stream_destroyed_in(emm_heap_t *heap, int device, void *arg)
{
	const struct destroying *d = arg;

	(void)device;
	/* A non-blocking stream's work runs on after the destroy, and no epoch
	 * of its context's heaps records on it from now on: carried. */
	if (d->nonblocking && d->ctx && !st_is_exiting()) {
		struct ctx_entry *e = st_heap_entry(heap);
		if (e && e->ctx == d->ctx)
			st_carry_into(heap, e, d->key, d->ctx);
	}
	emm_heap_stream_destroyed(heap, d->key);
}

void emm_state_stream_destroying(CUstream stream)
{
	struct destroying d = {emm_state_stream_key(stream, false), NULL, false};

	if (!st_is_enabled() || !EMM_STREAM_IS_HANDLE(d.key))
		return;
	if (stream_lookup(d.key, &d.nonblocking))
		d.ctx = emm_state_stream_context(d.key);
	/* While the stream still lives: its ready blocks get a marker recorded
	 * on it (or wait as orphans), and the heaps stop recording on it. The
	 * registry keeps it until the destroy succeeds. Every heap, not only
	 * those of the stream's context: a cuMemFreeAsync of another device's
	 * block on this stream left that block keyed to it in the owner's heap
	 * (the walk's shared heap_life lock keeps the heaps alive). */
	emm_state_for_each_heap(stream_destroyed_in, &d, false);
}

void emm_state_stream_destroy_failed(CUstream stream)
{
	emm_heap_t *heaps[ST_CONTEXT_HEAPS];
	emm_stream_t key = emm_state_stream_key(stream, false);
	bool nonblocking = false;
	size_t n;

	if (!st_is_enabled() || !EMM_STREAM_IS_HANDLE(key) || !stream_lookup(key, &nonblocking))
		return;
	/* The stream lives on: the heaps fence it again (a non-blocking one is
	 * announced anew, and waits on the latest epoch marker). */
	st_enter();
	n = heaps_of_stream(key, heaps);
	for (size_t i = 0; i < n; i++)
		emm_heap_stream_created(heaps[i], key, nonblocking);
	st_leave();
}

void emm_state_stream_destroyed(CUstream stream)
{
	emm_stream_t key = emm_state_stream_key(stream, false);

	if (!st_is_enabled() || !EMM_STREAM_IS_HANDLE(key))
		return;
	(void)stream_remove(key);
}

struct stream_keys {
	emm_stream_t *keys;
	size_t n;
};

static void streams_destroyed_in(emm_heap_t *heap, int device, void *arg)
{
	const struct stream_keys *k = arg;

	(void)device;
	for (size_t i = 0; i < k->n; i++)
		emm_heap_stream_destroyed(heap, k->keys[i]);
}

/* Every live stream of ctx (caller frees; n 0 and NULL without memory). */
static struct stream_keys context_streams(CUcontext ctx)
{
	struct stream_keys k = {NULL, 0};
	size_t cap = 0;

	for (;;) {
		size_t n = context_stream_keys(ctx, false, k.keys, cap);
		if (n <= cap) {
			k.n = n;
			return k;
		}
		free(k.keys);
		cap = n + 8;
		k.keys = malloc(cap * sizeof(*k.keys));
		if (!k.keys)
			return (struct stream_keys){NULL, 0};
	}
}

void emm_state_context_destroying(CUcontext ctx)
{
	struct stream_keys k;

	if (!ctx || !st_is_enabled() || st_is_exiting())
		return;
	/* As for each stream's own destroy (emm_state_stream_destroying),
	 * while the context and its streams still live: blocks of any heap
	 * freed on them (another device's too) get their markers now; the
	 * context's fence pool dies with it, and so they read complete. */
	k = context_streams(ctx);
	if (k.n)
		emm_state_for_each_heap(streams_destroyed_in, &k, false);
	free(k.keys);
}

void emm_state_context_destroy_failed(CUcontext ctx)
{
	struct stream_keys k;

	if (!ctx || !st_is_enabled())
		return;
	k = context_streams(ctx);
	for (size_t i = 0; i < k.n; i++)
		emm_state_stream_destroy_failed(emm_state_stream_handle(k.keys[i]));
	free(k.keys);
}
