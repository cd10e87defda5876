/* SPDX-License-Identifier: MIT */
/*
 * tests/common/ipc_test.h - what the two-process IPC tests share (the CPU
 * one, tests/shims/test_shims_ipc.c, and the GPU one, tests/gpu/ipc_blocks.cu):
 * an IPC handle written as hex on a child's command line and read back, and
 * the byte pattern each block is filled with. Functions are static inline.
 */
#ifndef EMM_TESTS_IPC_TEST_H
#define EMM_TESTS_IPC_TEST_H

#include <cuda.h>
#include <stddef.h>
#include <stdio.h>

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

#endif
