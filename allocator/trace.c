/* SPDX-License-Identifier: MIT */
/*
 * allocator/trace.c - the EMM_LOG CSV event trace (format in trace.h).
 *
 * An event costs a clock read, a few dozen bytes of formatting on the stack
 * and one short critical section that copies the line into the shared
 * buffer; the write(2) happens only when the buffer is full, under the same
 * lock so lines stay in buffer order.
 */
#include "allocator/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"

#define TRACE_BUFFER_SIZE (64u * 1024u)
#define TRACE_LINE_MAX    160u /* longest line is about 120 bytes */

static const char trace_header[] = "Thread,Time,Action,Pointer,Size,Stream,Memory\n";

atomic_bool emm_trace_active;

static pthread_mutex_t trace_lock = PTHREAD_MUTEX_INITIALIZER;
static int trace_fd = -1;
static size_t trace_used;
static bool trace_write_failed;
static char trace_buffer[TRACE_BUFFER_SIZE];

static __thread unsigned long trace_tid;

/* Writes all of buf or gives up on an error; 0 or a negative errno. */
static int write_all(int fd, const char *buf, size_t len)
{
	while (len > 0) {
		ssize_t w = write(fd, buf, len);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return w < 0 ? -errno : -EIO;
		buf += w;
		len -= (size_t)w;
	}
	return 0;
}

/* Caller holds trace_lock. */
static void flush_locked(void)
{
	int ret;

	if (trace_used == 0 || trace_fd < 0)
		return;
	ret = write_all(trace_fd, trace_buffer, trace_used);
	if (ret < 0 && !trace_write_failed) {
		trace_write_failed = true;
		emm_warn("trace: write failed (%s); events are being lost", strerror(-ret));
	}
	trace_used = 0;
}

int emm_trace_open(const char *path)
{
	int fd, ret = 0;

	if (!path || !*path)
		return -EINVAL;
	pthread_mutex_lock(&trace_lock);
	if (trace_fd >= 0) {
		ret = -EBUSY;
		goto out;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	/* Another live process writing this file holds the lock: leave its
	 * trace alone. The lock goes with the open file (a fork child that
	 * goes on tracing into it shares it) and with the process. */
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		ret = errno == EWOULDBLOCK ? -EAGAIN : -errno;
		close(fd);
		goto out;
	}
	if (ftruncate(fd, 0) < 0) {
		ret = -errno;
		close(fd);
		goto out;
	}
	trace_fd = fd;
	trace_write_failed = false;
	memcpy(trace_buffer, trace_header, sizeof(trace_header) - 1);
	trace_used = sizeof(trace_header) - 1;
	atomic_store_explicit(&emm_trace_active, true, memory_order_release);
out:
	pthread_mutex_unlock(&trace_lock);
	return ret;
}

/* --- formatting without stdio --- */

static char *put_dec(char *p, uint64_t v)
{
	char tmp[20];
	int n = 0;

	do {
		tmp[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (n)
		*p++ = tmp[--n];
	return p;
}

static char *put_hex(char *p, uint64_t v)
{
	static const char digits[] = "0123456789abcdef";
	char tmp[16];
	int n = 0;

	*p++ = '0';
	*p++ = 'x';
	do {
		tmp[n++] = digits[v & 15];
		v >>= 4;
	} while (v);
	while (n)
		*p++ = tmp[--n];
	return p;
}

static char *put_str(char *p, const char *s)
{
	size_t n = strlen(s);

	memcpy(p, s, n);
	return p + n;
}

static const char *memory_name(enum emm_trace_memory memory)
{
	switch (memory) {
	case EMM_TRACE_PINNED:
		return "pinned";
	case EMM_TRACE_MANAGED:
		return "managed";
	case EMM_TRACE_DEVICE:
	default:
		return "device";
	}
}

static const char *action_name(enum emm_trace_action action)
{
	switch (action) {
	case EMM_TRACE_ALLOCATE:
		return "allocate";
	case EMM_TRACE_FREE:
		return "free";
	case EMM_TRACE_ALLOCATE_FAILURE:
	default:
		return "allocate failure";
	}
}

void emm_trace_event(enum emm_trace_action action, uint64_t ptr, size_t size, uint64_t stream)
{
	emm_trace_event_memory(action, ptr, size, stream, EMM_TRACE_DEVICE);
}

void emm_trace_event_memory(enum emm_trace_action action, uint64_t ptr, size_t size, uint64_t stream,
                            enum emm_trace_memory memory)
{
	char line[TRACE_LINE_MAX];
	char *p = line;
	struct timespec ts;
	uint32_t usec;
	size_t len;

	if (!emm_trace_enabled())
		return;
	if (EMM_UNLIKELY(trace_tid == 0))
		trace_tid = (unsigned long)syscall(SYS_gettid);
	clock_gettime(CLOCK_REALTIME, &ts);

	p = put_dec(p, trace_tid);
	*p++ = ',';
	p = put_dec(p, (uint64_t)ts.tv_sec);
	*p++ = '.';
	usec = (uint32_t)(ts.tv_nsec / 1000);
	for (uint32_t div = 100000; div; div /= 10)
		*p++ = (char)('0' + usec / div % 10);
	*p++ = ',';
	p = put_str(p, action_name(action));
	*p++ = ',';
	p = put_hex(p, ptr);
	*p++ = ',';
	p = put_dec(p, size);
	*p++ = ',';
	p = put_hex(p, stream);
	*p++ = ',';
	p = put_str(p, memory_name(memory));
	*p++ = '\n';
	len = (size_t)(p - line);

	pthread_mutex_lock(&trace_lock);
	if (trace_fd >= 0) {
		if (trace_used + len > sizeof(trace_buffer))
			flush_locked();
		memcpy(trace_buffer + trace_used, line, len);
		trace_used += len;
	}
	pthread_mutex_unlock(&trace_lock);
}

void emm_trace_flush(void)
{
	pthread_mutex_lock(&trace_lock);
	flush_locked();
	pthread_mutex_unlock(&trace_lock);
}

void emm_trace_close(void)
{
	pthread_mutex_lock(&trace_lock);
	atomic_store_explicit(&emm_trace_active, false, memory_order_relaxed);
	if (trace_fd >= 0) {
		flush_locked();
		close(trace_fd);
		trace_fd = -1;
	}
	pthread_mutex_unlock(&trace_lock);
}

void emm_trace_fork_child(void)
{
	/* Only the forking thread exists here; the lock may have been held
	 * by another one. The buffered lines are the parent's to write. */
	pthread_mutex_init(&trace_lock, NULL);
	trace_used = 0;
	trace_tid = 0;
}
