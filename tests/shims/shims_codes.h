/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/shims_codes.h - a fixed sequence of driver calls whose answers
 * (one "name code" line each, no pointer values) must be the same with and
 * without libemm (run in a fresh process with run_self, shims_run.h).
 * Shared by test_shims.c (over the test-double driver) and test_shims_gpu.c
 * (over the real one). Functions are static: each program includes this
 * once.
 */
#ifndef EMM_TESTS_SHIMS_CODES_H
#define EMM_TESTS_SHIMS_CODES_H

#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "shims_run.h"

/* --- mode "codes": the driver's answers to a fixed sequence ------------- */

#define P(name, expr) printf("%-28s %d\n", name, (int)(expr))

static int mode_codes(void)
{
	CUdeviceptr d = 0, d2 = 0, b = 0;
	CUdevice dev;
	CUcontext ctx, c2;
	CUctxCreateParams params;
	size_t f = 0, t = 0, s = 0, pitch = 0;
	void *h = NULL;
	CUipcMemHandle ipc;

	/* before cuInit */
	P("pre_alloc", cuMemAlloc(&d, 1024));
	P("pre_free0", cuMemFree(0));
	P("pre_getinfo", cuMemGetInfo(&f, &t));
	P("pre_alloc_host", cuMemAllocHost(&h, 64));
	P("pre_alloc_async", cuMemAllocAsync(&d, 64, 0));
	P("init", cuInit(0));
	P("device_get", cuDeviceGet(&dev, 0));
	/* no context */
	P("noctx_alloc", cuMemAlloc(&d, 1024));
	P("noctx_free0", cuMemFree(0));
	P("noctx_free_unknown", cuMemFree(0x1234));
	P("noctx_getinfo", cuMemGetInfo(&f, &t));
	P("noctx_alloc_async", cuMemAllocAsync(&d, 64, 0));
	P("noctx_host_alloc", cuMemHostAlloc(&h, 64, 0));
	P("retain", cuDevicePrimaryCtxRetain(&ctx, dev));
	P("set_current", cuCtxSetCurrent(ctx));
	/* invalid arguments */
	P("alloc_size0", cuMemAlloc(&d, 0));
	P("alloc_null", cuMemAlloc(NULL, 1024));
	P("alloc_async_size0", cuMemAllocAsync(&d, 0, 0));
	P("alloc_async_null", cuMemAllocAsync(NULL, 16, 0));
	P("pitch_elem3", cuMemAllocPitch(&d, &pitch, 100, 10, 3));
	P("pitch_width0", cuMemAllocPitch(&d, &pitch, 0, 10, 4));
	P("pitch_null", cuMemAllocPitch(NULL, &pitch, 100, 10, 4));
	P("pitch_ok", cuMemAllocPitch(&d, &pitch, 100, 10, 4));
	P("pitch_value", pitch);
	P("pitch_free", cuMemFree(d));
	/* frees */
	P("alloc", cuMemAlloc(&d, 1024));
	P("free_interior", cuMemFree(d + 256));
	P("free", cuMemFree(d));
	P("free_double", cuMemFree(d));
	P("free0", cuMemFree(0));
	P("free_unknown", cuMemFree(0x1234));
	/* stream-ordered */
	P("alloc_async", cuMemAllocAsync(&d2, 4096, 0));
	P("free_async", cuMemFreeAsync(d2, 0));
	P("free_async_double", cuMemFreeAsync(d2, 0));
	P("free_async0", cuMemFreeAsync(0, 0));
	P("free_async_unknown", cuMemFreeAsync(0x1234, 0));
	/* pinned */
	P("host_alloc_null", cuMemHostAlloc(NULL, 16, 0));
	P("alloc_host", cuMemAllocHost(&h, 4096));
	P("free_host_interior", cuMemFreeHost((char *)h + 16));
	P("free_host", cuMemFreeHost(h));
	P("free_host_double", cuMemFreeHost(h));
	P("free_host_null", cuMemFreeHost(NULL));
	P("free_host_unknown", cuMemFreeHost((void *)0x1234));
	P("managed_size0", cuMemAllocManaged(&d, 0, CU_MEM_ATTACH_GLOBAL));
	P("register_null", cuMemHostRegister(NULL, 4096, 0));
	P("unregister_unknown", cuMemHostUnregister((void *)0x1234));
	/* ranges and attributes */
	P("alloc_1000", cuMemAlloc(&d, 1000));
	P("range_interior", cuMemGetAddressRange(&b, &s, d + 100));
	P("range_base_offset", b - d);
	P("range_size", s);
	P("range_past_end", cuMemGetAddressRange(&b, &s, d + 1024));
	P("range_far", cuMemGetAddressRange(&b, &s, d + 100000));
	s = 0;
	P("attr_range_size", cuPointerGetAttribute(&s, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d + 100));
	P("attr_range_size_value", s);
	b = 0;
	P("attr_range_start", cuPointerGetAttribute(&b, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d + 100));
	P("attr_range_start_offset", b - d);
	P("ipc_unknown", cuIpcGetMemHandle(&ipc, 0x1234));
	P("free_1000", cuMemFree(d));
	P("getinfo", cuMemGetInfo(&f, &t));
	/* a context destroyed under its blocks */
	memset(&params, 0, sizeof(params));
	P("ctx_create", cuCtxCreate(&c2, &params, 0, dev));
	P("ctx_alloc", cuMemAlloc(&d, 4096));
	P("ctx_destroy", cuCtxDestroy(c2));
	P("set_current2", cuCtxSetCurrent(ctx));
	P("free_after_ctx_destroy", cuMemFree(d));
	fflush(stdout);
	return 0;
}

#undef P

#endif
