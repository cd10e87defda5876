/* SPDX-License-Identifier: MIT */
/*
 * process/ipc_export.c - the exporting side of legacy CUDA IPC
 * (cuIpcGetMemHandle; ipc.c has the overview): a block's libemm handle,
 * and keeping its segment allocated while an importer has it open.
 *
 * Exporter. A block that is its whole segment is exported with the
 * driver's own handle (any importer, with or without libemm, opens its
 * bytes). A block inside a segment gets a libemm handle (ipc_internal.h):
 * the driver's handle of the segment, the block's offset and size go into
 * the per-user registry (ipc_registry.c) under (this process, a serial);
 * exporting the same block again gives the same handle. A process without
 * libemm hands a libemm handle to the driver, which refuses it (the
 * driver's handle of the segment is not in it): never the segment's first
 * bytes.
 *
 * Lifetime (the decision). A segment with a block exported this way
 * stays allocated while a libemm process has it open: each importer
 * records in the registry which segments it has open (a dead importer's
 * record does not count). When the heap gives the segment back (release
 * threshold, OOM retry, emm_release_idle) and an importer still has it,
 * the backend free is skipped and the segment kept here, unused ("retired"),
 * until a later give-back or emm_release_idle finds nobody holding it, or
 * its context goes; when nobody has it, it is freed at once and its
 * handles stop opening (CUDA_ERROR_INVALID_VALUE), as the driver's handles
 * of freed memory do. So an importer's mapping stays valid whatever the
 * exporter frees; reusing a freed block's bytes while an importer still
 * uses them is the program's error, as CUDA makes it. A whole-segment
 * export is the driver's handle and follows the driver's rules, as without
 * libemm (its segment goes back no earlier than the program's free of the
 * block would have returned it). Registry entries go when their context
 * goes; a dead process's are reclaimed by the next one that finds the
 * registry full.
 *
 * Under ipc_tables.lock (ipc_internal.h): exports, kept, next_serial.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "common/log.h"
#include "process/ipc_internal.h"
#include "process/process.h"
#include "process/process_internal.h"

static EMM_TLS_IE bool tls_reaping;

int emm_ipc_export_begin(emm_addr_t dptr, struct emm_ipc_export *ex)
{
	struct emm_block_range range;
	struct ctx_entry *entry = NULL;
	bool found;
	int r;

	if (!emm_state_enabled())
		return -ENOENT;
	st_enter();
	r = emm_serve_find_block(dptr, &range);
	found = r == 0 && !emm_state_heap_is_pinned(range.heap);
	if (found)
		entry = st_heap_entry(range.heap);
	st_leave();
	if (r == -ENXIO)
		return -EINVAL; /* freed memory in a segment of ours: not the segment's handle */
	if (!found)
		return -ENOENT; /* pinned memory, or not ours: the driver answers */
	if (!emm_state_backend_can_ipc()) {
		static atomic_bool warned;
		if (!atomic_exchange(&warned, true))
			emm_warn("cuIpcGetMemHandle(%#llx): the %s backend's memory cannot be exported with "
			         "cuIpcGetMemHandle, so libemm refuses (CUDA_ERROR_NOT_SUPPORTED). Run this program "
			         "with EMM_BACKEND=driver or EMM_DISABLE=1 to export it",
			         (unsigned long long)dptr, emm_state_backend_name());
		return -ENOTSUP;
	}
	if (range.base == range.segment_base && range.size == range.segment_size)
		return 1;
	if (!entry)
		return -ENOTSUP; /* its context is being torn down: never the segment's handle */
	*ex = (struct emm_ipc_export){
	    .segment_base = range.segment_base,
	    .segment_size = range.segment_size,
	    .offset = range.base - range.segment_base,
	    .size = range.requested,
	    .entry = entry,
	};
	return 0;
}

static void export_refused(const struct emm_ipc_export *ex, int why)
{
	static atomic_bool warned;

	if (!atomic_exchange(&warned, true))
		emm_warn("cuIpcGetMemHandle: a block of %zu bytes at offset %zu of a libemm segment cannot be "
		         "registered for other processes (%s; registry in EMM_IPC_DIR=%s), so libemm refuses "
		         "(CUDA_ERROR_NOT_SUPPORTED)",
		         ex->size, ex->offset, why == -ENOSPC ? "registry full" : strerror(-why), ipc_dir());
}

/* Keep the segment from now on (unless it is kept already). ipc_tables.lock held. */
static int keep_locked(const struct emm_ipc_export *ex, const CUipcMemHandle *segment)
{
	for (size_t i = 0; i < ipc_tables.kept.n; i++)
		if (ipc_tables.kept.v[i].base == ex->segment_base && !ipc_tables.kept.v[i].retired)
			return 0;
	if (!IPC_VEC_RESERVE(ipc_tables.kept))
		return -ENOMEM;
	ipc_tables.kept.v[ipc_tables.kept.n++] = (struct ipc_kept){
	    .entry = ex->entry, .base = ex->segment_base, .size = ex->segment_size, .segment = *segment};
	atomic_store(&ipc_tables.kept_count, ipc_tables.kept.n);
	return 0;
}

int emm_ipc_export_done(const struct emm_ipc_export *ex, const CUipcMemHandle *segment, CUipcMemHandle *ret_handle)
{
	struct ipc_handle h;
	struct ipc_entry e;
	uint64_t serial = 0;
	int r = 0;

	memset(&e, 0, sizeof(e));
	st_lock(&ipc_tables.lock);
	e.owner = ipc_self_locked();
	for (size_t i = 0; i < ipc_tables.exports.n && !serial; i++) {
		const struct ipc_export *x = &ipc_tables.exports.v[i];
		if (x->seg_base == ex->segment_base && x->offset == ex->offset && x->size == ex->size)
			serial = x->serial;
	}
	if (!serial) {
		e.kind = IPC_SLOT_EXPORT;
		e.serial = ++ipc_tables.next_serial;
		e.offset = ex->offset;
		e.size = ex->size;
		e.seg_size = ex->segment_size;
		e.segment = *segment;
		r = IPC_VEC_RESERVE(ipc_tables.exports) ? keep_locked(ex, segment) : -ENOMEM;
		if (r == 0)
			r = ipc_registry_add(ipc_dir(), &e);
		if (r == 0) {
			ipc_tables.exports.v[ipc_tables.exports.n++] =
			    (struct ipc_export){.ctx = ex->entry->ctx,
			                        .seg_base = ex->segment_base,
			                        .offset = ex->offset,
			                        .size = ex->size,
			                        .serial = e.serial};
			serial = e.serial;
		}
	}
	st_unlock(&ipc_tables.lock);
	if (r != 0) {
		export_refused(ex, r);
		return -ENOTSUP;
	}
	memset(&h, 0, sizeof(h));
	memcpy(h.magic, IPC_HANDLE_MAGIC, sizeof(h.magic));
	h.owner = e.owner;
	h.serial = serial;
	memcpy(ret_handle, &h, sizeof(h));
	return 0;
}

/* Forget ipc_tables.kept.v[i] and the exports of its segment. ipc_tables.lock held. */
static void unkeep_locked(size_t i)
{
	emm_addr_t base = ipc_tables.kept.v[i].base;
	size_t j = 0;

	ipc_tables.kept.v[i] = ipc_tables.kept.v[--ipc_tables.kept.n];
	atomic_store(&ipc_tables.kept_count, ipc_tables.kept.n);
	for (size_t k = 0; k < ipc_tables.exports.n; k++)
		if (ipc_tables.exports.v[k].seg_base != base)
			ipc_tables.exports.v[j++] = ipc_tables.exports.v[k];
	ipc_tables.exports.n = j;
}

/* Retired segments nobody has open any more (of `device`, -1 all): taken
 * out of the books into out[] (at most cap). ipc_tables.lock held. */
static size_t reapable_locked(int device, struct ipc_kept *out, size_t cap)
{
	struct ipc_owner self = ipc_self_locked();
	size_t n = 0;

	for (size_t i = 0; i < ipc_tables.kept.n && n < cap;) {
		struct ipc_kept *k = &ipc_tables.kept.v[i];
		if (k->retired && (device == -1 || k->entry->device == device) &&
		    ipc_registry_release(ipc_dir(), &self, &k->segment) == 0) {
			out[n++] = *k;
			unkeep_locked(i);
		} else {
			i++;
		}
	}
	return n;
}

/* Give the reaped segments back to their backend (no lock held). */
static size_t free_reaped(const struct ipc_kept *r, size_t n)
{
	size_t bytes = 0;

	if (n == 0)
		return 0;
	/* Under the heap guard: a context teardown waits for these frees. */
	st_enter();
	tls_reaping = true;
	for (size_t i = 0; i < n; i++) {
		emm_debug("IPC segment %#llx (%zu bytes): no importer has it open any more: given back",
		          (unsigned long long)r[i].base, r[i].size);
		if (st_segment_free(r[i].entry, false, r[i].base, r[i].size, EMM_STREAM_SYNC) == 0)
			bytes += r[i].size;
	}
	tls_reaping = false;
	st_leave();
	return bytes;
}

#define REAP_BATCH 16

bool st_ipc_keep_segment(struct ctx_entry *entry, emm_addr_t base, size_t size)
{
	struct ipc_kept reaped[REAP_BATCH];
	size_t n = 0;
	bool keep = false;

	if (tls_reaping || atomic_load_explicit(&ipc_tables.kept_count, memory_order_relaxed) == 0)
		return false;
	st_lock(&ipc_tables.lock);
	for (size_t i = 0; i < ipc_tables.kept.n; i++) {
		struct ipc_kept *k = &ipc_tables.kept.v[i];
		if (k->base != base || k->retired || k->entry != entry)
			continue;
		struct ipc_owner self = ipc_self_locked();
		int r = ipc_registry_release(ipc_dir(), &self, &k->segment);
		if (r == 0) {
			unkeep_locked(i); /* nobody has it: it goes, its handles with it */
		} else {
			k->retired = true; /* in use elsewhere (or the registry unreadable): kept */
			k->size = size;
			keep = true;
		}
		break;
	}
	/* Memory is wanted: give back what nobody holds any more. */
	n = reapable_locked(entry->device, reaped, REAP_BATCH);
	st_unlock(&ipc_tables.lock);
	if (keep)
		emm_debug("segment %#llx (%zu bytes) is open in another process through IPC: kept allocated",
		          (unsigned long long)base, size);
	free_reaped(reaped, n);
	return keep;
}

size_t st_ipc_release_retired(int device)
{
	struct ipc_kept reaped[REAP_BATCH];
	size_t bytes = 0, n;

	if (device == -2 || atomic_load_explicit(&ipc_tables.kept_count, memory_order_relaxed) == 0)
		return 0;
	do {
		st_lock(&ipc_tables.lock);
		n = reapable_locked(device, reaped, REAP_BATCH);
		st_unlock(&ipc_tables.lock);
		bytes += free_reaped(reaped, n);
	} while (n == REAP_BATCH);
	return bytes;
}
