/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_pool.c - explicit memory pools: cuMemPoolCreate,
 * cuMemPoolDestroy, cuMemPoolTrimTo, cuMemPoolSetAttribute/GetAttribute,
 * cuMemAllocFromPoolAsync(_ptsz), cuDeviceGetDefaultMemPool,
 * cuDeviceGetMemPool, cuDeviceSetMemPool.
 *
 * A pool counts what its allocations use (USED_MEM_*) and what it keeps
 * reserved from the device (RESERVED_MEM_*): reserved bytes count against
 * the device capacity (fakecuda_mem_used, cuMemGetInfo) whether or not an
 * allocation uses them. The pool grows in 2 MiB steps; a free
 * (cuMemFreeAsync, cuMemFree_v2, a launched graph's free node: fake_mem.c
 * calls fake_pool_give_locked) gives the bytes back to the pool, which then
 * releases reserved memory above the release threshold at once (the real
 * pool does so at the next synchronisation). cuMemPoolTrimTo releases down
 * to its argument. There is no fragmentation: every free byte is reusable
 * and releasable. props.maxSize, when not 0, caps the reservation.
 *
 * The default pool of each device is a handle only: cuMemAllocAsync from it
 * keeps fake_mem.c's own accounting (as before pools existed), so its
 * counters stay 0 and trimming it does nothing. cuMemAllocAsync allocates
 * from an explicit pool once cuDeviceSetMemPool made it the device's current
 * pool.
 *
 * Error codes: the real driver's documented ones where the documentation
 * names one; each choice the documentation leaves open is marked
 * "unverified" (no probe-driver case yet).
 */
#include "fake.h"

#include <stdlib.h>
#include <string.h>

#define POOL_GRANULE ((size_t)2 << 20)

struct fake_pool {
	struct fake_pool *next;        /* pools (live and destroyed-but-used) */
	int device;
	bool is_default;
	bool destroyed;                /* handle invalid; freed with its last allocation */
	size_t max_size;               /* 0: no cap */
	uint64_t release_threshold;
	int reuse_follow, reuse_opportunistic, reuse_internal;
	size_t used, used_high;
	size_t reserved, reserved_high;
};

static struct fake_pool *pools;
static struct fake_ptrset pool_set;    /* live explicit pools */
static struct fake_pool default_pools[FAKE_MAX_DEVICES];
static struct fake_pool *current_pool[FAKE_MAX_DEVICES]; /* NULL: the default pool */

static void pool_defaults(struct fake_pool *p, int dev, bool is_default)
{
	memset(p, 0, sizeof(*p));
	p->device = dev;
	p->is_default = is_default;
	p->reuse_follow = 1;
	p->reuse_opportunistic = 1;
	p->reuse_internal = 1;
}

static struct fake_pool *default_pool(int dev)
{
	struct fake_pool *p = &default_pools[dev];
	if (!p->is_default)
		pool_defaults(p, dev, true);
	return p;
}

static size_t round_granule(size_t n)
{
	if (n > SIZE_MAX - POOL_GRANULE)
		return SIZE_MAX & ~(POOL_GRANULE - 1);
	return (n + POOL_GRANULE - 1) & ~(POOL_GRANULE - 1);
}

/* Gives reserved memory above max(keep, used) back to the device. */
static void release_to_locked(struct fake_pool *p, size_t keep)
{
	size_t target = round_granule(keep > p->used ? keep : p->used);
	if (p->reserved <= target)
		return;
	g_fake.used[p->device] -= p->reserved - target;
	p->reserved = target;
}

static void pool_unlink_free_locked(struct fake_pool *p)
{
	release_to_locked(p, 0);
	for (struct fake_pool **pp = &pools; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
	free(p);
}

CUresult fake_pool_lookup_locked(CUmemoryPool h, struct fake_pool **out)
{
	struct fake_pool *p = (struct fake_pool *)h;
	if (p && p >= default_pools && p < default_pools + FAKE_MAX_DEVICES &&
	    (size_t)(p - default_pools) < (size_t)g_fake.device_count) {
		*out = default_pool((int)(p - default_pools));
		return CUDA_SUCCESS;
	}
	if (!p || !fake_ptrset_has(&pool_set, p))
		return CUDA_ERROR_INVALID_VALUE; /* unverified: a destroyed or unknown pool */
	*out = p;
	return CUDA_SUCCESS;
}

struct fake_pool *fake_pool_current_locked(int dev)
{
	return current_pool[dev];
}

CUmemoryPool fake_pool_handle_locked(struct fake_pool *pool, int dev)
{
	return (CUmemoryPool)(pool ? pool : default_pool(dev));
}

CUresult fake_pool_take_locked(struct fake_pool *p, size_t bytes)
{
	if (p->is_default)
		return CUDA_SUCCESS;
	if (bytes > SIZE_MAX - p->used)
		return CUDA_ERROR_OUT_OF_MEMORY;
	size_t need = p->used + bytes;
	if (need > p->reserved) {
		size_t target = round_granule(need);
		size_t grow = target - p->reserved;
		int dev = p->device;
		if ((p->max_size && target > p->max_size) || grow > g_fake.capacity ||
		    g_fake.used[dev] > g_fake.capacity - grow)
			return CUDA_ERROR_OUT_OF_MEMORY;
		g_fake.used[dev] += grow;
		p->reserved = target;
		if (p->reserved > p->reserved_high)
			p->reserved_high = p->reserved;
	}
	p->used = need;
	if (p->used > p->used_high)
		p->used_high = p->used;
	return CUDA_SUCCESS;
}

void fake_pool_give_locked(struct fake_pool *p, size_t bytes)
{
	if (p->is_default)
		return;
	p->used -= bytes < p->used ? bytes : p->used;
	if (p->destroyed && p->used == 0) {
		pool_unlink_free_locked(p);
		return;
	}
	if (p->reserved > p->release_threshold)
		release_to_locked(p, p->release_threshold > SIZE_MAX ? SIZE_MAX : (size_t)p->release_threshold);
}

void fake_pool_reset_locked(void)
{
	/* fake_mem_reset_locked gave every allocation back first. */
	while (pools) {
		struct fake_pool *p = pools;
		pools = p->next;
		free(p);
	}
	fake_ptrset_clear(&pool_set);
	memset(default_pools, 0, sizeof(default_pools));
	memset(current_pool, 0, sizeof(current_pool));
}

/* --- entry points --- */

FAKE_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
	FAKE_ENTER(cuMemPoolCreate);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!pool || !props))
		r = CUDA_ERROR_INVALID_VALUE;
	/* Documented: allocType must be PINNED; the fake serves device
	 * locations only (HOST_NUMA pools exist on the real one: unverified
	 * code here), and no shareable handle types. */
	if (r == CUDA_SUCCESS && props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
		r = CUDA_ERROR_NOT_SUPPORTED; /* unverified */
	if (r == CUDA_SUCCESS && !fake_device_valid(props->location.id))
		r = CUDA_ERROR_INVALID_DEVICE; /* unverified (may be INVALID_VALUE) */
	if (r == CUDA_SUCCESS && props->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
		r = CUDA_ERROR_NOT_SUPPORTED; /* unverified: the fake has no shareable pools */
	struct fake_pool *p = NULL;
	if (r == CUDA_SUCCESS) {
		p = malloc(sizeof(*p));
		if (!p)
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (r == CUDA_SUCCESS) {
		pool_defaults(p, props->location.id, false);
		p->max_size = props->maxSize;
		if (!fake_ptrset_add(&pool_set, p)) {
			free(p);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		}
	}
	if (r == CUDA_SUCCESS) {
		p->next = pools;
		pools = p;
		*pool = (CUmemoryPool)p;
	}
	fake_unlock();
	return r;
}

/* Documented: with allocations outstanding the call returns at once and the
 * pool goes with its last allocation; a device's current pool falls back to
 * the default pool. */
FAKE_API CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
	FAKE_ENTER(cuMemPoolDestroy);
	fake_lock();
	struct fake_pool *p = NULL;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS)
		r = fake_pool_lookup_locked(pool, &p);
	if (r == CUDA_SUCCESS && p->is_default)
		r = CUDA_ERROR_INVALID_VALUE; /* unverified */
	if (r == CUDA_SUCCESS) {
		fake_ptrset_del(&pool_set, p);
		for (int d = 0; d < FAKE_MAX_DEVICES; d++)
			if (current_pool[d] == p)
				current_pool[d] = NULL;
		p->destroyed = true;
		if (p->used == 0)
			pool_unlink_free_locked(p);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
	FAKE_ENTER(cuMemPoolTrimTo);
	fake_lock();
	struct fake_pool *p = NULL;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS)
		r = fake_pool_lookup_locked(pool, &p);
	if (r == CUDA_SUCCESS && !p->is_default)
		release_to_locked(p, minBytesToKeep);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	FAKE_ENTER(cuMemPoolSetAttribute);
	fake_lock();
	struct fake_pool *p = NULL;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS)
		r = fake_pool_lookup_locked(pool, &p);
	if (r == CUDA_SUCCESS && !value)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r != CUDA_SUCCESS) {
		fake_unlock();
		return r;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
		p->reuse_follow = *(int *)value != 0;
		break;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
		p->reuse_opportunistic = *(int *)value != 0;
		break;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		p->reuse_internal = *(int *)value != 0;
		break;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		p->release_threshold = *(cuuint64_t *)value;
		break;
	/* Documented: the high watermarks can only be reset, to 0 (to the
	 * current value). Another value: unverified code. */
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		if (*(cuuint64_t *)value != 0)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			p->reserved_high = p->reserved;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		if (*(cuuint64_t *)value != 0)
			r = CUDA_ERROR_INVALID_VALUE;
		else
			p->used_high = p->used;
		break;
	default: /* the read-only CURRENT values, unknown attributes: unverified */
		r = CUDA_ERROR_INVALID_VALUE;
		break;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
	FAKE_ENTER(cuMemPoolGetAttribute);
	fake_lock();
	struct fake_pool *p = NULL;
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS)
		r = fake_pool_lookup_locked(pool, &p);
	if (r == CUDA_SUCCESS && !value)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r != CUDA_SUCCESS) {
		fake_unlock();
		return r;
	}
	switch (attr) {
	case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
		*(int *)value = p->reuse_follow;
		break;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
		*(int *)value = p->reuse_opportunistic;
		break;
	case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
		*(int *)value = p->reuse_internal;
		break;
	case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
		*(cuuint64_t *)value = p->release_threshold;
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
		*(cuuint64_t *)value = p->reserved;
		break;
	case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
		*(cuuint64_t *)value = p->reserved_high;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
		*(cuuint64_t *)value = p->used;
		break;
	case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
		*(cuuint64_t *)value = p->used_high;
		break;
	default:
		r = CUDA_ERROR_INVALID_VALUE; /* unverified */
		break;
	}
	fake_unlock();
	return r;
}

/* Checks and errors as cuMemAllocAsync (fake_mem.c); an unknown or
 * destroyed pool: CUDA_ERROR_INVALID_VALUE (unverified). */
FAKE_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
	FAKE_ENTER(cuMemAllocFromPoolAsync);
	return fake_mem_alloc_async(dptr, bytesize, hStream, false, true, pool);
}

FAKE_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					       CUstream hStream)
{
	FAKE_ENTER(cuMemAllocFromPoolAsync_ptsz);
	return fake_mem_alloc_async(dptr, bytesize, hStream, true, true, pool);
}

/* The device calls: a bad ordinal is CUDA_ERROR_INVALID_DEVICE, a NULL
 * output CUDA_ERROR_INVALID_VALUE (unverified). */
static CUresult device_pool_prologue_locked(CUdevice dev, const void *out)
{
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !out)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && !fake_device_valid(dev))
		r = CUDA_ERROR_INVALID_DEVICE;
	return r;
}

FAKE_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
	FAKE_ENTER(cuDeviceGetDefaultMemPool);
	fake_lock();
	CUresult r = device_pool_prologue_locked(dev, pool_out);
	if (r == CUDA_SUCCESS)
		*pool_out = (CUmemoryPool)default_pool(dev);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
	FAKE_ENTER(cuDeviceGetMemPool);
	fake_lock();
	CUresult r = device_pool_prologue_locked(dev, pool);
	if (r == CUDA_SUCCESS)
		*pool = fake_pool_handle_locked(current_pool[dev], dev);
	fake_unlock();
	return r;
}

/* A pool of another device: CUDA_ERROR_INVALID_VALUE (unverified). */
FAKE_API CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
	FAKE_ENTER(cuDeviceSetMemPool);
	fake_lock();
	struct fake_pool *p = NULL;
	CUresult r = device_pool_prologue_locked(dev, pool);
	if (r == CUDA_SUCCESS)
		r = fake_pool_lookup_locked(pool, &p);
	if (r == CUDA_SUCCESS && p->device != dev)
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		current_pool[dev] = p->is_default ? NULL : p;
	fake_unlock();
	return r;
}
