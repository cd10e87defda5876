/* SPDX-License-Identifier: MIT */
/*
 * process/vmm_defer.c - deferred VMM operations: the vbufs a call touches,
 * taken under vmm_lock in a batch and made real after it (the real
 * cuMemUnmap, cuMemMap, cuMemRelease, cuMemAddressFree), the rule that a
 * thread's other VMM call makes its pending deferrals real, and waiting
 * for a vbuf another thread is making real. The state machine that defers
 * them is vmm.c's.
 */
#include <stdlib.h>

#include "common/log.h"
#include "process/process_internal.h"
#include "process/vmm_internal.h"

/* --- batches: vbufs taken under the lock, made real after it ------------- */

void vmm_batch_take(struct vmm_batch *b, struct vbuf *v)
{
	if (v->busy || b->n == VMM_BATCH_MAX)
		return; /* someone else is at it; or later (the reaper) */
	v->busy = true;
	vmm_list_del_locked(v);
	b->v[b->n++] = v;
}

void vmm_batch_run(struct vmm_batch *b)
{
	for (unsigned i = 0; i < b->n; i++)
		vmm_materialize(b->v[i]);
	b->n = 0;
}

/* Rule (a): this thread's pending deferrals, but `keep`, are made real by
 * any other VMM call it makes. */
void vmm_take_own_pending(struct vmm_batch *b, const struct vbuf *keep)
{
	uint64_t self = st_thread_uid();

	for (struct vbuf *v = vmm_pending_head_locked(), *next; v; v = next) {
		next = v->next;
		if (v != keep && v->owner == self)
			vmm_batch_take(b, v);
	}
}

/* Wait until nothing the call names is busy. */
void vmm_wait_unbusy(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle h)
{
	for (;;) {
		struct vbuf *v, *hv = has_handle ? vmm_handle_find(h) : NULL;
		bool busy = hv && hv->busy;
		size_t pos = SIZE_MAX;

		while (!busy && va && (v = vmm_va_next_overlap(va, size, &pos)) != NULL)
			busy = v->busy;
		if (!busy)
			return;
		pthread_cond_wait(&vmm_busy_cond, &vmm_lock);
	}
}

/* Take what the call touches: every vbuf it names (`all`), or only those
 * whose physical state differs from the program's view. */
void vmm_take_touched(struct vmm_batch *b, CUdeviceptr va, size_t size, bool has_handle,
                         CUmemGenericAllocationHandle h, bool all)
{
	struct vbuf *v;
	size_t pos = SIZE_MAX;

	while (va && (v = vmm_va_next_overlap(va, size, &pos)) != NULL)
		if (all || !vmm_consistent(v))
			vmm_batch_take(b, v);
	if (has_handle && (v = vmm_handle_find(h)) != NULL && (all || !vmm_consistent(v)))
		vmm_batch_take(b, v);
}

/* The common prologue of a call the driver answers. */
void vmm_pass_prologue(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle h, bool all)
{
	struct vmm_batch b = {.n = 0};

	if (!vmm_tracked())
		return;
	st_lock(&vmm_lock);
	vmm_wait_unbusy(va, size, has_handle, h);
	vmm_take_own_pending(&b, NULL);
	vmm_take_touched(&b, va, size, has_handle, h, all);
	st_unlock(&vmm_lock);
	vmm_batch_run(&b);
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
	unsigned p = vmm_physical(v), l = v->l;
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
	vmm_va_remove(v);
	vmm_handle_remove(v);
	if (l & L_RESERVED)
		vmm_resv_add(v->va, v->size);
	if (l & L_CREATED)
		vmm_hnd_add(v->handle, v->size, &v->prop, false);
	pthread_cond_broadcast(&vmm_busy_cond);
	st_unlock(&vmm_lock);
	free(v);
}
