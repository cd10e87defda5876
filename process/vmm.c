/* SPDX-License-Identifier: MIT */
/*
 * process/vmm.c - the VMM calls' state machine: which reservations,
 * handles and mappings the program made, which of its frees libemm defers
 * so that the memory can come back from the cache, and making a deferred
 * operation real when anything could see the difference.
 *
 * XLA's platform allocator makes every buffer with cuMemAddressReserve +
 * cuMemCreate + cuMemMap + cuMemSetAccess and frees it with cuMemUnmap +
 * cuMemRelease + cuMemAddressFree (about 300 + 235 us a buffer on an H100).
 * A buffer that is a whole plain reservation (no hint, no flags) mapped at
 * offset 0 by the first mapping of a handle of the same size, made by
 * cuMemCreate with no shareable handle type, never exported, retained or
 * imported, whose access the program set once, becomes a `vbuf`
 * (vmm_internal.h). Its free is deferred: cuMemUnmap, cuMemRelease and
 * cuMemAddressFree only change what the program believes (vbuf.l); when
 * all three have come it is idle, fenced (vmm_idle.c), and the next
 * cuMemAddressReserve of its size (no hint, no flags, an alignment its
 * address meets), cuMemCreate of its size and properties, cuMemMap of that
 * pair and cuMemSetAccess with the same access - the same thread's next
 * VMM calls - are answered from it without the driver.
 *
 * Anything else that touches a vbuf whose physical state differs from what
 * the program believes (a map of another handle into its range, its handle
 * mapped elsewhere, a partial unmap, another property, a query) first makes
 * the deferred operations real (vmm_materialize: the real cuMemUnmap,
 * cuMemRelease, cuMemAddressFree as needed) and then goes to the driver,
 * which answers exactly as without libemm. A deferral that is not a free
 * of the whole buffer - unmap + release keeping the range, as vLLM's sleep
 * mode does to give memory back - is pending, and pending deferrals are
 * made real when their thread makes any other VMM call, in cuMemGetInfo,
 * emm_release_idle, on out of memory and before fork, and by the reaper
 * after a few milliseconds (vmm_idle.c). Deferred calls do not wait for
 * running work, and neither would the real ones (tests/bench/RESULTS.md
 * section 7), so making them real later is never less safe.
 *
 * Locks: vmm_lock (a leaf) over everything here; no driver call under it.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocator/trace.h"
#include "common/log.h"
#include "process/process_internal.h"
#include "process/vmm_internal.h"

#define BUCKETS	  1024
#define BATCH_MAX 16

pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t vmm_busy_cond = PTHREAD_COND_INITIALIZER;

/* Tracked vbufs, sorted by address; vbufs by handle. */
static struct vbuf **by_va;
static size_t nva, cap_va;
static atomic_size_t tracked; /* nva, read without the lock */
static struct vbuf *by_handle[BUCKETS];

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
static struct plain_resv *resv_tab[BUCKETS];
static struct plain_handle *hnd_tab[BUCKETS];

static atomic_uint_fast64_t next_thread = 1;
static EMM_TLS_IE uint64_t tls_thread;

uint64_t vmm_thread_id(void)
{
	if (EMM_UNLIKELY(!tls_thread))
		tls_thread = atomic_fetch_add(&next_thread, 1);
	return tls_thread;
}

uint64_t vmm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

enum emm_vmm_mode_value emm_vmm_mode(void)
{
	if (!st_is_enabled())
		return EMM_VMM_MODE_OFF;
	switch (st_opts->vmm) {
	case EMM_OPT_VMM_OFF:
		return EMM_VMM_MODE_OFF;
	case EMM_OPT_VMM_COUNT:
		return EMM_VMM_MODE_COUNT;
	default:
		return EMM_VMM_MODE_CACHE;
	}
}

static bool cache_on(void)
{
	return emm_vmm_mode() == EMM_VMM_MODE_CACHE;
}

static void trace(enum emm_trace_action action, CUdeviceptr va, size_t size)
{
	if (emm_trace_enabled())
		emm_trace_event(action, va, size, 0);
}

static CUcontext current_ctx(void)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUcontext ctx = NULL;

	if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
		return NULL;
	return ctx;
}

/* --- the tables (vmm_lock held) ------------------------------------------ */

static unsigned bucket(uint64_t key)
{
	return (unsigned)(((key >> 9) * UINT64_C(0x9E3779B97F4A7C15)) >> 54) % BUCKETS;
}

/* The first index whose vbuf starts at or after va. */
static size_t va_lower(CUdeviceptr va)
{
	size_t lo = 0, hi = nva;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (by_va[mid]->va < va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The first vbuf overlapping [va, va + max(size, 1)) at index >= *pos, or
 * NULL; advances *pos past it. Start with *pos = SIZE_MAX. */
static struct vbuf *va_next_overlap(CUdeviceptr va, size_t size, size_t *pos)
{
	CUdeviceptr end = va + (size ? size : 1);

	if (*pos == SIZE_MAX) {
		*pos = va_lower(va);
		if (*pos > 0 && by_va[*pos - 1]->va + by_va[*pos - 1]->size > va)
			(*pos)--;
	}
	if (*pos < nva && by_va[*pos]->va < end)
		return by_va[(*pos)++];
	return NULL;
}

static struct vbuf *va_find(CUdeviceptr va)
{
	size_t i = va_lower(va);

	return i < nva && by_va[i]->va == va ? by_va[i] : NULL;
}

static bool va_insert(struct vbuf *v)
{
	size_t i = va_lower(v->va);

	if (nva == cap_va) {
		size_t cap = cap_va ? cap_va * 2 : 64;
		struct vbuf **a = realloc(by_va, cap * sizeof(*a));
		if (!a)
			return false;
		by_va = a;
		cap_va = cap;
	}
	memmove(&by_va[i + 1], &by_va[i], (nva - i) * sizeof(*by_va));
	by_va[i] = v;
	atomic_store_explicit(&tracked, ++nva, memory_order_relaxed);
	return true;
}

static void va_remove(struct vbuf *v)
{
	size_t i = va_lower(v->va);

	if (i < nva && by_va[i] == v) {
		memmove(&by_va[i], &by_va[i + 1], (nva - i - 1) * sizeof(*by_va));
		atomic_store_explicit(&tracked, --nva, memory_order_relaxed);
	}
}

static struct vbuf *handle_find(CUmemGenericAllocationHandle h)
{
	struct vbuf *v = by_handle[bucket(h)];

	while (v && v->handle != h)
		v = v->hnext;
	return v;
}

static void handle_remove(struct vbuf *v)
{
	for (struct vbuf **link = &by_handle[bucket(v->handle)]; *link; link = &(*link)->hnext)
		if (*link == v) {
			*link = v->hnext;
			return;
		}
}

static struct plain_resv **resv_link(CUdeviceptr va)
{
	struct plain_resv **link = &resv_tab[bucket(va)];

	while (*link && (*link)->va != va)
		link = &(*link)->next;
	return link;
}

static struct plain_handle **hnd_link(CUmemGenericAllocationHandle h)
{
	struct plain_handle **link = &hnd_tab[bucket(h)];

	while (*link && (*link)->handle != h)
		link = &(*link)->next;
	return link;
}

/* Without memory a reservation or handle is simply not tracked: it can
 * never become a vbuf, and everything about it goes to the driver. */
static void resv_add(CUdeviceptr va, size_t size)
{
	struct plain_resv *r = *resv_link(va);

	if (!r && (r = malloc(sizeof(*r))) != NULL) {
		r->next = resv_tab[bucket(va)];
		resv_tab[bucket(va)] = r;
	}
	if (r) {
		r->va = va;
		r->size = size;
	}
}

static void resv_del(CUdeviceptr va)
{
	struct plain_resv **link = resv_link(va), *r = *link;

	if (r) {
		*link = r->next;
		free(r);
	}
}

static void hnd_add(CUmemGenericAllocationHandle h, size_t size, const CUmemAllocationProp *prop, bool cacheable)
{
	struct plain_handle *p = *hnd_link(h);

	if (!p && (p = malloc(sizeof(*p))) != NULL) {
		p->next = hnd_tab[bucket(h)];
		hnd_tab[bucket(h)] = p;
	}
	if (p) {
		p->handle = h;
		p->size = size;
		p->prop = *prop;
		p->cacheable = cacheable;
	}
}

static void hnd_del(CUmemGenericAllocationHandle h)
{
	struct plain_handle **link = hnd_link(h), *p = *link;

	if (p) {
		*link = p->next;
		free(p);
	}
}

void vmm_tables_fork_child(void)
{
	/* Leaked: the parent's objects are not the child's. */
	by_va = NULL;
	nva = cap_va = 0;
	atomic_store(&tracked, 0);
	memset(by_handle, 0, sizeof(by_handle));
	memset(resv_tab, 0, sizeof(resv_tab));
	memset(hnd_tab, 0, sizeof(hnd_tab));
}

/* --- comparing what the program asks for --------------------------------- */

static bool prop_cacheable(const CUmemAllocationProp *p)
{
	return p->type == CU_MEM_ALLOCATION_TYPE_PINNED && p->requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE &&
	       p->location.type == CU_MEM_LOCATION_TYPE_DEVICE && !p->win32HandleMetaData;
}

static bool prop_equal(const CUmemAllocationProp *a, const CUmemAllocationProp *b)
{
	return a->type == b->type && a->requestedHandleTypes == b->requestedHandleTypes &&
	       a->location.type == b->location.type && a->location.id == b->location.id &&
	       a->win32HandleMetaData == b->win32HandleMetaData &&
	       memcmp(&a->allocFlags, &b->allocFlags, sizeof(a->allocFlags)) == 0;
}

static bool access_equal(const struct vbuf *v, const CUmemAccessDesc *desc, size_t count)
{
	if (!desc || count != v->naccess)
		return false;
	for (size_t i = 0; i < count; i++)
		if (desc[i].location.type != v->access[i].location.type ||
		    desc[i].location.id != v->access[i].location.id || desc[i].flags != v->access[i].flags)
			return false;
	return true;
}

/* What libemm holds physically: everything, access once the program set it. */
static unsigned physical(const struct vbuf *v)
{
	return L_RESERVED | L_CREATED | L_MAPPED | (v->access_set ? L_ACCESS : 0);
}

static bool consistent(const struct vbuf *v)
{
	return v->l == physical(v);
}

/* A live vbuf whose free may be deferred. */
static bool deferrable(const struct vbuf *v)
{
	return !v->nocache && v->access_set && v->list == VB_NONE && !st_is_exiting();
}

/* --- batches: vbufs taken under the lock, made real after it ------------- */

struct batch {
	struct vbuf *v[BATCH_MAX];
	unsigned n;
};

static void batch_take(struct batch *b, struct vbuf *v)
{
	if (v->busy || b->n == BATCH_MAX)
		return; /* someone else is at it; or later (the reaper) */
	v->busy = true;
	vmm_list_del_locked(v);
	b->v[b->n++] = v;
}

static void batch_run(struct batch *b)
{
	for (unsigned i = 0; i < b->n; i++)
		vmm_materialize(b->v[i]);
	b->n = 0;
}

/* Rule (a): this thread's pending deferrals, but `keep`, are made real by
 * any other VMM call it makes. */
static void take_own_pending(struct batch *b, const struct vbuf *keep)
{
	uint64_t self = vmm_thread_id();

	for (struct vbuf *v = vmm_pending_head_locked(), *next; v; v = next) {
		next = v->next;
		if (v != keep && v->owner == self)
			batch_take(b, v);
	}
}

/* Wait until nothing the call names is busy. */
static void wait_unbusy(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle h)
{
	for (;;) {
		struct vbuf *v, *hv = has_handle ? handle_find(h) : NULL;
		bool busy = hv && hv->busy;
		size_t pos = SIZE_MAX;

		while (!busy && va && (v = va_next_overlap(va, size, &pos)) != NULL)
			busy = v->busy;
		if (!busy)
			return;
		pthread_cond_wait(&vmm_busy_cond, &vmm_lock);
	}
}

/* Take what the call touches: every vbuf it names (`all`), or only those
 * whose physical state differs from the program's view. */
static void take_touched(struct batch *b, CUdeviceptr va, size_t size, bool has_handle,
                         CUmemGenericAllocationHandle h, bool all)
{
	struct vbuf *v;
	size_t pos = SIZE_MAX;

	while (va && (v = va_next_overlap(va, size, &pos)) != NULL)
		if (all || !consistent(v))
			batch_take(b, v);
	if (has_handle && (v = handle_find(h)) != NULL && (all || !consistent(v)))
		batch_take(b, v);
}

/* The common prologue of a call the driver answers. */
static void pass_prologue(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle h, bool all)
{
	struct batch b = {.n = 0};

	if (!atomic_load_explicit(&tracked, memory_order_relaxed))
		return;
	st_lock(&vmm_lock);
	wait_unbusy(va, size, has_handle, h);
	take_own_pending(&b, NULL);
	take_touched(&b, va, size, has_handle, h, all);
	st_unlock(&vmm_lock);
	batch_run(&b);
}

/* --- making deferred operations real ------------------------------------- */

static void real_call(const char *what, CUresult r, const struct vbuf *v)
{
	if (r != CUDA_SUCCESS)
		emm_debug("%s of the VMM buffer %#llx (%zu bytes) failed (%d)", what, (unsigned long long)v->va,
		          v->size, (int)r);
}

void vmm_materialize(struct vbuf *v)
{
	const struct emm_real_vmm_table *vm = emm_real_vmm();
	unsigned p = physical(v), l = v->l;
	struct emm_fence_ops ops;

	st_assert_unlocked("making a deferred VMM operation real");
	if (p != l && vm->cuMemUnmap && vm->cuMemMap && vm->cuMemRelease && vm->cuMemAddressFree) {
		if ((p & L_MAPPED) && !(l & L_MAPPED)) {
			real_call("cuMemUnmap", vm->cuMemUnmap(v->va, v->size), v);
		} else if ((l & L_MAPPED) && !(l & L_ACCESS) && (p & L_ACCESS)) {
			/* Mapped again by the program but without its access yet:
			 * a fresh mapping has none. */
			real_call("cuMemUnmap", vm->cuMemUnmap(v->va, v->size), v);
			real_call("cuMemMap", vm->cuMemMap(v->va, v->size, 0, v->handle, 0), v);
		}
		if (!(l & L_CREATED))
			real_call("cuMemRelease", vm->cuMemRelease(v->handle), v);
		if (!(l & L_RESERVED))
			real_call("cuMemAddressFree", vm->cuMemAddressFree(v->va, v->size), v);
		vmm_count(l ? VC_MATERIALIZED : VC_IDLE_RELEASED, v->device, 1);
	}
	if (v->nfences) {
		emm_fence_ops_init(v->pool, &ops);
		for (unsigned i = 0; i < v->nfences; i++)
			ops.release(ops.ctx, v->fences[i]);
		v->nfences = 0;
	}
	st_lock(&vmm_lock);
	va_remove(v);
	handle_remove(v);
	if (l & L_RESERVED)
		resv_add(v->va, v->size);
	if (l & L_CREATED)
		hnd_add(v->handle, v->size, &v->prop, false);
	pthread_cond_broadcast(&vmm_busy_cond);
	st_unlock(&vmm_lock);
	free(v);
}

/* --- the calls ----------------------------------------------------------- */

int emm_vmm_reserve(size_t size, size_t align, CUdeviceptr addr, unsigned long long flags, CUdeviceptr *ret_va)
{
	struct batch b = {.n = 0};
	struct vbuf *hit = NULL;
	CUdeviceptr va = 0;
	CUcontext ctx;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return 0;
	ctx = current_ctx();
	st_lock(&vmm_lock);
	take_own_pending(&b, NULL);
	if (ret_va && size && !addr && !flags && !(align & (align - 1)) && !st_is_exiting())
		hit = vmm_idle_take_locked(size, align, ctx);
	if (hit) {
		hit->l = L_RESERVED;
		hit->owner = vmm_thread_id();
		hit->busy = false;
		vmm_list_add_locked(hit, VB_PENDING);
		vmm_reaper_kick_locked();
		pthread_cond_broadcast(&vmm_busy_cond);
		va = hit->va;
	}
	st_unlock(&vmm_lock);
	batch_run(&b);
	if (!hit)
		return 0;
	*ret_va = va;
	return 1;
}

void emm_vmm_reserve_done(CUdeviceptr va, size_t size, CUdeviceptr addr, unsigned long long flags, bool ok)
{
	if (!ok || addr || flags || !cache_on())
		return;
	st_lock(&vmm_lock);
	resv_add(va, size);
	st_unlock(&vmm_lock);
}

int emm_vmm_create(size_t size, const CUmemAllocationProp *prop, unsigned long long flags,
                   CUmemGenericAllocationHandle *ret_handle)
{
	struct batch b = {.n = 0};
	struct vbuf *hit = NULL;
	CUmemGenericAllocationHandle h = 0;
	uint64_t self = vmm_thread_id();
	int device = 0;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return 0;
	st_lock(&vmm_lock);
	if (ret_handle && prop && !flags)
		for (struct vbuf *v = vmm_pending_head_locked(); v && !hit; v = v->next)
			if (v->owner == self && !v->busy && v->l == L_RESERVED && v->size == size &&
			    prop_equal(prop, &v->prop))
				hit = v;
	take_own_pending(&b, hit);
	if (hit) {
		hit->l |= L_CREATED;
		h = hit->handle;
		device = hit->device;
	}
	st_unlock(&vmm_lock);
	batch_run(&b);
	if (!hit)
		return 0;
	vmm_count(VC_ALLOCS, device, 1);
	vmm_count(VC_HITS, device, 1);
	vmm_count(VC_HIT_BYTES, device, size);
	*ret_handle = h;
	return 1;
}

void emm_vmm_create_done(CUmemGenericAllocationHandle handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags, bool ok)
{
	enum emm_vmm_mode_value mode = emm_vmm_mode();
	int device = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;

	if (!ok || mode == EMM_VMM_MODE_OFF)
		return;
	vmm_count(VC_ALLOCS, device, 1);
	vmm_count(VC_MISSES, device, 1);
	if (mode != EMM_VMM_MODE_CACHE)
		return;
	st_lock(&vmm_lock);
	hnd_add(handle, size, prop, !flags && prop_cacheable(prop));
	st_unlock(&vmm_lock);
}

int emm_vmm_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                unsigned long long flags)
{
	struct batch b = {.n = 0};
	struct vbuf *v;
	bool served = false;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return 0;
	st_lock(&vmm_lock);
	wait_unbusy(va, size, true, handle);
	v = handle_find(handle);
	if (v && v->owner == vmm_thread_id() && v->list == VB_PENDING && v->l == (L_RESERVED | L_CREATED) &&
	    v->va == va && v->size == size && !offset && !flags) {
		v->l |= L_MAPPED;
		served = true;
	}
	take_own_pending(&b, served ? v : NULL);
	if (!served)
		take_touched(&b, va, size, true, handle, true);
	st_unlock(&vmm_lock);
	batch_run(&b);
	if (served)
		trace(EMM_TRACE_ALLOCATE, va, size);
	return served;
}

void emm_vmm_map_done(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags, bool ok)
{
	enum emm_vmm_mode_value mode = emm_vmm_mode();
	struct plain_resv **rl;
	struct plain_handle **hl;
	struct vbuf *v;
	CUcontext ctx;

	if (!ok || mode == EMM_VMM_MODE_OFF)
		return;
	trace(EMM_TRACE_ALLOCATE, va, size);
	if (mode != EMM_VMM_MODE_CACHE)
		return;
	ctx = current_ctx();
	v = calloc(1, sizeof(*v));
	st_lock(&vmm_lock);
	rl = resv_link(va);
	hl = hnd_link(handle);
	if (v && ctx && !offset && !flags && *rl && (*rl)->size == size && *hl && (*hl)->size == size &&
	    (*hl)->cacheable && !handle_find(handle)) {
		v->va = va;
		v->size = size;
		v->handle = handle;
		v->prop = (*hl)->prop;
		v->ctx = ctx;
		v->device = v->prop.location.id;
		v->l = L_RESERVED | L_CREATED | L_MAPPED;
		if (va_insert(v)) {
			v->hnext = by_handle[bucket(handle)];
			by_handle[bucket(handle)] = v;
			resv_del(va);
			hnd_del(handle);
			v = NULL;
		}
	} else if (*hl) {
		(*hl)->cacheable = false; /* mapped once: never its first mapping again */
	}
	st_unlock(&vmm_lock);
	free(v);
}

int emm_vmm_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	struct batch b = {.n = 0};
	struct vbuf *v;
	bool served = false;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return 0;
	st_lock(&vmm_lock);
	wait_unbusy(va, size, false, 0);
	v = va_find(va);
	if (v && v->owner == vmm_thread_id() && v->list == VB_PENDING &&
	    v->l == (L_RESERVED | L_CREATED | L_MAPPED) && v->size == size && access_equal(v, desc, count)) {
		v->l = L_ALL;
		vmm_list_del_locked(v); /* live again */
		served = true;
	}
	take_own_pending(&b, NULL);
	if (!served)
		take_touched(&b, va, size, false, 0, false);
	st_unlock(&vmm_lock);
	batch_run(&b);
	return served;
}

void emm_vmm_set_access_done(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count, bool ok)
{
	struct vbuf *v;
	size_t pos = SIZE_MAX;

	if (!ok || !cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return;
	st_lock(&vmm_lock);
	while ((v = va_next_overlap(va, size, &pos)) != NULL) {
		/* The program's first access of the whole buffer is what a
		 * reuse must repeat; anything else (a second call, a part of
		 * it, more descriptors than kept) keeps it out of the cache. */
		if (v->va == va && v->size == size && !v->access_set && count && count <= VMM_MAX_ACCESS) {
			memcpy(v->access, desc, count * sizeof(*desc));
			v->naccess = (unsigned)count;
		} else {
			v->nocache = true;
		}
		if (v->va == va && v->size == size && (v->l & L_MAPPED)) {
			v->access_set = true;
			v->l |= L_ACCESS;
		}
	}
	st_unlock(&vmm_lock);
}

int emm_vmm_unmap(CUdeviceptr va, size_t size)
{
	struct batch b = {.n = 0};
	struct vbuf *v;
	bool served = false;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return 0;
	st_lock(&vmm_lock);
	wait_unbusy(va, size, false, 0);
	v = va_find(va);
	if (v && v->size == size && (v->l & (L_MAPPED | L_ACCESS)) == (L_MAPPED | L_ACCESS) && deferrable(v)) {
		v->l &= ~(L_MAPPED | L_ACCESS);
		v->owner = vmm_thread_id();
		vmm_list_add_locked(v, VB_PENDING);
		vmm_reaper_kick_locked();
		served = true;
	}
	take_own_pending(&b, served ? v : NULL);
	if (!served)
		take_touched(&b, va, size, false, 0, true);
	st_unlock(&vmm_lock);
	batch_run(&b);
	if (served)
		trace(EMM_TRACE_FREE, va, size);
	return served;
}

void emm_vmm_unmap_done(CUdeviceptr va, size_t size, bool ok)
{
	if (ok && emm_vmm_mode() != EMM_VMM_MODE_OFF)
		trace(EMM_TRACE_FREE, va, size);
}

/* The last deferred step of a free came: v (l == 0) goes idle. */
static void went_idle_locked(struct vbuf *v, struct vbuf **ret)
{
	vmm_list_del_locked(v);
	v->busy = true;
	*ret = v;
}

int emm_vmm_release(CUmemGenericAllocationHandle handle)
{
	struct batch b = {.n = 0};
	struct vbuf *v, *idle = NULL;
	bool served = false;
	int device = -1;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return 0;
	st_lock(&vmm_lock);
	wait_unbusy(0, 0, true, handle);
	v = handle_find(handle);
	if (v && (v->l & L_CREATED) && !v->nocache && v->access_set && !st_is_exiting() &&
	    (v->list == VB_NONE || (v->list == VB_PENDING && !(v->l & L_MAPPED)))) {
		v->l &= ~L_CREATED;
		v->owner = vmm_thread_id();
		device = v->device;
		if (!v->l)
			went_idle_locked(v, &idle);
		served = true;
	}
	take_own_pending(&b, served ? v : NULL);
	if (!served)
		take_touched(&b, 0, 0, true, handle, true);
	st_unlock(&vmm_lock);
	batch_run(&b);
	if (idle)
		vmm_make_idle(idle);
	if (served)
		vmm_count(VC_FREES, device, 1);
	return served;
}

void emm_vmm_release_done(CUmemGenericAllocationHandle handle, bool ok)
{
	enum emm_vmm_mode_value mode = emm_vmm_mode();

	if (!ok || mode == EMM_VMM_MODE_OFF)
		return;
	vmm_count(VC_FREES, st_tls_device(), 1);
	if (mode != EMM_VMM_MODE_CACHE)
		return;
	st_lock(&vmm_lock);
	hnd_del(handle);
	st_unlock(&vmm_lock);
}

int emm_vmm_address_free(CUdeviceptr va, size_t size)
{
	struct batch b = {.n = 0};
	struct vbuf *v, *idle = NULL;
	bool served = false;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return 0;
	st_lock(&vmm_lock);
	wait_unbusy(va, size, false, 0);
	v = va_find(va);
	/* Pending with its mapping gone: an unmap was deferred. */
	if (v && v->size == size && v->list == VB_PENDING && (v->l & L_RESERVED) && !(v->l & L_MAPPED) &&
	    !st_is_exiting()) {
		v->l &= ~L_RESERVED;
		v->owner = vmm_thread_id();
		if (!v->l)
			went_idle_locked(v, &idle);
		served = true;
	}
	take_own_pending(&b, served ? v : NULL);
	if (!served)
		take_touched(&b, va, size, false, 0, true);
	st_unlock(&vmm_lock);
	batch_run(&b);
	if (idle)
		vmm_make_idle(idle);
	return served;
}

void emm_vmm_address_free_done(CUdeviceptr va, size_t size, bool ok)
{
	(void)size;
	if (!ok || !cache_on())
		return;
	st_lock(&vmm_lock);
	resv_del(va);
	st_unlock(&vmm_lock);
}

void emm_vmm_touch(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle handle, bool pin)
{
	struct plain_handle *p;
	struct vbuf *v;
	size_t pos = SIZE_MAX;

	if (!cache_on())
		return;
	pass_prologue(va, size, has_handle, handle, false);
	if (!pin)
		return;
	st_lock(&vmm_lock);
	while (va && (v = va_next_overlap(va, size, &pos)) != NULL)
		v->nocache = true;
	if (has_handle && (v = handle_find(handle)) != NULL)
		v->nocache = true;
	if (has_handle && (p = *hnd_link(handle)) != NULL)
		p->cacheable = false;
	st_unlock(&vmm_lock);
}

void emm_vmm_imported(CUmemGenericAllocationHandle handle)
{
	if (cache_on())
		emm_vmm_touch(0, 0, true, handle, true);
}

void emm_vmm_flush_pending(void)
{
	struct batch b = {.n = 0};
	unsigned taken;

	if (!cache_on() || !atomic_load_explicit(&tracked, memory_order_relaxed))
		return;
	do {
		st_lock(&vmm_lock);
		for (struct vbuf *v = vmm_pending_head_locked(), *next; v; v = next) {
			next = v->next;
			batch_take(&b, v);
		}
		st_unlock(&vmm_lock);
		taken = b.n;
		batch_run(&b);
	} while (taken == BATCH_MAX);
}
