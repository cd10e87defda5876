/* SPDX-License-Identifier: MIT */
/*
 * test-heap-pages-fence: page-granular heaps (the vmm backend) never unmap
 * memory the device may still use. A synchronous free whose epoch closes
 * on the fast path (no live non-blocking stream) makes its block ready-any
 * at once, ordered only by the legacy-stream event: reuse is stream-ordered
 * and safe, but an unmap (cuMemUnmap) is not, and giving the block's pages
 * back before that event completes is an illegal address for the kernel
 * still using them (PyTorch training under EMM_BACKEND=vmm with
 * EMM_HOLD_PEAK, "illegal memory access" in Adam's step). So is freeing a
 * whole idle segment of such blocks (the vmm backend's segment_free unmaps
 * too), and, in stream free mode, any unmap before a device synchronize.
 *
 * The doubles: every unmap and segment free notes whether every event
 * recorded so far had completed (the fake completes an event only when it
 * is synchronized, or all at a device synchronize).
 */
#include <errno.h>
#include <pthread.h>

#include "allocator/heap.h"
#include "emm_test.h"
#include "heap_doubles.h"
#include "pages_double.h"

#define MIB ((size_t)1 << 20)

static struct pages_double pd;
static struct fake_fence fence;
static unsigned unfenced;      /* unmaps and segment frees with work maybe in flight */
static bool stream_mode;       /* in flight unless a device synchronize came first */
static unsigned device_syncs0; /* fence.device_syncs at the last free */

static bool all_complete(void)
{
	pthread_mutex_lock(&fence.lock);
	bool done = stream_mode ? fence.device_syncs > device_syncs0
	                        : fence.done_upto >= fence.nev || fence.max_done >= fence.nev;
	pthread_mutex_unlock(&fence.lock);
	return done;
}

/* With allow_hi set, an unmap outside [allow_lo, allow_hi) counts as
 * unfenced instead (the test completed only some events). */
static emm_addr_t allow_lo, allow_hi;

static int unmap_checked(void *state, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	if (allow_hi)
		unfenced += seg + off < allow_lo || seg + off + len > allow_hi;
	else
		unfenced += !all_complete();
	return pd_unmap(state, seg, seg_size, off, len);
}

static int free_checked(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	unfenced += !all_complete();
	return pd_free(state, addr, size, stream);
}

static emm_heap_t *setup(struct emm_heap_params *p, size_t capacity)
{
	emm_heap_t *h = NULL;

	pd_init(&pd, capacity);
	fake_fence_init(&fence);
	unfenced = 0;
	allow_lo = allow_hi = 0;
	stream_mode = p->free_mode == EMM_FREE_MODE_STREAM;
	struct emm_segment_source src = pd_source(&pd);
	struct emm_segment_pages pages = pd_pages(&pd, true, true);
	struct emm_fence_ops fops = fake_fence_ops(&fence);
	src.free = free_checked;
	pages.unmap = unmap_checked;
	if (emm_heap_create_paged(p, &src, &pages, &fops, 0, &h))
		return NULL;
	return h;
}

static void teardown(emm_heap_t *h)
{
	fake_complete(&fence, 0);
	emm_heap_destroy(h, true);
	expect_int_eq(pd.misuse, 0);
	expect_u64_eq(pd.used, 0);
	pd_fini(&pd);
	fake_fence_fini(&fence);
}

static struct emm_heap_params params(enum emm_free_mode mode)
{
	struct emm_heap_params p;

	emm_heap_params_default(&p);
	p.arenas = 1;
	p.hold_peak = true;
	p.epoch_max_blocks = 1; /* every synchronous free closes its epoch */
	p.free_mode = mode;
	return p;
}

static void sync_free(emm_addr_t a)
{
	device_syncs0 = fence.device_syncs;
	xfree(a, EMM_STREAM_SYNC);
}

/* EMM_HOLD_PEAK's give-back before a growth: 40 + 40 MiB, the first freed
 * (its kernel still running), then 60 MiB past the mark. In stream free
 * mode the hole's pages still go back, after a device synchronize. */
TEST_BEGIN(test_hold_peak_stream_mode_waits_for_device)
{
	struct emm_heap_params p = params(EMM_FREE_MODE_STREAM);
	emm_heap_t *h = setup(&p, 512 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	sync_free(a);
	emm_addr_t c = xalloc(h, 60 * MIB, EMM_STREAM_SYNC);
	expect_true(pd.unmaps > 0); /* the peak is still held */
	expect_u64_eq(pd.used, 100 * MIB);
	expect_u64_eq(unfenced, 0);
	expect_int_eq(emm_heap_check(h), 0);
	xfree(b, EMM_STREAM_SYNC);
	xfree(c, EMM_STREAM_SYNC);
	teardown(h);
}
TEST_END

/* In fence mode the hold makes no host wait: while the free's legacy
 * event runs, the growth maps new pages and gives none back (the peak
 * moves up); once the event has completed, the next growth gives the
 * hole's pages back, still without a wait. */
TEST_BEGIN(test_hold_peak_defers_while_legacy_event_runs)
{
	struct emm_heap_params p = params(EMM_FREE_MODE_FENCE);
	emm_heap_t *h = setup(&p, 512 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	sync_free(a);
	expect_u64_eq(fence.records, 1);
	expect_true(fence.nev > fence.max_done); /* a's event runs on */
	emm_addr_t c = xalloc(h, 60 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(pd.unmaps, 0);
	expect_u64_eq(pd.used, 140 * MIB);
	expect_u64_eq(unfenced, 0);
	expect_u64_eq(fence.syncs + fence.device_syncs, 0);
	expect_u64_eq(heap_stats(h).host_waits, 0);

	fake_complete(&fence, 0); /* the device caught up */
	emm_addr_t d = xalloc(h, 50 * MIB, EMM_STREAM_SYNC);
	expect_true(pd.unmaps > 0);
	expect_u64_eq(pd.used, 150 * MIB); /* 140 + 50 - a's 40 */
	expect_u64_eq(unfenced, 0);
	expect_u64_eq(fence.syncs + fence.device_syncs, 0);
	expect_int_eq(emm_heap_check(h), 0);
	xfree(b, EMM_STREAM_SYNC);
	xfree(c, EMM_STREAM_SYNC);
	xfree(d, EMM_STREAM_SYNC);
	teardown(h);
}
TEST_END

/* The held peak gives back what an older close covers while a newer one
 * runs: a freed (close 1), c freed (close 2), only close 1's event
 * completed: the growth past the mark unmaps a's pages, not c's, and
 * makes no host wait. */
TEST_BEGIN(test_hold_peak_older_close_complete)
{
	struct emm_heap_params p = params(EMM_FREE_MODE_FENCE);
	emm_heap_t *h = setup(&p, 512 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	emm_addr_t c = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	sync_free(a);
	sync_free(c);
	expect_u64_eq(fence.records, 2);
	fence.done_upto = 1; /* the device reached a's close, not c's */
	allow_lo = a;
	allow_hi = a + 40 * MIB;
	emm_addr_t d = xalloc(h, 60 * MIB, EMM_STREAM_SYNC);
	expect_true(d != 0);
	expect_true(pd.unmaps > 0);
	expect_u64_eq(unfenced, 0);
	/* d is c's block grown by 20 MiB in place: 20 MiB of a's went back. */
	expect_u64_eq(pd.used, 120 * MIB);
	expect_u64_eq(fence.syncs + fence.device_syncs, 0);
	expect_u64_eq(heap_stats(h).host_waits, 0);
	expect_int_eq(emm_heap_check(h), 0);
	allow_hi = 0;
	xfree(b, EMM_STREAM_SYNC);
	xfree(d, EMM_STREAM_SYNC);
	teardown(h);
}
TEST_END

/* The give-back of emm_heap_release_idle: whole idle segments (segment
 * free) and the pages under free blocks, both after the free's event. */
TEST_BEGIN(test_release_idle_waits)
{
	struct emm_heap_params p = params(EMM_FREE_MODE_FENCE);
	p.hold_peak = false;
	emm_heap_t *h = setup(&p, 512 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = xalloc(h, 40 * MIB, EMM_STREAM_SYNC); /* grown: a's segment */
	emm_addr_t c = xalloc(h, 1 * MIB, EMM_STREAM_SYNC);  /* small pool: a segment alone */
	sync_free(a);
	sync_free(c);
	expect_true(emm_heap_release_idle(h, 0) >= (long long)(40 * MIB));
	expect_true(pd.unmaps > 0);
	expect_true(pd.frees > 0);
	expect_u64_eq(unfenced, 0);
	/* Nothing freed since: no second wait. */
	unsigned waits = fence.syncs + fence.device_syncs;
	expect_int_eq(emm_heap_release_idle(h, 0), 0);
	expect_u64_eq(fence.syncs + fence.device_syncs, waits);
	xfree(b, EMM_STREAM_SYNC);
	teardown(h);
}
TEST_END

/* The OOM retry frees idle segments and pages too. */
TEST_BEGIN(test_oom_retry_waits)
{
	struct emm_heap_params p = params(EMM_FREE_MODE_FENCE);
	p.hold_peak = false;
	emm_heap_t *h = setup(&p, 96 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = xalloc(h, 40 * MIB, EMM_STREAM_SYNC);
	sync_free(a);
	emm_addr_t c = xalloc(h, 50 * MIB, EMM_STREAM_SYNC); /* only with a's pages back */
	expect_true(c != 0);
	expect_true(heap_stats(h).oom_retries > 0);
	expect_u64_eq(unfenced, 0);
	xfree(b, EMM_STREAM_SYNC);
	xfree(c, EMM_STREAM_SYNC);
	teardown(h);
}
TEST_END

int main(void)
{
	return emm_test_run(test_hold_peak_defers_while_legacy_event_runs, test_hold_peak_older_close_complete, test_hold_peak_stream_mode_waits_for_device,
	                    test_release_idle_waits, test_oom_retry_waits, NULL);
}
