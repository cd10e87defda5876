/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/shims_busy.h - the busy-stream scenario the shim tests share:
 * a non-blocking stream kept busy (an event of the test's own recorded on
 * it with a long completion delay, so the fake calls the stream busy until
 * it is synchronized) while a block freed synchronously waits for it. The
 * test frees the block between busy_begin and busy_miss and checks what
 * the free and the miss cost; the helpers check the reuse: the block stays
 * out of reach until the legacy stream's and then the busy stream's work
 * completes. Shared by test_shims_epochs.c and test_shims_lazyclose.c.
 * Functions are static inline; include after emm_test.h and shims_common.h.
 * Call each under assert_() (emm_test.h), so that a failed step inside it
 * leaves the test.
 */
#ifndef EMM_TESTS_SHIMS_BUSY_H
#define EMM_TESTS_SHIMS_BUSY_H

#include <cuda.h>
#include <stddef.h>

struct busy_scenario {
	size_t size;
	CUstream busy;
	CUevent work;
	CUdeviceptr a; /* the block the test frees while busy is busy */
	CUdeviceptr b; /* the allocation that misses after that free */
};

/* Create the busy stream, give it "work" (an event that completes only when
 * synchronized) and allocate s->a of `size` bytes, for the test to free. */
static inline void busy_begin(struct busy_scenario *s, size_t size)
{
	s->size = size;
	assert_int_eq(cuStreamCreate(&s->busy, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	assert_int_eq(cuEventCreate(&s->work, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(cuEventRecord(s->work, s->busy), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&s->a, size), CUDA_SUCCESS);
}

/* After the test freed s->a: an allocation of the same size; neither event
 * is complete, so a stays out of reach. */
static inline void busy_miss(struct busy_scenario *s)
{
	assert_int_eq(cuMemAlloc(&s->b, s->size), CUDA_SUCCESS);
	expect_true(s->b != s->a);
}

/* The legacy event completes, busy's does not: a is still out of reach;
 * busy's work done: a comes back. Then everything is freed, the delay
 * reset and the event and the stream destroyed. */
static inline void busy_end(struct busy_scenario *s)
{
	CUdeviceptr c, d;

	assert_int_eq(cuStreamSynchronize(NULL), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&c, s->size), CUDA_SUCCESS);
	expect_true(c != s->a);
	assert_int_eq(cuStreamSynchronize(s->busy), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&d, s->size), CUDA_SUCCESS);
	expect_u64_eq(d, s->a);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(c), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(s->b), CUDA_SUCCESS);
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	assert_int_eq(cuEventDestroy(s->work), CUDA_SUCCESS);
	assert_int_eq(cuStreamDestroy(s->busy), CUDA_SUCCESS);
}

#endif
