/* SPDX-License-Identifier: MIT */
/*
 * allocator/segmap.c - the segment map: [base, base + size) -> segment.
 *
 * Segments come and go rarely (a backend call each); lookups happen on every
 * free (to find the block's arena, whose table holds the block), on every
 * pointer that is not a live block start and on every range query. So this
 * is a sorted array searched by bisection without a lock or any write: a
 * sequence count, odd while a writer changes the array, tells a reader to
 * search again (writers serialise on a lock of their own). The array grows
 * by doubling; an outgrown array is kept, never freed, so a reader that
 * still holds it reads valid memory before its sequence check sends it
 * back (the arrays together stay under twice the largest one).
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
static atomic_uint seq;                      /* odd while a writer changes the array */
static struct segment_array *retired;        /* outgrown arrays, chained through entries[0].value */
static _Atomic uint64_t bound_lo = UINT64_MAX;
static _Atomic uint64_t bound_hi;

/*
 * The directory: which segment covers each 2 MiB granule of the address
 * space, so that a lookup is a few loads and a range check instead of a
 * bisection (115 instructions a free over the segments of
 * bench-shims --pattern ws; tests/bench/RESULTS.md section 36). 1 GiB
 * leaves, made on first use and kept (cleared on reset). A granule holds
 * the one or two segments that meet it (two: the end of one and the start
 * of the next, segments not 2 MiB-aligned, as pinned host memory). Left to
 * the bisection: a granule that three or more segments share (it holds
 * DIR_SHARED); a segment larger than DIR_MAX_GRANULES granules or
 * reaching past 2^48 (`unindexed`: a lookup that the directory cannot
 * answer bisects); and everything once a leaf could not be made (`dir_off`:
 * the counts would no longer follow the array). Written under the lock
 * between write_begin and write_end; read as the array is.
 */
#define DIR_SHIFT        21 /* 2 MiB granules */
#define DIR_LEAF_BITS    9  /* 512 granules: 1 GiB a leaf */
#define DIR_TOP_BITS     (48 - DIR_SHIFT - DIR_LEAF_BITS)
#define DIR_MAX_GRANULES (UINT64_C(1) << 15) /* 64 GiB */

struct dir_slot {
	struct segment_entry seg[2]; /* value NULL: none; seg[0].value DIR_SHARED: bisect */
};

struct dir_leaf {
	struct dir_slot slot[1u << DIR_LEAF_BITS];
	uint16_t count[1u << DIR_LEAF_BITS];            /* segments meeting the granule */
	struct dir_leaf *all_next;
};

static char dir_shared_mark;
#define DIR_SHARED ((void *)&dir_shared_mark)

static struct dir_leaf *dir[UINT64_C(1) << DIR_TOP_BITS];
static struct dir_leaf *dir_all; /* every leaf made, for reset */
static bool unindexed;          /* some segment is not in the directory */
static bool dir_off;            /* a leaf could not be made: every lookup bisects */

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

/* Granule g's place in its leaf. */
static inline unsigned dir_index(uint64_t g)
{
	return (unsigned)(g & ((1u << DIR_LEAF_BITS) - 1));
}

static struct dir_leaf *dir_leaf_of(uint64_t g, bool make)
{
	struct dir_leaf **l = &dir[g >> DIR_LEAF_BITS];

	if (!*l && make) {
		struct dir_leaf *leaf = calloc(1, sizeof(*leaf));
		if (!leaf)
			return NULL;
		leaf->all_next = dir_all;
		dir_all = leaf;
		__atomic_store_n(l, leaf, __ATOMIC_RELEASE);
	}
	return *l;
}

static void slot_set(struct segment_entry *e, const struct segment_entry *from)
{
	__atomic_store_n(&e->base, from ? from->base : 0, __ATOMIC_RELAXED);
	__atomic_store_n(&e->end, from ? from->end : 0, __ATOMIC_RELAXED);
	__atomic_store_n(&e->value, from ? from->value : NULL, __ATOMIC_RELAXED);
}

/* The one or two segments meeting granule g (its count), from the array:
 * the last entries that start below the granule's end. */
static void dir_fill(struct dir_leaf *leaf, uint64_t g, unsigned count)
{
	uint64_t start = g << DIR_SHIFT;
	size_t i = upper_bound(((g + 1) << DIR_SHIFT) - 1);
	struct dir_slot *slot = &leaf->slot[dir_index(g)];
	const struct segment_entry *a = i > 0 ? &array->entries[i - 1] : NULL;
	const struct segment_entry *b = count == 2 && i > 1 ? &array->entries[i - 2] : NULL;

	if (!a || a->end <= start || (count == 2 && (!b || b->end <= start))) {
		/* Cannot happen (the counts follow the array): bisect. */
		slot_set(&slot->seg[1], NULL);
		__atomic_store_n(&slot->seg[0].value, DIR_SHARED, __ATOMIC_RELAXED);
		return;
	}
	slot_set(&slot->seg[1], b);
	slot_set(&slot->seg[0], a);
}

/* Account segment [base, end) in (delta 1) or out of (delta -1) every
 * granule it meets, the array already updated. */
static void dir_update(uint64_t base, uint64_t end, int delta)
{
	uint64_t g0 = base >> DIR_SHIFT, g1 = (end - 1) >> DIR_SHIFT;

	if (dir_off)
		return;
	if (end > (UINT64_C(1) << 48) || g1 - g0 >= DIR_MAX_GRANULES) {
		__atomic_store_n(&unindexed, true, __ATOMIC_RELAXED);
		return;
	}
	for (uint64_t g = g0; g <= g1; g++) {
		struct dir_leaf *leaf = dir_leaf_of(g, delta > 0);
		unsigned k = dir_index(g);

		if (!leaf) {
			if (delta > 0) {
				__atomic_store_n(&dir_off, true, __ATOMIC_RELAXED);
				return;
			}
			continue;
		}
		leaf->count[k] = (uint16_t)(leaf->count[k] + delta);
		if (leaf->count[k] == 0) {
			slot_set(&leaf->slot[k].seg[0], NULL);
			slot_set(&leaf->slot[k].seg[1], NULL);
		} else if (leaf->count[k] <= 2) {
			dir_fill(leaf, g, leaf->count[k]);
		} else {
			__atomic_store_n(&leaf->slot[k].seg[0].value, DIR_SHARED, __ATOMIC_RELAXED);
		}
	}
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
	if (old) {
		/* A reader may still be searching it (top of file). */
		/* Atomic: a reader's bisection may load this very field. */
		__atomic_store_n(&old->entries[0].value, retired, __ATOMIC_RELAXED);
		retired = old;
	}
	return 0;
}

/* An entry written while readers may be searching the array: each field
 * an atomic store (the sequence count tells them to search again). */
static void entry_store(struct segment_entry *to, const struct segment_entry *from)
{
	__atomic_store_n(&to->base, from->base, __ATOMIC_RELAXED);
	__atomic_store_n(&to->end, from->end, __ATOMIC_RELAXED);
	__atomic_store_n(&to->value, from->value, __ATOMIC_RELAXED);
}

/* Writers, under the lock: the count odd while the array changes. */
static void write_begin(void)
{
	atomic_store_explicit(&seq, atomic_load_explicit(&seq, memory_order_relaxed) + 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_release);
}

static void write_end(void)
{
	atomic_store_explicit(&seq, atomic_load_explicit(&seq, memory_order_relaxed) + 1, memory_order_release);
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
	write_begin();
	ret = reserve_one_more();
	if (ret < 0) {
		write_end();
		goto out;
	}
	for (size_t j = segment_count; j > i; j--)
		entry_store(&array->entries[j], &array->entries[j - 1]);
	entry_store(&array->entries[i], &(struct segment_entry){.base = base, .end = end, .value = value});
	__atomic_store_n(&segment_count, segment_count + 1, __ATOMIC_RELAXED);
	dir_update(base, end, 1);
	write_end();
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
			uint64_t old_end = array->entries[i - 1].end;

			write_begin();
			__atomic_store_n(&array->entries[i - 1].end, end, __ATOMIC_RELAXED);
			dir_update(base, old_end, -1);
			dir_update(base, end, 1);
			write_end();
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
		uint64_t removed_end = array->entries[--i].end;

		value = array->entries[i].value;
		write_begin();
		for (size_t j = i; j + 1 < segment_count; j++)
			entry_store(&array->entries[j], &array->entries[j + 1]);
		__atomic_store_n(&segment_count, segment_count - 1, __ATOMIC_RELAXED);
		dir_update(base, removed_end, -1);
		write_end();
	}
	pthread_rwlock_unlock(&segmap_lock);
	return value;
}

/* One search of the array as a reader sees it: true and *ret when addr lies
 * in an entry, and *ret_seq the sequence count it started from (odd: a
 * writer was busy, search again). */
static bool search_once(uint64_t addr, struct segment_entry *ret, unsigned *ret_seq)
{
	unsigned s = atomic_load_explicit(&seq, memory_order_acquire);
	const struct segment_array *a = __atomic_load_n(&array, __ATOMIC_ACQUIRE);
	size_t n = __atomic_load_n(&segment_count, __ATOMIC_RELAXED), lo = 0, hi;
	bool found = false;

	*ret_seq = s;
	if (s & 1u || !a)
		return false;
	if (n > a->capacity)
		n = a->capacity; /* an outgrown array with the new count: the check below fails */
	for (hi = n; lo < hi;) {
		size_t mid = lo + (hi - lo) / 2;

		if (__atomic_load_n(&a->entries[mid].base, __ATOMIC_RELAXED) <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo > 0) {
		const struct segment_entry *e = &a->entries[lo - 1];

		ret->base = __atomic_load_n(&e->base, __ATOMIC_RELAXED);
		ret->end = __atomic_load_n(&e->end, __ATOMIC_RELAXED);
		ret->value = __atomic_load_n(&e->value, __ATOMIC_RELAXED);
		found = addr >= ret->base && addr < ret->end;
	}
	return found;
}

/* The directory's answer for addr: 1 found (*ret), 0 not ours, -1 ask the
 * bisection. Read inside a sequence check, as search_once. */
static int dir_search(uint64_t addr, struct segment_entry *ret)
{
	const struct dir_leaf *leaf;
	const struct dir_slot *slot;

	if ((addr >> 48) || __atomic_load_n(&dir_off, __ATOMIC_RELAXED))
		return -1;
	leaf = __atomic_load_n(&dir[addr >> (DIR_SHIFT + DIR_LEAF_BITS)], __ATOMIC_ACQUIRE);
	if (!leaf)
		return __atomic_load_n(&unindexed, __ATOMIC_RELAXED) ? -1 : 0;
	slot = &leaf->slot[dir_index(addr >> DIR_SHIFT)];
	for (unsigned k = 0; k < 2; k++) {
		void *value = __atomic_load_n(&slot->seg[k].value, __ATOMIC_RELAXED);

		if (value == DIR_SHARED)
			return -1;
		if (!value)
			break;
		ret->base = __atomic_load_n(&slot->seg[k].base, __ATOMIC_RELAXED);
		ret->end = __atomic_load_n(&slot->seg[k].end, __ATOMIC_RELAXED);
		ret->value = value;
		if (addr >= ret->base && addr < ret->end)
			return 1;
	}
	return __atomic_load_n(&unindexed, __ATOMIC_RELAXED) ? -1 : 0;
}

int emm_segmap_find(uint64_t addr, uint64_t *ret_base, size_t *ret_size, void **ret_value)
{
	struct segment_entry e;
	unsigned s;
	bool found;

	if (addr < atomic_load_explicit(&bound_lo, memory_order_relaxed) ||
	    addr >= atomic_load_explicit(&bound_hi, memory_order_relaxed))
		return -ENOENT;
	for (;;) {
		s = atomic_load_explicit(&seq, memory_order_acquire);
		int d = s & 1u ? -1 : dir_search(addr, &e);
		/* The directory's answer, else the bisection's (which reads the
		 * count again into s). */
		found = d >= 0 ? d == 1 : search_once(addr, &e, &s);
		atomic_thread_fence(memory_order_acquire);
		if (!(s & 1u) && atomic_load_explicit(&seq, memory_order_relaxed) == s)
			break;
		emm_cpu_relax();
	}
	if (!found)
		return -ENOENT;
	if (ret_base)
		*ret_base = e.base;
	if (ret_size)
		*ret_size = (size_t)(e.end - e.base);
	if (ret_value)
		*ret_value = e.value;
	return 0;
}

void *emm_segmap_value(uint64_t addr)
{
	unsigned s = atomic_load_explicit(&seq, memory_order_acquire);
	struct segment_entry e;
	void *value;

	/* The common case, once: the directory answers, no writer meanwhile. */
	if (EMM_LIKELY(!(s & 1u) && dir_search(addr, &e) == 1)) {
		atomic_thread_fence(memory_order_acquire);
		if (EMM_LIKELY(atomic_load_explicit(&seq, memory_order_relaxed) == s))
			return e.value;
	}
	return emm_segmap_find(addr, NULL, NULL, &value) == 0 ? value : NULL;
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
	atomic_store_explicit(&seq, 0, memory_order_relaxed);
	for (struct dir_leaf *leaf = dir_all; leaf; leaf = leaf->all_next) {
		memset(leaf->slot, 0, sizeof(leaf->slot));
		memset(leaf->count, 0, sizeof(leaf->count));
	}
	unindexed = false;
	dir_off = false;
	segment_count = 0;
	atomic_store_explicit(&bound_lo, UINT64_MAX, memory_order_relaxed);
	atomic_store_explicit(&bound_hi, 0, memory_order_relaxed);
}
