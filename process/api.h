/* SPDX-License-Identifier: MIT */
/*
 * process/api.h - the public API's allocation door (api.c): emm_device_alloc
 * and friends of include/emm/emm.h served in a context of the device asked
 * for. Part of process.h, which includes it: interpose/ includes
 * process.h, never this.
 */
#ifndef EMM_PROCESS_API_H
#define EMM_PROCESS_API_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>

/*
 * emm_device_alloc and friends (include/emm/emm.h), in `device`'s context
 * (the current one if on that device, else its primary context pushed
 * around the call). `has_stream` false: no stream (cuMemAlloc/cuMemFree
 * semantics). `hooked`: libemm's shims see the process's CUDA calls
 * (preloaded), so captures are tracked; otherwise the driver is asked.
 * What the heaps do not serve goes to the driver. 0 or a negative errno.
 */
int emm_api_device_alloc(size_t size, int device, CUstream stream, bool has_stream, bool hooked, void **ret_ptr);
int emm_api_device_free(void *ptr, int device, CUstream stream, bool has_stream, bool hooked);
int emm_api_host_alloc(size_t size, unsigned int flags, void **ret_ptr);
int emm_api_host_free(void *ptr);
int emm_api_mem_info(int device, size_t *ret_free, size_t *ret_total);
/* emm_release_idle, in a context of `device` (its primary one when the
 * thread has none current). */
int emm_api_release_idle(int device, size_t keep_bytes, long long *ret_released);

#endif
