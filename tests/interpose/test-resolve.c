/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/test-resolve.c - every resolver path a program can take to
 * a driver function, as cudart does it: dlopen("libcuda.so.1"), dlsym of
 * cuGetProcAddress_v2 (and of exact names), then lookups through the
 * resolver at each cudaVersion, flag and symbolStatus combination.
 *
 * The program prints one row per lookup:
 *     row <TAB> case <TAB> result <TAB> status <TAB> owner <TAB> name
 * owner is the file (basename) the returned pointer lies in and name its
 * exported name (dladdr). check-resolve.py runs it without libemm (the
 * driver's own answers), with libemm, and with EMM_DISABLE=1, and checks
 * that libemm changed exactly the pointers it has shims for and nothing
 * else. Built twice: plain (dlopen only, like cudart) and with -DLINKED
 * (linked to the driver, so the ELF references to cuGetProcAddress* bind to
 * libemm when it is preloaded: the "direct" rows).
 *
 * argv[1] names the configuration ("ref", "emm", "disabled") for the
 * in-process checks, which need no reference run.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "emm_test.h"

#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa1_fn)(const char *, void **, int, cuuint64_t);

#define EMM_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define UNWRITTEN_PTR     ((void *)0x5a5a5a5a)
#define UNWRITTEN_STATUS  ((CUdriverProcAddressQueryResult)0x77)

static const char *mode = "ref";
static void *libcuda;

static const char *const lookup_names[] = {
    "cuMemAlloc",
    "cuMemFree",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemAllocPitch",
    "cuMemAllocHost",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister",
    "cuMemHostUnregister",
    "cuMemAllocManaged",
    "cuMemGetInfo",
    "cuMemGetAddressRange",
    "cuPointerGetAttribute",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle",
    "cuIpcCloseMemHandle",
    "cuStreamCreate",
    "cuStreamDestroy",
    "cuEventRecord",
    "cuInit",
    "cuCtxCreate",
    "cuDriverGetVersion",
    "cuGetProcAddress",
    "cuNoSuchFunction",
};
static const int versions[] = {2000, 3020, 11020, 11030, 12000, 13000, 99000};

static const char *const dlsym_names[] = {
    "cuMemAlloc_v2",
    "cuMemAlloc",
    "cuMemFree_v2",
    "cuMemFree",
    "cuMemAllocAsync",
    "cuMemAllocAsync_ptsz",
    "cuMemFreeAsync",
    "cuMemFreeAsync_ptsz",
    "cuMemAllocPitch_v2",
    "cuMemAllocPitch",
    "cuMemAllocHost_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemGetInfo_v2",
    "cuMemGetInfo",
    "cuIpcOpenMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuInit",
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuDriverGetVersion",
    "cuNoSuchFunction",
    "fakecuda_calls",
};

static const char *basename_of(const char *path)
{
	const char *slash = path ? strrchr(path, '/') : NULL;

	return slash ? slash + 1 : (path ? path : "?");
}

/* "owner<TAB>name" of a pointer. */
static void describe(const void *p, char *out, size_t len)
{
	Dl_info info;

	if (p == UNWRITTEN_PTR)
		snprintf(out, len, "unwritten\t-");
	else if (!p)
		snprintf(out, len, "null\t-");
	else if (!dladdr(p, &info) || !info.dli_fname)
		snprintf(out, len, "?\t?");
	else
		snprintf(out, len, "%s\t%s", basename_of(info.dli_fname),
		         info.dli_saddr == p && info.dli_sname ? info.dli_sname : "?");
}

static bool owned_by(const void *p, const char *base_prefix)
{
	Dl_info info;

	return p && dladdr(p, &info) && info.dli_fname &&
	       strncmp(basename_of(info.dli_fname), base_prefix, strlen(base_prefix)) == 0;
}

static void row(const char *what, int result, int status, const void *p)
{
	char desc[512];

	describe(p, desc, sizeof(desc));
	if (status < 0)
		printf("row\t%s\t%d\t-\t%s\n", what, result, desc);
	else
		printf("row\t%s\t%d\t%d\t%s\n", what, result, status, desc);
}

/* Every (name, version, flags, status?) through a v2 resolver. */
static void rows_v2(const char *tag, gpa2_fn gpa)
{
	char what[256];

	for (size_t n = 0; n < EMM_ARRAY_SIZE(lookup_names); n++)
		for (size_t v = 0; v < EMM_ARRAY_SIZE(versions); v++)
			for (unsigned flags = 0; flags <= 2; flags++)
				for (int with_status = 0; with_status <= 1; with_status++) {
					CUdriverProcAddressQueryResult st = UNWRITTEN_STATUS;
					void *p = UNWRITTEN_PTR;
					CUresult r = gpa(lookup_names[n], &p, versions[v], flags,
					                 with_status ? &st : NULL);

					snprintf(what, sizeof(what), "%s %s v%d f%u %s", tag, lookup_names[n],
					         versions[v], flags, with_status ? "status" : "nostatus");
					row(what, r, with_status ? (int)st : -1, p);
				}
}

static void rows_v1(const char *tag, gpa1_fn gpa)
{
	char what[256];

	for (size_t n = 0; n < EMM_ARRAY_SIZE(lookup_names); n++)
		for (size_t v = 0; v < EMM_ARRAY_SIZE(versions); v++)
			for (unsigned flags = 0; flags <= 2; flags++) {
				void *p = UNWRITTEN_PTR;
				CUresult r = gpa(lookup_names[n], &p, versions[v], flags);

				snprintf(what, sizeof(what), "%s %s v%d f%u", tag, lookup_names[n],
				         versions[v], flags);
				row(what, r, -1, p);
			}
}

static gpa2_fn gpa2;
static gpa1_fn gpa1;

TEST_BEGIN(test_open)
{
	libcuda = dlopen("libcuda.so.1", RTLD_NOW);
	assert_ptr_not_null(libcuda);
	gpa2 = (gpa2_fn)dlsym(libcuda, "cuGetProcAddress_v2");
	gpa1 = (gpa1_fn)dlsym(libcuda, "cuGetProcAddress");
	assert_ptr_not_null(gpa2);
	assert_ptr_not_null(gpa1);
	row("dlsym-handle cuGetProcAddress_v2", 0, -1, (void *)gpa2);
	row("dlsym-handle cuGetProcAddress", 0, -1, (void *)gpa1);
	if (strcmp(mode, "emm") == 0) {
		/* The resolver cudart bootstraps with is libemm's... */
		expect_true(owned_by((void *)gpa2, "libemm"));
		expect_true(owned_by((void *)gpa1, "libemm"));
		/* ...and the same function the global scope resolves. */
		expect_ptr_eq((void *)gpa2, dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
		expect_ptr_eq((void *)gpa1, dlsym(RTLD_DEFAULT, "cuGetProcAddress"));
	} else {
		expect_true(owned_by((void *)gpa2, "libcuda.so"));
		expect_true(owned_by((void *)gpa1, "libcuda.so"));
	}
}
TEST_END

TEST_BEGIN(test_dlsym_rows)
{
	char what[256];

	assert_ptr_not_null(libcuda);
	for (size_t n = 0; n < EMM_ARRAY_SIZE(dlsym_names); n++) {
		void *p;

		dlerror();
		p = dlsym(libcuda, dlsym_names[n]);
		snprintf(what, sizeof(what), "dlsym %s", dlsym_names[n]);
		row(what, p ? 0 : -1, -1, p);
		if (!p)
			expect_ptr_not_null(dlerror()); /* the failure is reported as usual */
	}
	/* RTLD_DEFAULT and RTLD_NEXT are answered by glibc for the caller:
	 * with libemm preloaded both name libemm's export (the first
	 * definition after this executable). */
	row("dlsym-default cuMemAlloc_v2", 0, -1, dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
	row("dlsym-next cuMemAlloc_v2", 0, -1, dlsym(RTLD_NEXT, "cuMemAlloc_v2"));
	if (strcmp(mode, "emm") == 0) {
		void *p = dlsym(libcuda, "cuMemAlloc_v2");
		void *v1 = dlsym(libcuda, "cuMemAlloc");

		expect_true(owned_by(p, "libemm"));
		expect_ptr_eq(p, dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"));
		expect_true(owned_by(v1, "libcuda.so")); /* the 32-bit ABI: untouched */
	} else if (strcmp(mode, "disabled") == 0) {
		expect_true(owned_by(dlsym(libcuda, "cuMemAlloc_v2"), "libcuda.so"));
	}
}
TEST_END

TEST_BEGIN(test_resolver_rows)
{
	assert_ptr_not_null(gpa2);
	rows_v2("gpa2", gpa2);
	rows_v1("gpa1", gpa1);
}
TEST_END

/* Asking a resolver for "cuGetProcAddress" gives a resolver of the ABI the
 * driver chose for that version; it must work as that ABI. */
TEST_BEGIN(test_resolver_for_itself)
{
	static const int self_versions[] = {11030, 12000, 13000};
	char what[256];

	assert_ptr_not_null(gpa2);
	for (size_t i = 0; i < EMM_ARRAY_SIZE(self_versions); i++) {
		void *self = NULL;
		Dl_info info;
		CUresult r = gpa2("cuGetProcAddress", &self, self_versions[i], 0, NULL);

		assert_int_eq(r, CUDA_SUCCESS);
		assert_ptr_not_null(self);
		assert_true(dladdr(self, &info) && info.dli_sname && info.dli_saddr == self);
		if (strcmp(mode, "emm") == 0)
			expect_true(owned_by(self, "libemm"));
		else
			expect_true(owned_by(self, "libcuda.so"));
		if (strcmp(info.dli_sname, "cuGetProcAddress") == 0) {
			snprintf(what, sizeof(what), "self%d-v1", self_versions[i]);
			rows_v1(what, (gpa1_fn)self);
		} else {
			expect_str_eq(info.dli_sname, "cuGetProcAddress_v2");
			snprintf(what, sizeof(what), "self%d-v2", self_versions[i]);
			rows_v2(what, (gpa2_fn)self);
		}
	}
}
TEST_END

/* Bad arguments reach the driver and come back with its answer. */
TEST_BEGIN(test_bad_arguments)
{
	CUdriverProcAddressQueryResult st = UNWRITTEN_STATUS;
	void *p = UNWRITTEN_PTR;

	assert_ptr_not_null(gpa2);
	row("bad flags", gpa2("cuMemAlloc", &p, 12000, 8, &st), (int)st, p);
	/* NULL pointers: the real driver (580) crashes on them, so only the
	 * test double is asked. */
	if (!dlsym(libcuda, "fakecuda_calls"))
		break;
	st = UNWRITTEN_STATUS;
	p = UNWRITTEN_PTR;
	row("bad null-pfn", gpa2("cuMemAlloc", NULL, 12000, 0, &st), (int)st, NULL);
	st = UNWRITTEN_STATUS;
	row("bad null-symbol", gpa2(NULL, &p, 12000, 0, &st), (int)st, p);
	p = UNWRITTEN_PTR;
	row("bad v1-null-symbol", gpa1(NULL, &p, 12000, 0), -1, p);
}
TEST_END

/*
 * Lookups from a driver library (libnvidia-*) or a libemm backend get the
 * driver's own functions, through dlsym and through libemm's resolver
 * alike (HAMi-core PR #326: the driver looked up cuInit, got the hook and
 * recursed). The same lookups from this program are substituted.
 */
TEST_BEGIN(test_exempt_callers)
{
	static const char *const libs[] = {"libnvidia-emmtest.so", "libemm-backend-emmtest.so"};

	assert_ptr_not_null(gpa2);
	for (size_t i = 0; i < EMM_ARRAY_SIZE(libs); i++) {
		void *h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
		void *(*caller_dlsym)(void *, const char *);
		void *(*caller_gpa2)(gpa2_fn, const char *, int, cuuint64_t);
		void *from_lib, *from_lib_gpa, *from_here = NULL;

		assert_ptr_not_null(h);
		caller_dlsym = (void *(*)(void *, const char *))dlsym(h, "caller_dlsym");
		caller_gpa2 = (void *(*)(gpa2_fn, const char *, int, cuuint64_t))dlsym(h, "caller_gpa2");
		assert_true(caller_dlsym && caller_gpa2);
		from_lib = caller_dlsym(libcuda, "cuMemAlloc_v2");
		from_lib_gpa = caller_gpa2(gpa2, "cuMemAllocAsync", 12000, 2);
		expect_int_eq(gpa2("cuMemAllocAsync", &from_here, 12000, 2, NULL), CUDA_SUCCESS);
		expect_true(owned_by(from_lib, "libcuda.so"));
		expect_true(owned_by(from_lib_gpa, "libcuda.so"));
		if (strcmp(mode, "emm") == 0) {
			expect_true(owned_by(dlsym(libcuda, "cuMemAlloc_v2"), "libemm"));
			expect_true(owned_by(from_here, "libemm"));
		}
	}
}
TEST_END

/* A driver copy in another link-map namespace (dlmopen) is not the driver
 * libemm's shims call: its exports are never substituted. */
TEST_BEGIN(test_dlmopen_namespace)
{
	void *h, *copy, *base;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	/* The sanitized test-double driver needs the sanitizer runtime, which
	 * cannot start again in a new namespace (ASan aborts: "runtime does not
	 * come first"). */
	emm_test_skip("dlmopen: a sanitizer runtime cannot load in a second namespace");
	break;
#endif
	h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		emm_test_skip(dlerror());
		break;
	}
	copy = dlsym(h, "cuMemAlloc_v2");
	base = dlsym(libcuda, "cuMemAlloc_v2");
	expect_true(owned_by(copy, "libcuda.so"));
	expect_true(copy != base);
	expect_true(owned_by(dlsym(h, "cuGetProcAddress_v2"), "libcuda.so"));
	dlclose(h);
}
TEST_END

#ifdef LINKED
/* ELF references: bound to libemm when it is preloaded. */
TEST_BEGIN(test_direct)
{
	void *self2 = (void *)&cuGetProcAddress_v2, *self1 = (void *)&cuGetProcAddress;

	row("direct &cuGetProcAddress_v2", 0, -1, self2);
	row("direct &cuGetProcAddress", 0, -1, self1);
	row("direct &cuMemAlloc_v2", 0, -1, (void *)&cuMemAlloc_v2);
	if (strcmp(mode, "emm") == 0 || strcmp(mode, "disabled") == 0) {
		expect_true(owned_by(self2, "libemm"));
		expect_true(owned_by(self1, "libemm"));
	} else {
		expect_true(owned_by(self2, "libcuda.so"));
	}
	rows_v2("direct2", cuGetProcAddress_v2);
	rows_v1("direct1", cuGetProcAddress);
}
TEST_END
#endif

int main(int argc, char **argv)
{
	if (argc > 1)
		mode = argv[1];
	return emm_test_run(test_open, test_dlsym_rows, test_resolver_rows, test_resolver_for_itself,
	                    test_bad_arguments, test_exempt_callers, test_dlmopen_namespace,
#ifdef LINKED
	                    test_direct,
#endif
	                    NULL);
}
