/* SPDX-License-Identifier: MIT */
/*
 * process/vmm_internal.h - what vmm.c (the state machine of the VMM calls),
 * vmm_table.c (the tables it keeps) and vmm_idle.c (idle entries, their
 * fences, giving memory back, the reaper, counters) share with each other
 * and nobody else.
 *
 * A `vbuf` is one cacheable VMM buffer: a plain reservation of `size`
 * bytes mapped whole, at offset 0, by one handle of `size` bytes that
 * cuMemCreate made with no shareable handle type. While it is tracked
 * libemm holds it physically reserved, created and mapped (with the access
 * the program set); `l` is what the program believes (L_* bits), and every
 * difference is a deferred operation:
 *
 *   l == L_ALL             live: the program uses it
 *   l == L_ALL & ~L_CREATED  live, its handle released early (legal)
 *   l == 0                 idle: freed whole, in the cache (fenced)
 *   anything else          pending: a free or a reuse under way; made
 *                          real by the owner thread's next other call,
 *                          by cuMemGetInfo, fork, OOM, or the reaper
 *
 * All fields are under vmm_lock. `busy` marks a vbuf whose driver calls
 * (materializing, fence records or queries) run outside the lock: others
 * wait on vmm_busy_cond before they touch it.
 */
#ifndef EMM_PROCESS_VMM_INTERNAL_H
#define EMM_PROCESS_VMM_INTERNAL_H

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "process/process.h"

#pragma GCC visibility push(hidden)

#define L_RESERVED 1u
#define L_CREATED  2u
#define L_MAPPED   4u
#define L_ACCESS   8u
#define L_ALL      (L_RESERVED | L_CREATED | L_MAPPED | L_ACCESS)

#define VMM_MAX_ACCESS 4 /* access descriptors a cached buffer remembers */
#define VMM_MAX_FENCES 64 /* legacy stream + non-blocking streams fenced */

enum vbuf_list { VB_NONE, VB_PENDING, VB_IDLE };

struct vbuf {
	CUdeviceptr va;
	size_t size;
	CUmemGenericAllocationHandle handle;
	CUmemAllocationProp prop;
	CUcontext ctx; /* current at the map: whose streams fence it */
	int device;
	CUmemAccessDesc access[VMM_MAX_ACCESS];
	unsigned naccess;
	unsigned l;	   /* L_* the program believes */
	bool access_set;   /* physically: the program's cuMemSetAccess ran */
	bool nocache;	   /* live, but never deferred (see vmm.c) */
	bool busy;
	uint64_t owner;	   /* thread (st_thread_uid) of the last logical step */
	uint64_t since_ns; /* pending or idle since (CLOCK_MONOTONIC) */
	/* idle: completion markers of the work issued before the free */
	struct emm_fence_pool *pool;
	uint64_t fences[VMM_MAX_FENCES];
	unsigned nfences;
	uint64_t ticket; /* idle, fenced by a later cuCtxSynchronize (vmm_sync.c); 0: not */
	enum vbuf_list list;
	struct vbuf *prev, *next; /* pending or idle list */
	struct vbuf *hnext;	  /* handle hash chain */
};

/* vmm_sync.c: a free fenced by the program's next cuCtxSynchronize
 * instead of events (true: v->ticket set); whether one has come since. */
bool vmm_sync_lazy_free(struct vbuf *v);
bool vmm_sync_covered(const struct vbuf *v);
void vmm_sync_fork_child(void);

extern pthread_mutex_t vmm_lock;
extern pthread_cond_t vmm_busy_cond;

uint64_t vmm_now_ns(void);

/* vmm.c: driver calls until the physical state is what the program
 * believes, then forget the vbuf (its reservation and handle are tracked
 * as plain ones if the program still holds them). v is busy and on no
 * list; no lock held. */
void vmm_materialize(struct vbuf *v);

/* Plain reservations (no hint, no flags) and handles cuMemCreate made,
 * while no vbuf owns them: what a cuMemMap may turn into a vbuf. */
struct plain_resv {
	CUdeviceptr va;
	size_t size;
	struct plain_resv *next;
};
struct plain_handle {
	CUmemGenericAllocationHandle handle;
	size_t size;
	CUmemAllocationProp prop;
	bool cacheable; /* never mapped, no shareable type, not exported */
	struct plain_handle *next;
};

/* vmm_table.c, vmm_lock held. Tracked vbufs by address: the first vbuf
 * overlapping [va, va + max(size, 1)) at index >= *pos, advancing *pos
 * (start with SIZE_MAX); the one starting at va; insert (false without
 * memory: not tracked) and remove. By handle: find, insert, remove. Plain
 * reservations and handles: find, add or update (not tracked without
 * memory), delete. */
struct vbuf *vmm_va_next_overlap(CUdeviceptr va, size_t size, size_t *pos);
struct vbuf *vmm_va_find(CUdeviceptr va);
bool vmm_va_insert(struct vbuf *v);
void vmm_va_remove(struct vbuf *v);
struct vbuf *vmm_handle_find(CUmemGenericAllocationHandle h);
void vmm_handle_insert(struct vbuf *v);
void vmm_handle_remove(struct vbuf *v);
struct plain_resv *vmm_resv_find(CUdeviceptr va);
void vmm_resv_add(CUdeviceptr va, size_t size);
void vmm_resv_del(CUdeviceptr va);
struct plain_handle *vmm_hnd_find(CUmemGenericAllocationHandle h);
void vmm_hnd_add(CUmemGenericAllocationHandle h, size_t size, const CUmemAllocationProp *prop, bool cacheable);
void vmm_hnd_del(CUmemGenericAllocationHandle h);
/* Forget every table (a fork child; nothing freed). */
void vmm_tables_fork_child(void);

/* Tracked vbufs (any state); read without the lock to skip the cache. */
extern atomic_size_t vmm_tracked_count;
static inline size_t vmm_tracked(void)
{
	return atomic_load_explicit(&vmm_tracked_count, memory_order_relaxed);
}

/* vmm_idle.c, vmm_lock held: link / unlink v (list: VB_PENDING or
 * VB_IDLE); the list heads; the idle bytes. */
void vmm_list_add_locked(struct vbuf *v, enum vbuf_list list);
void vmm_list_del_locked(struct vbuf *v);
struct vbuf *vmm_pending_head_locked(void);
size_t vmm_idle_bytes_locked(int device);

/* vmm_idle.c, no lock held: v (busy, on no list) was freed whole: record
 * its fences and make it idle (or materialize it when it cannot be
 * fenced), then apply EMM_RELEASE_THRESHOLD. */
void vmm_make_idle(struct vbuf *v);
/* vmm_idle.c, vmm_lock held: an idle vbuf of `size` that a reservation
 * aligned to `align` in context `ctx` may take and whose fences are
 * complete; busy and unlinked, or NULL. Drops and retakes the lock to
 * query fences. */
struct vbuf *vmm_idle_take_locked(size_t size, size_t align, CUcontext ctx, const CUmemAllocationProp *prop);
/* Same physical-allocation properties (vmm.c). */
bool vmm_prop_equal(const CUmemAllocationProp *a, const CUmemAllocationProp *b);
/* vmm_idle.c: start the reaper if it is not running (vmm_lock held), and
 * wake it for a new pending entry. */
void vmm_reaper_kick_locked(void);

/* vmm_idle.c: counters. */
enum vmm_counter {
	VC_ALLOCS,
	VC_HITS,
	VC_MISSES,
	VC_FREES,
	VC_HIT_BYTES,
	VC_MATERIALIZED,
	VC_IDLE_RELEASED,
	VC_POOL_ALLOCS,
	VC_POOL_CREATES,
	VC_POOL_DESTROYS,
	VC__COUNT
};
void vmm_count(enum vmm_counter which, int device, uint64_t n);

#pragma GCC visibility pop


/* --- vmm_defer.c: batches of vbufs made real after vmm_lock ------------- */

#define VMM_BATCH_MAX 16

struct vmm_batch {
	struct vbuf *v[VMM_BATCH_MAX];
	unsigned n;
};

/* What libemm holds physically: everything, access once the program set it. */
static inline unsigned vmm_physical(const struct vbuf *v)
{
	return L_RESERVED | L_CREATED | L_MAPPED | (v->access_set ? L_ACCESS : 0);
}

static inline bool vmm_consistent(const struct vbuf *v)
{
	return v->l == vmm_physical(v);
}

/* Take v into the batch (unless busy or the batch is full); lock held. */
void vmm_batch_take(struct vmm_batch *b, struct vbuf *v);
/* Make the batch real; no lock held. */
void vmm_batch_run(struct vmm_batch *b);
/* Rule (a): this thread's pending deferrals, but `keep`; lock held. */
void vmm_take_own_pending(struct vmm_batch *b, const struct vbuf *keep);
/* Wait until nothing the call names is busy; lock held (dropped while waiting). */
void vmm_wait_unbusy(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle h);
/* Take what a call touches: every vbuf it names (`all`), or those whose
 * physical state differs from the program's view; lock held. */
void vmm_take_touched(struct vmm_batch *b, CUdeviceptr va, size_t size, bool has_handle,
                      CUmemGenericAllocationHandle h, bool all);
/* The prologue of a call the driver answers; no lock held. */
void vmm_pass_prologue(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle h, bool all);

#endif
