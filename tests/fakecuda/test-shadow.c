/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/test-shadow.c - run with libfakecuda-shadow.so preloaded
 * (it exports cuMemAlloc_v2): a lookup by symbol finds the preload, but the
 * fake's resolver returns the fake's own cuMemAlloc_v2, which dladdr names
 * in libcuda.so.1. Never links libcuda, like libemm.
 */
#include <dlfcn.h>
#include <string.h>

#include <cuda.h>

#include "emm_test.h"

typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

TEST_BEGIN(test_resolver_ignores_preload)
{
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	assert_ptr_not_null(lib);
	Dl_info info;
	void *global = dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
	assert_ptr_not_null(global);
	assert_true(dladdr(global, &info) != 0);
	expect_true(strstr(info.dli_fname, "shadow") != NULL);

	get_proc_fn get_proc = (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2");
	CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(lib, "cuInit");
	CUresult (*retain)(CUcontext *, CUdevice) = (CUresult(*)(CUcontext *, CUdevice))dlsym(lib, "cuDevicePrimaryCtxRetain");
	CUresult (*set_current)(CUcontext) = (CUresult(*)(CUcontext))dlsym(lib, "cuCtxSetCurrent");
	assert_true(get_proc && init && retain && set_current);
	void *fn = NULL;
	assert_int_eq(get_proc("cuMemAlloc", &fn, 13000, 0, NULL), CUDA_SUCCESS);
	assert_ptr_not_null(fn);
	expect_true(fn != global);
	assert_true(dladdr(fn, &info) != 0);
	expect_true(strstr(info.dli_fname, "libcuda.so") != NULL);
	expect_str_eq(info.dli_sname, "cuMemAlloc_v2");

	CUcontext ctx;
	CUdeviceptr p = 0;
	assert_int_eq(init(0), CUDA_SUCCESS);
	assert_int_eq(retain(&ctx, 0), CUDA_SUCCESS);
	assert_int_eq(set_current(ctx), CUDA_SUCCESS);
	expect_int_eq(((alloc_fn)fn)(&p, 64), CUDA_SUCCESS);
	expect_int_eq(((alloc_fn)global)(&p, 64), CUDA_ERROR_UNKNOWN);
}
TEST_END

int main(void)
{
	return emm_test_run(test_resolver_ignores_preload, NULL);
}
