/* SPDX-License-Identifier: MIT */
/*
 * common/log.c - owns libemm's stderr output. Formats into a stack buffer and
 * writes the whole line at once, so concurrent lines do not interleave and no
 * path here calls malloc (which an LD_PRELOADed library must not assume is
 * safe to call from every context).
 */
#include "common/log.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static atomic_bool log_debug;
static atomic_int log_fd = 2;

void emm_log_set_debug(bool on)
{
	atomic_store(&log_debug, on);
}

bool emm_log_debug_enabled(void)
{
	return atomic_load_explicit(&log_debug, memory_order_relaxed);
}

void emm_log_set_fd(int fd)
{
	atomic_store(&log_fd, fd < 0 ? 2 : fd);
}

bool emm_log_sparingly(atomic_uint *count, unsigned *ret_n)
{
	unsigned n = atomic_fetch_add_explicit(count, 1, memory_order_relaxed) + 1;

	*ret_n = n;
	return (n & (n - 1)) == 0;
}

static const char *log_prefix(enum emm_log_level level)
{
	switch (level) {
	case EMM_LOG_WARNING:
		return "emm: warning: ";
	case EMM_LOG_ERROR:
		return "emm: error: ";
	case EMM_LOG_DEBUG:
		return "emm: debug: ";
	case EMM_LOG_INFO:
	default:
		return "emm: ";
	}
}

void emm_vlog(enum emm_log_level level, const char *fmt, va_list ap)
{
	char line[1024];
	size_t len;
	int n;

	if (level == EMM_LOG_DEBUG && !emm_log_debug_enabled())
		return;

	len = strlen(log_prefix(level));
	memcpy(line, log_prefix(level), len);
	n = vsnprintf(line + len, sizeof(line) - len - 1, fmt, ap);
	if (n < 0)
		return;
	len += (size_t)n < sizeof(line) - len - 1 ? (size_t)n : sizeof(line) - len - 2;
	line[len++] = '\n';

	/* One write; a short write to a pipe is retried, errors are dropped
	 * (there is nowhere left to report them). */
	{
		int saved_errno = errno;
		int fd = atomic_load_explicit(&log_fd, memory_order_relaxed);
		const char *p = line;
		while (len > 0) {
			ssize_t w = write(fd, p, len);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				break;
			p += w;
			len -= (size_t)w;
		}
		errno = saved_errno;
	}
}

void emm_log(enum emm_log_level level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	emm_vlog(level, fmt, ap);
	va_end(ap);
}
