/* SPDX-License-Identifier: MIT */
/*
 * test-heap-release: a segment source whose free fails. The segment it
 * failed to free, and every segment not yet handled, must stay with the
 * heap: still idle and reusable, still counted, still in the segment map,
 * and the error must reach the caller (emm_heap_release_idle, the release
 * threshold on free). Destroy still tries every segment.
 */
#include <errno.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define MIB ((size_t)1 << 20)

static struct fake_src src;

static emm_heap_t *setup(struct emm_heap_params *p)
{
	emm_heap_t *h = NULL;
	fake_src_init(&src, SIZE_MAX);
	struct emm_segment_source s = fake_src_ops(&src);
	if (emm_heap_create(p, &s, NULL, 0, &h)) /* no fences: frees are ready at once */
		return NULL;
	return h;
}

/* Three idle 20 MiB segments; the source fails the 2nd free. */
TEST_BEGIN(test_release_idle_fails)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.arenas = 1;
	emm_heap_t *h = setup(&p);
	assert_ptr_not_null(h);
	emm_addr_t a[3];
	for (int i = 0; i < 3; i++)
		a[i] = xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	for (int i = 0; i < 3; i++)
		expect_int_eq(emm_heap_free(a[i], EMM_STREAM_SYNC, NULL), 0);
	expect_u64_eq(heap_stats(h).segments, 3);

	src.fail_free_at = 2;
	expect_int_eq(emm_heap_release_idle(h, 0), -EIO);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(src.frees, 1);
	expect_u64_eq(st.segments, 2); /* the failed one and the one after it */
	expect_u64_eq(st.reserved_bytes, 40 * MIB);
	expect_u64_eq(st.reserved_bytes, src.used);
	expect_u64_eq(st.backend_frees, 1);
	expect_int_eq(emm_heap_check(h), 0);
	size_t idle = 0, largest = 0;
	emm_heap_idle_info(h, &idle, &largest);
	expect_u64_eq(idle, 40 * MIB);
	expect_u64_eq(largest, 20 * MIB);

	/* Still reusable: no new segment for the next allocation. */
	emm_addr_t b = xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(heap_stats(h).backend_allocs, 3);
	struct emm_block_range range;
	expect_int_eq(emm_heap_find_block(b + 4096, &range), 0);
	expect_int_eq(emm_heap_free(b, EMM_STREAM_SYNC, NULL), 0);

	/* The next release gives both back. */
	expect_int_eq(emm_heap_release_idle(h, 0), 40 * MIB);
	st = heap_stats(h);
	expect_u64_eq(st.segments, 0);
	expect_u64_eq(st.reserved_bytes, 0);
	expect_int_eq(emm_heap_check(h), 0);
	emm_heap_destroy(h, true);
	expect_u64_eq(src.used, 0);
	expect_int_eq(src.bad_frees, 0);
	fake_src_fini(&src);
}
TEST_END

/* The release threshold on free: a failed free keeps the segment. */
TEST_BEGIN(test_release_threshold_fails)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.arenas = 1;
	p.release_threshold = 0;
	emm_heap_t *h = setup(&p);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	src.fail_free_at = 1;
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0); /* the free itself succeeds */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.segments, 1);
	expect_u64_eq(st.reserved_bytes, src.used);
	expect_int_eq(emm_heap_check(h), 0);
	expect_u64_eq(xalloc(h, 20 * MIB, EMM_STREAM_SYNC), a); /* reused, not lost */
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0); /* released now */
	expect_u64_eq(heap_stats(h).segments, 0);
	expect_u64_eq(src.used, 0);
	emm_heap_destroy(h, true);
	expect_int_eq(src.bad_frees, 0);
	fake_src_fini(&src);
}
TEST_END

/* Destroy: one failed free does not stop the others. */
TEST_BEGIN(test_destroy_free_fails)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.arenas = 1;
	emm_heap_t *h = setup(&p);
	assert_ptr_not_null(h);
	for (int i = 0; i < 3; i++)
		xalloc(h, 20 * MIB, EMM_STREAM_SYNC);
	src.fail_free_at = 1;
	emm_heap_destroy(h, true);
	expect_u64_eq(src.frees, 2);
	expect_u64_eq(src.used, 20 * MIB);
	fake_src_fini(&src);
}
TEST_END

int main(void)
{
	return emm_test_run(test_release_idle_fails, test_release_threshold_fails, test_destroy_free_fails, NULL);
}
