/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/test-dlsym-versions.c - which dlsym a program binds to.
 *
 * glibc 2.34 moved dlsym into libc.so.6 as dlsym@@GLIBC_2.34 and kept the
 * old version (dlsym@GLIBC_2.2.5 on x86-64, @GLIBC_2.17 on aarch64) for
 * binaries linked before. This program references BOTH versions (the old
 * one through .symver) and checks that each reaches libemm's unversioned
 * dlsym when libemm is preloaded: a lookup of cuMemAlloc_v2 in libcuda
 * through either comes back as libemm's shim. Without libemm (or with
 * EMM_DISABLE=1) both give the driver's own. check-dlsym-versions.py also
 * verifies the version references in the binary and the loader's bindings
 * (LD_DEBUG=bindings).
 *
 * argv[1]: "ref", "emm" or "disabled".
 */
#include <dlfcn.h>
#include <string.h>

#include "emm_test.h"

#if defined(__x86_64__)
#define OLD_DLSYM_VERSION "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define OLD_DLSYM_VERSION "GLIBC_2.17"
#endif

#ifdef OLD_DLSYM_VERSION
void *dlsym_old(void *handle, const char *name);
__asm__(".symver dlsym_old, dlsym@" OLD_DLSYM_VERSION);
#endif

static const char *mode = "ref";

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

TEST_BEGIN(test_default_version)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	void *p;

	assert_ptr_not_null(h);
	p = dlsym(h, "cuMemAlloc_v2");
	assert_ptr_not_null(p);
	if (strcmp(mode, "emm") == 0)
		expect_true(owned_by(p, "libemm"));
	else
		expect_true(owned_by(p, "libcuda.so"));
	/* RTLD_NEXT through this reference: the caller is still us. (getpagesize:
	 * a libc function no sanitizer runtime intercepts, unlike strlen.) */
	expect_true(owned_by(dlsym(RTLD_NEXT, "getpagesize"), "libc.so"));
}
TEST_END

TEST_BEGIN(test_old_version)
{
#ifdef OLD_DLSYM_VERSION
	void *h = dlopen("libcuda.so.1", RTLD_NOW);
	void *p;

	assert_ptr_not_null(h);
	p = dlsym_old(h, "cuMemAlloc_v2");
	assert_ptr_not_null(p);
	if (strcmp(mode, "emm") == 0)
		expect_true(owned_by(p, "libemm"));
	else
		expect_true(owned_by(p, "libcuda.so"));
	/* Both references name the same function. */
	expect_ptr_eq(p, dlsym(h, "cuMemAlloc_v2"));
	expect_true(owned_by(dlsym_old(RTLD_NEXT, "getpagesize"), "libc.so"));
	if (strcmp(mode, "ref") == 0)
		expect_true(owned_by((void *)dlsym_old, "libc.so"));
	else
		expect_true(owned_by((void *)dlsym_old, "libemm"));
#else
	emm_test_skip("no old dlsym version known for this architecture");
#endif
}
TEST_END

int main(int argc, char **argv)
{
	if (argc > 1)
		mode = argv[1];
	return emm_test_run(test_default_version, test_old_version, NULL);
}
