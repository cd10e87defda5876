/* SPDX-License-Identifier: MIT */
/* tests/backends/test-trace.c - the EMM_LOG CSV event trace. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "allocator/trace.h"
#include "emm_test.h"

#define THREADS 4
#define EVENTS  30000 /* per thread: several buffer flushes */

static char dir[] = "/tmp/emm-test-trace-XXXXXX";
static char path[256];

struct worker {
	unsigned index;
	long tid;
};

/* Event i of thread t: pointer (t << 40) | (i * 512 + 512), size i + 1,
 * stream t; every third is a free, every 97th a failed allocation. */
static enum emm_trace_action action_of(uint64_t i)
{
	return i % 97 == 0 ? EMM_TRACE_ALLOCATE_FAILURE : i % 3 == 2 ? EMM_TRACE_FREE : EMM_TRACE_ALLOCATE;
}

static void *trace_worker(void *p)
{
	struct worker *w = p;

	w->tid = (long)syscall(SYS_gettid);
	for (uint64_t i = 0; i < EVENTS; i++) {
		enum emm_trace_action a = action_of(i);
		uint64_t ptr =
		    a == EMM_TRACE_ALLOCATE_FAILURE ? 0 : ((uint64_t)w->index << 40) | (i * 512 + 512);

		emm_trace_event(a, ptr, (size_t)i + 1, w->index);
	}
	return NULL;
}

TEST_BEGIN(test_threads_roundtrip)
{
	pthread_t threads[THREADS];
	struct worker workers[THREADS];
	uint64_t next[THREADS] = {0};
	size_t counts[3] = {0};
	char line[512];
	struct timespec start;
	FILE *f;
	int lines = 0, bad = 0;

	clock_gettime(CLOCK_REALTIME, &start);
	assert_int_eq(emm_trace_open(path), 0);
	expect_true(emm_trace_enabled());
	expect_int_eq(emm_trace_open(path), -EBUSY);
	for (unsigned t = 0; t < THREADS; t++) {
		workers[t] = (struct worker){.index = t};
		assert_int_eq(pthread_create(&threads[t], NULL, trace_worker, &workers[t]), 0);
	}
	for (unsigned t = 0; t < THREADS; t++)
		pthread_join(threads[t], NULL);
	emm_trace_close();
	expect_false(emm_trace_enabled());
	emm_trace_event(EMM_TRACE_ALLOCATE, 0x1000, 1, 0); /* after close: dropped */

	f = fopen(path, "r");
	assert_ptr_not_null(f);
	assert_ptr_not_null(fgets(line, sizeof(line), f));
	expect_str_eq(line, "Thread,Time,Action,Pointer,Size,Stream,Memory\n");
	while (fgets(line, sizeof(line), f)) {
		long tid;
		uint64_t sec, usec, ptr, size, stream;
		char action[32];
		int consumed = 0;
		unsigned t;

		lines++;
		/* Thread,sec.usec,action,0xptr,size,0xstream,device */
		if (sscanf(line,
		           "%ld,%" SCNu64 ".%6" SCNu64 ",%31[a-z ],0x%" SCNx64 ",%" SCNu64 ",0x%" SCNx64
		           ",device\n%n",
		           &tid, &sec, &usec, action, &ptr, &size, &stream, &consumed) != 7 ||
		    consumed != (int)strlen(line) || stream >= THREADS) {
			if (bad++ < 5)
				emm_test_fail_("bad line %d: %s", lines, line);
			continue;
		}
		t = (unsigned)stream;
		/* the time has exactly six fractional digits and is now-ish */
		expect_true(strchr(line, '.') && strchr(line, '.')[7] == ',');
		expect_true(sec >= (uint64_t)start.tv_sec && sec < (uint64_t)start.tv_sec + 600);
		expect_int_eq(tid, workers[t].tid);
		/* one thread's events appear in its order */
		if (size != next[t] + 1 && bad++ < 5)
			emm_test_fail_("thread %u: event %" PRIu64 " after %" PRIu64, t, size - 1, next[t]);
		next[t] = size;
		{
			enum emm_trace_action want = action_of(size - 1);
			static const char *const names[] = {"allocate", "free", "allocate failure"};

			expect_str_eq(action, names[want]);
			counts[want]++;
			if (want == EMM_TRACE_ALLOCATE_FAILURE)
				expect_u64_eq(ptr, 0);
			else
				expect_u64_eq(ptr, ((uint64_t)t << 40) | ((size - 1) * 512 + 512));
		}
	}
	fclose(f);
	expect_int_eq(lines, THREADS * EVENTS);
	expect_int_eq(bad, 0);
	{
		size_t fails = 0, frees = 0;

		for (uint64_t i = 0; i < EVENTS; i++) {
			fails += action_of(i) == EMM_TRACE_ALLOCATE_FAILURE;
			frees += action_of(i) == EMM_TRACE_FREE;
		}
		expect_int_eq(counts[EMM_TRACE_ALLOCATE_FAILURE], THREADS * fails);
		expect_int_eq(counts[EMM_TRACE_FREE], THREADS * frees);
		expect_int_eq(counts[EMM_TRACE_ALLOCATE], THREADS * (EVENTS - fails - frees));
	}
	for (unsigned t = 0; t < THREADS; t++)
		expect_u64_eq(next[t], EVENTS);
}
TEST_END

TEST_BEGIN(test_open_close)
{
	char other[300];
	struct stat st;
	FILE *f;
	char buf[256];
	size_t n;

	expect_false(emm_trace_enabled());
	emm_trace_close(); /* nothing open: fine */
	expect_int_eq(emm_trace_open("/nonexistent-dir/trace.csv"), -ENOENT);
	expect_int_eq(emm_trace_open(""), -EINVAL);
	expect_false(emm_trace_enabled());

	/* reopening truncates; an empty trace is just the header */
	snprintf(other, sizeof(other), "%s/empty.csv", dir);
	f = fopen(other, "w");
	assert_ptr_not_null(f);
	fputs("old contents that must go\n", f);
	fclose(f);
	assert_int_eq(emm_trace_open(other), 0);
	emm_trace_close();
	assert_int_eq(stat(other, &st), 0);
	expect_int_eq(st.st_size, strlen("Thread,Time,Action,Pointer,Size,Stream,Memory\n"));

	/* flush writes what is buffered without closing */
	assert_int_eq(emm_trace_open(other), 0);
	emm_trace_event(EMM_TRACE_ALLOCATE, UINT64_C(0x7f0000000200), 4096, 0);
	emm_trace_flush();
	f = fopen(other, "r");
	assert_ptr_not_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = '\0';
	fclose(f);
	expect_true(strstr(buf, ",allocate,0x7f0000000200,4096,0x0,device\n") != NULL);
	emm_trace_close();
}
TEST_END

int main(void)
{
	int ret;

	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	snprintf(path, sizeof(path), "%s/trace.csv", dir);
	ret = emm_test_run(test_threads_roundtrip, test_open_close, NULL);
	if (ret == 0) {
		char other[300];

		snprintf(other, sizeof(other), "%s/empty.csv", dir);
		unlink(path);
		unlink(other);
		rmdir(dir);
	}
	return ret;
}
