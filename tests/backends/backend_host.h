/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/backend_host.h - what the backend tests over the fake
 * driver share: a struct emm_backend_host whose driver_proc resolves exact
 * exported names in the fake libcuda.so.1 (some can be hidden or replaced),
 * a log that counts lines per level and keeps the last one, and a fresh fake
 * with device 0's primary context current.
 */
#ifndef TESTS_BACKENDS_BACKEND_HOST_H
#define TESTS_BACKENDS_BACKEND_HOST_H

#include <cuda.h>
#include <dlfcn.h>

#include "emm/emm_backend.h"
#include "emm_test.h"
#include "fakecuda.h"

static const char *bh_hidden;	     /* driver_proc answers NULL for this name */
static const char *bh_replaced;	     /* ... and bh_replacement for this one */
static void *bh_replacement;
static int bh_log_lines[4];
static char bh_last_log[512];

static void *bh_driver_proc(const char *name)
{
	static void *lib;

	if (bh_hidden && strcmp(name, bh_hidden) == 0)
		return NULL;
	if (bh_replaced && strcmp(name, bh_replaced) == 0)
		return bh_replacement;
	if (!lib)
		lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	return lib ? dlsym(lib, name) : NULL;
}

static void bh_log(enum emm_backend_log_level level, const char *msg)
{
	bh_log_lines[level]++;
	snprintf(bh_last_log, sizeof(bh_last_log), "%s", msg);
}

static const struct emm_backend_host bh_host = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
    .struct_size = sizeof(struct emm_backend_host),
    .driver_proc = bh_driver_proc,
    .log = bh_log,
    .options = "",
};

/* Bad news logged (warnings and errors). */
static inline int bh_complaints(void)
{
	return bh_log_lines[EMM_BACKEND_LOG_WARNING] + bh_log_lines[EMM_BACKEND_LOG_ERROR];
}

/* A fresh fake driver (capacity `capacity`, 0: the default) with device 0's
 * primary context current; nothing hidden, the log cleared. */
static inline CUcontext bh_reset(size_t capacity)
{
	CUcontext ctx = NULL;
	CUdevice dev;

	fakecuda_reset();
	if (capacity)
		fakecuda_set_mem_capacity(capacity);
	bh_hidden = bh_replaced = NULL;
	bh_replacement = NULL;
	memset(bh_log_lines, 0, sizeof(bh_log_lines));
	bh_last_log[0] = '\0';
	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
		fprintf(stderr, "the fake driver did not start\n");
		exit(1);
	}
	return ctx;
}

/* A cuDeviceGetAttribute that says 0 to everything (a device without pools
 * or managed memory). */
static inline CUresult bh_attribute_zero(int *value, CUdevice_attribute attr, CUdevice dev)
{
	(void)attr;
	(void)dev;
	*value = 0;
	return CUDA_SUCCESS;
}

#endif
