/* SPDX-License-Identifier: MIT */
/*
 * tests/tools/test-replay-trace.c - emm-replay's trace reader, map and
 * runner: both CSV dialects (libemm's, RMM's with "(nil)" and hex streams),
 * stream keys, replay order, free matching, malformed lines, and replays
 * that fail, expect failures, run on a 16 MiB simulated device, and fill
 * a 2000 MiB one with 7 MiB blocks.
 */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "allocator/heap.h"
#include "emm_test.h"
#include "tools/replay_map.h"
#include "tools/replay_pages.h"
#include "tools/replay_run.h"
#include "tools/replay_trace.h"

#define MIB (UINT64_C(1) << 20)

static char path[64];

static void write_trace(const char *text)
{
	FILE *f;

	snprintf(path, sizeof(path), "/tmp/emm-test-trace-%d.csv", (int)getpid());
	f = fopen(path, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static int load(const char *text, struct replay_trace *t, char *err, size_t err_size)
{
	int r;

	write_trace(text);
	r = replay_trace_load(path, t, err, err_size);
	unlink(path);
	return r;
}

TEST_BEGIN(test_map)
{
	struct replay_map map = {0};
	uint32_t v = 0;

	for (uint32_t i = 0; i < 5000; i++)
		assert_int_eq(replay_map_put(&map, UINT64_C(0x7f0000000000) + (uint64_t)i * 512, i), 0);
	expect_int_eq(map.count, 5000);
	for (uint32_t i = 0; i < 5000; i += 2)
		expect_true(replay_map_remove(&map, UINT64_C(0x7f0000000000) + (uint64_t)i * 512));
	expect_false(replay_map_remove(&map, 1));
	for (uint32_t i = 0; i < 5000; i++) {
		bool there = replay_map_get(&map, UINT64_C(0x7f0000000000) + (uint64_t)i * 512, &v);
		expect_int_eq(there, i % 2);
		if (there)
			expect_int_eq(v, i);
	}
	replay_map_free(&map);
}
TEST_END

TEST_BEGIN(test_libemm_dialect)
{
	struct replay_trace t;
	char err[256] = "";

	assert_int_eq(load("Thread,Time,Action,Pointer,Size,Stream\n"
			   "7,1763675732.000010,allocate,0x7f0000000000,1024,0x0\n"
			   "8,1763675732.000030,free,0x7f0000000000,1024,0x0\n"
			   "7,1763675732.000020,allocate,0x7f0000100000,4096,0x1\n"
			   "8,1763675732.000040,allocate failure,0x0,99999999999,0x2\n",
			   &t, err, sizeof(err)),
		       0);
	assert_int_eq(t.count, 4);
	/* Sorted by time: lines 2, 4, 3, 5. */
	expect_int_eq(t.events[0].line, 2);
	expect_int_eq(t.events[1].line, 4);
	expect_int_eq(t.events[2].line, 3);
	expect_int_eq(t.events[3].line, 5);
	expect_int_eq(t.events[2].action, REPLAY_FREE);
	expect_int_eq(t.events[2].match, 0);
	expect_int_eq(t.events[3].action, REPLAY_ALLOC_FAILURE);
	expect_u64_eq(t.events[0].stream_key, EMM_STREAM_SYNC);
	expect_u64_eq(t.events[1].stream_key, EMM_STREAM_LEGACY);
	expect_true(EMM_STREAM_IS_PER_THREAD(t.events[3].stream_key));
	expect_int_eq(t.nthreads, 2);
	expect_u64_eq(t.thread_ids[t.events[3].thread], 8);
	expect_int_eq(t.allocs, 2);
	expect_int_eq(t.frees, 1);
	expect_int_eq(t.failures, 1);
	expect_u64_eq(t.peak_requested, 5120);
	expect_int_eq(t.unmatched_frees, 0);
	replay_trace_free(&t);
}
TEST_END

TEST_BEGIN(test_rmm_dialect)
{
	struct replay_trace t;
	char err[256] = "";
	uint64_t k1, k2;

	/* Times of day across midnight; "(nil)"; hex streams that RMM's own
	 * replay would read as decimal; a free of an untraced pointer. */
	assert_int_eq(load("Thread,Time,Action,Pointer,Size,Stream\n"
			   "1,23:59:59.999000,free,0x7f00dead0000,512,0x55d9c4a1f2e0\n"
			   "1,23:59:59.999500,allocate,0x7f0000000000,2048,0x55d9c4a1f2e0\n"
			   "2,00:00:00.000100,allocate,0x7f0000001000,2048,0x10\n"
			   "2,00:00:00.000200,allocate failure,(nil),4096,16\n"
			   "1,00:00:00.000300,free,0x7f0000000000,2048,0x55d9c4a1f2e0\n",
			   &t, err, sizeof(err)),
		       0);
	assert_int_eq(t.count, 5);
	/* The day wrap keeps file order. */
	for (size_t i = 0; i < t.count; i++)
		expect_int_eq(t.events[i].line, i + 2);
	expect_int_eq(t.unmatched_frees, 1);
	expect_int_eq(t.events[0].match, REPLAY_NO_MATCH);
	expect_int_eq(t.events[4].match, 1);
	expect_u64_eq(t.events[3].ptr, 0);
	k1 = t.events[1].stream_key;
	k2 = t.events[2].stream_key;
	expect_true(EMM_STREAM_IS_HANDLE(k1));
	expect_true(EMM_STREAM_IS_HANDLE(k2));
	expect_true(k1 != k2);
	/* 0x10 and 16 are the same stream. */
	expect_u64_eq(t.events[3].stream_key, k2);
	expect_int_eq(t.nstreams, 2);
	replay_trace_free(&t);
}
TEST_END

TEST_BEGIN(test_memory_column)
{
	struct replay_trace t;
	char err[256] = "";

	/* libemm's seventh column: pinned and managed events are skipped,
	 * device events (and six-column lines) replayed. */
	assert_int_eq(load("Thread,Time,Action,Pointer,Size,Stream,Memory\n"
			   "1,1.000001,allocate,0x7f0000000000,2048,0x0,device\n"
			   "1,1.000002,allocate,0x7e0000000000,4096,0x0,pinned\n"
			   "1,1.000003,allocate,0x7d0000000000,8192,0x0,managed\n"
			   "1,1.000004,free,0x7e0000000000,0,0x0,pinned\n"
			   "1,1.000005,allocate,0x7f0000001000,512,0x0\n"
			   "1,1.000006,free,0x7f0000000000,2048,0x0,device\n",
			   &t, err, sizeof(err)),
		       0);
	expect_int_eq(t.count, 3);
	expect_int_eq(t.other_memory, 3);
	expect_int_eq(t.allocs, 2);
	expect_int_eq(t.frees, 1);
	expect_int_eq(t.unmatched_frees, 0);
	replay_trace_free(&t);
	expect_int_eq(load("Thread,Time,Action,Pointer,Size,Stream,Memory\n"
			   "1,1.000001,allocate,0x7f0000000000,2048,0x0,texture\n",
			   &t, err, sizeof(err)),
		       -EINVAL);
	expect_true(strstr(err, "bad Memory 'texture'") != NULL);
	expect_int_eq(load("Thread,Time,Action,Pointer,Size,Stream,Memory\n"
			   "1,1.000001,allocate,0x7f0000000000,2048,0x0,device,extra\n",
			   &t, err, sizeof(err)),
		       -EINVAL);
}
TEST_END

TEST_BEGIN(test_malformed)
{
	struct replay_trace t;
	char err[256] = "";

	expect_int_eq(load("Thread,Time,Action,Pointer,Size,Stream\n"
			   "1,1.0,allocate,0x1000,512,0x0\n"
			   "1,1.1,reallocate,0x1000,512,0x0\n",
			   &t, err, sizeof(err)),
		      -EINVAL);
	expect_true(strstr(err, ":3: bad Action 'reallocate'") != NULL);
	expect_int_eq(load("1,1.0,allocate,0x1000,512\n", &t, err, sizeof(err)), -EINVAL);
	expect_true(strstr(err, ":1: expected 6") != NULL);
	expect_int_eq(load("1,1.0,allocate,0x1000,12z,0x0\n", &t, err, sizeof(err)), -EINVAL);
	expect_true(strstr(err, "bad Size '12z'") != NULL);
	expect_int_eq(load("1,1.0,allocate,(nil),512,0x0\n", &t, err, sizeof(err)), -EINVAL);
	expect_int_eq(replay_trace_load("/nonexistent/trace.csv", &t, err, sizeof(err)), -ENOENT);
	/* A last line cut short is dropped with a warning, not fatal. */
	assert_int_eq(load("1,1.0,allocate,0x1000,512,0x0\n1,1.1,fre", &t, err, sizeof(err)), 0);
	expect_int_eq(t.count, 1);
	replay_trace_free(&t);
}
TEST_END

static void setup_default(struct replay_setup *s, uint64_t capacity)
{
	memset(s, 0, sizeof(*s));
	emm_heap_params_default(&s->params);
	s->backend = "hostsim";
	s->capacity = capacity;
}

/* Small-pool blocks and one large block on a stream: 14 MiB live at the
 * peak, 16 MiB reserved; fits a 16 MiB device. (Requests from 1 to 10 MiB
 * would need a segment of up to 20 MiB: EMM_LARGE_SEGMENT.) */
static const char small_loop[] = "Thread,Time,Action,Pointer,Size,Stream\n"
				 "1,1.000001,allocate,0x10000000,1048576,0x0\n"
				 "2,1.000002,allocate,0x10400000,12582912,0x7f10\n"
				 "1,1.000003,allocate,0x10100000,1048576,0x0\n"
				 "2,1.000004,free,0x10400000,12582912,0x7f10\n"
				 "2,1.000005,allocate,0x10400000,10485760,0x7f10\n"
				 "1,1.000006,allocate,0x10200000,524288,0x0\n"
				 "1,1.000007,free,0x10000000,1048576,0x0\n"
				 "2,1.000008,allocate failure,(nil),1099511627776,0x7f10\n"
				 "1,1.000009,free,0x10100000,1048576,0x0\n";

TEST_BEGIN(test_replay_small_device)
{
	struct replay_trace t;
	struct replay_setup s;
	struct replay_result res;
	struct replayer *rp;
	char err[256] = "";

	assert_int_eq(load(small_loop, &t, err, sizeof(err)), 0);
	for (int threads = 0; threads < 2; threads++) {
		assert_int_eq(replayer_create(&t, threads == 0, &rp), 0);
		setup_default(&s, 16 * MIB);
		s.timeline = true;
		assert_int_eq(replayer_run(rp, &s, &res, err, sizeof(err)), 0);
		expect_true(res.ok);
		expect_int_eq(res.expected_failures, 1);
		expect_int_eq(res.unexpected_successes, 0);
		expect_int_eq(res.tl_count, t.count);
		expect_u64_eq(res.peak_requested, 14 * MIB);
		expect_true(res.peak_reserved <= 16 * MIB);
		expect_u64_eq(res.peak_allocated, 14 * MIB);
		expect_true(replay_fragmentation(&res) >= 0.0);
		replay_result_free(&res);

		/* Too small: fails at the 12 MiB block (line 3). */
		setup_default(&s, 6 * MIB);
		assert_int_eq(replayer_run(rp, &s, &res, err, sizeof(err)), 0);
		expect_false(res.ok);
		expect_int_eq(t.events[res.fail_index].line, 3);
		expect_int_eq(res.fail_error, -ENOMEM);
		expect_u64_eq(res.fail_requested, 1 * MIB);
		expect_u64_eq(res.fail_reserved, 2 * MIB);
		replay_result_free(&res);
		replayer_destroy(rp);
	}
	replay_trace_free(&t);
}
TEST_END

/* Issue 9 on the simulated device: 7 MiB blocks until it is full. Two
 * in each 14 MiB segment fill 1988 of 2000 MiB (one 20 MiB segment per
 * two blocks stopped at 1400 MiB; cudaMalloc's 8 MiB per block: 1750). */
TEST_BEGIN(test_replay_fill_7mib)
{
	struct replay_trace t;
	struct replay_setup s;
	struct replay_result res;
	struct replayer *rp;
	char err[256] = "";
	size_t n = 300, len = 64 + n * 64, off = 0;
	char *text = malloc(len);

	assert_ptr_not_null(text);
	off += (size_t)snprintf(text + off, len - off, "Thread,Time,Action,Pointer,Size,Stream\n");
	for (size_t i = 0; i < n; i++)
		off += (size_t)snprintf(text + off, len - off, "1,%zu.5,allocate,0x%llx,%llu,0x0\n", i + 1,
		                        (unsigned long long)(0x100000000000ull + i * 8 * MIB),
		                        (unsigned long long)(7 * MIB));
	assert_int_eq(load(text, &t, err, sizeof(err)), 0);
	free(text);
	assert_int_eq(replayer_create(&t, true, &rp), 0);
	setup_default(&s, 2000 * MIB);
	assert_int_eq(replayer_run(rp, &s, &res, err, sizeof(err)), 0);
	expect_false(res.ok);
	expect_int_eq(res.fail_error, -ENOMEM);
	expect_u64_eq(res.fail_index, 2000 / 14 * 2);
	expect_u64_eq(res.fail_requested, 2000 / 14 * 2 * 7 * MIB);
	expect_u64_eq(res.fail_reserved, 2000 / 14 * 14 * MIB);
	expect_true(res.fail_requested > 2000 / 8 * 7 * MIB);
	replay_result_free(&res);
	replayer_destroy(rp);
	replay_trace_free(&t);
}
TEST_END

TEST_BEGIN(test_replay_unexpected_success)
{
	struct replay_trace t;
	struct replay_setup s;
	struct replay_result res;
	struct replayer *rp;
	char err[256] = "";

	assert_int_eq(load("1,1.0,allocate failure,(nil),8388608,0x0\n", &t, err, sizeof(err)), 0);
	assert_int_eq(replayer_create(&t, false, &rp), 0);
	setup_default(&s, 0);
	assert_int_eq(replayer_run(rp, &s, &res, err, sizeof(err)), 0);
	expect_true(res.ok);
	expect_int_eq(res.unexpected_successes, 1);
	expect_u64_eq(res.stats.allocated_bytes, 0);
	replay_result_free(&res);

	s.backend = "no-such-backend";
	expect_int_ne(replayer_run(rp, &s, &res, err, sizeof(err)), 0);
	expect_true(strstr(err, "no-such-backend") != NULL);
	replayer_destroy(rp);
	replay_trace_free(&t);
}
TEST_END

/* The simulated vmm device's page rules (replay_pages.h): a block held
 * over an unmapped page, a page unmapped under a held block, a double map
 * and a segment freed under a held block are each a violation. */
TEST_BEGIN(test_pages_rules)
{
	const size_t mib = (size_t)1 << 20;
	struct replay_pages *p;
	struct emm_segment_source src;
	struct emm_segment_pages pg;
	emm_addr_t seg;

	for (int c = 0; c < 4; c++) {
		assert_int_eq(replay_pages_create(64 * mib, 2 * mib, 4 * mib, &p), 0);
		replay_pages_bind(p, &src, &pg);
		assert_int_eq(src.alloc(src.state, 8 * mib, 0, &seg), 0);
		expect_int_eq(replay_pages_handed_out(p, seg, 3 * mib), 0);
		expect_int_eq(pg.unmap(pg.state, seg, 8 * mib, 4 * mib, 4 * mib), 0); /* clear of it */
		expect_true(replay_pages_violation(p) == NULL);
		switch (c) {
		case 0: /* over the unmapped page */
			expect_int_eq(replay_pages_handed_out(p, seg + 3 * mib, 2 * mib), -EFAULT);
			break;
		case 1: /* unmapped under it: page 1 holds its last MiB */
			expect_int_eq(pg.unmap(pg.state, seg, 8 * mib, 2 * mib, 2 * mib), 0);
			break;
		case 2: /* mapped twice */
			expect_int_eq(pg.map(pg.state, seg, 8 * mib, 2 * mib, 2 * mib), 0);
			break;
		case 3: /* its segment freed */
			expect_int_eq(src.free(src.state, seg, 8 * mib, 0), 0);
			break;
		}
		expect_true(replay_pages_violation(p) != NULL);
		replay_pages_taken_back(p, seg);
		if (c == 0) {
			/* Mapped again, the same block is fine. */
			expect_int_eq(pg.map(pg.state, seg, 8 * mib, 4 * mib, 2 * mib), 0);
			expect_int_eq(replay_pages_handed_out(p, seg + 3 * mib, 2 * mib), 0);
		}
		replay_pages_destroy(p);
	}
}
TEST_END

int main(void)
{
	return emm_test_run(test_map, test_libemm_dialect, test_rmm_dialect, test_memory_column, test_malformed,
			    test_replay_small_device, test_replay_fill_7mib, test_replay_unexpected_success,
			    test_pages_rules, NULL);
}
