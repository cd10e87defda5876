/* SPDX-License-Identifier: MIT */
/*
 * process/vmm.h - the VMM calls as the shims see them: each VMM shim's two
 * steps around the driver's call over the cache of whole freed buffers
 * (vmm.c, vmm_table.c, vmm_idle.c, vmm_defer.c), and the counting of
 * explicit pools. Part of process.h, which includes it: interpose/
 * includes process.h, never this. The cache's private state is
 * vmm_internal.h's.
 */
#ifndef EMM_PROCESS_VMM_H
#define EMM_PROCESS_VMM_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * Each VMM shim asks the process layer first and then, unless it was
 * served, calls the driver and reports what the driver did:
 *   emm_vmm_X(args)          1: served by the cache (the shim returns
 *                            CUDA_SUCCESS and, for reserve and create, the
 *                            value written to *ret); 0: call the driver (any
 *                            deferred operation on what the call touches is
 *                            made real first, so the driver sees what it
 *                            would have seen without libemm).
 *   emm_vmm_X_done(..., ok)  after the driver's call (ok: it succeeded).
 * In EMM_VMM=count mode the first always answers 0 and the second counts
 * and traces; in EMM_VMM=off neither does anything. vmm.c documents the
 * state machine.
 */
enum emm_vmm_mode_value { EMM_VMM_MODE_OFF, EMM_VMM_MODE_COUNT, EMM_VMM_MODE_CACHE };
/* The mode (OFF when libemm is disabled). */
enum emm_vmm_mode_value emm_vmm_mode(void);

int emm_vmm_reserve(size_t size, size_t align, CUdeviceptr addr, unsigned long long flags, CUdeviceptr *ret_va);
void emm_vmm_reserve_done(CUdeviceptr va, size_t size, CUdeviceptr addr, unsigned long long flags, bool ok);
int emm_vmm_create(size_t size, const CUmemAllocationProp *prop, unsigned long long flags,
                   CUmemGenericAllocationHandle *ret_handle);
void emm_vmm_create_done(CUmemGenericAllocationHandle handle, size_t size, const CUmemAllocationProp *prop,
                         unsigned long long flags, bool ok);
int emm_vmm_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                unsigned long long flags);
void emm_vmm_map_done(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                      unsigned long long flags, bool ok);
int emm_vmm_set_access(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count);
void emm_vmm_set_access_done(CUdeviceptr va, size_t size, const CUmemAccessDesc *desc, size_t count, bool ok);
int emm_vmm_unmap(CUdeviceptr va, size_t size);
void emm_vmm_unmap_done(CUdeviceptr va, size_t size, bool ok);
int emm_vmm_release(CUmemGenericAllocationHandle handle);
void emm_vmm_release_done(CUmemGenericAllocationHandle handle, bool ok);
int emm_vmm_address_free(CUdeviceptr va, size_t size);
void emm_vmm_address_free_done(CUdeviceptr va, size_t size, bool ok);
/* A call that names a range (va, size; size 0: the one address va) and/or
 * a handle (has_handle) and is always the driver's: make real whatever
 * deferred state it could observe. `pin`: the call makes the handle
 * shareable or adds a reference the cache cannot follow (export, retain),
 * so the allocation behind it is never cached. */
void emm_vmm_touch(CUdeviceptr va, size_t size, bool has_handle, CUmemGenericAllocationHandle handle, bool pin);
/* A handle the driver returned from an import: never cached. */
void emm_vmm_imported(CUmemGenericAllocationHandle handle);
/* cuMemCreate ran out of memory: give back idle VMM memory of every
 * device; true when something was released (retry once). */
bool emm_vmm_oom_release(void);
/* cuMemGetInfo: make every pending deferral real now. */
void emm_vmm_flush_pending(void);

/* Explicit pools, passed through and counted (cuMemAllocFromPoolAsync,
 * cuMemPoolCreate/Destroy, cudaMallocFromPoolAsync). */
enum emm_pool_event { EMM_POOL_ALLOC, EMM_POOL_CREATE, EMM_POOL_DESTROY };
void emm_vmm_count_pool(enum emm_pool_event what, CUdeviceptr ptr, size_t size, const void *stream);
/* Set around cudaMallocFromPoolAsync's delegation, so that the driver
 * shim under it does not count the allocation a second time. */
void emm_vmm_runtime_pool_enter(void);
void emm_vmm_runtime_pool_leave(void);

#endif
