/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-heap-overlap.c - a segment source that returns
 * memory the segment map still holds (after a context reset, until the old
 * heap is dropped): each allocation fails with -ENOMEM, the returned
 * segment goes back to the source, nothing leaks, the heap stays sound,
 * and the error is said at the 1st, 2nd, 4th, 8th ... occurrence, not at
 * every retry (a flood of them, written under the arena lock, once held a
 * unit-suite child past its time limit).
 */
#include <errno.h>
#include <stdio.h>

#include "allocator/heap.h"
#include "common/log.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define MIB ((size_t)1 << 20)
#define TRIES 64

static struct fake_src src;
static struct fake_fence fence;

/* Returns the address of a live segment of another heap, every time. */
struct stale_src {
	emm_addr_t addr;
	unsigned allocs, frees;
};

static int stale_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret)
{
	struct stale_src *s = state;

	(void)size;
	(void)stream;
	s->allocs++;
	*ret = s->addr;
	return 0;
}

static int stale_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	struct stale_src *s = state;

	(void)size;
	(void)stream;
	if (addr == s->addr)
		s->frees++;
	return 0;
}

TEST_BEGIN(test_overlapping_segment_refused_and_said_sparingly)
{
	struct emm_heap_params p;
	emm_heap_t *owner = NULL, *h = NULL;
	struct stale_src stale = {0};
	FILE *log = tmpfile();
	emm_addr_t a = 0;

	assert_ptr_not_null(log);
	emm_heap_params_default(&p);
	p.arenas = 1;
	p.oom_retry = false;
	fake_src_init(&src, SIZE_MAX);
	fake_fence_init(&fence);
	struct emm_segment_source s = fake_src_ops(&src);
	struct emm_fence_ops f = fake_fence_ops(&fence);
	assert_int_eq(emm_heap_create(&p, &s, &f, 0, &owner), 0);
	a = xalloc(owner, MIB, 0); /* a segment in the segment map */
	stale.addr = a;

	struct emm_segment_source ss = {&stale, stale_alloc, stale_free};
	assert_int_eq(emm_heap_create(&p, &ss, NULL, 0, &h), 0);
	emm_log_set_fd(fileno(log));
	for (int i = 0; i < TRIES; i++) {
		emm_addr_t b = 0;
		expect_int_eq(emm_heap_alloc(h, MIB, 0, &b), -ENOMEM);
		expect_u64_eq(b, 0);
	}
	emm_log_set_fd(-1);
	expect_int_eq(stale.allocs, TRIES);
	expect_int_eq(stale.frees, TRIES);
	/* 1, 2, 4, 8, 16, 32, 64 */
	expect_int_eq(emm_test_count_lines(log, "overlapping a known segment"), 7);
	fclose(log);
	expect_int_eq(emm_heap_check(h), 0);
	emm_heap_destroy(h, true);

	/* The other heap's block is untouched. */
	expect_true(emm_heap_of_block(a) == owner);
	xfree(a, 0);
	fake_complete(&fence, 0);
	expect_int_eq(emm_heap_flush(owner), 0);
	fake_heap_destroy_checked(owner, &src, &fence);
}
TEST_END

int main(void)
{
	static emm_test_fn tests[] = {
		test_overlapping_segment_refused_and_said_sparingly,
		NULL,
	};
	return emm_test_run_list(tests);
}
