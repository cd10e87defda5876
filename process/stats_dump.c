/* SPDX-License-Identifier: MIT */
/*
 * process/stats_dump.c - when the statistics are written, and where: at
 * exit as EMM_STATS says (a table on stderr, JSON on stderr, or JSON into a
 * file), the EMM_SNAPSHOT at exit, and all of it on EMM_STATS_SIGNAL.
 *
 * The signal, async-signal-safely: the handler only writes one byte into
 * a pipe (write(2) is async-signal-safe; the write end is non-blocking, so
 * a flood of signals drops bytes instead of blocking the interrupted
 * thread, a dump being pending anyway) and restores errno. A helper thread,
 * started with every signal blocked, sleeps in read(2) on the pipe and
 * makes the dump with ordinary calls: it takes the heaps' locks, formats
 * with snprintf, writes files. The interrupted thread may hold any lock of
 * libemm or of libc's malloc, which is why nothing else runs in the
 * handler. The handler is installed when libemm initialises (the first
 * CUDA call), only if the program has none for that signal, with
 * SA_RESTART; a fork child gets a pipe and a helper of its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "allocator/trace.h"
#include "common/format.h"
#include "common/log.h"
#include "common/outbuf.h"
#include "config/options.h"
#include "process/process.h"
#include "process/process_internal.h"

static int sig_pipe[2] = {-1, -1};
static unsigned sig_number;
/* One dump at a time: the exit report may meet a signal's (same files). */
static pthread_mutex_t dump_lock = PTHREAD_MUTEX_INITIALIZER;

static void write_json(const struct emm_options *o, const char *reason)
{
	struct emm_outbuf ob;
	char path[256];
	int r;

	if (!o->stats_file[0]) {
		emm_outbuf_fd(&ob, 2);
		emm_stats_write_json(&ob, reason);
		emm_outbuf_commit(&ob);
		return;
	}
	r = emm_format_path(o->stats_file, path, sizeof(path));
	if (r == 0)
		r = emm_outbuf_open(&ob, path);
	if (r == 0) {
		emm_stats_write_json(&ob, reason);
		r = emm_outbuf_commit(&ob);
	}
	if (r < 0)
		emm_warn("EMM_STATS: cannot write %s: %s", o->stats_file, strerror(-r));
}

/* The statistics as EMM_STATS says (a table when it is off: a signal asked). */
static void dump_stats(const char *reason)
{
	const struct emm_options *o = emm_state_options();

	if (o->stats && o->stats_json)
		write_json(o, reason);
	else
		emm_stats_print_exit();
}

void st_stats_exit_report(void)
{
	const struct emm_options *o = emm_state_options();

	pthread_mutex_lock(&dump_lock);
	if (o->stats)
		dump_stats("exit");
	pthread_mutex_unlock(&dump_lock);
	if (st_snapshot_on)
		emm_snapshot_write(o->snapshot_file, "exit");
}

static void on_signal(int sig)
{
	int saved = errno;
	char byte = 1;
	ssize_t r = write(sig_pipe[1], &byte, 1);

	(void)sig;
	(void)r;
	errno = saved;
}

static void *helper_main(void *arg)
{
	int fd = (int)(intptr_t)arg;
	char bytes[64];

	for (;;) {
		ssize_t n = read(fd, bytes, sizeof(bytes));

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return NULL; /* the pipe was closed: nothing more can come */
		pthread_mutex_lock(&dump_lock);
		if (st_is_exiting()) {
			pthread_mutex_unlock(&dump_lock);
			continue; /* the exit report is being written */
		}
		dump_stats("signal");
		pthread_mutex_unlock(&dump_lock);
		emm_trace_flush();
		if (st_snapshot_on)
			emm_snapshot_write(emm_state_options()->snapshot_file, "signal");
	}
}

/* A pipe and a helper thread (every signal blocked in it). */
static int start_helper(void)
{
	sigset_t all, old;
	pthread_attr_t attr;
	pthread_t t;
	int r;

	if (pipe2(sig_pipe, O_CLOEXEC) < 0)
		return -errno;
	(void)fcntl(sig_pipe[1], F_SETFL, O_NONBLOCK);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	r = -pthread_create(&t, &attr, helper_main, (void *)(intptr_t)sig_pipe[0]);
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (r < 0) {
		close(sig_pipe[0]);
		close(sig_pipe[1]);
		sig_pipe[0] = sig_pipe[1] = -1;
	}
	return r;
}

void st_stats_signal_setup(void)
{
	const struct emm_options *o = emm_state_options();
	struct sigaction sa, old;
	char name[32];
	int r;

	if (!o->stats_signal)
		return;
	emm_format_signal(o->stats_signal, name, sizeof(name));
	if (sigaction((int)o->stats_signal, NULL, &old) < 0) {
		emm_warn("EMM_STATS_SIGNAL: cannot handle %s: %s", name, strerror(errno));
		return;
	}
	if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN) {
		emm_warn("EMM_STATS_SIGNAL: the program handles %s itself: no statistics on it", name);
		return;
	}
	if ((old.sa_flags & SA_SIGINFO) && old.sa_sigaction) {
		emm_warn("EMM_STATS_SIGNAL: the program handles %s itself: no statistics on it", name);
		return;
	}
	r = start_helper();
	if (r < 0) {
		emm_warn("EMM_STATS_SIGNAL: cannot start the helper thread (%s): no statistics on %s", strerror(-r),
		         name);
		return;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sa.sa_flags = SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction((int)o->stats_signal, &sa, NULL) < 0) {
		emm_warn("EMM_STATS_SIGNAL: cannot handle %s: %s", name, strerror(errno));
		return;
	}
	sig_number = o->stats_signal;
	if (o->verbose >= 1)
		emm_info("statistics on %s (kill -%s %ld)", name, strncmp(name, "SIG", 3) == 0 ? name + 3 : name,
		         (long)getpid());
}

void st_stats_signal_fork_child(void)
{
	int old[2] = {sig_pipe[0], sig_pipe[1]};

	pthread_mutex_init(&dump_lock, NULL); /* the parent's helper may have held it */
	if (!sig_number)
		return;
	/* The parent's helper reads the inherited pipe: the child's handler
	 * must write into a pipe of its own, served by a helper of its own.
	 * The handler may run meanwhile: it writes into the old pipe. */
	if (start_helper() < 0) {
		sig_pipe[0] = old[0];
		sig_pipe[1] = old[1];
		return;
	}
	close(old[0]);
	close(old[1]);
}
