/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/shims_common.h - helpers shared by the driver-shim test
 * programs: they run with LD_PRELOAD=libemm.so over the test-double driver
 * (tests/fakecuda), call the driver API directly (bound to libemm's exports
 * through the preload), steer the fake through its fakecuda_* functions and
 * read libemm's counters through emm_stats_get found with dlsym.
 */
#ifndef EMM_TESTS_SHIMS_COMMON_H
#define EMM_TESTS_SHIMS_COMMON_H

#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emm/emm.h"
#include "fakecuda.h"

/* Declared by cuda.h only for per-thread-default-stream builds. */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

static inline int shims_stats(int device, struct emm_stats *out)
{
	static int (*get)(int, struct emm_stats *);

	memset(out, 0, sizeof(*out));
	out->struct_size = sizeof(*out);
	if (!get)
		get = (int (*)(int, struct emm_stats *))dlsym(RTLD_DEFAULT, "emm_stats_get");
	if (!get) {
		fprintf(stderr, "emm_stats_get not found: is libemm.so preloaded?\n");
		exit(1);
	}
	return get(device, out);
}

/* *d = the process-wide counters now minus `before` (every uint64_t from
 * `allocs` on; the header fields are now's). */
static inline void shims_stats_since(const struct emm_stats *before, struct emm_stats *d)
{
	struct emm_stats now;
	const uint64_t *n = &now.allocs, *b = &before->allocs;
	uint64_t *o = &d->allocs;

	if (shims_stats(-1, &now) != 0) {
		fprintf(stderr, "emm_stats_get failed\n");
		exit(1);
	}
	*d = now;
	for (size_t i = 0; i < (sizeof(now) - offsetof(struct emm_stats, allocs)) / sizeof(uint64_t); i++)
		o[i] = n[i] - b[i];
}

static inline long long shims_release_idle(int device, size_t keep)
{
	long long (*rel)(int, size_t) = (long long (*)(int, size_t))dlsym(RTLD_DEFAULT, "emm_release_idle");

	return rel ? rel(device, keep) : -1;
}

/* cuInit, device 0's primary context made current. Exits on failure. */
static inline CUcontext shims_setup(void)
{
	CUdevice dev;
	CUcontext ctx;

	if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
	    cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
		fprintf(stderr, "driver setup failed\n");
		exit(1);
	}
	return ctx;
}

static inline struct fakecuda_stats fake_stats(void)
{
	struct fakecuda_stats s;

	memset(&s, 0, sizeof(s));
	fakecuda_get_stats(&s);
	return s;
}

#endif
