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
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
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

static unsigned stream_bucket(emm_stream_t key)
{
	return (unsigned)(((key >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 56) % STREAM_BUCKETS;
}

static void stream_insert(emm_stream_t key, CUcontext ctx, bool nonblocking)
{
	struct stream_node *n, **head = &stream_buckets[stream_bucket(key)];

	pthread_rwlock_wrlock(&stream_lock);
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
	pthread_rwlock_unlock(&stream_lock);
}

/* Remove a stream; its context (NULL if unknown). */
static CUcontext stream_remove(emm_stream_t key)
{
	struct stream_node **link, *n = NULL;
	CUcontext ctx = NULL;

	pthread_rwlock_wrlock(&stream_lock);
	for (link = &stream_buckets[stream_bucket(key)]; *link; link = &(*link)->next) {
		if ((*link)->key == key) {
			n = *link;
			*link = n->next;
			break;
		}
	}
	pthread_rwlock_unlock(&stream_lock);
	if (n) {
		ctx = n->ctx;
		free(n);
	}
	return ctx;
}

void st_stream_remove_context(CUcontext ctx)
{
	pthread_rwlock_wrlock(&stream_lock);
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
	pthread_rwlock_unlock(&stream_lock);
}

CUcontext emm_state_stream_context(emm_stream_t key)
{
	struct stream_node *n;
	CUcontext ctx = NULL;

	if (!EMM_STREAM_IS_HANDLE(key))
		return NULL;
	pthread_rwlock_rdlock(&stream_lock);
	for (n = stream_buckets[stream_bucket(key)]; n; n = n->next) {
		if (n->key == key) {
			ctx = n->ctx;
			break;
		}
	}
	pthread_rwlock_unlock(&stream_lock);
	return ctx;
}

void st_announce_streams(emm_heap_t *heap, CUcontext ctx)
{
	pthread_rwlock_rdlock(&stream_lock);
	for (unsigned b = 0; b < STREAM_BUCKETS; b++)
		for (struct stream_node *n = stream_buckets[b]; n; n = n->next)
			if (n->ctx == ctx)
				emm_heap_stream_created(heap, n->key, n->nonblocking);
	pthread_rwlock_unlock(&stream_lock);
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
	emm_heap_t *heaps[1 + PINNED_FLAG_SETS];
	emm_stream_t key = emm_state_stream_key(stream, false);
	CUcontext ctx;
	size_t n;

	if (!st_is_enabled() || !EMM_STREAM_IS_HANDLE(key))
		return;
	ctx = current_context();
	if (!ctx)
		return;
	emm_state_enter();
	/* Insert and look up under st_ctx_lock, so a heap created concurrently
	 * either sees the stream in its announcement or is seen here (never
	 * both). */
	pthread_mutex_lock(&st_ctx_lock);
	stream_insert(key, ctx, nonblocking);
	n = st_heaps_of_context_locked(ctx, heaps);
	pthread_mutex_unlock(&st_ctx_lock);
	/* A new non-blocking stream is not ordered by the legacy-stream
	 * markers of epochs already closed: the heap makes it wait on the
	 * latest one as it learns of it, so blocks released before the stream
	 * existed are safe on it. */
	for (size_t i = 0; i < n; i++)
		emm_heap_stream_created(heaps[i], key, nonblocking);
	emm_state_leave();
}

void emm_state_stream_destroyed(CUstream stream)
{
	emm_heap_t *heaps[1 + PINNED_FLAG_SETS];
	emm_stream_t key = emm_state_stream_key(stream, false);
	CUcontext ctx;
	size_t n;

	if (!st_is_enabled() || !EMM_STREAM_IS_HANDLE(key))
		return;
	ctx = stream_remove(key);
	if (!ctx)
		ctx = current_context();
	if (!ctx)
		return;
	emm_state_enter();
	pthread_mutex_lock(&st_ctx_lock);
	n = st_heaps_of_context_locked(ctx, heaps);
	pthread_mutex_unlock(&st_ctx_lock);
	for (size_t i = 0; i < n; i++)
		emm_heap_stream_destroyed(heaps[i], key);
	emm_state_leave();
}
