/* SPDX-License-Identifier: MIT */
/*
 * process/trace_file.c - which file the EMM_LOG trace goes to: %p in the
 * path becomes the process id (EMM_LOG=trace-%p.csv: one file per
 * process; a fork child stops writing into its parent's), and a file
 * another live process is tracing into is never truncated: this process
 * writes "trace.PID.csv" beside it instead and says so (allocator/trace.c
 * holds the lock that tells).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "allocator/trace.h"
#include "common/format.h"
#include "common/log.h"
#include "process/process.h"
#include "process/process_internal.h"

/* "dir/trace.csv" -> "dir/trace.PID.csv" (no extension: "trace.PID"). */
static int beside(const char *path, char *out, size_t n)
{
	const char *slash = strrchr(path, '/');
	const char *dot = strrchr(path, '.');
	int len;

	if (!dot || (slash && dot < slash) || dot == (slash ? slash + 1 : path))
		dot = path + strlen(path);
	len = snprintf(out, n, "%.*s.%ld%s", (int)(dot - path), path, (long)getpid(), dot);
	return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : 0;
}

static void open_trace(const char *pattern)
{
	char path[256], other[300];
	int r;

	r = emm_format_path(pattern, path, sizeof(path));
	if (r == 0)
		r = emm_trace_open(path);
	if (r == -EAGAIN && beside(path, other, sizeof(other)) == 0) {
		r = emm_trace_open(other);
		if (r == 0)
			emm_info("EMM_LOG: %s is another process's trace: this one (pid %ld) writes %s (EMM_LOG=...%%p... "
			         "names one file per process)",
			         path, (long)getpid(), other);
	}
	if (r < 0 && r != -EBUSY)
		emm_warn("EMM_LOG: cannot open %s: %s (no trace is written)", pattern, strerror(-r));
}

void st_trace_start(void)
{
	const struct emm_options *o = emm_state_options();

	if (o->log_file[0])
		open_trace(o->log_file);
}

void st_trace_fork_child(void)
{
	const struct emm_options *o = emm_state_options();

	if (!emm_trace_enabled())
		return;
	emm_trace_fork_child();
	/* One file per process: not the parent's. A child of an initialised
	 * process cannot use CUDA, so it has nothing to trace; a program that
	 * forks before its first CUDA call opens its own file then. */
	if (strstr(o->log_file, "%p"))
		emm_trace_close();
}
