/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/test-runtime-local.c - a shared cudart outside the global
 * scope: this program does not link cudart; it opens a library that does
 * (fakecudart/uses-cudart.c) with RTLD_LOCAL, as Python opens PyTorch. The
 * library's cudaMalloc reference still binds to libemm (global scope first),
 * and libemm must still find that cudart to delegate to: RTLD_NEXT cannot
 * see it, so libemm looks among the loaded objects.
 *
 * argv[1]: "ref" (no libemm) or "emm".
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

#include "emm_test.h"

static const char *config = "ref";

static bool owned_by(const void *p, const char *prefix)
{
	Dl_info info;
	const char *base;

	if (!p || !dladdr(p, &info) || !info.dli_fname)
		return false;
	base = strrchr(info.dli_fname, '/');
	base = base ? base + 1 : info.dli_fname;
	return strncmp(base, prefix, strlen(prefix)) == 0;
}

TEST_BEGIN(test_local_cudart)
{
	void *h = dlopen("libuses-cudart.so", RTLD_NOW | RTLD_LOCAL);
	int (*do_malloc)(void **, size_t);
	int (*do_free)(void *);
	void *(*malloc_address)(void);
	uint64_t (*calls)(const char *);
	bool emm = strcmp(config, "emm") == 0;
	void *p = NULL, *q = NULL;

	assert_ptr_not_null(h);
	do_malloc = (int (*)(void **, size_t))dlsym(h, "uses_cudart_malloc");
	do_free = (int (*)(void *))dlsym(h, "uses_cudart_free");
	malloc_address = (void *(*)(void))dlsym(h, "uses_cudart_malloc_address");
	calls = (uint64_t(*)(const char *))dlsym(h, "uses_cudart_calls");
	assert_true(do_malloc && do_free && malloc_address && calls);
	/* cudart is not in the global scope... */
	expect_ptr_null(dlsym(RTLD_DEFAULT, "fakecudart_calls"));
	/* ...but the library's reference binds to libemm's cudaMalloc. */
	expect_true(owned_by(malloc_address(), emm ? "libemm" : "libcudart"));

	/* An error only cudart can give: libemm found it and delegated (and
	 * cudart made its context current on the way). */
	expect_int_eq(do_malloc(NULL, 16), cudaErrorInvalidValue);
	expect_int_eq(calls("cudaMalloc"), 1);
	/* With a context current, libemm serves the allocations. */
	expect_int_eq(do_malloc(&p, 100), cudaSuccess);
	expect_int_eq(do_malloc(&q, 100), cudaSuccess);
	expect_int_eq(calls("cudaMalloc"), emm ? 1 : 3);
	expect_int_eq(do_free(p), cudaSuccess);
	expect_int_eq(do_free(q), cudaSuccess);
	expect_int_eq(calls("cudaFree"), emm ? 0 : 2);
}
TEST_END

int main(int argc, char **argv)
{
	if (argc > 1)
		config = argv[1];
	return emm_test_run(test_local_cudart, NULL);
}
