/* SPDX-License-Identifier: MIT */
/*
 * test-heap-orphan: blocks of a stream destroyed while no marker can be
 * recorded (a global capture, a failed record). cuStreamDestroy returns
 * while the stream's work still runs, so those blocks must stay out of
 * every allocation until that work is known finished: a blocking-class
 * stream's by the next epoch's legacy-stream event once recording is
 * allowed again, a non-blocking stream's by a device-wide synchronize
 * (emm_heap_flush, which interpose/ calls on every heap at capture end).
 */
#include <errno.h>

#include "allocator/heap.h"
#include "common/compiler.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define MIB ((size_t)1 << 20)

#define S1  ((emm_stream_t)0x1000)
#define S2  ((emm_stream_t)0x2000)
#define NB1 ((emm_stream_t)0x3000)

static struct fake_src src;
static struct fake_fence fence;

#define CHECKH(h) expect_int_eq(emm_heap_check(h), 0)

/* One arena, no OOM retry, room for one 2 MiB small segment only: an
 * allocation either reuses the freed blocks or fails with -ENOMEM. */
static emm_heap_t *setup(void)
{
	emm_heap_t *h = NULL;

	return fake_heap_create_one_arena(&src, 2 * MIB, false, &fence, &h) ? NULL : h;
}

static void teardown(emm_heap_t *h)
{
	fake_heap_destroy_checked(h, &src, &fence);
}

/* No allocation, on any stream, may get the orphaned memory. */
static void expect_unreachable(emm_heap_t *h)
{
	static const emm_stream_t streams[] = {S2, EMM_STREAM_SYNC, EMM_STREAM_LEGACY, S1, NB1};
	for (unsigned i = 0; i < EMM_ARRAY_SIZE(streams); i++) {
		emm_addr_t r = 0;
		int rc = emm_heap_alloc(h, 1 * MIB, streams[i], &r);
		if (rc == 0) {
			emm_test_fail_("stream 0x%llx got 0x%llx while the destroyed stream's work may run",
			               (unsigned long long)streams[i], (unsigned long long)r);
			xfree(r, streams[i]);
		} else {
			expect_int_eq(rc, -ENOMEM);
		}
	}
}

/* Blocking-class stream destroyed during a global capture: its blocks stay
 * pending through the capture; once it ends, flush closes an epoch whose
 * legacy-stream event orders the destroyed stream's earlier work. */
TEST_BEGIN(test_orphan_blocking_capture)
{
	emm_heap_t *h = setup();
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 1 * MIB, S1), b = xalloc(h, 1 * MIB, S1);
	xfree(a, S1);
	xfree(b, S1);
	fence.capture_sync = true;
	emm_heap_stream_destroyed(h, S1);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 2 * MIB);
	expect_u64_eq(st.events_recorded, 0);
	CHECKH(h);
	expect_unreachable(h);
	expect_int_eq(emm_heap_flush(h), -EBUSY); /* still capturing */
	expect_unreachable(h);
	CHECKH(h);

	fence.capture_sync = false;
	expect_int_eq(emm_heap_flush(h), 0);
	st = heap_stats(h);
	expect_u64_eq(st.events_recorded, 1);
	expect_u64_eq(fence.ev[fence.nev - 1].stream, EMM_STREAM_LEGACY);
	expect_int_eq(fence.device_syncs, 0); /* no host wait needed */
	expect_u64_eq(st.pending_bytes, 0);
	CHECKH(h);
	size_t idle = 0, largest = 0;
	emm_heap_idle_info(h, &idle, &largest);
	expect_u64_eq(largest, 2 * MIB); /* ready-any, merged whole again */
	expect_u64_eq(xalloc(h, 1 * MIB, S2), a);
	xfree(a, S2);
	teardown(h);
}
TEST_END

/* Non-blocking stream destroyed during a global capture: no event on any
 * live stream orders its work, so the blocks wait for the device-wide
 * synchronize flush does after the capture, never for an epoch close. */
TEST_BEGIN(test_orphan_nonblocking_capture)
{
	emm_heap_t *h = setup();
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB1, true);
	emm_addr_t a = xalloc(h, 1 * MIB, NB1), b = xalloc(h, 1 * MIB, NB1);
	xfree(a, NB1);
	xfree(b, NB1);
	fence.capture_sync = true;
	emm_heap_stream_destroyed(h, NB1);
	expect_u64_eq(heap_stats(h).pending_bytes, 2 * MIB);
	CHECKH(h);
	expect_unreachable(h);

	/* Recording allowed again, but no sync yet: epochs close on later
	 * frees without touching the orphans. */
	fence.capture_sync = false;
	expect_unreachable(h);
	expect_int_eq(fence.device_syncs, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_int_eq(fence.device_syncs, 1);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 0);
	expect_u64_eq(st.host_waits, 1);
	CHECKH(h);
	expect_u64_eq(xalloc(h, 1 * MIB, S2), a);
	xfree(a, S2);
	teardown(h);
}
TEST_END

/* A failed record (not a capture) at destroy orphans the blocks too. */
TEST_BEGIN(test_orphan_record_fails)
{
	emm_heap_t *h = setup();
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 1 * MIB, S1), b = xalloc(h, 1 * MIB, S1);
	xfree(a, S1);
	xfree(b, S1);
	fence.fail_record = 1;
	emm_heap_stream_destroyed(h, S1);
	expect_u64_eq(heap_stats(h).pending_bytes, 2 * MIB);
	CHECKH(h);
	expect_unreachable(h);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_u64_eq(heap_stats(h).pending_bytes, 0);
	expect_u64_eq(xalloc(h, 1 * MIB, S2), a);
	xfree(a, S2);
	teardown(h);
}
TEST_END

/* Destroying the heap with orphans still held synchronizes the device
 * before giving the memory back. */
TEST_BEGIN(test_orphan_destroy)
{
	emm_heap_t *h = setup();
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB1, true);
	emm_addr_t a = xalloc(h, 1 * MIB, NB1);
	xfree(a, NB1);
	fence.capture_stream = NB1; /* the dying stream itself is capturing */
	emm_heap_stream_destroyed(h, NB1);
	fence.capture_stream = 0;
	expect_u64_eq(heap_stats(h).pending_bytes, 1 * MIB);
	CHECKH(h);
	emm_heap_destroy(h, true);
	expect_int_eq(fence.device_syncs, 1);
	expect_u64_eq(src.used, 0);
	expect_int_eq(fake_live_events(&fence), 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}
TEST_END

int main(void)
{
	return emm_test_run(test_orphan_blocking_capture, test_orphan_nonblocking_capture,
	                    test_orphan_record_fails, test_orphan_destroy, NULL);
}
