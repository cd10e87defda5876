/* SPDX-License-Identifier: MIT */
/*
 * process/pool_attr.c - the device's default memory pool as a program sees
 * it through cuMemPoolGetAttribute: libemm serves the cuMemAllocAsync /
 * cudaMallocAsync calls that would have come from that pool, so its
 * USED_MEM_CURRENT/HIGH and RESERVED_MEM_CURRENT/HIGH, read from the driver
 * alone, say 0 (CuPy's MemoryAsyncPool.used_bytes() and total_bytes() read
 * them). Here those answers get libemm's books added: the bytes the
 * device's heap has handed out (used) and holds from its backend
 * (reserved), which include the device's cudaMalloc blocks (one heap serves
 * both), on top of what the driver's pool itself holds (allocations libemm
 * passed to it, as during a capture).
 *
 * A pool is "served" when it is its device's default pool and still the
 * device's current pool; any pool the program created, and the default one
 * once the program made another current (cuDeviceSetMemPool), passes
 * through untouched.
 *
 * High-water marks: setting one to 0 resets it to the current value, as
 * the driver does. libemm's heap keeps lifetime peaks only, so after a
 * reset libemm's part of a high mark is the heap's peak once that exceeds
 * the peak at the reset (a new peak, exact), and otherwise the largest
 * current value seen at the reset and at later queries (a peak between two
 * queries below the lifetime peak is missed). cuMemPoolTrimTo and a
 * RELEASE_THRESHOLD set on a served pool give libemm's idle memory back
 * (emm_release_idle) down to the bytes asked to be kept, when they are
 * called; libemm does not re-apply the threshold at each synchronisation
 * as the driver does. What goes back is what emm_release_idle can give
 * back: segments whose blocks are all free and fenced. A block freed by
 * cuMemFreeAsync stays bound to its stream until another stream takes it
 * behind an event, so a trim right after stream-ordered frees may keep its
 * segment (the driver, too, trims only frees that synchronised).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "process/process.h"
#include "process/process_internal.h"

#define POOL_DEVICES 64

/* Per device: its default pool (resolved once) and the reset baselines. */
static struct pool_books {
	_Atomic(CUmemoryPool) pool;
	uint64_t used_peak_base, used_floor;
	uint64_t reserved_peak_base, reserved_floor;
} books[POOL_DEVICES];
static pthread_mutex_t books_lock = PTHREAD_MUTEX_INITIALIZER;

/* The ordinal of the device whose default and current pool `pool` is, or
 * -1. Driver calls only, no lock. */
static int served_device(CUmemoryPool pool)
{
	const struct emm_real_vmm_table *vm = emm_real_vmm();
	CUresult (*get_default)(CUmemoryPool *, CUdevice) = vm->cuDeviceGetDefaultMemPool;
	CUresult (*get_current)(CUmemoryPool *, CUdevice) = vm->cuDeviceGetMemPool;
	CUresult (*count)(int *) = vm->cuDeviceGetCount;
	CUmemoryPool cur = NULL;
	int n = 0;

	if (!pool || !get_default || !get_current || !count || count(&n) != CUDA_SUCCESS)
		return -1;
	for (int d = 0; d < n && d < POOL_DEVICES; d++) {
		CUmemoryPool def = atomic_load_explicit(&books[d].pool, memory_order_acquire);

		if (!def && get_default(&def, d) == CUDA_SUCCESS)
			atomic_store_explicit(&books[d].pool, def, memory_order_release);
		if (def == pool)
			return get_current(&cur, d) == CUDA_SUCCESS && cur == pool ? d : -1;
	}
	return -1;
}

/* libemm's part of a high mark: see the header. */
static uint64_t high_mark(uint64_t peak, uint64_t current, uint64_t peak_base, uint64_t *floor)
{
	uint64_t v = peak > peak_base ? peak : (*floor > current ? *floor : current);

	if (v > *floor)
		*floor = v;
	return v;
}

bool emm_pool_books_get(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	struct emm_stats s = {.struct_size = sizeof(s)};
	uint64_t ours;
	int d;

	if (attr != CU_MEMPOOL_ATTR_USED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH &&
	    attr != CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
		return false;
	d = served_device(pool);
	if (d < 0)
		return false;
	emm_state_stats_snapshot(d, &s);
	pthread_mutex_lock(&books_lock);
	switch (attr) {
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		ours = s.allocated_bytes;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		ours = high_mark(s.allocated_bytes_peak, s.allocated_bytes, books[d].used_peak_base,
		                 &books[d].used_floor);
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		ours = s.reserved_bytes;
		break;
	default:
		ours = high_mark(s.reserved_bytes_peak, s.reserved_bytes, books[d].reserved_peak_base,
		                 &books[d].reserved_floor);
		break;
	}
	pthread_mutex_unlock(&books_lock);
	*(cuuint64_t *)value += ours;
	return true;
}

/* Idle bytes to keep so that the device holds about `reserved` bytes. */
static void release_to(int d, uint64_t reserved)
{
	struct emm_stats s = {.struct_size = sizeof(s)};
	long long released = 0;

	emm_state_stats_snapshot(d, &s);
	(void)emm_state_release_idle(d, reserved > s.allocated_bytes ? reserved - s.allocated_bytes : 0, &released);
}

void emm_pool_books_set(CUmemoryPool pool, CUmemPool_attribute attr, const void *value)
{
	struct emm_stats s = {.struct_size = sizeof(s)};
	int d = served_device(pool);

	if (d < 0)
		return;
	if (attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD) {
		release_to(d, *(const cuuint64_t *)value);
		return;
	}
	if (attr != CU_MEMPOOL_ATTR_USED_MEM_HIGH && attr != CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
		return;
	emm_state_stats_snapshot(d, &s);
	pthread_mutex_lock(&books_lock);
	if (attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
		books[d].used_peak_base = s.allocated_bytes_peak;
		books[d].used_floor = s.allocated_bytes;
	} else {
		books[d].reserved_peak_base = s.reserved_bytes_peak;
		books[d].reserved_floor = s.reserved_bytes;
	}
	pthread_mutex_unlock(&books_lock);
}

void emm_pool_books_trim(CUmemoryPool pool, size_t keep)
{
	int d = served_device(pool);

	if (d >= 0)
		release_to(d, keep);
}
