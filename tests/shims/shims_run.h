/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/shims_run.h - run the test program again in a fresh process,
 * in another mode and with other settings, and collect what it prints
 * (shared by test_shims.c, test_shims_gpu.c through shims_codes.h, and
 * test_shims_multidev.c). Functions are static: each program includes
 * this once.
 */
#ifndef EMM_TESTS_SHIMS_RUN_H
#define EMM_TESTS_SHIMS_RUN_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* --- running this program again ---------------------------------------- */

/*
 * Run this program with `mode`, with extra "NAME=value" settings (NULL
 * value: unset). Captures its stdout into out (NUL-terminated); its stderr
 * goes to ours. Returns the exit status, or -1.
 */
static int run_self(const char *mode, const char *const *env, char *out, size_t out_size)
{
	int pipefd[2];
	pid_t pid;
	size_t used = 0;
	int status;

	if (pipe(pipefd) != 0)
		return -1;
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		close(pipefd[0]);
		dup2(pipefd[1], 1);
		for (const char *const *e = env; e && *e; e += 2) {
			if (e[1])
				setenv(e[0], e[1], 1);
			else
				unsetenv(e[0]);
		}
		execl("/proc/self/exe", "self", mode, (char *)NULL);
		_exit(127);
	}
	close(pipefd[1]);
	for (;;) {
		ssize_t n = read(pipefd[0], out + used, out_size - 1 - used);
		if (n <= 0)
			break;
		used += (size_t)n;
		if (used == out_size - 1)
			break;
	}
	out[used] = '\0';
	close(pipefd[0]);
	if (waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
