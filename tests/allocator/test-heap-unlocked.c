/* SPDX-License-Identifier: MIT */
/*
 * test-heap-unlocked: no fence operation (record, query, stream_wait,
 * synchronize, release, device_synchronize: CUDA driver calls in
 * production) runs while a heap lock is held. The fence double's probe
 * starts a helper thread that takes every arena lock (emm_heap_add_stats)
 * and waits for it: if it has not finished within PROBE_MS, the operation
 * was called under a lock. Black-box, so it needs no debug build; debug
 * builds also abort on such a call by themselves (heap_internal.h).
 *
 * Each scenario drives one path that calls fence operations: closing an
 * epoch (with a live non-blocking stream), polling fences on the miss path,
 * stealing another stream's block, stream creation and destruction, flush,
 * the OOM retry, release of idle memory, strict mode.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <string.h>
#include <time.h>

#include "allocator/heap.h"
#include "common/compiler.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

#define S1  ((emm_stream_t)0x1000)
#define S2  ((emm_stream_t)0x2000)
#define NB1 ((emm_stream_t)0x3000)
#define NB2 ((emm_stream_t)0x4000)

#define PROBE_MS    300
#define MAX_HELPERS 4096

static struct fake_src src;
static struct fake_fence fence;
static emm_heap_t *probe_heap;

struct helper {
	pthread_t thread;
	sem_t done;
};
static struct helper *helpers[MAX_HELPERS];
static unsigned nhelpers;
static const char *flagged[16]; /* operations seen under a lock (each once per heap) */
static unsigned nflagged;
static unsigned probes;

static void *helper_main(void *arg)
{
	struct helper *hp = arg;
	struct emm_stats st;
	memset(&st, 0, sizeof(st));
	st.struct_size = sizeof(st);
	emm_heap_add_stats(probe_heap, &st); /* takes every arena lock in turn */
	sem_post(&hp->done);
	return NULL;
}

static bool already_flagged(const char *op)
{
	for (unsigned i = 0; i < nflagged; i++)
		if (strcmp(flagged[i], op) == 0)
			return true;
	return false;
}

static void probe(const char *op)
{
	struct timespec until;

	if (!probe_heap || nhelpers == MAX_HELPERS || already_flagged(op))
		return;
	struct helper *hp = calloc(1, sizeof(*hp));
	if (!hp || sem_init(&hp->done, 0, 0) || pthread_create(&hp->thread, NULL, helper_main, hp)) {
		emm_test_fail_("probe: cannot start a helper thread");
		free(hp);
		return;
	}
	helpers[nhelpers++] = hp;
	probes++;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_nsec += (long)PROBE_MS * 1000000L;
	until.tv_sec += until.tv_nsec / 1000000000L;
	until.tv_nsec %= 1000000000L;
	int r;
	while ((r = sem_timedwait(&hp->done, &until)) != 0 && errno == EINTR)
		;
	if (r != 0) {
		emm_test_fail_("fence op '%s' called while a heap lock is held", op);
		if (nflagged < EMM_ARRAY_SIZE(flagged))
			flagged[nflagged++] = op;
	}
}

/* Wait for every helper (those blocked on a lock finish once it drops). */
static void probe_drain(void)
{
	for (unsigned i = 0; i < nhelpers; i++) {
		pthread_join(helpers[i]->thread, NULL);
		sem_destroy(&helpers[i]->done);
		free(helpers[i]);
	}
	nhelpers = 0;
}

static emm_heap_t *setup(struct emm_heap_params *p, size_t capacity)
{
	emm_heap_t *h = NULL;
	fake_src_init(&src, capacity);
	fake_fence_init(&fence);
	struct emm_segment_source s = fake_src_ops(&src);
	struct emm_fence_ops f = fake_fence_ops(&fence);
	if (emm_heap_create(p, &s, &f, 0, &h))
		return NULL;
	probe_heap = h;
	nflagged = 0; /* each scenario reports its own */
	fence.probe = probe;
	return h;
}

static void teardown(emm_heap_t *h)
{
	fence.probe = NULL;
	probe_drain();
	probe_heap = NULL;
	expect_int_eq(emm_heap_check(h), 0);
	emm_heap_destroy(h, true);
	expect_u64_eq(src.used, 0);
	expect_int_eq(fence.misuse, 0);
	expect_int_eq(fake_live_events(&fence), 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

static struct emm_heap_params defaults(void)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.epoch_max_blocks = 16;
	return p;
}

/* Epoch close with a live non-blocking stream (records on the legacy
 * stream and on it), then polling on the miss path (queries), the fast
 * path's last fence waited on by a new stream, and flush. */
TEST_BEGIN(test_unlocked_epochs)
{
	struct emm_heap_params p = defaults();
	p.oom_retry = false;
	emm_heap_t *h = setup(&p, 2 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t blk[16], r = 0;

	emm_heap_stream_created(h, NB1, true);
	for (int i = 0; i < 16; i++)
		blk[i] = xalloc(h, 128 * KIB, 0);
	for (int i = 0; i < 16; i++)
		xfree(blk[i], 0); /* the 16th closes the epoch */
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.epochs_closed, 1);
	expect_u64_eq(st.events_recorded, 2);
	expect_int_eq(emm_heap_alloc(h, 128 * KIB, 0, &r), -ENOMEM); /* polls: queries */
	expect_true(heap_stats(h).event_queries > 0);
	fake_complete(&fence, 0);
	emm_addr_t a = xalloc(h, 128 * KIB, 0); /* polls, retires, releases */
	expect_u64_eq(a, blk[0]);
	emm_heap_stream_destroyed(h, NB1);

	/* Fast path (no non-blocking stream), then a new one waits on it. */
	xfree(a, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	emm_heap_stream_created(h, NB2, true);
	expect_int_eq(fence.nwaits, 1);
	emm_heap_stream_destroyed(h, NB2);
	teardown(h);
}
TEST_END

/* Stealing another stream's ready block: record, stream_wait, release (and
 * query for a synchronous allocation). */
TEST_BEGIN(test_unlocked_steal)
{
	struct emm_heap_params p = defaults();
	p.oom_retry = false;
	emm_heap_t *h = setup(&p, 2 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 1 * MIB, S1), b = xalloc(h, 1 * MIB, S1);
	xfree(a, S1);
	expect_u64_eq(xalloc(h, 1 * MIB, S2), a);
	expect_int_eq(fence.nwaits, 1);
	xfree(a, S2);
	fence.auto_complete = true;
	expect_u64_eq(xalloc(h, 1 * MIB, EMM_STREAM_SYNC), a);
	xfree(a, 0);
	xfree(b, 0);
	emm_heap_flush(h);
	teardown(h);
}
TEST_END

/* Stream destroy (a marker on the dying stream), the OOM retry (epoch
 * close, fencing ready-stream blocks, host waits), release of idle memory
 * and strict mode's device synchronize. */
TEST_BEGIN(test_unlocked_destroy_oom_strict)
{
	struct emm_heap_params p = defaults();
	emm_heap_t *h = setup(&p, 50 * MIB);
	assert_ptr_not_null(h);
	emm_addr_t q[4];

	emm_heap_stream_created(h, NB1, true);
	emm_addr_t s = xalloc(h, 64 * KIB, NB1);
	xfree(s, NB1);
	emm_heap_stream_destroyed(h, NB1); /* record on NB1 */
	emm_heap_stream_created(h, NB1, true);
	for (int i = 0; i < 4; i++)
		q[i] = xalloc(h, 5 * MIB, 0);
	emm_addr_t big = xalloc(h, 20 * MIB, 0);
	for (int i = 0; i < 4; i++)
		xfree(q[i], 0);
	xfree(big, S1);
	emm_addr_t c = xalloc(h, 30 * MIB, 0); /* OOM: recover, retry */
	expect_true(heap_stats(h).oom_retries >= 1);
	expect_true(fence.syncs > 0);
	xfree(c, 0);
	expect_true(emm_heap_release_idle(h, 0) >= 0);
	emm_heap_stream_destroyed(h, NB1);
	teardown(h);

	p = defaults();
	p.free_mode = EMM_FREE_MODE_STRICT;
	h = setup(&p, SIZE_MAX);
	assert_ptr_not_null(h);
	emm_addr_t a = xalloc(h, 64 * KIB, 0);
	xfree(a, 0);
	expect_int_eq(fence.device_syncs, 1);
	teardown(h);
}
TEST_END

int main(void)
{
	int r = emm_test_run(test_unlocked_epochs, test_unlocked_steal, test_unlocked_destroy_oom_strict, NULL);
	fprintf(stderr, "  %u probes\n", probes);
	return r;
}
