/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_poison.c - EMM_POISON (process/poison.c) over the
 * test-double driver, whose device memory is host memory and whose streams
 * run work when it is enqueued. Modes:
 *   on   (EMM_POISON=165) - a block freed by cuMemFree is filled with 165 by
 *        one cuMemsetD8Async on the legacy stream, a block freed by
 *        cuMemFreeAsync on its stream, over the whole (rounded) block; the
 *        next owner of the memory sees the byte; pinned blocks are left
 *        alone; a bad free (a pinned free of a device block too) fills
 *        nothing.
 *   off  (unset) - no fill, no cuMemsetD8Async.
 * Failure is exit status 1 with a message.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shims_common.h"

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "test_poison: line %d: %s\n", __LINE__, #cond);    \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

/* True if all n bytes at device address p are v. */
static int all_bytes(CUdeviceptr p, size_t n, unsigned char v)
{
	unsigned char buf[8192];

	CHECK(n <= sizeof(buf));
	CHECK(cuMemcpyDtoH(buf, p, n) == CUDA_SUCCESS);
	for (size_t i = 0; i < n; i++)
		if (buf[i] != v)
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	int on = argc > 1 && strcmp(argv[1], "on") == 0;
	unsigned char want = on ? 165 : 1;
	uint64_t sets;
	CUdeviceptr a, b, c;
	CUstream s;
	void *host;

	shims_setup();

	/* A synchronous free: the whole 1024-byte block (1000 rounded). */
	CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
	CHECK(cuMemsetD8(a, 1, 1024) == CUDA_SUCCESS);
	sets = fakecuda_calls("cuMemsetD8Async");
	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(fakecuda_calls("cuMemsetD8Async") == sets + (on ? 1 : 0));
	CHECK(all_bytes(a, 1024, want));
	/* Its next owner sees the poison, not the old data. */
	CHECK(cuMemAlloc(&c, 1000) == CUDA_SUCCESS);
	CHECK(c == a);
	CHECK(all_bytes(c, 1000, want));

	/* A bad free fills nothing. */
	sets = fakecuda_calls("cuMemsetD8Async");
	CHECK(cuMemFree(c + 16) != CUDA_SUCCESS);
	CHECK(fakecuda_calls("cuMemsetD8Async") == sets);
	/* So does a pinned free of a device block (refused): the live block
	 * keeps its bytes. */
	CHECK(cuMemsetD8(c, 1, 1000) == CUDA_SUCCESS);
	CHECK(cuMemFreeHost((void *)(uintptr_t)c) != CUDA_SUCCESS);
	CHECK(fakecuda_calls("cuMemsetD8Async") == sets);
	CHECK(all_bytes(c, 1000, 1));
	CHECK(cuMemFree(c) == CUDA_SUCCESS);

	/* A stream-ordered free: on its stream (non-blocking: created after
	 * the synchronous part, so that the block above was reusable at once). */
	CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
	CHECK(cuMemAllocAsync(&b, 4096, s) == CUDA_SUCCESS);
	CHECK(cuMemsetD8(b, 1, 4096) == CUDA_SUCCESS);
	sets = fakecuda_calls("cuMemsetD8Async");
	CHECK(cuMemFreeAsync(b, s) == CUDA_SUCCESS);
	CHECK(fakecuda_calls("cuMemsetD8Async") == sets + (on ? 1 : 0));
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(all_bytes(b, 4096, want));

	/* A synchronous free with a non-blocking stream alive: the legacy
	 * stream first waits for it (a kernel there may still read the block).
	 * Either way the epoch's close (EMM_EPOCH_BLOCKS=1) makes the idle
	 * stream wait for the legacy event: one wait more. */
	{
		uint64_t waits = fakecuda_calls("cuStreamWaitEvent");

		CHECK(cuMemAlloc(&a, 1000) == CUDA_SUCCESS);
		CHECK(cuMemFree(a) == CUDA_SUCCESS);
		CHECK(on ? fakecuda_calls("cuStreamWaitEvent") > waits + 1
		         : fakecuda_calls("cuStreamWaitEvent") == waits + 1);
	}

	/* Pinned host blocks are not poisoned. */
	CHECK(cuMemAllocHost(&host, 4096) == CUDA_SUCCESS);
	memset(host, 1, 4096);
	sets = fakecuda_calls("cuMemsetD8Async");
	CHECK(cuMemFreeHost(host) == CUDA_SUCCESS);
	CHECK(fakecuda_calls("cuMemsetD8Async") == sets);
	CHECK(((unsigned char *)host)[0] == 1);

	CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
	printf("test_poison %s: ok\n", on ? "on" : "off");
	return 0;
}
