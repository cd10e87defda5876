/* SPDX-License-Identifier: MIT */
/*
 * allocator/ptrmap.c - the block map: exact block start address -> block.
 *
 * On the path of every allocation (insert) and every free (take), so it is
 * built for the uncontended single-thread case first and for many threads
 * second:
 *
 *   - 65536 shards, each one cache line with its own spinlock and table.
 *     The shard is picked by a Fibonacci hash of the 512 KiB region of the
 *     address (addr >> 19), the home slot inside it by one of addr >> 9 (blocks are
 *     at least 512 B apart). A thread that works on its own segments (its
 *     arena's, a stream's) stays on its own shards and cache lines even
 *     when its working set spans tens of megabytes, and threads that carve
 *     blocks from the same segments still spread over several shards.
 *     tests/backends/bench-ptrmap (ns per insert+take pair per thread, 16
 *     threads; RESULTS.md sections 27 and 28):
 *
 *       layout                          spread   shared segments   1 thread
 *       256 shards, 256 KiB              304-317  157-175           61-83    (64 CPUs)
 *       4096 shards, 2 MiB               106-113  523-539           38-46    (64 CPUs)
 *       4096 shards, 512 KiB             153-154  146-147           37-42    (64 CPUs)
 *       4096 shards, 512 KiB             147.5    131.6             36.4     (32 CPUs)
 *       65536 shards, 512 KiB (this)     35.3     135.7             32.0     (32 CPUs)
 *
 *     "spread" is the working set of tests/gpu/bench_threads.cu: 64 live
 *     blocks per thread in 32 segments of its own, interleaved in the
 *     address space with the other threads'. By estimate, 16 such threads'
 *     ~1 600 regions share a shard with another thread's one time in three
 *     over 4096 shards, one in forty over 65536. The shards are 4 MiB of
 *     zeroed memory, touched only where blocks are.
 *   - Each table uses linear probing and backward-shift deletion (no
 *     tombstones, so probe lengths stay short however many inserts and
 *     takes have happened). Key 0 marks an empty slot; address 0 is never
 *     a block.
 *   - Tables start in the shard (2 slots) and double (calloc) above 3/4 load.
 *     They never shrink, not even on reset: once a program's working set
 *     has been seen, insert and take allocate nothing.
 *
 * The lock is a test-and-test-and-set spinlock: critical sections are a
 * handful of loads and stores, except for the rare doubling, during which a
 * waiter yields the CPU instead of burning it.
 */
#include "allocator/ptrmap.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"

#define SHARD_BITS          16
#define SHARD_COUNT         (1u << SHARD_BITS)
#define SHARD_REGION_SHIFT  19 /* 512 KiB regions pick the shard */
#define SHARD_INITIAL_SLOTS 2u /* power of two; the shard stays one cache line */
#define SPINS_BEFORE_YIELD  128

struct slot {
	uint64_t key; /* 0: empty */
	void *value;
};

struct shard {
	atomic_int lock;
	uint32_t mask;          /* slots - 1 */
	_Atomic uint32_t count; /* written under the lock, read racily by emm_blockmap_count */
	uint32_t shift;         /* 64 - log2(slots): home_of's */
	struct slot *slots;
	struct slot initial[SHARD_INITIAL_SLOTS];
} __attribute__((aligned(64)));

_Static_assert(sizeof(struct shard) == 64, "a shard is one cache line");

static struct shard shards[SHARD_COUNT];

/* Fibonacci hashing: multiply by 2^64 / golden ratio, keep the top bits.
 * One multiply and a shift; consecutive regions and consecutive 512 B
 * slots land far apart. */
#define FIB UINT64_C(0x9E3779B97F4A7C15)

/* The home slot of addr in a table of 2^(64 - shift) slots. */
static inline size_t home_of(uint64_t addr, unsigned shift)
{
	return (size_t)(((addr >> 9) * FIB) >> shift);
}

static inline struct shard *shard_of(uint64_t addr)
{
	return &shards[((addr >> SHARD_REGION_SHIFT) * FIB) >> (64 - SHARD_BITS)];
}

static void shard_lock_slow(struct shard *s)
{
	for (int spins = 0;; spins++) {
		if (atomic_load_explicit(&s->lock, memory_order_relaxed) == 0 &&
		    !atomic_exchange_explicit(&s->lock, 1, memory_order_acquire))
			return;
		if (spins < SPINS_BEFORE_YIELD)
			emm_cpu_relax();
		else
			sched_yield();
	}
}

static inline void shard_lock(struct shard *s)
{
	if (EMM_LIKELY(!atomic_exchange_explicit(&s->lock, 1, memory_order_acquire)))
		return;
	shard_lock_slow(s);
}

static inline void shard_unlock(struct shard *s)
{
	atomic_store_explicit(&s->lock, 0, memory_order_release);
}

/* Points an unused shard at its static table; called lazily (a static
 * struct cannot point into itself in an initializer portably per shard). */
static inline void shard_ensure_init(struct shard *s)
{
	if (EMM_UNLIKELY(s->slots == NULL)) {
		s->slots = s->initial;
		s->mask = SHARD_INITIAL_SLOTS - 1;
		s->shift = 64 - (unsigned)__builtin_ctz(SHARD_INITIAL_SLOTS);
	}
}

/*
 * A grown table is one calloc'd block: a header slot holding the table's
 * slot count, then the slots. So the pointer alone tells the size, and a
 * fork child (emm_blockmap_reset) can reuse whatever table its shard points
 * to without trusting `mask`, which the parent may have been updating.
 */
static struct slot *table_alloc(size_t nslots)
{
	struct slot *block = calloc(nslots + 1, sizeof(*block));

	if (!block)
		return NULL;
	block[0].key = nslots;
	return block + 1;
}

static size_t table_slots(const struct shard *s, const struct slot *slots)
{
	return slots == s->initial ? SHARD_INITIAL_SLOTS : (size_t)slots[-1].key;
}

/* The slot holding key, or the empty slot where it would go. */
static inline size_t table_probe(const struct slot *slots, uint32_t mask, size_t home, uint64_t key)
{
	size_t i = home;

	while (slots[i].key != 0 && slots[i].key != key)
		i = (i + 1) & mask;
	return i;
}

static inline size_t shard_probe(const struct shard *s, uint64_t key)
{
	return table_probe(s->slots, s->mask, home_of(key, s->shift), key);
}

static int shard_grow(struct shard *s)
{
	size_t old_slots = (size_t)s->mask + 1;
	size_t new_slots = old_slots * 2;
	uint32_t new_mask = (uint32_t)(new_slots - 1);
	unsigned new_shift = s->shift - 1;
	struct slot *old = s->slots;
	struct slot *table;

	if (new_slots > UINT32_MAX)
		return -ENOMEM;
	table = table_alloc(new_slots);
	if (!table)
		return -ENOMEM;
	for (size_t i = 0; i < old_slots; i++) {
		if (old[i].key != 0)
			table[table_probe(table, new_mask, home_of(old[i].key, new_shift), old[i].key)] = old[i];
	}
	/* Publish only the finished table (see table_alloc). */
	__atomic_store_n(&s->slots, table, __ATOMIC_RELEASE);
	s->mask = new_mask;
	s->shift = new_shift;
	if (old != s->initial)
		free(old - 1);
	return 0;
}

int emm_blockmap_insert(uint64_t addr, void *value)
{
	struct shard *s = shard_of(addr);
	uint32_t count;
	size_t i;
	int ret = 0;

	if (addr == 0 || value == NULL)
		return -EINVAL;

	shard_lock(s);
	shard_ensure_init(s);
	i = shard_probe(s, addr);
	if (s->slots[i].key == addr) {
		ret = -EEXIST;
		goto out;
	}
	count = atomic_load_explicit(&s->count, memory_order_relaxed);
	/* Keep the load at or below 3/4 after this insert. */
	if (EMM_UNLIKELY(((size_t)count + 1) * 4 > ((size_t)s->mask + 1) * 3)) {
		ret = shard_grow(s);
		if (ret < 0)
			goto out;
		i = shard_probe(s, addr);
	}
	s->slots[i].key = addr;
	s->slots[i].value = value;
	atomic_store_explicit(&s->count, count + 1, memory_order_relaxed);
out:
	shard_unlock(s);
	return ret;
}

/* Empties slot i and shifts later members of its cluster back, so every key
 * stays reachable from its home slot without tombstones. */
static void shard_remove_at(struct shard *s, size_t i)
{
	size_t j = i;

	for (;;) {
		size_t home;

		j = (j + 1) & s->mask;
		if (s->slots[j].key == 0)
			break;
		home = home_of(s->slots[j].key, s->shift);
		/* Move j into the hole at i unless its home lies cyclically in (i, j]. */
		if (i <= j ? (home <= i || home > j) : (home <= i && home > j)) {
			s->slots[i] = s->slots[j];
			i = j;
		}
	}
	s->slots[i].key = 0;
	s->slots[i].value = NULL;
}

/* Looks addr up under its shard's lock; with `remove`, takes it out if
 * `accept` (NULL: always) says so. *refused: found but not accepted.
 * Inlined into each caller: a free's take makes no test it does not need. */
static inline __attribute__((always_inline)) void *blockmap_find(uint64_t addr, bool remove,
                                                                 bool (*accept)(const void *, const void *),
                                                                 const void *arg, bool *refused)
{
	struct shard *s = shard_of(addr);
	void *value = NULL;
	size_t i;

	if (addr == 0)
		return NULL;

	shard_lock(s);
	if (s->slots != NULL) {
		i = shard_probe(s, addr);
		if (s->slots[i].key == addr) {
			value = s->slots[i].value;
			if (accept && !accept(value, arg)) {
				*refused = true;
				value = NULL;
			} else if (remove) {
				shard_remove_at(s, i);
				atomic_store_explicit(
				    &s->count, atomic_load_explicit(&s->count, memory_order_relaxed) - 1,
				    memory_order_relaxed);
			}
		}
	}
	shard_unlock(s);
	return value;
}

void *emm_blockmap_take(uint64_t addr)
{
	return blockmap_find(addr, true, NULL, NULL, NULL);
}

int emm_blockmap_take_if(uint64_t addr, bool (*accept)(const void *value, const void *arg), const void *arg,
                         void **ret_value)
{
	bool refused = false;
	void *value = blockmap_find(addr, true, accept, arg, &refused);

	if (!value)
		return refused ? -EXDEV : -ENOENT;
	*ret_value = value;
	return 0;
}

void *emm_blockmap_get(uint64_t addr)
{
	return blockmap_find(addr, false, NULL, NULL, NULL);
}

size_t emm_blockmap_count(void)
{
	size_t n = 0;

	for (unsigned i = 0; i < SHARD_COUNT; i++)
		n += atomic_load_explicit(&shards[i].count, memory_order_relaxed);
	return n;
}

void emm_blockmap_reset(void)
{
	/*
	 * In a fork child another (now nonexistent) thread may have held a
	 * shard lock, even in the middle of doubling a table. Take no lock:
	 * empty whichever table each shard points to (always a complete one,
	 * see shard_grow), keep its size, and free the lock. A table being
	 * replaced at the moment of the fork is simply not freed here.
	 */
	for (unsigned i = 0; i < SHARD_COUNT; i++) {
		struct shard *s = &shards[i];
		struct slot *slots = s->slots ? s->slots : s->initial;
		size_t nslots = table_slots(s, slots);

		memset(slots, 0, nslots * sizeof(*slots));
		s->slots = slots;
		s->mask = (uint32_t)(nslots - 1);
		s->shift = 64 - (unsigned)__builtin_ctzll((unsigned long long)nslots);
		atomic_store_explicit(&s->count, 0, memory_order_relaxed);
		atomic_store_explicit(&s->lock, 0, memory_order_release);
	}
}

void emm_ptrmap_reset(void)
{
	emm_blockmap_reset();
	emm_segmap_reset();
}
