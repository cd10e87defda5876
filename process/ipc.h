/* SPDX-License-Identifier: MIT */
/*
 * process/ipc.h - legacy IPC of any block as the shims see it: the two
 * steps around the driver's cuIpcGetMemHandle and cuIpcOpenMemHandle, the
 * close and the lookup of an opened block (ipc.c, ipc_export.c,
 * ipc_import.c, ipc_registry.c). Part of process.h, which includes it:
 * interpose/ includes process.h, never this. The tables and the registry's
 * format are ipc_internal.h's.
 */
#ifndef EMM_PROCESS_IPC_H
#define EMM_PROCESS_IPC_H

#include <cuda.h>
#include <stddef.h>

#include "allocator/heap.h"

/*
 * cuIpcGetMemHandle(dptr), in two steps around the driver's call, which the
 * shim makes:
 *   emm_ipc_export_begin  -ENOENT: not libemm's device memory (or libemm
 *                         off): the driver answers for dptr unchanged.
 *                         -ENOTSUP: the backend's memory cannot be
 *                         exported (warned once): CUDA_ERROR_NOT_SUPPORTED.
 *                         -EINVAL: in a segment of libemm's, in no live
 *                         block (freed): CUDA_ERROR_INVALID_VALUE, the
 *                         driver's answer for freed memory.
 *                         1: the block is its whole segment: the driver's
 *                         handle of dptr is the answer.
 *                         0: a block inside a segment: ask the driver for
 *                         the handle of ex->segment_base, then
 *   emm_ipc_export_done   0 and the libemm handle of the block in
 *                         *ret_handle; -ENOTSUP: it cannot be registered
 *                         (registry unusable or full; warned once).
 * A segment with blocks exported stays allocated while another process has
 * it open (ipc_export.c says how long exactly).
 */
struct ctx_entry;
struct emm_ipc_export {
	emm_addr_t segment_base;
	size_t segment_size, offset, size;
	struct ctx_entry *entry; /* the context of the block's heap */
};
int emm_ipc_export_begin(emm_addr_t dptr, struct emm_ipc_export *ex);
int emm_ipc_export_done(const struct emm_ipc_export *ex, const CUipcMemHandle *segment, CUipcMemHandle *ret_handle);

/*
 * cuIpcOpenMemHandle(handle), likewise:
 *   emm_ipc_import_begin  -ENOENT: not a libemm handle (or libemm off): the
 *                         driver's call with the same arguments. -EINVAL:
 *                         a libemm handle no exporter registered
 *                         (CUDA_ERROR_INVALID_VALUE, the driver's answer for
 *                         a handle it never made); -ENXIO: no current context
 *                         (CUDA_ERROR_INVALID_CONTEXT); -ENOMEM.
 *                         1: served: *ret_ptr (the segment is open here).
 *                         0: open im->segment with the driver, then
 *   emm_ipc_import_done   with the driver's mapping `base`: 0 and *ret_ptr
 *                         (base + the block's offset); -EINVAL: the mapping
 *                         does not hold the block, -ENOMEM: the caller
 *                         closes `base` once and fails the call; or, when
 *                         the driver's open failed, emm_ipc_import_failed.
 */
struct emm_ipc_import {
	CUipcMemHandle segment;
	size_t offset, size, segment_size;
	CUcontext ctx;
};
int emm_ipc_import_begin(const CUipcMemHandle *handle, struct emm_ipc_import *im, emm_addr_t *ret_ptr);
int emm_ipc_import_done(const struct emm_ipc_import *im, emm_addr_t base, emm_addr_t *ret_ptr);
/* The driver refused to open im->segment (its code is the answer). */
void emm_ipc_import_failed(const struct emm_ipc_import *im);
/* cuIpcCloseMemHandle(ptr): -ENOENT: no open of a libemm handle gave ptr
 * (the driver answers). -EINVAL: ptr lies in a segment opened through
 * libemm handles but no open gave it (CUDA_ERROR_INVALID_VALUE; a program
 * that also opened that segment's driver handle itself cannot close it
 * while blocks of it are open through libemm). 0: one reference dropped; the caller closes the
 * segment's mapping *ret_base with the driver *ret_closes times (0 while
 * other blocks or opens of the segment remain). */
int emm_ipc_close(emm_addr_t ptr, emm_addr_t *ret_base, unsigned *ret_closes);
/* The block opened through a libemm handle that contains addr: 0, its
 * pointer and size; -ENXIO: inside a segment opened here, in no block
 * opened here; -ENOENT. */
int emm_ipc_find_import(emm_addr_t addr, emm_addr_t *ret_base, size_t *ret_size);

#endif
