/* SPDX-License-Identifier: MIT */
/*
 * interpose/public_api.c - the exported API of include/emm/emm.h: the
 * queries (emm_version_string, emm_stats_get, emm_release_idle) and the
 * allocation door for frameworks that dlopen libemm (emm_device_alloc,
 * emm_alloc, emm_host_alloc, emm_mem_info, ...): argument checks and the
 * calls into the process layer (process/api.c).
 *
 * The queries do not initialise libemm: before the first CUDA call there is
 * nothing to report, and a statistics query must not load a backend.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/compiler.h"
#include "config/options.h"
#include "emm/emm.h"
#include "emm/emm_version.h"
#include "process/process.h"

#define STATS_MIN_SIZE (2 * sizeof(uint32_t)) /* struct_size and version */

EMM_EXPORT const char *emm_version_string(void)
{
	return EMM_VERSION_STRING;
}

/* "EMM_NAME=value<TAB>source\n" per option, snprintf-style (emm.h). */
EMM_EXPORT size_t emm_settings(char *buf, size_t size)
{
	const struct emm_options *opts = emm_options_get();
	const enum emm_option_source *sources = emm_options_sources();
	size_t len = 0;

	for (int id = 0; id < EMM_OPT__COUNT; id++) {
		const char *src = sources[id] == EMM_OPTION_DEFAULT ? "default"
		                  : sources[id] == EMM_OPTION_ENV   ? "env"
		                                                    : "invalid";
		char value[300];
		int n;

		emm_option_format((enum emm_option_id)id, opts, value, sizeof(value));
		n = snprintf(len < size ? buf + len : NULL, len < size ? size - len : 0, "EMM_%s=%s\t%s\n",
		             emm_option_name((enum emm_option_id)id), value, src);
		if (n > 0)
			len += (size_t)n;
	}
	return len;
}

EMM_EXPORT int emm_stats_get(int device, struct emm_stats *out)
{
	if (!out || out->struct_size < STATS_MIN_SIZE || device < -2)
		return -EINVAL;
	emm_state_stats_snapshot(device, out);
	return 0;
}

EMM_EXPORT long long emm_release_idle(int device, size_t keep_bytes)
{
	long long released = 0;
	int r = emm_api_release_idle(device, keep_bytes, &released);

	return r < 0 ? r : released;
}

/* --- the allocation door ------------------------------------------------ */

/* Do libemm's shims see the process's CUDA calls (it is preloaded, or
 * otherwise first in the global scope)? Then captures are tracked. Asked
 * once: the global scope's first cuMemAlloc_v2 does not change. */
static bool shims_hooked(void)
{
	static atomic_int hooked = -1;
	int h = atomic_load_explicit(&hooked, memory_order_relaxed);

	if (EMM_UNLIKELY(h < 0)) {
		/* The program's handle searches the global scope only (RTLD_DEFAULT
		 * from inside libemm would also search libemm's own local scope,
		 * and find our export when libemm was merely dlopen'ed). */
		void *global = dlopen(NULL, RTLD_NOW);

		h = global && emm_real_dlsym(global, "cuMemAlloc_v2") == (void *)&cuMemAlloc_v2;
		atomic_store_explicit(&hooked, h, memory_order_relaxed);
	}
	return h;
}

static bool has_stream(struct CUstream_st *stream)
{
	return stream != EMM_STREAM_NONE;
}

static CUstream cu_stream(struct CUstream_st *stream)
{
	return has_stream(stream) ? (CUstream)stream : NULL;
}

EMM_EXPORT int emm_device_alloc(size_t size, int device, struct CUstream_st *stream, void **ret_ptr)
{
	return emm_api_device_alloc(size, device, cu_stream(stream), has_stream(stream), shims_hooked(), ret_ptr);
}

EMM_EXPORT int emm_device_free(void *ptr, int device, struct CUstream_st *stream)
{
	return emm_api_device_free(ptr, device, cu_stream(stream), has_stream(stream), shims_hooked());
}

EMM_EXPORT void *emm_alloc(size_t size, int device, struct CUstream_st *stream)
{
	void *p = NULL;

	return emm_device_alloc(size, device, stream, &p) == 0 ? p : NULL;
}

EMM_EXPORT void emm_free(void *ptr, size_t size, int device, struct CUstream_st *stream)
{
	(void)size;
	(void)emm_device_free(ptr, device, stream);
}

EMM_EXPORT void *emm_param_alloc(struct CUstream_st *stream, size_t size, int device)
{
	return emm_alloc(size, device, stream);
}

EMM_EXPORT void emm_param_free(struct CUstream_st *stream, void *ptr, int device)
{
	(void)emm_device_free(ptr, device, stream);
}

EMM_EXPORT int emm_host_alloc(size_t size, unsigned int flags, void **ret_ptr)
{
	return emm_api_host_alloc(size, flags, ret_ptr);
}

EMM_EXPORT int emm_host_free(void *ptr)
{
	return emm_api_host_free(ptr);
}

EMM_EXPORT int emm_mem_info(int device, size_t *ret_free, size_t *ret_total)
{
	return emm_api_mem_info(device, ret_free, ret_total);
}
