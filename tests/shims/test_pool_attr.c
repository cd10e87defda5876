/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_pool_attr.c - the default pool's attributes under
 * libemm (process/pool_attr.c) over the test-double driver. libemm serves
 * cuMemAllocAsync, so the driver's default pool alone would say 0; the
 * answers must be libemm's books: used = the bytes handed out, reserved =
 * the bytes held, high >= current, a high mark set to 0 drops to the
 * current value, cuMemPoolTrimTo(0) and RELEASE_THRESHOLD 0 give idle
 * memory back. A pool the program created, and the default pool once
 * another is current, pass through unchanged. Exit 1 with a message on
 * failure.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shims_common.h"

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "test_pool_attr: line %d: %s\n", __LINE__, #cond); \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

#define MIB (1024ull * 1024)

static cuuint64_t get(CUmemoryPool p, CUmemPool_attribute a)
{
	cuuint64_t v = 12345;

	CHECK(cuMemPoolGetAttribute(p, a, &v) == CUDA_SUCCESS);
	return v;
}

static void set0(CUmemoryPool p, CUmemPool_attribute a)
{
	cuuint64_t zero = 0;

	CHECK(cuMemPoolSetAttribute(p, a, &zero) == CUDA_SUCCESS);
}

int main(void)
{
	CUmemoryPool def, mine;
	CUmemPoolProps props;
	CUdeviceptr a, b, c;
	CUstream s;
	cuuint64_t used, reserved, v;

	shims_setup();
	CHECK(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
	CHECK(cuDeviceGetDefaultMemPool(&def, 0) == CUDA_SUCCESS);

	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
	CHECK(cuMemAllocAsync(&a, 3 * MIB, s) == CUDA_SUCCESS);
	CHECK(cuMemAllocAsync(&b, 1 * MIB, s) == CUDA_SUCCESS);
	used = get(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
	reserved = get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	CHECK(used == 4 * MIB);
	CHECK(reserved >= used);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == used);
	CHECK(get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == reserved);

	/* A synchronous free (legal for a stream-ordered block): its fence lets
	 * the trim below give the segment back; a block freed by
	 * cuMemFreeAsync stays bound to its stream (pool_attr.c). */
	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1 * MIB);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 4 * MIB); /* kept */
	CHECK(get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == reserved); /* cached */

	/* Reset to the current value, as the driver does. */
	set0(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == 1 * MIB);
	CHECK(cuMemAllocAsync(&c, 2 * MIB, s) == CUDA_SUCCESS);
	used = get(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT); /* the block c got, rounded */
	CHECK(used >= 3 * MIB);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == used); /* seen at the query */
	CHECK(cuMemFree(c) == CUDA_SUCCESS);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_HIGH) == used);

	/* Trim: idle memory goes back; used stays. */
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuMemPoolTrimTo(def, 0) == CUDA_SUCCESS);
	v = get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
	CHECK(v < reserved && v >= 1 * MIB);
	set0(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH);
	CHECK(get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH) == v);

	/* RELEASE_THRESHOLD 0: idle memory goes back at the set; the driver
	 * keeps the value. */
	CHECK(cuMemAllocAsync(&a, 8 * MIB, s) == CUDA_SUCCESS);
	CHECK(cuMemFree(a) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) > v);
	set0(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
	CHECK(get(def, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) == v);
	CHECK(get(def, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) == 0);

	/* A pool of the program's own: the driver's answers. */
	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	CHECK(cuMemPoolCreate(&mine, &props) == CUDA_SUCCESS);
	CHECK(get(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
	CHECK(cuMemAllocFromPoolAsync(&c, 4096, mine, s) == CUDA_SUCCESS);
	used = get(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
	CHECK(used >= 4096 && used < 1 * MIB);
	/* Made current: the default pool passes through (libemm's 1 MiB block
	 * b no longer counts there). */
	CHECK(cuDeviceSetMemPool(0, mine) == CUDA_SUCCESS);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 0);
	CHECK(get(mine, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == used);
	CHECK(cuDeviceSetMemPool(0, def) == CUDA_SUCCESS);
	CHECK(get(def, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) == 1 * MIB);

	CHECK(cuMemFreeAsync(c, s) == CUDA_SUCCESS);
	CHECK(cuMemFreeAsync(b, s) == CUDA_SUCCESS);
	CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
	CHECK(cuMemPoolDestroy(mine) == CUDA_SUCCESS);
	printf("test_pool_attr: ok\n");
	return 0;
}
