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
 * Making deferred operations real is vmm_defer.c's; fences, idle buffers
 * and the reaper vmm_idle.c's; the lookup tables vmm_table.c's.
 *
 * Locks: vmm_lock (a leaf) over everything here; no driver call under it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/trace.h"
#include "common/log.h"
#include "process/process_internal.h"
#include "process/vmm_internal.h"

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

/* --- comparing what the program asks for --------------------------------- */

/* A handle that may carry a shareable type (XLA asks for POSIX file
 * descriptors on every buffer) stays cacheable until it is actually
 * exported: cuMemExportToShareableHandle pins it (emm_vmm_touch). */
static bool prop_cacheable(const CUmemAllocationProp *p)
{
	return p->type == CU_MEM_ALLOCATION_TYPE_PINNED && p->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
	       !p->win32HandleMetaData;
}

bool vmm_prop_equal(const CUmemAllocationProp *a, const CUmemAllocationProp *b)
{
	return a->type == b->type && a->requestedHandleTypes == b->requestedHandleTypes &&
	       a->location.type == b->location.type && a->location.id == b->location.id &&
	       a->win32HandleMetaData == b->win32HandleMetaData &&
	       memcmp(&a->allocFlags, &b->allocFlags, sizeof(a->allocFlags)) == 0;
}

static bool access_known(const struct vbuf *v, const CUmemAccessDesc *d)
{
	for (unsigned i = 0; i < v->naccess; i++)
		if (d->location.type == v->access[i].location.type && d->location.id == v->access[i].location.id &&
		    d->flags == v->access[i].flags)
			return true;
	return false;
}

/* Every descriptor of the call is one the buffer's mapping already has
 * (the program's whole-buffer cuMemSetAccess calls, accumulated: XLA on
 * two GPUs grants each device in a call of its own). */
static bool access_subset(const struct vbuf *v, const CUmemAccessDesc *desc, size_t count)
{
	if (!desc || !count)
		return false;
	for (size_t i = 0; i < count; i++)
		if (!access_known(v, &desc[i]))
			return false;
	return true;
}

/* A live vbuf whose free may be deferred. */
static bool deferrable(const struct vbuf *v)
{
	return !v->nocache && v->access_set && v->list == VB_NONE && !st_is_exiting();
}

/* An idle buffer (taken by vmm_idle_take_locked) now on its way back to
 * this thread's program: the first step `l` of the sequence seen, the
 * rest pending. Lock held. */
static void claim_idle_locked(struct vbuf *v, unsigned l)
{
	v->l = l;
	v->owner = st_thread_uid();
	v->busy = false;
	vmm_list_add_locked(v, VB_PENDING);
	vmm_reaper_kick_locked();
	pthread_cond_broadcast(&vmm_busy_cond);
}

/* --- the calls ----------------------------------------------------------- */

int emm_vmm_reserve(size_t size, size_t align, CUdeviceptr addr, unsigned long long flags, CUdeviceptr *ret_va)
{
	struct vmm_batch b = {.n = 0};
	struct vbuf *hit = NULL;
	CUdeviceptr va = 0;
	CUcontext ctx;

	if (!cache_on() || !vmm_tracked())
		return 0;
	ctx = current_ctx();
	st_lock(&vmm_lock);
	if (ret_va && size && !addr && !flags && !(align & (align - 1)) && !st_is_exiting()) {
		/* The buffer this thread's cuMemCreate already took (XLA creates
		 * the handle first): its range. The thread's other pending
		 * deferrals are made real (rule (a)), not this one. */
		uint64_t self = st_thread_uid();
		struct vbuf *mine = NULL;
		for (struct vbuf *v = vmm_pending_head_locked(); v && !mine; v = v->next)
			if (v->owner == self && !v->busy && v->l == L_CREATED && v->size == size &&
			    !(align && v->va % align))
				mine = v;
		vmm_take_own_pending(&b, mine);
		if (mine) {
			mine->l |= L_RESERVED;
			va = mine->va;
			st_unlock(&vmm_lock);
			vmm_batch_run(&b);
			*ret_va = va;
			return 1;
		}
		hit = vmm_idle_take_locked(size, align, ctx, NULL);
	} else {
		vmm_take_own_pending(&b, NULL);
	}
	if (hit) {
		claim_idle_locked(hit, L_RESERVED);
		va = hit->va;
	}
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
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
	vmm_resv_add(va, size);
	st_unlock(&vmm_lock);
}

int emm_vmm_create(size_t size, const CUmemAllocationProp *prop, unsigned long long flags,
                   CUmemGenericAllocationHandle *ret_handle)
{
	struct vmm_batch b = {.n = 0};
	struct vbuf *hit = NULL;
	CUmemGenericAllocationHandle h = 0;
	uint64_t self = st_thread_uid();
	CUcontext ctx;
	int device = 0;

	if (!cache_on() || !vmm_tracked())
		return 0;
	ctx = current_ctx(); /* a driver call: before the lock */
	st_lock(&vmm_lock);
	if (ret_handle && prop && !flags)
		for (struct vbuf *v = vmm_pending_head_locked(); v && !hit; v = v->next)
			if (v->owner == self && !v->busy && v->l == L_RESERVED && v->size == size &&
			    vmm_prop_equal(prop, &v->prop))
				hit = v;
	vmm_take_own_pending(&b, hit);
	if (hit) {
		hit->l |= L_CREATED;
	} else if (ret_handle && prop && !flags && !st_is_exiting()) {
		/* Created before its range is reserved (XLA's order): an idle
		 * buffer of this size and these properties; the same thread's
		 * cuMemAddressReserve then takes its range. */
		hit = vmm_idle_take_locked(size, 0, ctx, prop);
		if (hit)
			claim_idle_locked(hit, L_CREATED);
	}
	if (hit) {
		h = hit->handle;
		device = hit->device;
	}
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
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

	if (ok)
		emm_state_passby(EMM_PASSBY_VMM, size);
	if (!ok || mode == EMM_VMM_MODE_OFF)
		return;
	vmm_count(VC_ALLOCS, device, 1);
	vmm_count(VC_MISSES, device, 1);
	if (mode != EMM_VMM_MODE_CACHE)
		return;
	st_lock(&vmm_lock);
	vmm_hnd_add(handle, size, prop, !flags && prop_cacheable(prop));
	st_unlock(&vmm_lock);
}

int emm_vmm_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                unsigned long long flags)
{
	struct vmm_batch b = {.n = 0};
	struct vbuf *v;
	bool served = false;

	if (!cache_on() || !vmm_tracked())
		return 0;
	st_lock(&vmm_lock);
	vmm_wait_unbusy(va, size, true, handle);
	v = vmm_handle_find(handle);
	if (v && v->owner == st_thread_uid() && v->list == VB_PENDING && v->l == (L_RESERVED | L_CREATED) &&
	    v->va == va && v->size == size && !offset && !flags) {
		v->l |= L_MAPPED;
		served = true;
	}
	vmm_take_own_pending(&b, served ? v : NULL);
	if (!served)
		vmm_take_touched(&b, va, size, true, handle, true);
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
	if (served)
		trace(EMM_TRACE_ALLOCATE, va, size);
	return served;
}

void emm_vmm_map_done(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags, bool ok)
{
	enum emm_vmm_mode_value mode = emm_vmm_mode();
	struct plain_resv *r;
	struct plain_handle *hd;
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
	r = vmm_resv_find(va);
	hd = vmm_hnd_find(handle);
	if (v && ctx && !offset && !flags && r && r->size == size && hd && hd->size == size && hd->cacheable &&
	    !vmm_handle_find(handle)) {
		v->va = va;
		v->size = size;
		v->handle = handle;
		v->prop = hd->prop;
		v->ctx = ctx;
		v->device = v->prop.location.id;
		v->l = L_RESERVED | L_CREATED | L_MAPPED;
		if (vmm_va_insert(v)) {
			vmm_handle_insert(v);
			vmm_resv_del(va);
			vmm_hnd_del(handle);
			v = NULL;
		}
	} else if (hd) {
		hd->cacheable = false; /* mapped once: never its first mapping again */
	} else {
		/* Another thread's first mapping of this handle, done
		 * meanwhile, made it a cached buffer at its own range: mapped
		 * twice, it must never be reused. */
		struct vbuf *o = vmm_handle_find(handle);
		if (o && o->va != va)
			o->nocache = true;
	}
	st_unlock(&vmm_lock);
	free(v);
}

int emm_vmm_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	struct vmm_batch b = {.n = 0};
	struct vbuf *v;
	bool served = false;

	if (!cache_on() || !vmm_tracked())
		return 0;
	st_lock(&vmm_lock);
	vmm_wait_unbusy(va, size, false, 0);
	v = vmm_va_find(va);
	if (v && v->owner == st_thread_uid() && v->list == VB_PENDING &&
	    v->l == (L_RESERVED | L_CREATED | L_MAPPED) && v->size == size && access_subset(v, desc, count)) {
		v->l = L_ALL;
		vmm_list_del_locked(v); /* live again */
		served = true;
	}
	vmm_take_own_pending(&b, NULL);
	if (!served)
		vmm_take_touched(&b, va, size, false, 0, false);
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
	return served;
}

void emm_vmm_set_access_done(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count, bool ok)
{
	struct vbuf *v;
	size_t pos = SIZE_MAX;

	if (!ok || !cache_on() || !vmm_tracked())
		return;
	st_lock(&vmm_lock);
	while ((v = vmm_va_next_overlap(va, size, &pos)) != NULL) {
		/* The accesses the program gives the whole buffer, accumulated
		 * over its calls, are what a reuse keeps mapped: a later call
		 * for a location replaces what an earlier one set there (a
		 * buffer made read-only is not served to a request for
		 * read-write); a call for a part of it, or more distinct
		 * locations than kept, keeps it out of the cache. */
		bool whole = v->va == va && v->size == size && count;
		for (size_t i = 0; whole && i < count; i++) {
			unsigned k = 0;
			while (k < v->naccess && (v->access[k].location.type != desc[i].location.type ||
			                          v->access[k].location.id != desc[i].location.id))
				k++;
			if (k < v->naccess)
				v->access[k].flags = desc[i].flags;
			else if (v->naccess == VMM_MAX_ACCESS)
				whole = false;
			else
				v->access[v->naccess++] = desc[i];
		}
		if (!whole)
			v->nocache = true;
		if (v->va == va && v->size == size && (v->l & L_MAPPED)) {
			v->access_set = true;
			v->l |= L_ACCESS;
		}
	}
	st_unlock(&vmm_lock);
}

int emm_vmm_unmap(CUdeviceptr va, size_t size)
{
	struct vmm_batch b = {.n = 0};
	struct vbuf *v;
	bool served = false;

	if (!cache_on() || !vmm_tracked())
		return 0;
	st_lock(&vmm_lock);
	vmm_wait_unbusy(va, size, false, 0);
	v = vmm_va_find(va);
	if (v && v->size == size && (v->l & (L_MAPPED | L_ACCESS)) == (L_MAPPED | L_ACCESS) && deferrable(v)) {
		v->l &= ~(L_MAPPED | L_ACCESS);
		v->owner = st_thread_uid();
		vmm_list_add_locked(v, VB_PENDING);
		vmm_reaper_kick_locked();
		served = true;
	}
	vmm_take_own_pending(&b, served ? v : NULL);
	if (!served)
		vmm_take_touched(&b, va, size, false, 0, true);
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
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
	struct vmm_batch b = {.n = 0};
	struct vbuf *v, *idle = NULL;
	bool served = false;
	int device = -1;

	if (!cache_on() || !vmm_tracked())
		return 0;
	st_lock(&vmm_lock);
	vmm_wait_unbusy(0, 0, true, handle);
	v = vmm_handle_find(handle);
	if (v && (v->l & L_CREATED) && !v->nocache && v->access_set && !st_is_exiting() &&
	    (v->list == VB_NONE || (v->list == VB_PENDING && !(v->l & L_MAPPED)))) {
		v->l &= ~L_CREATED;
		v->owner = st_thread_uid();
		device = v->device;
		if (!v->l)
			went_idle_locked(v, &idle);
		served = true;
	}
	vmm_take_own_pending(&b, served ? v : NULL);
	if (!served)
		vmm_take_touched(&b, 0, 0, true, handle, true);
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
	if (idle)
		vmm_make_idle(idle);
	if (served)
		vmm_count(VC_FREES, device, 1);
	return served;
}

void emm_vmm_release_done(CUmemGenericAllocationHandle handle, bool ok)
{
	enum emm_vmm_mode_value mode = emm_vmm_mode();

	struct plain_handle *hd;
	int device = st_tls_device();

	if (!ok || mode == EMM_VMM_MODE_OFF)
		return;
	if (mode == EMM_VMM_MODE_CACHE) {
		/* The free counts on the handle's device, which need not be
		 * the current context's (EMM_VMM=count keeps no table: there
		 * it is the thread's device). */
		st_lock(&vmm_lock);
		hd = vmm_hnd_find(handle);
		if (hd && hd->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
			device = hd->prop.location.id;
		vmm_hnd_del(handle);
		st_unlock(&vmm_lock);
	}
	vmm_count(VC_FREES, device, 1);
}

int emm_vmm_address_free(CUdeviceptr va, size_t size)
{
	struct vmm_batch b = {.n = 0};
	struct vbuf *v, *idle = NULL;
	bool served = false;

	if (!cache_on() || !vmm_tracked())
		return 0;
	st_lock(&vmm_lock);
	vmm_wait_unbusy(va, size, false, 0);
	v = vmm_va_find(va);
	/* Pending with its mapping gone: an unmap was deferred. */
	if (v && v->size == size && v->list == VB_PENDING && (v->l & L_RESERVED) && !(v->l & L_MAPPED) &&
	    !st_is_exiting()) {
		v->l &= ~L_RESERVED;
		v->owner = st_thread_uid();
		if (!v->l)
			went_idle_locked(v, &idle);
		served = true;
	}
	vmm_take_own_pending(&b, served ? v : NULL);
	if (!served)
		vmm_take_touched(&b, va, size, false, 0, true);
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
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
	vmm_resv_del(va);
	st_unlock(&vmm_lock);
}

void emm_vmm_touch(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle handle, bool pin)
{
	struct plain_handle *p;
	struct vbuf *v;
	size_t pos = SIZE_MAX;

	if (!cache_on())
		return;
	vmm_pass_prologue(va, size, has_handle, handle, false);
	if (!pin)
		return;
	st_lock(&vmm_lock);
	while (va && (v = vmm_va_next_overlap(va, size, &pos)) != NULL)
		v->nocache = true;
	if (has_handle && (v = vmm_handle_find(handle)) != NULL)
		v->nocache = true;
	if (has_handle && (p = vmm_hnd_find(handle)) != NULL)
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
	struct vmm_batch b = {.n = 0};
	unsigned taken;

	if (!cache_on() || !vmm_tracked())
		return;
	do {
		st_lock(&vmm_lock);
		for (struct vbuf *v = vmm_pending_head_locked(), *next; v; v = next) {
			next = v->next;
			vmm_batch_take(&b, v);
		}
		st_unlock(&vmm_lock);
		taken = b.n;
		vmm_batch_run(&b);
	} while (taken == VMM_BATCH_MAX);
}
