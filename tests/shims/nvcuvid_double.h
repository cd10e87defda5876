/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/nvcuvid_double.h - what the libnvcuvid.so.1 test double
 * (nvcuvid_double.c) exports; test_shims_driver_component.c finds them
 * with dlsym. Each returns the driver's code (CUDA_ERROR_NOT_FOUND when a
 * function it needs is missing).
 */
#ifndef EMM_TESTS_NVCUVID_DOUBLE_H
#define EMM_TESTS_NVCUVID_DOUBLE_H

#include <cuda.h>
#include <stddef.h>

#define NVCUVID_DOUBLE_API __attribute__((visibility("default")))

/* `size` bytes of device memory from the driver's private table, freed with
 * cuMemFree_v2 (async 0) or cuMemFreeAsync on the legacy stream (async 1). */
NVCUVID_DOUBLE_API CUresult nvcuvid_double_device_cycle(size_t size, int async);
/* Pinned host memory from the private table, freed with cuMemFreeHost. */
NVCUVID_DOUBLE_API CUresult nvcuvid_double_host_cycle(size_t size);
/* cuMemAlloc_v2 and cuMemFree_v2 as the library resolved them (dlsym). */
NVCUVID_DOUBLE_API CUresult nvcuvid_double_alloc(CUdeviceptr *p, size_t size);
NVCUVID_DOUBLE_API CUresult nvcuvid_double_free(CUdeviceptr p);

#endif
