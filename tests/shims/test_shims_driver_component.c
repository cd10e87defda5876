/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_driver_component.c - frees of memory a driver
 * component got inside the driver ("passed by, driver components"), over
 * the test-double driver, with LD_PRELOAD=libemm.so.
 *
 * usage: test_shims_driver_component PATH/libnvcuvid.so.1
 *
 * The library (nvcuvid_double.c) stands for the driver's libnvcuvid, which
 * nvJPEG's hardware path loads: it allocates through the driver's private
 * table, where libemm cannot serve it, and frees through cuMemFree_v2,
 * cuMemFreeAsync and cuMemFreeHost resolved by dlsym and cuGetProcAddress
 * (libemm's shims). Those frees count under passby_driver_* with the
 * driver's sizes, never as unknown frees; the same memory freed by the
 * program itself still is an unknown free; a block libemm handed out and
 * the library frees is libemm's free; a free the driver refuses counts
 * nothing. check-driver-component.py runs it for the EMM_STATS table, the
 * JSON and the EMM_VERBOSE=2 lines.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "emm_test.h"
#include "nvcuvid_double.h"
#include "shims_common.h"

static struct {
	__typeof__(nvcuvid_double_device_cycle) *device_cycle;
	__typeof__(nvcuvid_double_host_cycle) *host_cycle;
	__typeof__(nvcuvid_double_alloc) *alloc;
	__typeof__(nvcuvid_double_free) *free;
} nvcuvid;

static struct emm_stats before;

static void mark(void)
{
	assert_int_eq(shims_stats(-1, &before), 0);
}

/* *d = the process-wide counters now minus at mark(). */
static void since(struct emm_stats *d)
{
	shims_stats_since(&before, d);
}

/* Sizes nvJPEG's hardware path frees on an H200 (160 KiB, 240 KiB, 1.2 MiB),
 * and a page of pinned memory. */
enum { A = 160 << 10, B = 240 << 10, C = 1200 << 10, H = 64 << 10 };

TEST_BEGIN(test_component_frees)
{
	struct fakecuda_stats f0 = fake_stats(), f1;
	struct emm_stats d;

	mark();
	assert_int_eq(nvcuvid.device_cycle(A, 0), CUDA_SUCCESS);
	assert_int_eq(nvcuvid.device_cycle(B, 1), CUDA_SUCCESS);
	assert_int_eq(nvcuvid.device_cycle(C, 0), CUDA_SUCCESS);
	assert_int_eq(nvcuvid.host_cycle(H), CUDA_SUCCESS);
	since(&d);
	f1 = fake_stats();
	expect_int_eq(d.version, EMM_STATS_VERSION);
	expect_int_eq(d.passby_driver_calls, 4);
	expect_int_eq(d.passby_driver_bytes, A + B + C + H);
	expect_int_eq(d.passby_unknown_free_calls, 0);
	/* the driver freed them, as frees libemm passed on */
	expect_int_eq(d.passthrough_frees, 4);
	expect_int_eq(f1.device_frees - f0.device_frees, 3);
	expect_int_eq(f1.host_frees - f0.host_frees, 1);
	/* libemm neither served nor saw the allocations */
	expect_int_eq(d.allocs, 0);
	expect_int_eq(d.passthrough_allocs, 0);
	/* a device's row carries none of it */
	{
		struct emm_stats dev;

		assert_int_eq(shims_stats(0, &dev), 0);
		expect_int_eq(dev.passby_driver_calls, 0);
	}
}
TEST_END

/* The same memory freed by the program, not a driver component: unknown. */
TEST_BEGIN(test_program_free_is_unknown)
{
	static const CUuuid id = FAKECUDA_PRIVATE_TABLE_ID;
	const struct fakecuda_private_table *t = NULL;
	CUdeviceptr p = 0;
	struct emm_stats d;

	assert_int_eq(cuGetExportTable((const void **)&t, &id), CUDA_SUCCESS);
	assert_int_eq(t->alloc(&p, A), CUDA_SUCCESS);
	mark();
	assert_int_eq(cuMemFree_v2(p), CUDA_SUCCESS);
	since(&d);
	expect_int_eq(d.passby_unknown_free_calls, 1);
	expect_int_eq(d.passby_driver_calls, 0);
	expect_int_eq(d.passby_driver_bytes, 0);
	expect_int_eq(d.passthrough_frees, 1);
}
TEST_END

/* A block libemm handed out to the library is libemm's to free. */
TEST_BEGIN(test_component_frees_libemm_block)
{
	CUdeviceptr p = 0;
	struct emm_stats d;

	mark();
	assert_int_eq(nvcuvid.alloc(&p, B), CUDA_SUCCESS);
	assert_int_eq(nvcuvid.free(p), CUDA_SUCCESS);
	since(&d);
	expect_int_eq(d.allocs, 1);
	expect_int_eq(d.frees, 1);
	expect_int_eq(d.passby_driver_calls, 0);
	expect_int_eq(d.passby_unknown_free_calls, 0);
	expect_int_eq(d.passthrough_frees, 0);
}
TEST_END

/* A free the driver refuses (a pointer it never gave, one already freed)
 * keeps the driver's code and counts nothing. */
TEST_BEGIN(test_component_refused_free)
{
	static char not_device[4096] __attribute__((aligned(4096)));
	static const CUuuid id = FAKECUDA_PRIVATE_TABLE_ID;
	const struct fakecuda_private_table *t = NULL;
	CUdeviceptr p = 0;
	struct emm_stats d;

	assert_int_eq(cuGetExportTable((const void **)&t, &id), CUDA_SUCCESS);
	assert_int_eq(t->alloc(&p, A), CUDA_SUCCESS);
	assert_int_eq(nvcuvid.free(p), CUDA_SUCCESS);
	mark();
	expect_int_eq(nvcuvid.free(p), CUDA_ERROR_INVALID_VALUE);
	expect_int_eq(nvcuvid.free((CUdeviceptr)(uintptr_t)not_device), CUDA_ERROR_INVALID_VALUE);
	since(&d);
	expect_int_eq(d.passby_driver_calls, 0);
	expect_int_eq(d.passby_driver_bytes, 0);
	expect_int_eq(d.passby_unknown_free_calls, 0);
	expect_int_eq(d.passthrough_frees, 0);
	expect_int_eq(d.bad_frees, 0);
}
TEST_END

int main(int argc, char **argv)
{
	void *h;

	if (argc < 2) {
		fprintf(stderr, "usage: %s PATH/libnvcuvid.so.1\n", argv[0]);
		return 2;
	}
	shims_setup();
	h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	nvcuvid.device_cycle = (__typeof__(nvcuvid.device_cycle))dlsym(h, "nvcuvid_double_device_cycle");
	nvcuvid.host_cycle = (__typeof__(nvcuvid.host_cycle))dlsym(h, "nvcuvid_double_host_cycle");
	nvcuvid.alloc = (__typeof__(nvcuvid.alloc))dlsym(h, "nvcuvid_double_alloc");
	nvcuvid.free = (__typeof__(nvcuvid.free))dlsym(h, "nvcuvid_double_free");
	if (!nvcuvid.device_cycle || !nvcuvid.host_cycle || !nvcuvid.alloc || !nvcuvid.free) {
		fprintf(stderr, "%s lacks the nvcuvid_double_* functions\n", argv[1]);
		return 1;
	}
	return emm_test_run(test_component_frees, test_program_free_is_unknown, test_component_frees_libemm_block,
	                    test_component_refused_free, NULL);
}
