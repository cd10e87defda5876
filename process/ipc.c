/* SPDX-License-Identifier: MIT */
/*
 * process/ipc.c - legacy CUDA IPC of any block (cuIpcGetMemHandle,
 * cuIpcOpenMemHandle, cuIpcCloseMemHandle) for the shims of
 * interpose/shims_query.c, which make the driver calls themselves.
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
 * Importer. A libemm handle is looked up in the registry; the segment's
 * driver handle is opened once per context (the driver's mapping is shared
 * by every block of the segment and every open of the same handle, as
 * CUDA returns the same mapping for the same handle) and the block's
 * pointer is base + offset. Each open takes a reference; cuIpcCloseMemHandle
 * of the pointer drops one, and the segment's mapping is closed with the
 * last. An exporter that exited: its entry is still found, and the
 * driver's answer for the segment's handle is the program's answer.
 *
 * Locking: ipc_lock (a leaf) over the tables below and every registry
 * access; driver calls are the shims' (or made here) with no lock held.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "process/ipc_internal.h"
#include "process/process.h"
#include "process/process_internal.h"

/* A block exported with a libemm handle. */
struct export {
	CUcontext ctx;
	emm_addr_t seg_base;
	size_t offset, size;
	uint64_t serial;
};

/* A segment with blocks exported; `retired`: the heap gave it back while
 * an importer had it, so it is kept here. */
struct kept {
	struct ctx_entry *entry;
	emm_addr_t base;
	size_t size;
	CUipcMemHandle segment;
	bool retired;
};

/* A segment opened through libemm handles in this process. */
struct import_seg {
	CUcontext ctx;
	CUipcMemHandle segment;
	emm_addr_t base;
	size_t size;
	unsigned driver_refs; /* successful driver opens (two threads may race) */
	unsigned refs;        /* opened blocks' references */
};

/* An opened block: its pointer and references. */
struct import_blk {
	emm_addr_t ptr;
	size_t size;
	struct import_seg *seg;
	unsigned refs;
};

/* A growable array of T. */
#define VEC(T)                                                                                               \
	struct {                                                                                             \
		T *v;                                                                                        \
		size_t n, cap;                                                                               \
	}

static pthread_mutex_t ipc_lock = PTHREAD_MUTEX_INITIALIZER;
static VEC(struct export) exports;
static VEC(struct kept) kept;
static VEC(struct import_seg *) segs;
static VEC(struct import_blk) blks;
static uint64_t next_serial;
static unsigned opens_pending; /* imports between begin and done */
static atomic_size_t kept_count, blk_count; /* read without the lock on hot paths */
static EMM_TLS_IE bool tls_reaping;

static bool grow(void **v, size_t n, size_t *cap, size_t elem)
{
	size_t c = *cap ? *cap * 2 : 16;
	void *p;

	if (n < *cap)
		return true;
	p = realloc(*v, c * elem);
	if (!p)
		return false;
	*v = p;
	*cap = c;
	return true;
}
#define VEC_RESERVE(a) grow((void **)&(a).v, (a).n, &(a).cap, sizeof(*(a).v))

static const char *ipc_dir(void)
{
	return emm_state_options()->ipc_dir;
}

static struct ipc_owner self_locked(void)
{
	struct ipc_owner o;

	ipc_self(&o);
	return o;
}

/* --- exporter ------------------------------------------------------------ */

int emm_ipc_export_begin(emm_addr_t dptr, struct emm_ipc_export *ex)
{
	struct emm_block_range range;
	struct ctx_entry *entry = NULL;
	bool found;
	int r;

	if (!emm_state_enabled())
		return -ENOENT;
	emm_state_enter();
	r = emm_serve_find_block(dptr, &range);
	found = r == 0 && !emm_state_heap_is_pinned(range.heap);
	if (found)
		entry = st_heap_entry(range.heap);
	emm_state_leave();
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

/* Keep the segment from now on (unless it is kept already). ipc_lock held. */
static int keep_locked(const struct emm_ipc_export *ex, const CUipcMemHandle *segment)
{
	for (size_t i = 0; i < kept.n; i++)
		if (kept.v[i].base == ex->segment_base && !kept.v[i].retired)
			return 0;
	if (!VEC_RESERVE(kept))
		return -ENOMEM;
	kept.v[kept.n++] = (struct kept){
	    .entry = ex->entry, .base = ex->segment_base, .size = ex->segment_size, .segment = *segment};
	atomic_store(&kept_count, kept.n);
	return 0;
}

int emm_ipc_export_done(const struct emm_ipc_export *ex, const CUipcMemHandle *segment, CUipcMemHandle *ret_handle)
{
	struct ipc_handle h;
	struct ipc_entry e;
	uint64_t serial = 0;
	int r = 0;

	memset(&e, 0, sizeof(e));
	st_lock(&ipc_lock);
	e.owner = self_locked();
	for (size_t i = 0; i < exports.n && !serial; i++) {
		const struct export *x = &exports.v[i];
		if (x->seg_base == ex->segment_base && x->offset == ex->offset && x->size == ex->size)
			serial = x->serial;
	}
	if (!serial) {
		e.kind = IPC_SLOT_EXPORT;
		e.serial = ++next_serial;
		e.offset = ex->offset;
		e.size = ex->size;
		e.seg_size = ex->segment_size;
		e.segment = *segment;
		r = VEC_RESERVE(exports) ? keep_locked(ex, segment) : -ENOMEM;
		if (r == 0)
			r = ipc_registry_add(ipc_dir(), &e);
		if (r == 0) {
			exports.v[exports.n++] = (struct export){.ctx = ex->entry->ctx,
			                                         .seg_base = ex->segment_base,
			                                         .offset = ex->offset,
			                                         .size = ex->size,
			                                         .serial = e.serial};
			serial = e.serial;
		}
	}
	st_unlock(&ipc_lock);
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

/* Forget kept.v[i] and the exports of its segment. ipc_lock held. */
static void unkeep_locked(size_t i)
{
	emm_addr_t base = kept.v[i].base;
	size_t j = 0;

	kept.v[i] = kept.v[--kept.n];
	atomic_store(&kept_count, kept.n);
	for (size_t k = 0; k < exports.n; k++)
		if (exports.v[k].seg_base != base)
			exports.v[j++] = exports.v[k];
	exports.n = j;
}

/* Retired segments nobody has open any more (of `device`, -1 all): taken
 * out of the books into out[] (at most cap). ipc_lock held. */
static size_t reapable_locked(int device, struct kept *out, size_t cap)
{
	struct ipc_owner self = self_locked();
	size_t n = 0;

	for (size_t i = 0; i < kept.n && n < cap;) {
		struct kept *k = &kept.v[i];
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
static size_t free_reaped(const struct kept *r, size_t n)
{
	size_t bytes = 0;

	if (n == 0)
		return 0;
	/* Under the heap guard: a context teardown waits for these frees. */
	emm_state_enter();
	tls_reaping = true;
	for (size_t i = 0; i < n; i++) {
		emm_debug("IPC segment %#llx (%zu bytes): no importer has it open any more: given back",
		          (unsigned long long)r[i].base, r[i].size);
		if (st_segment_free(r[i].entry, false, r[i].base, r[i].size, EMM_STREAM_SYNC) == 0)
			bytes += r[i].size;
	}
	tls_reaping = false;
	emm_state_leave();
	return bytes;
}

#define REAP_BATCH 16

bool st_ipc_keep_segment(struct ctx_entry *entry, emm_addr_t base, size_t size)
{
	struct kept reaped[REAP_BATCH];
	size_t n = 0;
	bool keep = false;

	if (tls_reaping || atomic_load_explicit(&kept_count, memory_order_relaxed) == 0)
		return false;
	st_lock(&ipc_lock);
	for (size_t i = 0; i < kept.n; i++) {
		struct kept *k = &kept.v[i];
		if (k->base != base || k->retired || k->entry != entry)
			continue;
		struct ipc_owner self = self_locked();
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
	st_unlock(&ipc_lock);
	if (keep)
		emm_debug("segment %#llx (%zu bytes) is open in another process through IPC: kept allocated",
		          (unsigned long long)base, size);
	free_reaped(reaped, n);
	return keep;
}

size_t st_ipc_release_retired(int device)
{
	struct kept reaped[REAP_BATCH];
	size_t bytes = 0, n;

	if (device == -2 || atomic_load_explicit(&kept_count, memory_order_relaxed) == 0)
		return 0;
	do {
		st_lock(&ipc_lock);
		n = reapable_locked(device, reaped, REAP_BATCH);
		st_unlock(&ipc_lock);
		bytes += free_reaped(reaped, n);
	} while (n == REAP_BATCH);
	return bytes;
}

/* --- importer ------------------------------------------------------------ */

static void seg_remove_locked(struct import_seg *seg);

static bool is_libemm_handle(const CUipcMemHandle *handle)
{
	return memcmp(handle->reserved, IPC_HANDLE_MAGIC, sizeof(IPC_HANDLE_MAGIC)) == 0;
}

static CUcontext current_context(void)
{
	CUcontext ctx = NULL;

	if (!st_real_table()->cuCtxGetCurrent || st_real_table()->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
		return NULL;
	return ctx;
}

/* The opened segment of (ctx, handle); ctx NULL: of any context. ipc_lock
 * held. */
static struct import_seg *seg_find_locked(CUcontext ctx, const CUipcMemHandle *segment)
{
	for (size_t i = 0; i < segs.n; i++)
		if ((!ctx || segs.v[i]->ctx == ctx) && memcmp(&segs.v[i]->segment, segment, sizeof(*segment)) == 0)
			return segs.v[i];
	return NULL;
}

/* This process no longer has `segment` open in any context (and no open
 * of it is under way): drop its import record. ipc_lock held. */
static void unimport_if_unused_locked(const CUipcMemHandle *segment)
{
	if (!seg_find_locked(NULL, segment) && opens_pending == 0) {
		struct ipc_owner self = self_locked();
		ipc_registry_unimport(ipc_dir(), &self, segment);
	}
}

/* Take a reference on the block at seg->base + offset. ipc_lock held. */
static int blk_ref_locked(struct import_seg *seg, size_t offset, size_t size, emm_addr_t *ret_ptr)
{
	emm_addr_t ptr = seg->base + offset;

	for (size_t i = 0; i < blks.n; i++) {
		if (blks.v[i].ptr == ptr && blks.v[i].seg == seg) {
			blks.v[i].refs++;
			seg->refs++;
			*ret_ptr = ptr;
			return 0;
		}
	}
	if (!VEC_RESERVE(blks))
		return -ENOMEM;
	blks.v[blks.n++] = (struct import_blk){.ptr = ptr, .size = size, .seg = seg, .refs = 1};
	atomic_store(&blk_count, blks.n);
	seg->refs++;
	*ret_ptr = ptr;
	return 0;
}

int emm_ipc_import_begin(const CUipcMemHandle *handle, struct emm_ipc_import *im, emm_addr_t *ret_ptr)
{
	struct ipc_owner self;
	struct ipc_handle h;
	struct ipc_entry e;
	struct import_seg *seg;
	int r;

	if (!is_libemm_handle(handle) || !emm_state_enabled())
		return -ENOENT;
	memcpy(&h, handle, sizeof(h));
	im->ctx = current_context();
	st_lock(&ipc_lock);
	self = self_locked();
	/* The lookup records this process as an importer of the segment in
	 * the same step, so the exporter cannot give it back in between. */
	r = ipc_registry_open(ipc_dir(), &h.owner, h.serial, &self, &e);
	if (r == 0) {
		seg = seg_find_locked(im->ctx, &e.segment);
		if (seg && e.offset + e.size <= seg->size)
			r = blk_ref_locked(seg, e.offset, e.size, ret_ptr) == 0 ? 1 : -ENOMEM;
		else
			opens_pending++;
	}
	st_unlock(&ipc_lock);
	if (r < 0) {
		emm_debug("cuIpcOpenMemHandle: libemm handle of pid %u serial %llu: %s", h.owner.pid,
		          (unsigned long long)h.serial, r == -ENOENT ? "not in the registry" : strerror(-r));
		return r == -ENOMEM ? -ENOMEM : -EINVAL;
	}
	if (r == 0) {
		im->segment = e.segment;
		im->offset = e.offset;
		im->size = e.size;
		im->segment_size = e.seg_size;
	}
	return r;
}

void emm_ipc_import_failed(const struct emm_ipc_import *im)
{
	st_lock(&ipc_lock);
	opens_pending--;
	unimport_if_unused_locked(&im->segment);
	st_unlock(&ipc_lock);
}

int emm_ipc_import_done(const struct emm_ipc_import *im, emm_addr_t base, emm_addr_t *ret_ptr)
{
	const struct emm_real_driver_table *real = st_real_table();
	struct import_seg *seg;
	CUdeviceptr b = 0;
	size_t size = 0;
	int r;

	/* The driver's mapping must hold the block (a registry entry that does
	 * not match its segment is refused, never read past). */
	if (!real->cuMemGetAddressRange_v2 || real->cuMemGetAddressRange_v2(&b, &size, (CUdeviceptr)base) != CUDA_SUCCESS)
		size = im->segment_size;
	else
		size -= (size_t)(base - b);
	if (im->offset > size || im->size > size - im->offset) {
		emm_ipc_import_failed(im);
		return -EINVAL;
	}
	st_lock(&ipc_lock);
	opens_pending--;
	seg = seg_find_locked(im->ctx, &im->segment);
	if (!seg && VEC_RESERVE(segs) && (seg = calloc(1, sizeof(*seg))) != NULL) {
		*seg = (struct import_seg){.ctx = im->ctx, .segment = im->segment, .base = base, .size = size};
		segs.v[segs.n++] = seg;
	}
	if (seg && seg->base == base) {
		seg->driver_refs++;
		r = blk_ref_locked(seg, im->offset, im->size, ret_ptr);
		if (r != 0)
			seg->driver_refs--;
	} else {
		r = seg ? -EINVAL : -ENOMEM;
	}
	if (seg && seg->refs == 0) {
		seg_remove_locked(seg);
		unimport_if_unused_locked(&im->segment);
	}
	st_unlock(&ipc_lock);
	return r;
}

/* Drop an opened segment with no references left; ipc_lock held. */
static void seg_remove_locked(struct import_seg *seg)
{
	for (size_t i = 0; i < segs.n; i++) {
		if (segs.v[i] == seg) {
			segs.v[i] = segs.v[--segs.n];
			break;
		}
	}
	free(seg);
}

int emm_ipc_close(emm_addr_t ptr, emm_addr_t *ret_base, unsigned *ret_closes)
{
	int r = -ENOENT;

	if (atomic_load_explicit(&blk_count, memory_order_relaxed) == 0)
		return -ENOENT;
	st_lock(&ipc_lock);
	for (size_t i = 0; i < blks.n; i++) {
		struct import_blk *b = &blks.v[i];
		struct import_seg *seg = b->seg;
		if (b->ptr != ptr)
			continue;
		*ret_base = seg->base;
		*ret_closes = 0;
		if (--b->refs == 0) {
			blks.v[i] = blks.v[--blks.n];
			atomic_store(&blk_count, blks.n);
		}
		if (--seg->refs == 0) {
			CUipcMemHandle segment = seg->segment;
			*ret_closes = seg->driver_refs;
			seg_remove_locked(seg);
			unimport_if_unused_locked(&segment);
		}
		r = 0;
		break;
	}
	/* Inside a segment opened here, not an opened block (closed once too
	 * often): the driver would close the segment for the other blocks. */
	for (size_t i = 0; i < segs.n && r == -ENOENT; i++)
		if (ptr >= segs.v[i]->base && ptr - segs.v[i]->base < segs.v[i]->size)
			r = -EINVAL;
	st_unlock(&ipc_lock);
	return r;
}

int emm_ipc_find_import(emm_addr_t addr, emm_addr_t *ret_base, size_t *ret_size)
{
	int r = -ENOENT;

	if (atomic_load_explicit(&blk_count, memory_order_relaxed) == 0)
		return -ENOENT;
	st_lock(&ipc_lock);
	for (size_t i = 0; i < blks.n && r != 0; i++) {
		const struct import_blk *b = &blks.v[i];
		if (addr >= b->ptr && addr - b->ptr < (b->size ? b->size : 1)) {
			*ret_base = b->ptr;
			*ret_size = b->size;
			r = 0;
		} else if (addr >= b->seg->base && addr - b->seg->base < b->seg->size) {
			r = -ENXIO; /* in an opened segment, in no block of it this process opened */
		}
	}
	st_unlock(&ipc_lock);
	return r;
}

/* --- context teardown and fork ------------------------------------------- */

/* The registry entries of this process that name memory of the dropped
 * context: its exports' and its imports' segments. */
struct dropped {
	CUcontext ctx;
	struct ctx_entry *entry;
};

static bool of_dropped(void *arg, const struct ipc_entry *e)
{
	const struct dropped *d = arg;

	if (e->kind == IPC_SLOT_IMPORT) {
		/* open in the dropped context, and in no other */
		bool here = false, elsewhere = false;
		for (size_t i = 0; i < segs.n; i++)
			if (memcmp(&segs.v[i]->segment, &e->segment, sizeof(e->segment)) == 0)
				*(segs.v[i]->ctx == d->ctx ? &here : &elsewhere) = true;
		return here && !elsewhere;
	}
	for (size_t i = 0; i < kept.n; i++)
		if (kept.v[i].entry == d->entry && memcmp(&kept.v[i].segment, &e->segment, sizeof(e->segment)) == 0)
			return true;
	return false;
}

void st_ipc_context_dropped(struct ctx_entry *entry)
{
	struct dropped d = {.ctx = entry->ctx, .entry = entry};
	struct ipc_owner self;
	size_t j = 0;

	st_lock(&ipc_lock);
	/* Its memory went with it: its exports name nothing now, its
	 * mappings of other processes' segments are gone. */
	if (kept.n || segs.n) {
		self = self_locked();
		ipc_registry_remove(ipc_dir(), &self, of_dropped, &d);
	}
	for (size_t i = 0; i < exports.n; i++)
		if (exports.v[i].ctx != d.ctx)
			exports.v[j++] = exports.v[i];
	exports.n = j;
	j = 0;
	for (size_t i = 0; i < kept.n; i++)
		if (kept.v[i].entry != entry)
			kept.v[j++] = kept.v[i];
	kept.n = j;
	atomic_store(&kept_count, kept.n);
	j = 0;
	for (size_t i = 0; i < blks.n; i++)
		if (blks.v[i].seg->ctx != d.ctx)
			blks.v[j++] = blks.v[i];
	blks.n = j;
	atomic_store(&blk_count, blks.n);
	for (size_t i = segs.n; i-- > 0;)
		if (segs.v[i]->ctx == d.ctx)
			seg_remove_locked(segs.v[i]);
	st_unlock(&ipc_lock);
}

void st_ipc_fork_child(void)
{
	/* The parent's exports and imports are its own; the tables are
	 * leaked (a thread of the parent may have held the lock). */
	pthread_mutex_init(&ipc_lock, NULL);
	memset(&exports, 0, sizeof(exports));
	memset(&kept, 0, sizeof(kept));
	memset(&segs, 0, sizeof(segs));
	memset(&blks, 0, sizeof(blks));
	atomic_store(&kept_count, 0);
	atomic_store(&blk_count, 0);
	next_serial = 0;
	opens_pending = 0;
	ipc_registry_fork_child();
}
