/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/example/example_backend.c - an out-of-tree libemm backend:
 * the driver backend's behaviour (segments from cuMemAlloc_v2, back with
 * cuMemFree_v2, mem_info from cuMemGetInfo_v2) wrapped in counters of
 * segment allocations and frees. It shows what a backend needs and nothing
 * more: it includes only the installed public header <emm/emm_backend.h>
 * (no CUDA header: the three driver types it needs are declared here), and
 * it is built outside libemm's build:
 *
 *   cc -shared -fPIC -fvisibility=hidden $(pkg-config --cflags emm) \
 *      -o libexample-backend.so example_backend.c
 *   EMM_BACKEND=$PWD/libexample-backend.so LD_PRELOAD=libemm.so ./program
 *
 * The counts are readable through the exported emm_example_counts() (find
 * it with dlopen(path, RTLD_NOLOAD) + dlsym: libemm loads the backend
 * RTLD_LOCAL), and fini logs them through host->log (EMM_VERBOSE shows it).
 * Driver functions come from host->driver_proc only: libemm intercepts the
 * exported names, so dlsym would hand back libemm's own shims.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <emm/emm_backend.h>

#define EXAMPLE_API __attribute__((visibility("default")))

/* From cuda.h: CUresult is an enum whose success value is 0, out of memory
 * is 2; CUdeviceptr is 64 bits on every 64-bit platform. */
typedef int example_curesult;
typedef unsigned long long example_deviceptr;
#define EXAMPLE_CUDA_SUCCESS 0
#define EXAMPLE_CUDA_ERROR_OUT_OF_MEMORY 2

typedef example_curesult (*mem_alloc_fn)(example_deviceptr *dptr, size_t bytesize);
typedef example_curesult (*mem_free_fn)(example_deviceptr dptr);
typedef example_curesult (*mem_get_info_fn)(size_t *free_bytes, size_t *total);

struct example_state {
	const struct emm_backend_host *host;
	int device;
	mem_alloc_fn mem_alloc;
	mem_free_fn mem_free;
	mem_get_info_fn mem_get_info;
};

static atomic_ullong segment_allocs, segment_frees, failures;

EXAMPLE_API int emm_example_counts(uint64_t *allocs, uint64_t *frees, uint64_t *failed);
EXAMPLE_API int emm_backend_get(uint32_t *inout_version, const struct emm_backend **ret_table);

/* Segments served and returned so far, and failed calls, in this process. */
int emm_example_counts(uint64_t *allocs, uint64_t *frees, uint64_t *failed)
{
	if (allocs)
		*allocs = atomic_load(&segment_allocs);
	if (frees)
		*frees = atomic_load(&segment_frees);
	if (failed)
		*failed = atomic_load(&failures);
	return 0;
}

static void example_log(const struct emm_backend_host *host, enum emm_backend_log_level level, const char *msg)
{
	if (host && host->log)
		host->log(level, msg);
}

static int example_error(example_curesult res)
{
	atomic_fetch_add(&failures, 1);
	return res == EXAMPLE_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
}

static int example_init(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state)
{
	struct example_state *st;

	(void)context;
	if (!host || !ret_state || !host->driver_proc)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->host = host;
	st->device = device;
	*(void **)&st->mem_alloc = host->driver_proc("cuMemAlloc_v2");
	*(void **)&st->mem_free = host->driver_proc("cuMemFree_v2");
	*(void **)&st->mem_get_info = host->driver_proc("cuMemGetInfo_v2");
	if (!st->mem_alloc || !st->mem_free || !st->mem_get_info) {
		example_log(host, EMM_BACKEND_LOG_ERROR, "example backend: the driver lacks cuMemAlloc_v2");
		free(st);
		return -ENOENT;
	}
	example_log(host, EMM_BACKEND_LOG_INFO, "example backend: counting segments");
	*ret_state = st;
	return 0;
}

static void example_fini(void *state, bool driver_alive)
{
	struct example_state *st = state;
	char line[160];

	(void)driver_alive;
	snprintf(line, sizeof(line), "example backend: device %d: %llu segment allocations, %llu frees",
	         st->device, (unsigned long long)atomic_load(&segment_allocs),
	         (unsigned long long)atomic_load(&segment_frees));
	example_log(st->host, EMM_BACKEND_LOG_INFO, line);
	free(st);
}

static int example_segment_alloc(void *state, size_t size, uint64_t stream, uint64_t *ret_addr)
{
	struct example_state *st = state;
	example_deviceptr dptr = 0;
	example_curesult res;

	(void)stream;
	if (size == 0 || !ret_addr)
		return -EINVAL;
	res = st->mem_alloc(&dptr, size);
	if (res != EXAMPLE_CUDA_SUCCESS)
		return example_error(res);
	atomic_fetch_add(&segment_allocs, 1);
	*ret_addr = (uint64_t)dptr;
	return 0;
}

static int example_segment_free(void *state, uint64_t addr, size_t size, uint64_t stream)
{
	struct example_state *st = state;
	example_curesult res;

	(void)size;
	(void)stream;
	res = st->mem_free((example_deviceptr)addr);
	if (res != EXAMPLE_CUDA_SUCCESS)
		return example_error(res);
	atomic_fetch_add(&segment_frees, 1);
	return 0;
}

static int example_mem_info(void *state, size_t *ret_free, size_t *ret_total)
{
	struct example_state *st = state;
	size_t free_bytes = 0, total = 0;
	example_curesult res;

	res = st->mem_get_info(&free_bytes, &total);
	if (res != EXAMPLE_CUDA_SUCCESS)
		return example_error(res);
	if (ret_free)
		*ret_free = free_bytes;
	if (ret_total)
		*ret_total = total;
	return 0;
}

static const struct emm_backend example_backend = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
    .struct_size = sizeof(struct emm_backend),
    .name = "example",
    .caps = EMM_BACKEND_CAP_DEVICE,
    .init = example_init,
    .fini = example_fini,
    .segment_alloc = example_segment_alloc,
    .segment_free = example_segment_free,
    .mem_info = example_mem_info,
};

/* Version 1 defines every method this table has; a newer libemm offers a
 * higher version and gets 1 back. */
int emm_backend_get(uint32_t *inout_version, const struct emm_backend **ret_table)
{
	if (!inout_version || !ret_table)
		return -EINVAL;
	if (*inout_version < 1)
		return -ENOTSUP;
	*inout_version = 1;
	*ret_table = &example_backend;
	return 0;
}
