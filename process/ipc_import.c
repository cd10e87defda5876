/* SPDX-License-Identifier: MIT */
/*
 * process/ipc_import.c - the importing side of legacy CUDA IPC
 * (cuIpcOpenMemHandle, cuIpcCloseMemHandle of libemm handles; ipc.c has
 * the overview): the segments opened here and the blocks opened in them.
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
 * Under ipc_tables.lock (ipc_internal.h): imports, blocks, opens_pending.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "process/ipc_internal.h"
#include "process/process.h"
#include "process/process_internal.h"

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

/* The opened segment of (ctx, handle); ctx NULL: of any context. ipc_tables.lock
 * held. */
static struct ipc_import_seg *seg_find_locked(CUcontext ctx, const CUipcMemHandle *segment)
{
	for (size_t i = 0; i < ipc_tables.imports.n; i++)
		if ((!ctx || ipc_tables.imports.v[i]->ctx == ctx) &&
		    memcmp(&ipc_tables.imports.v[i]->segment, segment, sizeof(*segment)) == 0)
			return ipc_tables.imports.v[i];
	return NULL;
}

/* This process no longer has `segment` open in any context (and no open
 * of it is under way): drop its import record. ipc_tables.lock held. */
static void unimport_if_unused_locked(const CUipcMemHandle *segment)
{
	if (!seg_find_locked(NULL, segment) && ipc_tables.opens_pending == 0) {
		struct ipc_owner self = ipc_self_locked();
		ipc_registry_unimport(ipc_dir(), &self, segment);
	}
}

/* Take a reference on the block at seg->base + offset. ipc_tables.lock held. */
static int blk_ref_locked(struct ipc_import_seg *seg, size_t offset, size_t size, emm_addr_t *ret_ptr)
{
	emm_addr_t ptr = seg->base + offset;

	for (size_t i = 0; i < ipc_tables.blocks.n; i++) {
		if (ipc_tables.blocks.v[i].ptr == ptr && ipc_tables.blocks.v[i].seg == seg) {
			ipc_tables.blocks.v[i].refs++;
			seg->refs++;
			*ret_ptr = ptr;
			return 0;
		}
	}
	if (!IPC_VEC_RESERVE(ipc_tables.blocks))
		return -ENOMEM;
	ipc_tables.blocks.v[ipc_tables.blocks.n++] =
	    (struct ipc_import_blk){.ptr = ptr, .size = size, .seg = seg, .refs = 1};
	atomic_store(&ipc_tables.block_count, ipc_tables.blocks.n);
	seg->refs++;
	*ret_ptr = ptr;
	return 0;
}

int emm_ipc_import_begin(const CUipcMemHandle *handle, struct emm_ipc_import *im, emm_addr_t *ret_ptr)
{
	struct ipc_owner self;
	struct ipc_handle h;
	struct ipc_entry e;
	struct ipc_import_seg *seg;
	int r;

	if (!is_libemm_handle(handle) || !emm_state_enabled())
		return -ENOENT;
	memcpy(&h, handle, sizeof(h));
	im->ctx = current_context();
	if (!im->ctx)
		return -ENXIO; /* the driver's answer without a current context */
	st_lock(&ipc_tables.lock);
	self = ipc_self_locked();
	/* The lookup records this process as an importer of the segment in
	 * the same step, so the exporter cannot give it back in between. */
	r = ipc_registry_open(ipc_dir(), &h.owner, h.serial, &self, &e);
	if (r == 0) {
		seg = seg_find_locked(im->ctx, &e.segment);
		if (seg && e.offset + e.size <= seg->size)
			r = blk_ref_locked(seg, e.offset, e.size, ret_ptr) == 0 ? 1 : -ENOMEM;
		else
			ipc_tables.opens_pending++;
	}
	st_unlock(&ipc_tables.lock);
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
	st_lock(&ipc_tables.lock);
	ipc_tables.opens_pending--;
	unimport_if_unused_locked(&im->segment);
	st_unlock(&ipc_tables.lock);
}

int emm_ipc_import_done(const struct emm_ipc_import *im, emm_addr_t base, emm_addr_t *ret_ptr)
{
	const struct emm_real_driver_table *real = st_real_table();
	struct ipc_import_seg *seg;
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
	st_lock(&ipc_tables.lock);
	ipc_tables.opens_pending--;
	seg = seg_find_locked(im->ctx, &im->segment);
	if (!seg && IPC_VEC_RESERVE(ipc_tables.imports) && (seg = calloc(1, sizeof(*seg))) != NULL) {
		*seg = (struct ipc_import_seg){.ctx = im->ctx, .segment = im->segment, .base = base, .size = size};
		ipc_tables.imports.v[ipc_tables.imports.n++] = seg;
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
		ipc_import_seg_remove_locked(seg);
		unimport_if_unused_locked(&im->segment);
	}
	st_unlock(&ipc_tables.lock);
	return r;
}

void ipc_import_seg_remove_locked(struct ipc_import_seg *seg)
{
	for (size_t i = 0; i < ipc_tables.imports.n; i++) {
		if (ipc_tables.imports.v[i] == seg) {
			ipc_tables.imports.v[i] = ipc_tables.imports.v[--ipc_tables.imports.n];
			break;
		}
	}
	free(seg);
}

int emm_ipc_close(emm_addr_t ptr, emm_addr_t *ret_base, unsigned *ret_closes)
{
	int r = -ENOENT;

	if (atomic_load_explicit(&ipc_tables.block_count, memory_order_relaxed) == 0)
		return -ENOENT;
	st_lock(&ipc_tables.lock);
	for (size_t i = 0; i < ipc_tables.blocks.n; i++) {
		struct ipc_import_blk *b = &ipc_tables.blocks.v[i];
		struct ipc_import_seg *seg = b->seg;
		if (b->ptr != ptr)
			continue;
		*ret_base = seg->base;
		*ret_closes = 0;
		if (--b->refs == 0) {
			ipc_tables.blocks.v[i] = ipc_tables.blocks.v[--ipc_tables.blocks.n];
			atomic_store(&ipc_tables.block_count, ipc_tables.blocks.n);
		}
		if (--seg->refs == 0) {
			CUipcMemHandle segment = seg->segment;
			*ret_closes = seg->driver_refs;
			ipc_import_seg_remove_locked(seg);
			unimport_if_unused_locked(&segment);
		}
		r = 0;
		break;
	}
	/* Inside a segment opened here, not an opened block (closed once too
	 * often): the driver would close the segment for the other blocks. */
	for (size_t i = 0; i < ipc_tables.imports.n && r == -ENOENT; i++)
		if (ptr >= ipc_tables.imports.v[i]->base &&
		    ptr - ipc_tables.imports.v[i]->base < ipc_tables.imports.v[i]->size)
			r = -EINVAL;
	st_unlock(&ipc_tables.lock);
	return r;
}

int emm_ipc_find_import(emm_addr_t addr, emm_addr_t *ret_base, size_t *ret_size)
{
	int r = -ENOENT;

	if (atomic_load_explicit(&ipc_tables.block_count, memory_order_relaxed) == 0)
		return -ENOENT;
	st_lock(&ipc_tables.lock);
	for (size_t i = 0; i < ipc_tables.blocks.n && r != 0; i++) {
		const struct ipc_import_blk *b = &ipc_tables.blocks.v[i];
		if (addr >= b->ptr && addr - b->ptr < (b->size ? b->size : 1)) {
			*ret_base = b->ptr;
			*ret_size = b->size;
			r = 0;
		} else if (addr >= b->seg->base && addr - b->seg->base < b->seg->size) {
			r = -ENXIO; /* in an opened segment, in no block of it this process opened */
		}
	}
	st_unlock(&ipc_tables.lock);
	return r;
}
