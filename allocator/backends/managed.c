/* SPDX-License-Identifier: MIT */
/*
 * allocator/backends/managed.c - the "managed" backend: segments of unified
 * (managed) memory, cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL), given back with
 * cuMemFree_v2; mem_info is cuMemGetInfo_v2. For programs that must
 * oversubscribe the device: on a GPU with concurrent managed access (Linux,
 * Pascal or newer) pages migrate on demand, so the sum of segments may
 * exceed device memory.
 *
 * One file, two builds, as driver.c: libemm-backend-managed.so exports only
 * emm_backend_get; with -DEMM_BACKEND_BUILTIN the entry is the hidden
 * emm_backend_builtin_managed. Driver functions come only from
 * host->driver_proc.
 *
 * Limits (README "Backends: managed"):
 *   - Host access: the memory is also valid on the host (and on other GPUs
 *     with concurrent managed access); a program that reads a block on the
 *     host sees libemm's sub-allocation of a larger segment, so it can read
 *     past its block into a neighbour's without a fault. On a device without
 *     concurrent managed access (CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
 *     0: Windows, Maxwell and older), the host must not touch managed memory
 *     while any kernel runs - for the whole segment, i.e. for unrelated
 *     blocks that share it.
 *   - No prefetch or advice: the backend calls neither cuMemPrefetchAsync nor
 *     cuMemAdvise. First touch decides where a page lives, and pages fault
 *     in on demand; a program that wants them resident prefetches its own
 *     blocks.
 *   - Performance: page faults and migrations make first GPU access slower
 *     than device memory, much slower once the device is oversubscribed
 *     (pages thrash between host and device). cuMemFree_v2 of a segment
 *     synchronises the device, as with the driver backend.
 *   - cuMemGetInfo reports the device's physical memory: pages resident on
 *     the device count as used, pages on the host do not, so free memory
 *     says little about how much more can be allocated (the limit is host
 *     plus device memory), and libemm's figures derived from it are
 *     estimates. A segment allocation fails (-ENOMEM) only when the system
 *     cannot back it.
 *   - Not IPC-exportable (cuIpcGetMemHandle refuses managed memory), no
 *     pinned host segments (libemm passes cuMemHostAlloc through).
 * The device must report CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, else init is
 * -ENOTSUP.
 */
#include <cuda.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "allocator/backends/backend_util.h"
#include "emm/emm_backend.h"

#ifdef EMM_BACKEND_BUILTIN
#include "allocator/backend_loader.h"
#define MANAGED_ENTRY emm_backend_builtin_managed
#else
#define MANAGED_ENTRY emm_backend_get
__attribute__((visibility("default"))) int emm_backend_get(uint32_t *inout_version,
                                                           const struct emm_backend **ret_table);
#endif

typedef CUresult (*mem_alloc_managed_fn)(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
typedef CUresult (*mem_free_fn)(CUdeviceptr dptr);
typedef CUresult (*mem_get_info_fn)(size_t *free, size_t *total);
typedef CUresult (*device_get_attribute_fn)(int *value, CUdevice_attribute attr, CUdevice dev);

struct managed_state {
	const struct emm_backend_host *host;
	int device;
	mem_alloc_managed_fn alloc_managed;
	mem_free_fn mem_free;
	mem_get_info_fn mem_get_info;
};

#define managed_log emm_bk_log

/* Out of memory is -ENOMEM (the allocator releases cache and retries), a
 * device without managed memory -ENOTSUP, everything else -EIO. */
static int managed_error(const struct managed_state *st, const char *what, size_t size, CUresult res)
{
	return emm_bk_error(st->host, EMM_BACKEND_LOG_DEBUG, "managed", st->device, what, size, res);
}

static void *proc(const struct emm_backend_host *host, const char *name)
{
	return host->driver_proc ? host->driver_proc(name) : NULL;
}

static int managed_init(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state)
{
	device_get_attribute_fn get_attribute;
	struct managed_state *st;
	int supported = 1;

	if (!host || !ret_state)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->host = host;
	st->device = device;
	*(void **)&st->alloc_managed = proc(host, "cuMemAllocManaged");
	*(void **)&st->mem_free = proc(host, "cuMemFree_v2");
	*(void **)&st->mem_get_info = proc(host, "cuMemGetInfo_v2");
	*(void **)&get_attribute = proc(host, "cuDeviceGetAttribute");
	if (!st->alloc_managed || !st->mem_free || !st->mem_get_info) {
		managed_log(host, EMM_BACKEND_LOG_ERROR, "managed backend: the driver lacks %s",
		            !st->alloc_managed ? "cuMemAllocManaged"
		            : !st->mem_free    ? "cuMemFree_v2"
		                               : "cuMemGetInfo_v2");
		free(st);
		return -ENOENT;
	}
	/* An attribute the driver cannot answer is no verdict. */
	if (get_attribute &&
	    get_attribute(&supported, CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, (CUdevice)device) == CUDA_SUCCESS &&
	    !supported) {
		managed_log(host, EMM_BACKEND_LOG_WARNING,
		            "managed backend: device %d does not support managed memory", device);
		free(st);
		return -ENOTSUP;
	}
	managed_log(host, EMM_BACKEND_LOG_DEBUG, "managed backend: device %d, context 0x%llx", device,
	            (unsigned long long)context);
	*ret_state = st;
	return 0;
}

static void managed_fini(void *state, bool driver_alive)
{
	/* Nothing of the driver's is held: segments were returned by libemm
	 * (or die with the context). */
	free(state);
}

static int managed_segment_alloc(void *state, size_t size, uint64_t stream, uint64_t *ret_addr)
{
	struct managed_state *st = state;
	CUdeviceptr dptr = 0;
	CUresult res;

	if (size == 0 || !ret_addr)
		return -EINVAL;
	res = st->alloc_managed(&dptr, size, CU_MEM_ATTACH_GLOBAL);
	if (res != CUDA_SUCCESS)
		return managed_error(st, "cuMemAllocManaged", size, res);
	*ret_addr = (uint64_t)dptr;
	return 0;
}

static int managed_segment_free(void *state, uint64_t addr, size_t size, uint64_t stream)
{
	struct managed_state *st = state;
	CUresult res;

	res = st->mem_free((CUdeviceptr)addr);
	if (res != CUDA_SUCCESS)
		return managed_error(st, "cuMemFree_v2", size, res);
	return 0;
}

static int managed_mem_info(void *state, size_t *ret_free, size_t *ret_total)
{
	struct managed_state *st = state;

	return emm_bk_mem_info(st->host, EMM_BACKEND_LOG_DEBUG, "managed", st->device, st->mem_get_info, ret_free, ret_total);
}

static const struct emm_backend managed_backend = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
    .struct_size = sizeof(struct emm_backend),
    .name = "managed",
    .caps = EMM_BACKEND_CAP_DEVICE,
    .init = managed_init,
    .fini = managed_fini,
    .segment_alloc = managed_segment_alloc,
    .segment_free = managed_segment_free,
    .mem_info = managed_mem_info,
    .trim = NULL,
    .host_segment_alloc = NULL,
    .host_segment_free = NULL,
};

int MANAGED_ENTRY(uint32_t *inout_version, const struct emm_backend **ret_table)
{
	return emm_bk_negotiate(inout_version, ret_table, &managed_backend, 1);
}
