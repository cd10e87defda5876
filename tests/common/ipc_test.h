/* SPDX-License-Identifier: MIT */
/*
 * tests/common/ipc_test.h - what the two-process IPC tests share (the CPU
 * one, tests/shims/test_shims_ipc.c, and the GPU one, tests/gpu/ipc_blocks.cu):
 * an IPC handle written as hex on a child's command line and read back, the
 * byte pattern each block is filled with, and starting this program again as
 * a child on pipes. Functions are static inline.
 */
#ifndef EMM_TESTS_IPC_TEST_H
#define EMM_TESTS_IPC_TEST_H

#include <cuda.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* out: 2 * CU_IPC_HANDLE_SIZE hex digits and a NUL. */
static inline void ipc_to_hex(const CUipcMemHandle *h, char *out)
{
	for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++)
		sprintf(out + 2 * i, "%02x", (unsigned char)h->reserved[i]);
}

static inline void ipc_from_hex(const char *s, CUipcMemHandle *h)
{
	for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
		unsigned v = 0;
		sscanf(s + 2 * i, "%2x", &v);
		h->reserved[i] = (char)v;
	}
}

/* Byte i of a block filled with `seed`. */
static inline unsigned char ipc_pattern(unsigned seed, size_t i)
{
	return (unsigned char)(seed * 131u + i * 7u + (i >> 8));
}

/* A child: this program again, talked to on its stdin and stdout. */
struct ipc_child {
	pid_t pid;
	FILE *in, *out; /* its stdin, its stdout */
};

/* Start this program in a child mode (argv[1] on; argv[0] becomes "self"),
 * without the preload unless `preload`, with EMM_IPC_DIR=ipc_dir if set. */
static inline void ipc_spawn(struct ipc_child *c, bool preload, const char *ipc_dir, char **argv)
{
	int to[2], from[2];

	if (pipe(to) != 0 || pipe(from) != 0)
		abort();
	c->pid = fork();
	if (c->pid == 0) {
		dup2(to[0], 0);
		dup2(from[1], 1);
		close(to[1]);
		close(from[0]);
		if (!preload)
			unsetenv("LD_PRELOAD");
		if (ipc_dir)
			setenv("EMM_IPC_DIR", ipc_dir, 1);
		argv[0] = (char *)"self";
		execv("/proc/self/exe", argv);
		_exit(127);
	}
	close(to[0]);
	close(from[1]);
	c->in = fdopen(to[1], "w");
	c->out = fdopen(from[0], "r");
	setvbuf(c->in, NULL, _IONBF, 0);
}

#endif
