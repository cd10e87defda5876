/* SPDX-License-Identifier: MIT */
/*
 * process/vmm_sync.c - the context synchronisations that fence freed VMM
 * buffers for free. cuCtxSynchronize returns once all work issued in the
 * context before the call has completed, so every buffer of that context
 * freed before the call began has nothing left that may touch it.
 *
 * XLA's platform allocator synchronizes the context before every free
 * (RESULTS.md section 22), and the fence a free records otherwise (a
 * legacy-stream event and a query of each of XLA's 18 streams, vmm_idle.c)
 * cost JAX 1.5-1.7x of its step time. So each free takes a ticket, a
 * synchronisation remembers the last ticket taken before it began (the
 * context's horizon), and a buffer freed at or under its context's horizon
 * is reusable with no driver call. A free is fenced this way ("lazy") only
 * where the program keeps synchronizing: when a synchronisation has come
 * since the context's previous free; else it records its events as before,
 * so that a program that never synchronizes loses nothing. A lazy buffer
 * no synchronisation has covered yet is not taken (the reaper gives it
 * back after a second, as any idle buffer).
 *
 * A context's slot outlives the context: a handle the driver reuses
 * inherits a horizon older than any ticket its buffers will take, so it
 * covers none of them. With more than MAX_CTX contexts synchronizing, the
 * others fence as before.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "process/process_internal.h"
#include "process/vmm_internal.h"

#define MAX_CTX 16

static atomic_uint_fast64_t tickets;
static pthread_mutex_t sync_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	CUcontext ctx;
	uint64_t horizon;   /* every free with a ticket <= it is covered */
	uint64_t last_free; /* the ticket of the context's last free */
} ctxs[MAX_CTX];

/* The slot of ctx (made when `make`), or -1; sync_lock held. */
static int slot_locked(CUcontext ctx, bool make)
{
	int empty = -1;

	for (int i = 0; i < MAX_CTX; i++) {
		if (ctxs[i].ctx == ctx)
			return i;
		if (!ctxs[i].ctx && empty < 0)
			empty = i;
	}
	if (!make || empty < 0)
		return -1;
	ctxs[empty].ctx = ctx;
	ctxs[empty].horizon = 0;
	ctxs[empty].last_free = 0;
	return empty;
}

uint64_t emm_state_ctx_sync_begin(void)
{
	return atomic_load(&tickets);
}

void emm_state_ctx_sync_done(uint64_t ticket)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUcontext ctx = NULL;
	int i;

	if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		return;
	pthread_mutex_lock(&sync_lock);
	i = slot_locked(ctx, true);
	if (i >= 0 && ticket > ctxs[i].horizon)
		ctxs[i].horizon = ticket;
	pthread_mutex_unlock(&sync_lock);
}

bool vmm_sync_lazy_free(struct vbuf *v)
{
	uint64_t t = atomic_fetch_add(&tickets, 1) + 1;
	bool lazy = false;
	int i;

	pthread_mutex_lock(&sync_lock);
	i = slot_locked(v->ctx, false);
	if (i >= 0) {
		/* a synchronisation covered the context's previous free */
		lazy = ctxs[i].horizon >= ctxs[i].last_free;
		ctxs[i].last_free = t;
	}
	pthread_mutex_unlock(&sync_lock);
	v->ticket = lazy ? t : 0;
	return lazy;
}

bool vmm_sync_covered(const struct vbuf *v)
{
	bool covered = false;
	int i;

	pthread_mutex_lock(&sync_lock);
	i = slot_locked(v->ctx, false);
	if (i >= 0)
		covered = ctxs[i].horizon >= v->ticket;
	pthread_mutex_unlock(&sync_lock);
	return covered;
}

void vmm_sync_fork_child(void)
{
	pthread_mutex_init(&sync_lock, NULL);
	for (int i = 0; i < MAX_CTX; i++)
		ctxs[i].ctx = NULL;
}
