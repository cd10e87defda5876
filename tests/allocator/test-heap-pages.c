/* SPDX-License-Identifier: MIT */
/*
 * test-heap-pages: page-granular segments (heap.h, struct
 * emm_segment_pages) over the pages double: the fragmentation case of
 * project issue 9 in miniature (fill, free every other, bigger blocks),
 * mapping before hand-out and its failure (OOM retry), the release
 * threshold and emm_heap_release_idle counting mapped bytes, the fence rule
 * (a pending or ready-stream block is never unmapped), growing in place,
 * the create checks, threads racing maps, unmaps and grows, and holding
 * the mapped bytes at their high-water mark (EMM_HOLD_PEAK).
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

static emm_heap_t *setup(struct emm_heap_params *p, size_t capacity, bool remap, bool grow, bool fenced)
{
	emm_heap_t *h = NULL;
	pd_init(&pd, capacity);
	fake_fence_init(&fence);
	struct emm_segment_source src = pd_source(&pd);
	struct emm_segment_pages pages = pd_pages(&pd, remap, grow);
	struct emm_fence_ops fops = fake_fence_ops(&fence);
	/* Neither: a heap without page methods, as over the driver backend. */
	if (emm_heap_create_paged(p, &src, remap || grow ? &pages : NULL, fenced ? &fops : NULL, 0, &h))
		return NULL;
	return h;
}

static void teardown(emm_heap_t *h)
{
	emm_heap_destroy(h, true);
	expect_int_eq(pd.misuse, 0);
	expect_u64_eq(pd.used, 0);
	pd_fini(&pd);
	fake_fence_fini(&fence);
}

static struct emm_heap_params params1(void)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.arenas = 1;
	return p;
}

/* xalloc (heap_doubles.h), and the block must have memory behind it. */
static emm_addr_t palloc(emm_heap_t *h, size_t size, emm_stream_t s)
{
	emm_addr_t a = xalloc(h, size, s);

	if (a && !pd_is_mapped(&pd, a, size))
		emm_test_fail_("block 0x%llx (+%zu) handed out without memory", (unsigned long long)a, size);
	return a;
}

#define CHECKH(h) expect_int_eq(emm_heap_check(h), 0)

/* Issue 9 in miniature: 7 MiB blocks until full, free every other, then
 * 16 MiB blocks. Grown in place the 7 MiB blocks pack the capacity; the
 * holes' whole granules (3 of every 3.5) come back for the big ones. */
TEST_BEGIN(test_fragmentation)
{
	struct emm_heap_params p = params1();
	const size_t cap = 256 * MIB;
	emm_heap_t *h = setup(&p, cap, true, true, false);
	assert_ptr_not_null(h);
	emm_addr_t a[64], big[64], r;
	unsigned n = 0, nb = 0;

	while (n < 64 && emm_heap_alloc(h, 7 * MIB, EMM_STREAM_SYNC, &r) == 0)
		a[n++] = r;
	expect_true(n * 7 * MIB > cap - 9 * MIB); /* packed: at most a block and a granule lost */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.backend_allocs, 1); /* one segment, grown */
	expect_true(st.segment_grows > 0);
	for (unsigned i = 1; i < n; i++)
		expect_u64_eq(a[i], a[i - 1] + 7 * MIB);
	CHECKH(h);

	for (unsigned i = 0; i < n; i += 2)
		expect_int_eq(emm_heap_free(a[i], EMM_STREAM_SYNC, NULL), 0);
	while (nb < 64 && emm_heap_alloc(h, 16 * MIB, EMM_STREAM_SYNC, &r) == 0) {
		expect_true(pd_is_mapped(&pd, r, 16 * MIB));
		big[nb++] = r;
	}
	/* Each freed block held 3 whole granules (6 MiB): (n+1)/2 * 6 MiB. */
	size_t given = ((n + 1) / 2) * 6 * MIB;
	expect_true(nb * 16 * MIB + 16 * MIB > given);
	st = heap_stats(h);
	expect_true(st.page_unmaps > 0);
	expect_true(st.oom_retries > 0);
	expect_u64_eq(st.reserved_bytes, pd.used);
	expect_u64_eq(st.unmapped_bytes_total, given);
	CHECKH(h);
	for (unsigned i = 1; i < n; i += 2)
		expect_int_eq(emm_heap_free(a[i], EMM_STREAM_SYNC, NULL), 0);
	for (unsigned i = 0; i < nb; i++)
		expect_int_eq(emm_heap_free(big[i], EMM_STREAM_SYNC, NULL), 0);
	CHECKH(h);
	teardown(h);
}
TEST_END

/* release_idle unmaps a free block's granules while its live neighbour
 * keeps the segment; reusing it maps them again first. */
TEST_BEGIN(test_release_and_remap)
{
	struct emm_heap_params p = params1();
	emm_heap_t *h = setup(&p, 1024 * MIB, true, false, false);
	assert_ptr_not_null(h);
	emm_addr_t a = palloc(h, 40 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = palloc(h, 40 * MIB, EMM_STREAM_SYNC); /* another segment (no grow) */
	emm_addr_t c = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	(void)b;
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0);
	expect_int_eq(emm_heap_free(c, EMM_STREAM_SYNC, NULL), 0);
	/* a's and c's segments are idle whole: release_idle gives them back
	 * whole; keep 30 MiB, so one goes whole and the rest comes from pages. */
	size_t used0 = pd.used;
	long long got = emm_heap_release_idle(h, 10 * MIB);
	expect_true(got >= (long long)(50 * MIB));
	expect_u64_eq(pd.used, used0 - (size_t)got);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.reserved_bytes, pd.used);
	expect_true(st.reserved_bytes - st.allocated_bytes <= 10 * MIB);
	CHECKH(h);

	/* Split a segment: d and e share one; d's pages go back alone. */
	emm_addr_t x = palloc(h, 40 * MIB, EMM_STREAM_SYNC);
	expect_int_eq(emm_heap_free(x, EMM_STREAM_SYNC, NULL), 0);
	emm_addr_t d = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	emm_addr_t e = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(d, x);
	expect_u64_eq(e, x + 20 * MIB);
	expect_int_eq(emm_heap_free(d, EMM_STREAM_SYNC, NULL), 0);
	expect_int_eq(emm_heap_release_idle(h, 0), 20 * MIB);
	expect_false(pd_is_mapped(&pd, d, 2 * MIB));
	st = heap_stats(h);
	expect_u64_eq(st.unmapped_bytes, 20 * MIB);
	expect_u64_eq(st.reserved_bytes, pd.used);
	CHECKH(h);
	unsigned maps0 = pd.maps;
	emm_addr_t f = palloc(h, 20 * MIB, EMM_STREAM_SYNC); /* maps again */
	expect_u64_eq(f, d);
	expect_true(pd.maps > maps0);
	expect_u64_eq(heap_stats(h).unmapped_bytes, 0);
	expect_true(heap_stats(h).page_maps > 0);
	expect_true(heap_stats(h).remapped_bytes_total >= 20 * MIB);
	CHECKH(h);
	expect_int_eq(emm_heap_free(e, EMM_STREAM_SYNC, NULL), 0);
	expect_int_eq(emm_heap_free(f, EMM_STREAM_SYNC, NULL), 0);
	expect_int_eq(emm_heap_free(b, EMM_STREAM_SYNC, NULL), 0);
	teardown(h);
}
TEST_END

/* A map that fails for memory runs the OOM retry: other free pages go back
 * and the allocation gets its block. Without the retry it fails cleanly. */
TEST_BEGIN(test_map_failure)
{
	struct emm_heap_params p = params1();
	emm_heap_t *h = setup(&p, 64 * MIB, true, true, false);
	assert_ptr_not_null(h);
	emm_addr_t a = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	emm_addr_t c = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(b, a + 20 * MIB);
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0);
	expect_int_eq(emm_heap_release_idle(h, 0), 20 * MIB);
	expect_int_eq(emm_heap_free(c, EMM_STREAM_SYNC, NULL), 0); /* mapped, free */
	pd.capacity = 44 * MIB; /* b + c mapped: no room to map a again */
	expect_u64_eq(palloc(h, 20 * MIB, EMM_STREAM_SYNC), a);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 1);
	expect_u64_eq(st.ooms, 0);
	expect_true(pd_ever_unmapped(&pd, c, 20 * MIB));
	CHECKH(h);

	/* An injected failure with the retry off: -ENOMEM, nothing taken. */
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0);
	expect_true(emm_heap_release_idle(h, 0) > 0);
	teardown(h);

	p.oom_retry = false;
	h = setup(&p, 64 * MIB, true, false, false);
	assert_ptr_not_null(h);
	a = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	b = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0);
	/* a is a whole idle segment: releasing keeps 20 MiB -> pages only if
	 * the segment is not idle; take the segment back through pages by
	 * keeping part of it in use. */
	emm_addr_t a1 = palloc(h, 10 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(a1, a);
	expect_true(emm_heap_release_idle(h, 0) >= (long long)(10 * MIB));
	pd.fail_map = 1;
	emm_addr_t r = 0;
	expect_int_eq(emm_heap_alloc(h, 10 * MIB, EMM_STREAM_SYNC, &r), -ENOMEM);
	expect_u64_eq(r, 0);
	struct emm_stats st2 = heap_stats(h);
	expect_u64_eq(st2.ooms, 1);
	expect_u64_eq(st2.live_blocks, 2);
	CHECKH(h);
	expect_u64_eq(palloc(h, 10 * MIB, EMM_STREAM_SYNC), a + 10 * MIB); /* works again */
	CHECKH(h);
	teardown(h);
}
TEST_END

/* Above the release threshold a free gives back pages down to it: the
 * threshold counts mapped idle bytes. */
TEST_BEGIN(test_threshold)
{
	struct emm_heap_params p = params1();
	p.release_threshold = 8 * MIB;
	emm_heap_t *h = setup(&p, 1024 * MIB, true, true, false);
	assert_ptr_not_null(h);
	emm_addr_t a = palloc(h, 30 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = palloc(h, 30 * MIB, EMM_STREAM_SYNC); /* grown in place behind a */
	expect_u64_eq(b, a + 30 * MIB);
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0);
	struct emm_stats st = heap_stats(h);
	expect_true(st.reserved_bytes - st.allocated_bytes <= 8 * MIB);
	expect_true(st.reserved_bytes - st.allocated_bytes > 8 * MIB - 2 * MIB);
	expect_u64_eq(st.reserved_bytes, pd.used);
	expect_true(st.page_unmaps > 0);
	CHECKH(h);
	expect_int_eq(emm_heap_free(b, EMM_STREAM_SYNC, NULL), 0);
	teardown(h);
}
TEST_END

/* The fence rule: a block pending a fence, or ready for one stream only,
 * keeps its memory through release_idle; once its fence completes it may
 * go. heap_check also proves no granule under it lost its memory. */
TEST_BEGIN(test_fence_rule)
{
	const emm_stream_t NB = 0x7000, S1 = 0x8000;
	struct emm_heap_params p = params1();
	emm_heap_t *h = setup(&p, 1024 * MIB, true, true, true);
	assert_ptr_not_null(h);
	emm_heap_stream_created(h, NB, true); /* epochs then need events */
	emm_addr_t a = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	emm_addr_t b = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	emm_addr_t c = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	emm_addr_t keep = palloc(h, 20 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(c, a + 40 * MIB);
	expect_int_eq(emm_heap_free(a, EMM_STREAM_SYNC, NULL), 0); /* pending */
	expect_int_eq(emm_heap_free(b, S1, NULL), 0);              /* ready-stream S1 */
	expect_int_eq(emm_heap_flush(h), 0);                       /* closed, incomplete */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.pending_bytes, 20 * MIB);
	emm_heap_release_idle(h, 0);
	expect_false(pd_ever_unmapped(&pd, a, 20 * MIB));
	expect_false(pd_ever_unmapped(&pd, b, 20 * MIB));
	expect_true(pd_is_mapped(&pd, a, 60 * MIB));
	CHECKH(h);

	/* c freed ready-any right away (no fence ops in stream mode? no:
	 * through the epoch, pending too). */
	expect_int_eq(emm_heap_free(c, EMM_STREAM_SYNC, NULL), 0);
	emm_heap_release_idle(h, 0);
	expect_false(pd_ever_unmapped(&pd, c, 20 * MIB));

	/* The fences complete: a and c may go now, b (ready-stream) not. */
	fake_complete(&fence, 0);
	emm_heap_release_idle(h, 0);
	expect_true(pd_ever_unmapped(&pd, a, 20 * MIB));
	expect_true(pd_ever_unmapped(&pd, c, 20 * MIB));
	expect_false(pd_ever_unmapped(&pd, b, 20 * MIB));
	CHECKH(h);
	expect_int_eq(emm_heap_free(keep, EMM_STREAM_SYNC, NULL), 0);
	fake_complete(&fence, 0);
	teardown(h);
}
TEST_END

/* Page-granular heaps close the free epoch after epoch_max_blocks_paged
 * synchronous frees (8 by default, not 32): their peak. */
static uint64_t closes_after_frees(bool remap, unsigned n)
{
	const emm_stream_t NB = 0x7000;
	struct emm_heap_params p = params1();
	emm_heap_t *h = setup(&p, 1024 * MIB, remap, false, true);
	emm_addr_t a[16];
	uint64_t closed;

	if (!h)
		return UINT64_MAX;
	emm_heap_stream_created(h, NB, true); /* epochs then need events */
	for (unsigned i = 0; i < n; i++)
		a[i] = palloc(h, 4096, EMM_STREAM_SYNC);
	for (unsigned i = 0; i < n; i++)
		expect_int_eq(emm_heap_free(a[i], EMM_STREAM_SYNC, NULL), 0);
	closed = heap_stats(h).epochs_closed;
	fake_complete(&fence, 0);
	teardown(h);
	return closed;
}

TEST_BEGIN(test_paged_epoch_quota)
{
	expect_u64_eq(closes_after_frees(true, 7), 0);
	expect_u64_eq(closes_after_frees(true, 8), 1);
	expect_u64_eq(closes_after_frees(true, 16), 2);
	expect_u64_eq(closes_after_frees(false, 16), 0); /* 32 elsewhere */
}
TEST_END

/* Growing in place: per stream key, the tail block extended or a block
 * appended; a full reservation opens a new segment; a failed grow runs the
 * OOM retry. */
TEST_BEGIN(test_grow)
{
	const emm_stream_t S1 = 0x8000;
	struct emm_heap_params p = params1();
	emm_heap_t *h = setup(&p, 4096 * MIB, false, true, false);
	assert_ptr_not_null(h);
	pd.reserve = 66 * MIB;
	emm_addr_t a = palloc(h, 7 * MIB, EMM_STREAM_SYNC); /* 14 MiB segment, reserve 66 */
	emm_addr_t b = palloc(h, 7 * MIB, EMM_STREAM_SYNC);
	emm_addr_t c = palloc(h, 7 * MIB, EMM_STREAM_SYNC); /* segment full: grows */
	expect_u64_eq(b, a + 7 * MIB);
	expect_u64_eq(c, b + 7 * MIB);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.backend_allocs, 1);
	expect_u64_eq(st.segment_grows, 1);
	expect_u64_eq(st.reserved_bytes, pd.used);
	CHECKH(h);
	/* Fill the reservation (a remainder the large pool would not split
	 * costs a granule more per grow): the 10th block needs a new segment. */
	emm_addr_t more[8];
	for (int i = 0; i < 6; i++)
		more[i] = palloc(h, 7 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(more[5], a + 8 * 7 * MIB);
	emm_addr_t far = palloc(h, 7 * MIB, EMM_STREAM_SYNC);
	expect_true(far < a || far >= a + 64 * MIB);
	expect_u64_eq(heap_stats(h).backend_allocs, 2);
	CHECKH(h);

	/* A grow that fails for memory: OOM retry, then it works. */
	emm_addr_t far2 = palloc(h, 7 * MIB, EMM_STREAM_SYNC); /* from the new segment's tail */
	expect_u64_eq(far2, far + 7 * MIB);
	pd.fail_grow = 1;
	emm_addr_t g = palloc(h, 7 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(g, far + 14 * MIB);
	st = heap_stats(h);
	expect_u64_eq(st.oom_retries, 1);
	/* The tail free block grows in place when it is ready-any. */
	expect_int_eq(emm_heap_free(g, EMM_STREAM_SYNC, NULL), 0);
	emm_addr_t big = palloc(h, 16 * MIB, EMM_STREAM_SYNC);
	expect_u64_eq(big, far + 14 * MIB);
	CHECKH(h);

	/* Another stream key grows its own newest segment, not the other's. */
	emm_addr_t s1 = palloc(h, 16 * MIB, S1);
	emm_addr_t s2 = palloc(h, 16 * MIB, S1);
	expect_u64_eq(s2, s1 + 16 * MIB);
	expect_u64_eq(heap_stats(h).backend_allocs, 3);
	CHECKH(h);
	emm_heap_destroy(h, true);
	expect_int_eq(pd.misuse, 0);
	expect_u64_eq(pd.used, 0);
	pd_fini(&pd);
	fake_fence_fini(&fence);
}
TEST_END

TEST_BEGIN(test_create_checks)
{
	struct emm_heap_params p = params1();
	struct pages_double d;
	pd_init(&d, 64 * MIB);
	struct emm_segment_source src = pd_source(&d);
	struct emm_segment_pages pg = pd_pages(&d, true, true);
	emm_heap_t *h = NULL;

	pg.granularity = 3 * MIB;
	expect_int_eq(emm_heap_create_paged(&p, &src, &pg, NULL, 0, &h), -EINVAL);
	pg.granularity = 256;
	expect_int_eq(emm_heap_create_paged(&p, &src, &pg, NULL, 0, &h), -EINVAL);
	pg = pd_pages(&d, true, true);
	pg.map = NULL;
	expect_int_eq(emm_heap_create_paged(&p, &src, &pg, NULL, 0, &h), -EINVAL);
	pg = pd_pages(&d, false, false);
	expect_int_eq(emm_heap_create_paged(&p, &src, &pg, NULL, 0, &h), -EINVAL);
	expect_ptr_null(h);
	/* NULL pages: a plain heap. */
	expect_int_eq(emm_heap_create_paged(&p, &src, NULL, NULL, 0, &h), 0);
	emm_heap_destroy(h, true);
	pd_fini(&d);
}
TEST_END

/* Threads allocate and free in a small device, one releases idle memory
 * now and then: maps, unmaps and grows race; the invariants hold. */
#define THREADS 4
static emm_heap_t *race_heap;

static void *race_main(void *arg)
{
	unsigned seed = (unsigned)(uintptr_t)arg * 7919u + 1;
	emm_addr_t live[16] = {0};
	for (int it = 0; it < 3000; it++) {
		seed = seed * 1103515245u + 12345u;
		unsigned k = (seed >> 8) % 16;
		if (live[k]) {
			emm_heap_free(live[k], (seed & 1) ? EMM_STREAM_SYNC : 0x9000, NULL);
			live[k] = 0;
		} else {
			size_t size = ((seed >> 12) % 24 + 1) * MIB + ((seed >> 20) % 7) * 4096;
			if (emm_heap_alloc(race_heap, size, EMM_STREAM_SYNC, &live[k]) == 0 &&
			    !pd_is_mapped(&pd, live[k], size))
				emm_test_fail_("unmapped block handed out");
		}
		if ((uintptr_t)arg == 0 && it % 97 == 0)
			emm_heap_release_idle(race_heap, (seed >> 4) % 64 * MIB);
	}
	for (int k = 0; k < 16; k++)
		if (live[k])
			emm_heap_free(live[k], EMM_STREAM_SYNC, NULL);
	return NULL;
}

/* Threads racing on two arenas; with the peak held too (its visits to the
 * other arena, large requests all in arena 0). */
static void race_threads(bool hold)
{
	struct emm_heap_params p = params1();
	p.arenas = 2;
	p.hold_peak = hold;
	race_heap = setup(&p, 600 * MIB, true, true, false);
	assert_ptr_not_null(race_heap);
	pthread_t t[THREADS];
	for (uintptr_t i = 0; i < THREADS; i++)
		pthread_create(&t[i], NULL, race_main, (void *)i);
	for (int i = 0; i < THREADS; i++)
		pthread_join(t[i], NULL);
	CHECKH(race_heap);
	struct emm_stats st = heap_stats(race_heap);
	expect_u64_eq(st.live_blocks, 0);
	expect_u64_eq(st.reserved_bytes, pd.used);
	if (!hold)
		expect_true(st.page_unmaps > 0);
	teardown(race_heap);
}

TEST_BEGIN(test_threads)
{
	race_threads(false);
}
TEST_END

/* EMM_HOLD_PEAK: a growth that would pass the mapped high-water mark gives
 * back idle pages first. 40 + 40 MiB, the first freed, then 60 MiB (too
 * big for the hole): held, the hole's pages go back (100 MiB mapped);
 * not held, the hole stays mapped (140 MiB). */
TEST_BEGIN(test_hold_peak)
{
	for (int hold = 0; hold <= 1; hold++) {
		struct emm_heap_params p = params1();
		p.hold_peak = hold;
		emm_heap_t *h = setup(&p, 512 * MIB, true, true, false);
		assert_ptr_not_null(h);
		emm_addr_t a = palloc(h, 40 * MIB, EMM_STREAM_SYNC);
		emm_addr_t b = palloc(h, 40 * MIB, EMM_STREAM_SYNC);
		expect_u64_eq(pd.used, 80 * MIB);
		xfree(a, EMM_STREAM_SYNC);
		emm_addr_t c = palloc(h, 60 * MIB, EMM_STREAM_SYNC);
		expect_u64_eq(pd.used, hold ? 100 * MIB : 140 * MIB);
		expect_u64_eq(pd.unmaps > 0, hold);
		expect_u64_eq(heap_stats(h).reserved_bytes_peak, hold ? 100 * MIB : 140 * MIB);
		/* The hole is mapped again when handed out, within the mark. */
		a = palloc(h, 40 * MIB, EMM_STREAM_SYNC);
		expect_u64_eq(pd.used, 140 * MIB);
		CHECKH(h);
		xfree(a, EMM_STREAM_SYNC);
		xfree(b, EMM_STREAM_SYNC);
		xfree(c, EMM_STREAM_SYNC);
		teardown(h);
	}
}
TEST_END

/* With the peak held, every thread's large requests share arena 0: a
 * block one thread freed serves another's request with no new memory
 * (each thread's own arena would grow a segment of its own). */
static emm_heap_t *shared_heap;

static void *alloc_free_40(void *arg)
{
	emm_addr_t a = xalloc(shared_heap, 40 * MIB, EMM_STREAM_SYNC);

	(void)arg;
	xfree(a, EMM_STREAM_SYNC);
	return NULL;
}

TEST_BEGIN(test_hold_peak_shares_large_arena)
{
	for (int hold = 0; hold <= 1; hold++) {
		struct emm_heap_params p = params1();
		p.arenas = 2;
		p.hold_peak = hold;
		shared_heap = setup(&p, 512 * MIB, true, true, false);
		assert_ptr_not_null(shared_heap);
		/* Two threads one after the other: two slots, two arenas. With
		 * hold_peak both use arena 0; without, the second thread's miss
		 * takes the first arena's ready block before reserving more: one
		 * segment either way. */
		for (int i = 0; i < 2; i++) {
			pthread_t t;
			pthread_create(&t, NULL, alloc_free_40, NULL);
			pthread_join(t, NULL);
		}
		expect_u64_eq(pd.allocs, 1);
		expect_u64_eq(pd.used, 40 * MIB);
		expect_u64_eq(pd.unmaps, 0);
		CHECKH(shared_heap);
		teardown(shared_heap);
	}
}
TEST_END

TEST_BEGIN(test_threads_hold_peak)
{
	race_threads(true);
}
TEST_END

int main(void)
{
	return emm_test_run(test_fragmentation, test_release_and_remap, test_map_failure, test_threshold,
	                    test_fence_rule, test_paged_epoch_quota, test_grow, test_create_checks, test_threads, test_hold_peak,
	                    test_hold_peak_shares_large_arena, test_threads_hold_peak, NULL);
}
