/* SPDX-License-Identifier: MIT */
/*
 * allocator/backends/driver.c - the default backend: segments straight from
 * the real driver (cuMemAlloc_v2 / cuMemFree_v2, cuMemHostAlloc /
 * cuMemFreeHost for pinned host memory, cuMemGetInfo_v2 for mem_info).
 *
 * One file, two builds: as libemm-backend-driver.so it exports only
 * emm_backend_get; compiled into libemm with -DEMM_BACKEND_BUILTIN its entry
 * is the hidden emm_backend_builtin_driver. It includes only the public
 * backend header and <cuda.h> (for types; libcuda is never linked: the real
 * entry points come from host->driver_proc, past libemm's own shims).
 *
 * libemm calls every method with the context the state belongs to current.
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
#define DRIVER_ENTRY emm_backend_builtin_driver
#else
#define DRIVER_ENTRY emm_backend_get
__attribute__((visibility("default"))) int emm_backend_get(uint32_t *inout_version,
                                                           const struct emm_backend **ret_table);
#endif

typedef CUresult (*mem_alloc_fn)(CUdeviceptr *dptr, size_t bytesize);
typedef CUresult (*mem_free_fn)(CUdeviceptr dptr);
typedef CUresult (*mem_get_info_fn)(size_t *free, size_t *total);
typedef CUresult (*mem_host_alloc_fn)(void **pp, size_t bytesize, unsigned int flags);
typedef CUresult (*mem_free_host_fn)(void *p);

struct driver_state {
	const struct emm_backend_host *host;
	int device;
	mem_alloc_fn mem_alloc;
	mem_free_fn mem_free;
	mem_get_info_fn mem_get_info;
	mem_host_alloc_fn mem_host_alloc; /* NULL: no pinned host memory */
	mem_free_host_fn mem_free_host;
};

#define driver_log emm_bk_log

/* CUDA_ERROR_OUT_OF_MEMORY is the one failure the allocator acts on (it
 * releases cache and retries); everything else is an I/O-class error. */
static int driver_error(const struct driver_state *st, const char *what, size_t size, CUresult res)
{
	return emm_bk_error(st->host, EMM_BACKEND_LOG_DEBUG, "driver", st->device, what, size, res);
}

static void *driver_proc(const struct emm_backend_host *host, const char *name)
{
	return host->driver_proc ? host->driver_proc(name) : NULL;
}

static int driver_init(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state)
{
	struct driver_state *st;

	if (!host || !ret_state)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->host = host;
	st->device = device;
	*(void **)&st->mem_alloc = driver_proc(host, "cuMemAlloc_v2");
	*(void **)&st->mem_free = driver_proc(host, "cuMemFree_v2");
	*(void **)&st->mem_get_info = driver_proc(host, "cuMemGetInfo_v2");
	*(void **)&st->mem_host_alloc = driver_proc(host, "cuMemHostAlloc");
	*(void **)&st->mem_free_host = driver_proc(host, "cuMemFreeHost");
	if (!st->mem_alloc || !st->mem_free || !st->mem_get_info) {
		driver_log(host, EMM_BACKEND_LOG_ERROR, "driver backend: the driver lacks %s",
		           !st->mem_alloc  ? "cuMemAlloc_v2"
		           : !st->mem_free ? "cuMemFree_v2"
		                           : "cuMemGetInfo_v2");
		free(st);
		return -ENOENT;
	}
	if (!st->mem_host_alloc || !st->mem_free_host) {
		st->mem_host_alloc = NULL;
		st->mem_free_host = NULL;
	}
	driver_log(host, EMM_BACKEND_LOG_DEBUG, "driver backend: device %d, context 0x%llx", device,
	           (unsigned long long)context);
	*ret_state = st;
	return 0;
}

static void driver_fini(void *state, bool driver_alive)
{
	/* Nothing of the driver's is held: segments were returned by libemm
	 * (or die with the context). */
	free(state);
}

static int driver_segment_alloc(void *state, size_t size, uint64_t stream, uint64_t *ret_addr)
{
	struct driver_state *st = state;
	CUdeviceptr dptr = 0;
	CUresult res;

	if (size == 0 || !ret_addr)
		return -EINVAL;
	res = st->mem_alloc(&dptr, size);
	if (res != CUDA_SUCCESS)
		return driver_error(st, "cuMemAlloc_v2", size, res);
	*ret_addr = (uint64_t)dptr;
	return 0;
}

static int driver_segment_free(void *state, uint64_t addr, size_t size, uint64_t stream)
{
	struct driver_state *st = state;
	CUresult res;

	res = st->mem_free((CUdeviceptr)addr);
	if (res != CUDA_SUCCESS)
		return driver_error(st, "cuMemFree_v2", size, res);
	return 0;
}

static int driver_mem_info(void *state, size_t *ret_free, size_t *ret_total)
{
	struct driver_state *st = state;

	return emm_bk_mem_info(st->host, EMM_BACKEND_LOG_DEBUG, "driver", st->device, st->mem_get_info, ret_free, ret_total);
}

static int driver_host_segment_alloc(void *state, size_t size, unsigned flags, uint64_t *ret_addr)
{
	struct driver_state *st = state;
	void *p = NULL;
	CUresult res;

	if (!st->mem_host_alloc)
		return -ENOTSUP;
	if (size == 0 || !ret_addr)
		return -EINVAL;
	res = st->mem_host_alloc(&p, size, flags);
	if (res != CUDA_SUCCESS)
		return driver_error(st, "cuMemHostAlloc", size, res);
	*ret_addr = (uint64_t)(uintptr_t)p;
	return 0;
}

static int driver_host_segment_free(void *state, uint64_t addr, size_t size)
{
	struct driver_state *st = state;
	CUresult res;

	if (!st->mem_free_host)
		return -ENOTSUP;
	res = st->mem_free_host((void *)(uintptr_t)addr);
	if (res != CUDA_SUCCESS)
		return driver_error(st, "cuMemFreeHost", size, res);
	return 0;
}

static const struct emm_backend driver_backend = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
    .struct_size = sizeof(struct emm_backend),
    .name = "driver",
    .caps = EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_HOST_PINNED | EMM_BACKEND_CAP_IPC,
    .init = driver_init,
    .fini = driver_fini,
    .segment_alloc = driver_segment_alloc,
    .segment_free = driver_segment_free,
    .mem_info = driver_mem_info,
    .trim = NULL,
    .host_segment_alloc = driver_host_segment_alloc,
    .host_segment_free = driver_host_segment_free,
};

int DRIVER_ENTRY(uint32_t *inout_version, const struct emm_backend **ret_table)
{
	return emm_bk_negotiate(inout_version, ret_table, &driver_backend, 1);
}
