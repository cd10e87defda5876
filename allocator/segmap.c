/* SPDX-License-Identifier: MIT */
/*
 * allocator/segmap.c - the segment map: [base, base + size) -> segment.
 *
 * Segments come and go rarely (a backend call each), lookups happen on every
 * free of a pointer that is not a live block start and on every range query,
 * so this is a sorted array searched by bisection under a reader-writer lock
 * that prefers writers. The array grows by doubling and never shrinks.
 *
 * [lowest base, highest end) of everything ever inserted is kept in two
 * atomics outside the lock, so a pointer that was never near our memory
 * (the common case for a program's own driver allocations) is refused
 * without touching the lock. The bounds only widen, so a stale read can only
 * send a lookup on to the locked search, never refuse a real hit: a thread
 * holding an address inside a segment got it after the insert that widened
 * the bounds.
 */
#include "allocator/ptrmap.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"

struct segment_entry {
	uint64_t base;
	uint64_t end; /* base + size, exclusive */
	void *value;
};

/* The array carries its capacity, so one pointer describes it whole. */
struct segment_array {
	size_t capacity;
	struct segment_entry entries[];
};

static pthread_rwlock_t segmap_lock = PTHREAD_RWLOCK_WRITER_NONRECURSIVE_INITIALIZER_NP;
static struct segment_array *array; /* NULL until the first insert */
static size_t segment_count;
static _Atomic uint64_t bound_lo = UINT64_MAX;
static _Atomic uint64_t bound_hi;

/* Index of the first segment whose base is > addr (0..segment_count). */
static size_t upper_bound(uint64_t addr)
{
	size_t lo = 0, hi = segment_count;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (array->entries[mid].base <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * Grows by copying into a new array and publishing it before the old one is
 * freed (not realloc), so a fork child always finds a valid array to reuse.
 */
static int reserve_one_more(void)
{
	struct segment_array *grown, *old = array;
	size_t capacity;

	if (old && segment_count < old->capacity)
		return 0;
	capacity = old ? old->capacity * 2 : 64;
	grown = malloc(sizeof(*grown) + capacity * sizeof(grown->entries[0]));
	if (!grown)
		return -ENOMEM;
	grown->capacity = capacity;
	if (old)
		memcpy(grown->entries, old->entries, segment_count * sizeof(old->entries[0]));
	__atomic_store_n(&array, grown, __ATOMIC_RELEASE);
	free(old);
	return 0;
}

int emm_segmap_insert(uint64_t base, size_t size, void *value)
{
	uint64_t end = base + size;
	size_t i;
	int ret;

	if (size == 0 || end < base)
		return -EINVAL;

	pthread_rwlock_wrlock(&segmap_lock);
	i = upper_bound(base);
	/* Neighbours: entry i - 1 starts at or below base, entry i above it. */
	if ((i > 0 && array->entries[i - 1].end > base) ||
	    (i < segment_count && array->entries[i].base < end)) {
		ret = -EEXIST;
		goto out;
	}
	ret = reserve_one_more();
	if (ret < 0)
		goto out;
	memmove(&array->entries[i + 1], &array->entries[i], (segment_count - i) * sizeof(array->entries[0]));
	array->entries[i] = (struct segment_entry){.base = base, .end = end, .value = value};
	segment_count++;
	if (base < atomic_load_explicit(&bound_lo, memory_order_relaxed))
		atomic_store_explicit(&bound_lo, base, memory_order_relaxed);
	if (end > atomic_load_explicit(&bound_hi, memory_order_relaxed))
		atomic_store_explicit(&bound_hi, end, memory_order_relaxed);
out:
	pthread_rwlock_unlock(&segmap_lock);
	return ret;
}

int emm_segmap_resize(uint64_t base, size_t new_size)
{
	uint64_t end = base + new_size;
	size_t i;
	int ret = -ENOENT;

	if (new_size == 0 || end < base)
		return -EINVAL;
	pthread_rwlock_wrlock(&segmap_lock);
	i = array ? upper_bound(base) : 0;
	if (i > 0 && array->entries[i - 1].base == base) {
		if (i < segment_count && array->entries[i].base < end) {
			ret = -EEXIST;
		} else {
			array->entries[i - 1].end = end;
			if (end > atomic_load_explicit(&bound_hi, memory_order_relaxed))
				atomic_store_explicit(&bound_hi, end, memory_order_relaxed);
			ret = 0;
		}
	}
	pthread_rwlock_unlock(&segmap_lock);
	return ret;
}

void *emm_segmap_remove(uint64_t base)
{
	void *value = NULL;
	size_t i;

	pthread_rwlock_wrlock(&segmap_lock);
	i = upper_bound(base);
	if (i > 0 && array->entries[i - 1].base == base) {
		i--;
		value = array->entries[i].value;
		memmove(&array->entries[i], &array->entries[i + 1],
		        (segment_count - i - 1) * sizeof(array->entries[0]));
		segment_count--;
	}
	pthread_rwlock_unlock(&segmap_lock);
	return value;
}

int emm_segmap_find(uint64_t addr, uint64_t *ret_base, size_t *ret_size, void **ret_value)
{
	size_t i;
	int ret = -ENOENT;

	if (addr < atomic_load_explicit(&bound_lo, memory_order_relaxed) ||
	    addr >= atomic_load_explicit(&bound_hi, memory_order_relaxed))
		return -ENOENT;

	pthread_rwlock_rdlock(&segmap_lock);
	i = upper_bound(addr);
	if (i > 0 && addr < array->entries[i - 1].end) {
		const struct segment_entry *e = &array->entries[i - 1];

		if (ret_base)
			*ret_base = e->base;
		if (ret_size)
			*ret_size = (size_t)(e->end - e->base);
		if (ret_value)
			*ret_value = e->value;
		ret = 0;
	}
	pthread_rwlock_unlock(&segmap_lock);
	return ret;
}

size_t emm_segmap_count(void)
{
	size_t n;

	pthread_rwlock_rdlock(&segmap_lock);
	n = segment_count;
	pthread_rwlock_unlock(&segmap_lock);
	return n;
}

void emm_segmap_reset(void)
{
	pthread_rwlockattr_t attr;

	/*
	 * Fork child: the lock may be held by a thread that does not exist
	 * here. Re-create the lock and empty the map, keeping the array (a
	 * complete one even if the parent was growing it: see
	 * reserve_one_more).
	 */
	pthread_rwlockattr_init(&attr);
	pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&segmap_lock, &attr);
	pthread_rwlockattr_destroy(&attr);
	segment_count = 0;
	atomic_store_explicit(&bound_lo, UINT64_MAX, memory_order_relaxed);
	atomic_store_explicit(&bound_hi, 0, memory_order_relaxed);
}
