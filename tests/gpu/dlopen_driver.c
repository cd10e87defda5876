/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/dlopen_driver.c - PyTorch's way to the driver: not linked with
 * libcuda, it dlopen()s libcuda.so.1 and dlsym()s cuMemAlloc_v2,
 * cuMemFree_v2 and cuGetProcAddress_v2 from that handle. libemm's dlsym must
 * hand back its own shims for those exact names (and for cuGetProcAddress_v2
 * its resolver, which in turn hands out shims for the exact ABI the driver
 * chose), and leave the old 32-bit cuMemAlloc alone. Then every allocation
 * made through the pointers obtained this way must be served by the pool.
 */
#include <cuda.h>
#include <stdlib.h>

#include "gpu_common.h"

typedef CUresult (*init_fn)(unsigned int);
typedef CUresult (*count_fn)(int *);
typedef CUresult (*devget_fn)(CUdevice *, int);
typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*setcur_fn)(CUcontext);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);
typedef CUresult (*memset_fn)(CUdeviceptr, unsigned char, size_t);
typedef CUresult (*dtoh_fn)(void *, CUdeviceptr, size_t);
typedef CUresult (*gpa_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static void *libcuda;
static struct {
	init_fn init;
	count_fn count;
	devget_fn devget;
	retain_fn retain;
	setcur_fn setcur;
	alloc_fn alloc;
	free_fn free;
	memset_fn memset8;
	dtoh_fn dtoh;
	gpa_fn gpa;
} cu;

/* dlsym into a function pointer without a cast between object and function
 * pointer types. */
#define SYM(dst, name)                                                                                       \
	do {                                                                                                 \
		void *s_ = dlsym(libcuda, name);                                                             \
		memcpy(&(dst), &s_, sizeof(dst));                                                            \
	} while (0)

static void *raw_sym(const char *name)
{
	return dlsym(libcuda, name);
}

/* A pointer dlsym handed out for `name`: libemm's export of that exact name. */
static void expect_substituted(const char *how, const char *name, void *fn)
{
	printf("  %-56s -> %s in %s\n", how, gpu_symbol_at(fn), gpu_where(fn));
	if (!fn) {
		emm_test_fail_("%s: NULL", how);
		return;
	}
	if (!gpu_in_libemm(fn))
		emm_test_fail_("ESCAPE: %s returned the driver's own %s (in %s), not libemm's", how, name,
		               gpu_where(fn));
	else if (strcmp(gpu_symbol_at(fn), name) != 0)
		emm_test_fail_("%s: got libemm's %s, expected its %s (the exact ABI the driver chose)", how,
		               gpu_symbol_at(fn), name);
}

static int alloc_and_check(const char *path, alloc_fn a, free_fn f, unsigned n, unsigned seed)
{
	const size_t size = 300000;
	unsigned char *h = malloc(size);
	int ok = 1;

	if (!h)
		return 0;
	for (unsigned i = 0; i < n && ok; i++) {
		CUdeviceptr p = 0;
		unsigned char v = (unsigned char)(seed + i);
		CUresult r = a(&p, size);
		if (r != CUDA_SUCCESS) {
			emm_test_fail_("%s: alloc -> %d", path, (int)r);
			ok = 0;
			break;
		}
		if (cu.memset8(p, v, size) != CUDA_SUCCESS || cu.dtoh(h, p, size) != CUDA_SUCCESS) {
			emm_test_fail_("%s: memset/copy failed", path);
			ok = 0;
		}
		for (size_t k = 0; ok && k < size; k++) {
			if (h[k] != v) {
				emm_test_fail_("%s: byte %zu is 0x%02x, expected 0x%02x", path, k, h[k], v);
				ok = 0;
			}
		}
		if (f(p) != CUDA_SUCCESS) {
			emm_test_fail_("%s: free failed", path);
			ok = 0;
		}
	}
	free(h);
	return ok;
}

TEST_BEGIN(test_dlsym_from_handle)
{
	struct gpu_snap s0, s1;

	assert_emm_present();
	expect_substituted("dlsym(libcuda, \"cuMemAlloc_v2\")", "cuMemAlloc_v2", raw_sym("cuMemAlloc_v2"));
	expect_substituted("dlsym(libcuda, \"cuMemFree_v2\")", "cuMemFree_v2", raw_sym("cuMemFree_v2"));
	expect_substituted("dlsym(libcuda, \"cuGetProcAddress_v2\")", "cuGetProcAddress_v2",
	                   raw_sym("cuGetProcAddress_v2"));

	/* The 32-bit ABI is forwarded untouched. */
	void *v1 = raw_sym("cuMemAlloc");
	printf("  %-56s -> %s in %s\n", "dlsym(libcuda, \"cuMemAlloc\") (v1 ABI)", gpu_symbol_at(v1),
	       gpu_where(v1));
	if (v1 && gpu_in_libemm(v1))
		emm_test_fail_("dlsym(libcuda, \"cuMemAlloc\") (the 32-bit ABI) was substituted by libemm");

	gpu_snap_take(&s0);
	expect_true(alloc_and_check("dlsym'd cuMemAlloc_v2/cuMemFree_v2", cu.alloc, cu.free, 20, 1));
	gpu_snap_take(&s1);
	expect_served("dlopen(libcuda.so.1) + dlsym(cuMemAlloc_v2)", GPU_SCOPE_DEVICE, &s0, &s1, 20);
	expect_freed("dlopen(libcuda.so.1) + dlsym(cuMemFree_v2)", GPU_SCOPE_DEVICE, &s0, &s1, 20);
}
TEST_END

/* One cuGetProcAddress_v2 query through the dlsym'd resolver. */
static void *gpa(const char *sym, int version, cuuint64_t flags, int with_status)
{
	void *fn = NULL;
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	CUresult r = cu.gpa(sym, &fn, version, flags, with_status ? &st : NULL);

	if (r != CUDA_SUCCESS || (with_status && st != CU_GET_PROC_ADDRESS_SUCCESS)) {
		emm_test_fail_("cuGetProcAddress_v2(\"%s\", %d, %llu) -> %d, status %d", sym, version,
		               (unsigned long long)flags, (int)r, (int)st);
		return NULL;
	}
	return fn;
}

TEST_BEGIN(test_get_proc_address)
{
	struct gpu_snap s0, s1;
	alloc_fn a = NULL;
	free_fn f = NULL;
	void *fn;

	assert_emm_present();
	fn = gpa("cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_DEFAULT, 1);
	expect_substituted("cuGetProcAddress_v2(\"cuMemAlloc\", 12000, default)", "cuMemAlloc_v2", fn);
	memcpy(&a, &fn, sizeof(a));
	fn = gpa("cuMemAlloc", 3020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 0);
	expect_substituted("cuGetProcAddress_v2(\"cuMemAlloc\", 3020, ptds, NULL status)", "cuMemAlloc_v2",
	                   fn);
	fn = gpa("cuMemFree", 12000, CU_GET_PROC_ADDRESS_DEFAULT, 0);
	expect_substituted("cuGetProcAddress_v2(\"cuMemFree\", 12000, default, NULL status)", "cuMemFree_v2",
	                   fn);
	memcpy(&f, &fn, sizeof(f));
	fn = gpa("cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, 1);
	expect_substituted("cuGetProcAddress_v2(\"cuMemAllocAsync\", 11020, ptds)", "cuMemAllocAsync_ptsz",
	                   fn);
	fn = gpa("cuMemAllocAsync", 11020, CU_GET_PROC_ADDRESS_LEGACY_STREAM, 1);
	expect_substituted("cuGetProcAddress_v2(\"cuMemAllocAsync\", 11020, legacy)", "cuMemAllocAsync", fn);
	fn = gpa("cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_DEFAULT, 0);
	expect_substituted("cuGetProcAddress_v2(\"cuGetProcAddress\", 12000)", "cuGetProcAddress_v2", fn);
	fn = gpa("cuMemAlloc", 2000, CU_GET_PROC_ADDRESS_DEFAULT, 1);
	printf("  %-56s -> %s in %s\n", "cuGetProcAddress_v2(\"cuMemAlloc\", 2000) (v1 ABI)",
	       gpu_symbol_at(fn), gpu_where(fn));
	if (fn && gpu_in_libemm(fn))
		emm_test_fail_("the v1 cuMemAlloc ABI (cudaVersion 2000) was substituted by libemm");

	if (!a || !f)
		return;
	gpu_snap_take(&s0);
	expect_true(alloc_and_check("cuGetProcAddress_v2'd cuMemAlloc/cuMemFree", a, f, 20, 50));
	gpu_snap_take(&s1);
	expect_served("dlsym(cuGetProcAddress_v2) -> cuMemAlloc", GPU_SCOPE_DEVICE, &s0, &s1, 20);
	expect_freed("dlsym(cuGetProcAddress_v2) -> cuMemFree", GPU_SCOPE_DEVICE, &s0, &s1, 20);
}
TEST_END

int main(void)
{
	CUdevice dev = 0;
	CUcontext ctx = NULL;
	int count = 0;
	CUresult r;

	libcuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!libcuda) {
		printf("skip: cannot dlopen libcuda.so.1: %s\n", dlerror());
		return GPU_SKIP;
	}
	SYM(cu.init, "cuInit");
	SYM(cu.count, "cuDeviceGetCount");
	SYM(cu.devget, "cuDeviceGet");
	SYM(cu.retain, "cuDevicePrimaryCtxRetain");
	SYM(cu.setcur, "cuCtxSetCurrent");
	SYM(cu.alloc, "cuMemAlloc_v2");
	SYM(cu.free, "cuMemFree_v2");
	SYM(cu.memset8, "cuMemsetD8_v2");
	SYM(cu.dtoh, "cuMemcpyDtoH_v2");
	SYM(cu.gpa, "cuGetProcAddress_v2");
	if (!cu.init || !cu.count || !cu.devget || !cu.retain || !cu.setcur || !cu.alloc || !cu.free ||
	    !cu.memset8 || !cu.dtoh || !cu.gpa) {
		printf("FAIL: dlsym(libcuda.so.1, ...) gave NULL for an entry point this test needs "
		       "(cuInit %d, cuDeviceGetCount %d, cuDeviceGet %d, cuDevicePrimaryCtxRetain %d, "
		       "cuCtxSetCurrent %d, cuMemAlloc_v2 %d, cuMemFree_v2 %d, cuMemsetD8_v2 %d, "
		       "cuMemcpyDtoH_v2 %d, cuGetProcAddress_v2 %d)\n",
		       !!cu.init, !!cu.count, !!cu.devget, !!cu.retain, !!cu.setcur, !!cu.alloc, !!cu.free,
		       !!cu.memset8, !!cu.dtoh, !!cu.gpa);
		return 1;
	}
	r = cu.init(0);
	if (r == CUDA_SUCCESS)
		r = cu.count(&count);
	if (r != CUDA_SUCCESS || count == 0) {
		printf("skip: no usable CUDA device (cuInit/cuDeviceGetCount: %d, %d devices)\n", (int)r,
		       count);
		return GPU_SKIP;
	}
	if (cu.devget(&dev, 0) != CUDA_SUCCESS || cu.retain(&ctx, dev) != CUDA_SUCCESS ||
	    cu.setcur(ctx) != CUDA_SUCCESS) {
		printf("FAIL: cannot make device 0's primary context current\n");
		return 1;
	}
	emm_test_fn tests[] = {test_dlsym_from_handle, test_get_proc_address, NULL};
	int rc = emm_test_run_list(tests);
	gpu_print_served("dlopen-dlsym");
	return rc;
}
