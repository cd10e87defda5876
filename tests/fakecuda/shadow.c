/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/shadow.c - a preloaded library exporting one driver name,
 * as libemm does. test-shadow checks that the fake's cuGetProcAddress still
 * hands out the fake's own function (as the real driver does), not this one.
 */
#include <cuda.h>

__attribute__((visibility("default"))) CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	(void)dptr;
	(void)bytesize;
	return CUDA_ERROR_UNKNOWN;
}
