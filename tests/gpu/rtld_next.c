/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/rtld_next.c - dlsym(RTLD_NEXT, ...) keeps its meaning with libemm
 * preloaded next to another interposer (libgpuwrapnext.so, which wraps
 * cudaMalloc). Run twice by meson:
 *
 *   LD_PRELOAD=libemm.so:libgpuwrapnext.so  gpu-rtld-next --order emm-first
 *   LD_PRELOAD=libgpuwrapnext.so:libemm.so  gpu-rtld-next --order wrap-first
 *
 * Checks: lookups made from inside the wrapper library find the definition
 * after it (libc's malloc/strerror, the same pointer twice; cudaMalloc in
 * libcudart or libemm, by order); lookups made from this program find the
 * first preloaded definition; the wrapper never finds itself; and every
 * cudaMalloc still ends in the pool. Linked to shared cudart.
 */
#include <cuda_runtime_api.h>
#include <stdlib.h>

#include "gpu_common.h"

typedef void *(*next_fn)(const char *);
typedef int (*calls_fn)(void);

static const char *order = "";
static next_fn wrap_next;
static calls_fn wrap_calls;
static int emm_has_cuda_malloc;

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* `fn` lives in the object whose file name starts with `lib`. */
static void expect_in(const char *what, const void *fn, const char *lib)
{
	const char *where = base_name(gpu_where(fn));

	printf("  %-52s -> %s\n", what, gpu_where(fn));
	if (!fn)
		emm_test_fail_("%s: NULL (order %s)", what, order);
	else if (strncmp(where, lib, strlen(lib)) != 0)
		emm_test_fail_("%s: found in %s, expected %s* (order %s)", what, where, lib, order);
}

TEST_BEGIN(test_next_from_wrapper)
{
	assert_emm_present();
	assert_true(wrap_next != NULL);

	void *m1 = wrap_next("malloc"), *m2 = wrap_next("malloc");
	expect_in("wrapper: dlsym(RTLD_NEXT, \"malloc\")", m1, "libc.so");
	expect_ptr_eq(m1, m2);
	void *e1 = wrap_next("strerror"), *e2 = wrap_next("strerror");
	expect_in("wrapper: dlsym(RTLD_NEXT, \"strerror\")", e1, "libc.so");
	expect_ptr_eq(e1, e2);

	/* After the wrapper: libcudart when libemm comes first; libemm's
	 * runtime shim when it comes after (if libemm has one). */
	const char *expect =
	    strcmp(order, "wrap-first") == 0 && emm_has_cuda_malloc ? "libemm.so" : "libcudart.so";
	void *c1 = wrap_next("cudaMalloc"), *c2 = wrap_next("cudaMalloc");
	expect_in("wrapper: dlsym(RTLD_NEXT, \"cudaMalloc\")", c1, expect);
	expect_ptr_eq(c1, c2);
}
TEST_END

TEST_BEGIN(test_next_from_program)
{
	assert_emm_present();
	/* From the executable, RTLD_NEXT starts with the first preload. */
	const char *expect =
	    strcmp(order, "emm-first") == 0 && emm_has_cuda_malloc ? "libemm.so" : "libgpuwrapnext.so";
	void *c = dlsym(RTLD_NEXT, "cudaMalloc");
	expect_in("program: dlsym(RTLD_NEXT, \"cudaMalloc\")", c, expect);
	expect_ptr_eq(c, dlsym(RTLD_DEFAULT, "cudaMalloc"));
	expect_in("program: dlsym(RTLD_NEXT, \"gpuwrap_next\")", dlsym(RTLD_NEXT, "gpuwrap_next"),
	          "libgpuwrapnext.so");
	expect_in("program: dlsym(RTLD_NEXT, \"malloc\")", dlsym(RTLD_NEXT, "malloc"), "libc.so");
}
TEST_END

TEST_BEGIN(test_allocations_still_pooled)
{
	const int n = 10;
	const size_t size = 100000;
	unsigned char *h = malloc(size);
	struct gpu_snap s0, s1;
	int before, calls;

	assert_emm_present();
	assert_ptr_not_null(h);
	before = wrap_calls();
	gpu_snap_take(&s0);
	for (int i = 0; i < n; i++) {
		void *p = NULL;
		cudaError_t e = cudaMalloc(&p, size);
		if (e != cudaSuccess) {
			emm_test_fail_("cudaMalloc -> %d (order %s)", (int)e, order);
			break;
		}
		if (cudaMemset(p, 0x40 + i, size) != cudaSuccess ||
		    cudaMemcpy(h, p, size, cudaMemcpyDeviceToHost) != cudaSuccess) {
			emm_test_fail_("memset/copy failed");
			break;
		}
		for (size_t k = 0; k < size; k++) {
			if (h[k] != (unsigned char)(0x40 + i)) {
				emm_test_fail_("byte %zu is 0x%02x, expected 0x%02x", k, h[k], 0x40 + i);
				break;
			}
		}
		if (cudaFree(p) != cudaSuccess)
			emm_test_fail_("cudaFree failed");
	}
	gpu_snap_take(&s1);
	free(h);
	expect_served(strcmp(order, "emm-first") == 0
	                  ? "cudaMalloc, libemm preloaded before a wrapper"
	                  : "cudaMalloc through a wrapper preloaded before libemm",
	              GPU_SCOPE_DEVICE, &s0, &s1, (uint64_t)n);
	calls = wrap_calls() - before;
	printf("  wrapper's cudaMalloc called %d times\n", calls);
	/* The program's cudaMalloc binds to the first definition: the wrapper
	 * unless libemm comes first and has a cudaMalloc of its own (which may
	 * still call the next one, the wrapper, for first use or errors). */
	if (strcmp(order, "emm-first") == 0 && emm_has_cuda_malloc)
		expect_true(calls <= n);
	else
		expect_int_eq(calls, n);
}
TEST_END

int main(int argc, char **argv)
{
	int count = 0;
	cudaError_t e;

	if (argc == 3 && strcmp(argv[1], "--order") == 0)
		order = argv[2];
	if (strcmp(order, "emm-first") != 0 && strcmp(order, "wrap-first") != 0) {
		fprintf(stderr, "usage: %s --order emm-first|wrap-first\n", argv[0]);
		return 2;
	}
	e = cudaGetDeviceCount(&count);
	if (e != cudaSuccess || count == 0) {
		printf("skip: no usable CUDA device (cudaGetDeviceCount: %d, %d devices)\n", (int)e, count);
		return GPU_SKIP;
	}
	if (cudaSetDevice(0) != cudaSuccess || cudaFree(NULL) != cudaSuccess) {
		printf("FAIL: cannot initialise device 0\n");
		return 1;
	}

	void *sym = dlsym(RTLD_DEFAULT, "gpuwrap_next");
	memcpy(&wrap_next, &sym, sizeof(wrap_next));
	sym = dlsym(RTLD_DEFAULT, "gpuwrap_calls");
	memcpy(&wrap_calls, &sym, sizeof(wrap_calls));
	if (!wrap_next || !wrap_calls) {
		printf("FAIL: libgpuwrapnext.so is not preloaded (LD_PRELOAD=%s)\n",
		       getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "");
		return 1;
	}
	if (gpu_emm_present()) {
		void *emm = dlopen(gpu_where((const void *)gpu_stats_fn()), RTLD_LAZY | RTLD_NOLOAD);
		void *cm = emm ? dlsym(emm, "cudaMalloc") : NULL;
		emm_has_cuda_malloc = cm && gpu_in_libemm(cm);
		if (emm)
			dlclose(emm);
	}
	printf("rtld-next: order %s, LD_PRELOAD=%s, libemm %s cudaMalloc\n", order, getenv("LD_PRELOAD"),
	       emm_has_cuda_malloc ? "exports" : "does not export");

	emm_test_fn tests[] = {test_next_from_wrapper, test_next_from_program, test_allocations_still_pooled,
	                       NULL};
	int rc = emm_test_run_list(tests);
	gpu_print_served(strcmp(order, "emm-first") == 0 ? "rtld-next-cudart-emm-first"
	                                                 : "rtld-next-cudart-wrap-first");
	return rc;
}
