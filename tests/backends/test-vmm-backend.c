/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/test-vmm-backend.c - the vmm backend over the test-double
 * driver (tests/fakecuda, whose mapped device memory is host memory, so the
 * test writes through device addresses): negotiation, segments written
 * across unmap/map/grow, out-of-memory and bad arguments, options, a failed
 * unmap, and a paged heap over the backend running the fragmentation
 * pattern with data checks (what libemm does with it in production).
 */
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>

#include "allocator/backend_loader.h"
#include "allocator/heap.h"
#include "emm_test.h"
#include "fakecuda.h"

#define MIB ((size_t)1 << 20)

static const struct emm_backend *be;
static int warnings;
static char last_log[512];

static void *driver_proc(const char *name)
{
	return dlsym(RTLD_DEFAULT, name);
}

static void test_log(enum emm_backend_log_level level, const char *msg)
{
	if (level < EMM_BACKEND_LOG_WARNING)
		return;
	warnings++;
	snprintf(last_log, sizeof(last_log), "%s", msg);
}

static struct emm_backend_host host = {
    .interface_version = 2,
    .struct_size = sizeof(struct emm_backend_host),
    .driver_proc = driver_proc,
    .log = test_log,
    .options = "",
};

static void *start(size_t capacity, const char *options)
{
	CUcontext ctx;
	void *st = NULL;

	fakecuda_reset();
	fakecuda_set_mem_capacity(capacity);
	if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
	    cuCtxSetCurrent(ctx) != CUDA_SUCCESS)
		return NULL;
	host.options = options;
	warnings = 0;
	if (be->init(&host, 0, (uint64_t)(uintptr_t)ctx, &st))
		return NULL;
	return st;
}

static void fill(uint64_t addr, size_t len, unsigned char v)
{
	memset((void *)(uintptr_t)addr, v, len);
}

static bool holds(uint64_t addr, size_t len, unsigned char v)
{
	const unsigned char *p = (const unsigned char *)(uintptr_t)addr;
	for (size_t i = 0; i < len; i += 4096)
		if (p[i] != v || p[i + 4095 < len ? i + 4095 : len - 1] != v)
			return false;
	return true;
}

static unsigned long long access_of(uint64_t addr)
{
	unsigned long long flags = 99;
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
	if (cuMemGetAccess(&flags, &loc, (CUdeviceptr)addr) != CUDA_SUCCESS)
		return 98;
	return flags;
}

TEST_BEGIN(test_table)
{
	uint32_t v = 1;
	const struct emm_backend *t = NULL;

	expect_int_eq(emm_backend_builtin_vmm(&v, &t), -ENOTSUP); /* needs version 2 */
	expect_ptr_null(t);
	v = 9;
	expect_int_eq(emm_backend_builtin_vmm(&v, &t), 0);
	expect_int_eq(v, EMM_BACKEND_INTERFACE_VERSION);
	expect_str_eq(t->name, "vmm");
	expect_true(t->caps & EMM_BACKEND_CAP_REMAP);
	expect_true(t->caps & EMM_BACKEND_CAP_GROW);
	expect_false(t->caps & EMM_BACKEND_CAP_HOST_PINNED);
	expect_ptr_null(t->host_segment_alloc);
}
TEST_END

TEST_BEGIN(test_segment_life)
{
	void *st = start(256 * MIB, "");
	assert_ptr_not_null(st);
	size_t g = 0;
	uint64_t a = 0;

	expect_int_eq(be->granularity(st, &g), 0);
	expect_u64_eq(g, 2 * MIB);
	assert_int_eq(be->segment_alloc(st, 20 * MIB, 0, &a), 0);
	expect_u64_eq(a % (2 * MIB), 0);
	expect_u64_eq(fakecuda_mem_used(0), 20 * MIB);
	expect_u64_eq(access_of(a), CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
	fill(a, 20 * MIB, 0x5a);

	/* Unmap two pages in the middle: memory goes back, the rest keeps
	 * its data, the range is still reserved. */
	expect_int_eq(be->segment_unmap(st, a, 20 * MIB, 4 * MIB, 4 * MIB), 0);
	expect_u64_eq(fakecuda_mem_used(0), 16 * MIB);
	expect_u64_eq(access_of(a + 4 * MIB), 98); /* nothing mapped there */
	expect_true(holds(a, 4 * MIB, 0x5a));
	expect_true(holds(a + 8 * MIB, 12 * MIB, 0x5a));
	expect_int_eq(be->segment_unmap(st, a, 20 * MIB, 4 * MIB, 2 * MIB), -EINVAL); /* twice */
	expect_int_eq(be->segment_map(st, a, 20 * MIB, 4 * MIB, 4 * MIB), 0);
	expect_u64_eq(fakecuda_mem_used(0), 20 * MIB);
	fill(a + 4 * MIB, 4 * MIB, 0x33);
	expect_true(holds(a + 4 * MIB, 4 * MIB, 0x33));
	expect_int_eq(be->segment_map(st, a, 20 * MIB, 4 * MIB, 2 * MIB), -EINVAL); /* mapped */

	/* Grow in place (the reservation is the device's 256 MiB). */
	expect_int_eq(be->segment_grow(st, a, 20 * MIB, 40 * MIB), 0);
	expect_u64_eq(fakecuda_mem_used(0), 40 * MIB);
	fill(a + 20 * MIB, 20 * MIB, 0x77);
	expect_true(holds(a, 4 * MIB, 0x5a));
	expect_int_eq(be->segment_grow(st, a, 20 * MIB, 60 * MIB), -EINVAL); /* stale old size */
	expect_int_eq(be->segment_grow(st, a, 40 * MIB, 258 * MIB), -ENOSPC);
	expect_int_eq(be->segment_unmap(st, a, 40 * MIB, 30 * MIB, 10 * MIB), 0); /* the grown part */

	/* Bad ranges. */
	expect_int_eq(be->segment_unmap(st, a, 40 * MIB, 1 * MIB, 2 * MIB), -EINVAL);
	expect_int_eq(be->segment_unmap(st, a, 40 * MIB, 38 * MIB, 4 * MIB), -EINVAL);
	expect_int_eq(be->segment_map(st, a + 2 * MIB, 40 * MIB, 0, 2 * MIB), -EINVAL);

	/* Free releases what is mapped and the reservation. */
	expect_int_eq(be->segment_free(st, a, 40 * MIB, 0), 0);
	expect_u64_eq(fakecuda_mem_used(0), 0);
	expect_u64_eq(fakecuda_calls("cuMemAddressFree"), 1);
	expect_int_eq(be->segment_free(st, a, 40 * MIB, 0), -EINVAL);
	be->fini(st, true);
}
TEST_END

TEST_BEGIN(test_out_of_memory)
{
	void *st = start(16 * MIB, "reserve=64M");
	assert_ptr_not_null(st);
	uint64_t a = 0, b = 0;

	expect_int_eq(be->segment_alloc(st, 32 * MIB, 0, &a), -ENOMEM);
	expect_u64_eq(a, 0);
	expect_u64_eq(fakecuda_mem_used(0), 0); /* the pages made were undone */
	assert_int_eq(be->segment_alloc(st, 12 * MIB, 0, &a), 0);
	expect_int_eq(be->segment_grow(st, a, 12 * MIB, 20 * MIB), -ENOMEM);
	expect_u64_eq(fakecuda_mem_used(0), 12 * MIB);
	expect_int_eq(be->segment_unmap(st, a, 12 * MIB, 0, 4 * MIB), 0);
	assert_int_eq(be->segment_alloc(st, 8 * MIB, 0, &b), 0);
	expect_int_eq(be->segment_map(st, a, 12 * MIB, 0, 4 * MIB), -ENOMEM);
	expect_u64_eq(fakecuda_mem_used(0), 16 * MIB);
	expect_int_eq(be->segment_free(st, b, 8 * MIB, 0), 0);
	expect_int_eq(be->segment_map(st, a, 12 * MIB, 0, 4 * MIB), 0);
	/* A failing unmap releases nothing. */
	fakecuda_fail_next_call("cuMemUnmap", CUDA_ERROR_UNKNOWN, 1);
	expect_int_eq(be->segment_unmap(st, a, 12 * MIB, 0, 6 * MIB), -EIO);
	expect_u64_eq(fakecuda_mem_used(0), 12 * MIB);
	expect_int_eq(be->segment_unmap(st, a, 12 * MIB, 0, 6 * MIB), 0);
	expect_int_eq(be->segment_free(st, a, 12 * MIB, 0), 0);
	expect_u64_eq(fakecuda_mem_used(0), 0);
	be->fini(st, true);
}
TEST_END

TEST_BEGIN(test_options)
{
	void *st = start(256 * MIB, "page=4M,reserve=64M,grow_min=8M,bogus=1");
	assert_ptr_not_null(st);
	size_t g = 0;
	uint64_t small = 0, big = 0;

	expect_int_eq(warnings, 1);
	expect_true(strstr(last_log, "bogus") != NULL);
	expect_int_eq(be->granularity(st, &g), 0);
	expect_u64_eq(g, 4 * MIB);
	assert_int_eq(be->segment_alloc(st, 4 * MIB, 0, &small), 0);
	expect_int_eq(be->segment_grow(st, small, 4 * MIB, 8 * MIB), -ENOSPC); /* below grow_min */
	assert_int_eq(be->segment_alloc(st, 8 * MIB, 0, &big), 0);
	expect_int_eq(be->segment_grow(st, big, 8 * MIB, 64 * MIB), 0);
	expect_int_eq(be->segment_grow(st, big, 64 * MIB, 68 * MIB), -ENOSPC);
	expect_int_eq(be->segment_free(st, small, 4 * MIB, 0), 0);
	be->fini(st, true); /* gives back the segment left over */
	expect_u64_eq(fakecuda_mem_used(0), 0);

	st = start(256 * MIB, "page=3M");
	assert_ptr_not_null(st);
	expect_int_eq(warnings, 1);
	expect_int_eq(be->granularity(st, &g), 0);
	expect_u64_eq(g, 2 * MIB);
	be->fini(st, true);
}
TEST_END

/* --- a paged heap over the backend -------------------------------------- */

static void *heap_state;

static int src_alloc(void *s, size_t size, emm_stream_t stream, emm_addr_t *ret)
{
	return be->segment_alloc(heap_state, size, 0, ret);
}

static int src_free(void *s, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	return be->segment_free(heap_state, addr, size, 0);
}

static int pg_unmap(void *s, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	return be->segment_unmap(heap_state, seg, seg_size, off, len);
}

static int pg_map(void *s, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	return be->segment_map(heap_state, seg, seg_size, off, len);
}

static int pg_grow(void *s, emm_addr_t seg, size_t old_size, size_t new_size)
{
	return be->segment_grow(heap_state, seg, old_size, new_size);
}

TEST_BEGIN(test_heap_over_vmm)
{
	heap_state = start(200 * MIB, "");
	assert_ptr_not_null(heap_state);
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.arenas = 1;
	struct emm_segment_source src = {NULL, src_alloc, src_free};
	struct emm_segment_pages pages = {NULL, 0, pg_unmap, pg_map, pg_grow};
	expect_int_eq(be->granularity(heap_state, &pages.granularity), 0);
	emm_heap_t *h = NULL;
	assert_int_eq(emm_heap_create_paged(&p, &src, &pages, NULL, 0, &h), 0);

	emm_addr_t a[64], big[32], r;
	unsigned n = 0, nb = 0;
	while (n < 64 && emm_heap_alloc(h, 7 * MIB, EMM_STREAM_SYNC, &r) == 0) {
		fill(r, 7 * MIB, (unsigned char)(n + 1));
		a[n++] = r;
	}
	expect_true(n * 7 * MIB > 200 * MIB - 9 * MIB);
	for (unsigned i = 0; i < n; i += 2)
		expect_int_eq(emm_heap_free(a[i], EMM_STREAM_SYNC, NULL), 0);
	while (nb < 32 && emm_heap_alloc(h, 16 * MIB, EMM_STREAM_SYNC, &r) == 0) {
		fill(r, 16 * MIB, 0xee);
		big[nb++] = r;
	}
	expect_true(nb * 16 * MIB + 16 * MIB > ((n + 1) / 2) * 6 * MIB);
	for (unsigned i = 1; i < n; i += 2)
		expect_true(holds(a[i], 7 * MIB, (unsigned char)(i + 1)));
	for (unsigned i = 0; i < nb; i++)
		expect_true(holds(big[i], 16 * MIB, 0xee));
	expect_int_eq(emm_heap_check(h), 0);
	struct emm_stats st;
	memset(&st, 0, sizeof(st));
	st.struct_size = sizeof(st);
	emm_heap_add_stats(h, &st);
	expect_u64_eq(st.reserved_bytes, fakecuda_mem_used(0));
	expect_true(st.page_unmaps > 0);

	/* Free all, give back, allocate again: written data reads back. */
	for (unsigned i = 1; i < n; i += 2)
		expect_int_eq(emm_heap_free(a[i], EMM_STREAM_SYNC, NULL), 0);
	for (unsigned i = 0; i < nb; i++)
		expect_int_eq(emm_heap_free(big[i], EMM_STREAM_SYNC, NULL), 0);
	expect_true(emm_heap_release_idle(h, 0) > 0);
	expect_u64_eq(fakecuda_mem_used(0), 0);
	r = 0;
	assert_int_eq(emm_heap_alloc(h, 30 * MIB, EMM_STREAM_SYNC, &r), 0);
	fill(r, 30 * MIB, 0x42);
	expect_true(holds(r, 30 * MIB, 0x42));
	expect_int_eq(emm_heap_free(r, EMM_STREAM_SYNC, NULL), 0);
	emm_heap_destroy(h, true);
	expect_u64_eq(fakecuda_mem_used(0), 0);
	be->fini(heap_state, true);
}
TEST_END

int main(void)
{
	uint32_t v = EMM_BACKEND_INTERFACE_VERSION;

	if (emm_backend_builtin_vmm(&v, &be) != 0)
		return 1;
	return emm_test_run(test_table, test_segment_life, test_out_of_memory, test_options, test_heap_over_vmm,
	                    NULL);
}
