/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-heap-wide.c - epochs widen with the threads: once 8
 * arenas of a heap hold memory, every arena's open epoch closes after twice
 * EMM_EPOCH_BLOCKS synchronous frees (heap_types.h, EPOCH_WIDE_ARENAS); a
 * page-granular heap keeps its quota.
 *
 * Each case runs in a child process of its own, so that the threads take
 * arena slots from a fresh round-robin counter: the main thread arena 0,
 * helper i arena i (of 8). A helper allocates one 12 MiB block, a segment of
 * its own that no other arena could lend, and keeps it: its arena then holds
 * memory. The main thread frees 4 KiB blocks and counts the epochs closed:
 *
 *   - with 7 arenas holding memory the quota is EMM_EPOCH_BLOCKS: the
 *     epoch closes at the 64th free, not before;
 *   - the 8th arena doubles it, for the arenas already holding and the
 *     epoch already open: 127 frees close nothing, the 128th closes;
 *   - a page-granular heap (quota 8) still closes at 8 frees.
 */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "pages_double.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define ARENAS 8u
#define SMALL (4 * KIB)
#define NSMALL 512

static struct fake_src src;
static struct fake_fence fence;
static struct pages_double pd;

struct helper {
	emm_heap_t *heap;
	emm_addr_t block;
	int r;
};

static void *helper_main(void *arg)
{
	struct helper *hp = arg;

	hp->r = emm_heap_alloc(hp->heap, 12 * MIB, 0, &hp->block);
	return NULL;
}

/* One more thread, one more arena holding memory (its slot is the next). */
static void add_arena(emm_heap_t *h, struct helper *hp)
{
	pthread_t t;

	hp->heap = h;
	hp->r = -1;
	if (pthread_create(&t, NULL, helper_main, hp) != 0) {
		emm_test_fail_("pthread_create");
		return;
	}
	pthread_join(t, NULL);
	expect_int_eq(hp->r, 0);
}

/* Free `n` of the main thread's blocks from *next on: true when none of
 * the frees but the last closed an epoch and the last did. */
static bool epoch_closes_at(emm_heap_t *h, emm_addr_t *blocks, unsigned *next, unsigned n)
{
	uint64_t before = heap_stats(h).epochs_closed;

	for (unsigned i = 0; i < n - 1; i++)
		xfree(blocks[(*next)++], 0);
	if (heap_stats(h).epochs_closed != before) {
		fprintf(stderr, "an epoch closed before free %u\n", n);
		return false;
	}
	xfree(blocks[(*next)++], 0);
	return heap_stats(h).epochs_closed == before + 1;
}

static emm_heap_t *setup(bool paged)
{
	struct emm_heap_params p;
	emm_heap_t *h = NULL;

	emm_heap_params_default(&p); /* 64 frees; 8 in page-granular heaps */
	p.arenas = ARENAS;
	p.oom_retry = false;
	p.hold_peak = false; /* large requests in the thread's own arena */

	fake_fence_init(&fence);
	struct emm_fence_ops f = fake_fence_ops(&fence);
	if (paged) {
		pd_init(&pd, SIZE_MAX);
		struct emm_segment_source s = pd_source(&pd);
		struct emm_segment_pages pages = pd_pages(&pd, true, true);
		if (emm_heap_create_paged(&p, &s, &pages, &f, 0, &h))
			return NULL;
	} else {
		fake_src_init(&src, SIZE_MAX);
		struct emm_segment_source s = fake_src_ops(&src);
		if (emm_heap_create(&p, &s, &f, 0, &h))
			return NULL;
	}
	return h;
}

/* The case, in the child: 0 when every check passed. */
static int run_case(bool paged)
{
	static emm_addr_t blocks[NSMALL];
	struct helper helpers[ARENAS];
	unsigned next = 0, quota = paged ? 8 : 64;
	emm_heap_t *h = setup(paged);

	if (!h) {
		emm_test_fail_("heap create");
		return 1;
	}
	for (unsigned i = 0; i < NSMALL; i++)
		blocks[i] = xalloc(h, SMALL, 0);
	for (unsigned i = 1; i < ARENAS - 1; i++)
		add_arena(h, &helpers[i]);
	/* The main thread's 2 MiB of small blocks fill one segment. */
	expect_u64_eq(heap_stats(h).backend_allocs, ARENAS - 1);
	expect_true(epoch_closes_at(h, blocks, &next, quota));

	add_arena(h, &helpers[ARENAS - 1]);
	expect_true(epoch_closes_at(h, blocks, &next, paged ? quota : 2 * quota));
	expect_true(epoch_closes_at(h, blocks, &next, paged ? quota : 2 * quota));

	while (next < NSMALL)
		xfree(blocks[next++], 0);
	for (unsigned i = 1; i < ARENAS; i++)
		xfree(helpers[i].block, 0);
	fake_complete(&fence, 0);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_int_eq(emm_heap_check(h), 0);
	if (paged) {
		emm_heap_destroy(h, true);
		expect_int_eq(pd.misuse, 0);
		expect_u64_eq(pd.used, 0);
	} else {
		fake_heap_destroy_checked(h, &src, &fence);
	}
	return emm_test_current.failures != 0;
}

static void in_child(bool paged)
{
	int status = 0;
	pid_t pid = fork();

	assert_true(pid >= 0);
	if (pid == 0) {
		alarm(20);
		_exit(run_case(paged));
	}
	assert_int_eq(waitpid(pid, &status, 0), pid);
	expect_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_BEGIN(test_eight_arenas_double_the_epoch)
{
	in_child(false);
}
TEST_END

TEST_BEGIN(test_page_granular_heap_keeps_its_quota)
{
	in_child(true);
}
TEST_END

int main(void)
{
	static emm_test_fn tests[] = {
		test_eight_arenas_double_the_epoch,
		test_page_granular_heap_keeps_its_quota,
		NULL,
	};
	return emm_test_run_list(tests);
}
