/* SPDX-License-Identifier: MIT */
/*
 * allocator/backends/backend_util.h - what every built-in backend shares:
 * a log line through the host, a failed driver call as an errno, and the
 * version negotiation of emm_backend_get, the mem_info method. Header-only and static inline,
 * because each backend also builds alone as its own .so (only
 * emm_backend_get is exported). Out-of-tree backends use
 * include/emm/emm_backend.h alone (tests/backends/example/).
 */
#ifndef EMM_ALLOCATOR_BACKENDS_BACKEND_UTIL_H
#define EMM_ALLOCATOR_BACKENDS_BACKEND_UTIL_H

#include <cuda.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "emm/emm_backend.h"

/* One line through host->log (nothing without a host); never allocates. */
__attribute__((format(printf, 3, 4))) static inline void
emm_bk_log(const struct emm_backend_host *host, enum emm_backend_log_level level, const char *fmt, ...)
{
	char line[256];
	va_list ap;

	if (!host || !host->log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	host->log(level, line);
}

/* A failed driver call: CUDA_ERROR_OUT_OF_MEMORY is the one failure the
 * allocator acts on (it releases cache and retries: -ENOMEM, logged at
 * debug), CUDA_ERROR_NOT_SUPPORTED is -ENOTSUP, anything else an I/O-class
 * -EIO; those two logged at `level`. */
static inline int emm_bk_error(const struct emm_backend_host *host, enum emm_backend_log_level level,
                               const char *backend, int device, const char *what, size_t size, CUresult res)
{
	if (res == CUDA_ERROR_OUT_OF_MEMORY) {
		emm_bk_log(host, EMM_BACKEND_LOG_DEBUG, "%s backend: %s(%zu) on device %d: out of memory", backend,
		           what, size, device);
		return -ENOMEM;
	}
	emm_bk_log(host, level, "%s backend: %s(%zu) on device %d failed with CUresult %d", backend, what, size,
	           device, (int)res);
	return res == CUDA_ERROR_NOT_SUPPORTED ? -ENOTSUP : -EIO;
}

/* The mem_info method over cuMemGetInfo_v2 (`get`): 0 and the bytes, or
 * the call's failure as emm_bk_error maps it; outputs untouched then. */
static inline int emm_bk_mem_info(const struct emm_backend_host *host, enum emm_backend_log_level level,
                                  const char *backend, int device, CUresult (*get)(size_t *, size_t *),
                                  size_t *ret_free, size_t *ret_total)
{
	size_t free_bytes = 0, total_bytes = 0;
	CUresult res = get(&free_bytes, &total_bytes);

	if (res != CUDA_SUCCESS)
		return emm_bk_error(host, level, backend, device, "cuMemGetInfo_v2", 0, res);
	if (ret_free)
		*ret_free = free_bytes;
	if (ret_total)
		*ret_total = total_bytes;
	return 0;
}

/* The body of emm_backend_get: methods are only appended, so `table`
 * serves every version from `min_version` up to the one it was built for;
 * an older libemm gets -ENOTSUP. */
static inline int emm_bk_negotiate(uint32_t *inout_version, const struct emm_backend **ret_table,
                                   const struct emm_backend *table, uint32_t min_version)
{
	if (!inout_version || !ret_table)
		return -EINVAL;
	if (*inout_version < min_version)
		return -ENOTSUP;
	if (*inout_version > EMM_BACKEND_INTERFACE_VERSION)
		*inout_version = EMM_BACKEND_INTERFACE_VERSION;
	*ret_table = table;
	return 0;
}

#endif
