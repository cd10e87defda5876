/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/test-rtld-next.c - libemm's dlsym must be invisible to
 * RTLD_NEXT and RTLD_DEFAULT: glibc answers both relative to the code that
 * called dlsym, so libemm has to forward them with the caller's return
 * address intact.
 *
 * Run with LD_PRELOAD holding next-a and next-b (tests/interpose/next-*.c)
 * and libemm in some order (or not at all: the expectations below are
 * glibc's own, and the run without libemm checks them). The program is
 * linked to the test-double driver, so libcuda.so.1 follows the preloads in
 * the global scope.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "emm_test.h"

static int pos_emm = -1, pos_a = -1, pos_b = -1;

/* Where each library sits in LD_PRELOAD (-1: absent). */
static void parse_preload(void)
{
	const char *p = getenv("LD_PRELOAD");
	int index = 0;

	while (p && *p) {
		size_t len = strcspn(p, ": ");
		char item[1024];
		const char *base;

		if (len > 0 && len < sizeof(item)) {
			memcpy(item, p, len);
			item[len] = '\0';
			base = strrchr(item, '/');
			base = base ? base + 1 : item;
			if (strncmp(base, "libemm", 6) == 0)
				pos_emm = index;
			else if (strncmp(base, "libnext-a", 9) == 0)
				pos_a = index;
			else if (strncmp(base, "libnext-b", 9) == 0)
				pos_b = index;
			index++;
		}
		p += len;
		while (*p == ':' || *p == ' ')
			p++;
	}
}

static const char *owner(const void *p)
{
	Dl_info info;
	const char *slash;

	if (!p)
		return "null";
	if (!dladdr(p, &info) || !info.dli_fname)
		return "?";
	slash = strrchr(info.dli_fname, '/');
	return slash ? slash + 1 : info.dli_fname;
}

static bool owned_by(const void *p, const char *prefix)
{
	return strncmp(owner(p), prefix, strlen(prefix)) == 0;
}

static void *sym(const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name);

	if (!p) {
		fprintf(stderr, "%s not found: is libnext-a preloaded?\n", name);
		exit(1);
	}
	return p;
}

TEST_BEGIN(test_setup)
{
	/* A reference to the driver, so the linker keeps libcuda.so.1 as a
	 * dependency (--as-needed) and it follows the preloads. */
	static void *volatile keep_libcuda;

	keep_libcuda = (void *)&cuInit;
	(void)keep_libcuda;
	parse_preload();
	fprintf(stderr, "LD_PRELOAD positions: libemm %d, next-a %d, next-b %d\n", pos_emm, pos_a, pos_b);
	assert_true(pos_a >= 0 && pos_b > pos_a);
}
TEST_END

/* An interposer's wrapper finds the C library's function, not itself. */
TEST_BEGIN(test_getenv_wrapper)
{
	int (*calls)(void) = (int (*)(void))sym("next_a_getenv_calls");
	void *(*real)(void) = (void *(*)(void))sym("next_a_real_getenv");
	int before = calls();

	setenv("EMM_TEST_RTLD_NEXT", "through", 1);
	expect_str_eq(getenv("EMM_TEST_RTLD_NEXT") ? getenv("EMM_TEST_RTLD_NEXT") : "(null)", "through");
	expect_true(calls() > before); /* the program's getenv is next-a's */
	expect_true(owned_by(real(), "libc.so"));
	expect_true(owned_by((void *)getenv, "libnext-a"));
}
TEST_END

TEST_BEGIN(test_next_from_library)
{
	void *(*lookup)(const char *) = (void *(*)(const char *))sym("next_a_lookup");
	int (*probe_next)(void) = (int (*)(void))sym("next_a_probe_next");
	void *m1 = lookup("malloc"), *m2 = lookup("malloc");
	void *cu = lookup("cuMemAlloc_v2");

	expect_true(owned_by(lookup("getenv"), "libc.so"));
	/* Twice on one thread: the same answer (HAMi-core's dlmap guard gave
	 * NULL the second time). */
	expect_true(owned_by(m1, "libc.so"));
	expect_ptr_eq(m1, m2);
	expect_int_eq(probe_next(), 'b');
	/* The next cuMemAlloc_v2 after next-a: libemm's if libemm follows it,
	 * else the driver's (libemm before it is skipped, as RTLD_NEXT says). */
	if (pos_emm > pos_a)
		expect_true(owned_by(cu, "libemm"));
	else
		expect_true(owned_by(cu, "libcuda.so"));
	expect_ptr_null(lookup("emm_test_no_such_symbol"));
}
TEST_END

TEST_BEGIN(test_next_from_program)
{
	int (*probe)(void) = (int (*)(void))dlsym(RTLD_NEXT, "interpose_probe");
	void *cu = dlsym(RTLD_NEXT, "cuMemAlloc_v2");

	assert_ptr_not_null(probe);
	expect_int_eq(probe(), 'a');
	/* The first definition after the executable: the first preload that
	 * has one. */
	if (pos_emm >= 0)
		expect_true(owned_by(cu, "libemm"));
	else
		expect_true(owned_by(cu, "libcuda.so"));
	expect_true(owned_by(dlsym(RTLD_NEXT, "getenv"), "libnext-a"));
	expect_true(owned_by(dlsym(RTLD_DEFAULT, "getenv"), "libnext-a"));
}
TEST_END

/* RTLD_DEFAULT from a library opened with RTLD_LOCAL searches that
 * library's scope as well, which holds its dependencies. */
TEST_BEGIN(test_default_local_scope)
{
	void *h = dlopen("libnext-local.so", RTLD_NOW | RTLD_LOCAL);
	void *(*lookup)(const char *);
	void *dep;

	assert_ptr_not_null(h);
	lookup = (void *(*)(const char *))dlsym(h, "next_local_default_lookup");
	assert_ptr_not_null(lookup);
	dep = lookup("dep_only_symbol");
	expect_true(owned_by(dep, "libnext-dep"));
	/* Not in the global scope. */
	expect_ptr_null(dlsym(RTLD_DEFAULT, "dep_only_symbol"));
	/* An explicit handle still works, through libemm's explicit path. */
	expect_ptr_eq(dlsym(h, "dep_only_symbol"), dep);
}
TEST_END

int main(void)
{
	return emm_test_run(test_setup, test_getenv_wrapper, test_next_from_library, test_next_from_program,
	                    test_default_local_scope, NULL);
}
