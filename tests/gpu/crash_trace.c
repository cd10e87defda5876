/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/crash_trace.c - a test aid, not part of libemm: a module a test
 * process loads (ctypes.CDLL, dlopen or LD_PRELOAD) so that a fatal signal
 * (SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE) prints the native frames that
 * led to it, each as module+offset (and symbol, when exported), before the
 * process dies of the same signal. Python's faulthandler stops at the
 * interpreter's finalisation; this covers what runs after it (C static
 * destructors, atexit handlers, the CUDA driver's teardown), where the GPU
 * machine has no debugger to ask. Offsets into libemm.so resolve with
 * `addr2line -f -i -e libemm.so OFFSET`.
 *
 * Output: stderr, and with CRASH_TRACE_DIR set also the file
 * CRASH_TRACE_DIR/crash-PID.txt (created at the first fatal signal only).
 * Nothing here allocates in the handler.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <unistd.h>

static const struct {
	int sig;
	const char *name;
} fatal[] = {{SIGSEGV, "SIGSEGV"}, {SIGBUS, "SIGBUS"}, {SIGABRT, "SIGABRT"}, {SIGILL, "SIGILL"}, {SIGFPE, "SIGFPE"}};
static char trace_path[512];
static int trace_fd = -1;
static char alt_stack[1 << 16];

static void out(const char *s)
{
	size_t n = strlen(s);

	if (write(2, s, n) < 0) {
		/* nothing to do: stderr is gone */
	}
	if (trace_fd >= 0 && write(trace_fd, s, n) < 0) {
		/* the file is best effort */
	}
}

/* s + "0x" + hex of v; returns the end. */
static char *put_hex(char *s, unsigned long v)
{
	char t[16];
	int n = 0;

	do {
		t[n++] = "0123456789abcdef"[v & 15];
		v >>= 4;
	} while (v);
	*s++ = '0';
	*s++ = 'x';
	while (n)
		*s++ = t[--n];
	*s = '\0';
	return s;
}

static char *put_str(char *s, const char *from, size_t max)
{
	size_t n = strnlen(from, max);

	memcpy(s, from, n);
	s[n] = '\0';
	return s + n;
}

static void frame(const char *tag, void *pc)
{
	char line[640], *s = line;
	Dl_info di;

	s = put_str(s, tag, 16);
	s = put_hex(s, (unsigned long)pc);
	if (dladdr(pc, &di) && di.dli_fname) {
		s = put_str(s, " ", 1);
		s = put_str(s, di.dli_fname, 300);
		s = put_str(s, "+", 1);
		s = put_hex(s, (unsigned long)pc - (unsigned long)di.dli_fbase);
		if (di.dli_sname) {
			s = put_str(s, " ", 1);
			s = put_str(s, di.dli_sname, 200);
		}
	}
	put_str(s, "\n", 1);
	out(line);
}

static const char *sig_name(int sig)
{
	for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
		if (fatal[i].sig == sig)
			return fatal[i].name;
	return "?";
}

static void on_fatal(int sig, siginfo_t *si, void *ctx)
{
	char line[128], *s = line;
	void *bt[64];

	if (trace_path[0])
		trace_fd = open(trace_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	s = put_str(s, "crash-trace: signal ", 32);
	s = put_str(s, sig_name(sig), 16);
	s = put_str(s, ", pid ", 8);
	s = put_hex(s, (unsigned long)getpid());
	s = put_str(s, ", address ", 16);
	s = put_hex(s, (unsigned long)si->si_addr);
	put_str(s, "\n", 1);
	out(line);
#if defined(__x86_64__)
	frame("  at ", (void *)((ucontext_t *)ctx)->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
	frame("  at ", (void *)((ucontext_t *)ctx)->uc_mcontext.pc);
#else
	(void)ctx;
#endif
	int n = backtrace(bt, 64);
	for (int i = 0; i < n; i++)
		frame("  ", bt[i]);
	out("crash-trace: end\n");
	/* Die of the same signal: the default action, raised again. */
	signal(sig, SIG_DFL);
	raise(sig);
}

__attribute__((constructor)) static void crash_trace_init(void)
{
	void *warm[2];
	const char *dir = getenv("CRASH_TRACE_DIR");
	struct sigaction sa;
	stack_t ss;

	/* backtrace() loads libgcc's unwinder on first use: do it now, not
	 * in the handler. */
	(void)backtrace(warm, 2);
	if (dir && *dir)
		snprintf(trace_path, sizeof(trace_path), "%s/crash-%d.txt", dir, (int)getpid());
	memset(&ss, 0, sizeof(ss));
	ss.ss_sp = alt_stack;
	ss.ss_size = sizeof(alt_stack);
	(void)sigaltstack(&ss, NULL);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fatal;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
		(void)sigaction(fatal[i].sig, &sa, NULL);
}
