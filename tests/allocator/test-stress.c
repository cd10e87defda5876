/* SPDX-License-Identifier: MIT */
/*
 * test-stress: 8 threads allocate and free concurrently on one shared heap
 * (synchronous and stream-ordered, each thread on its own per-thread key
 * and a shared stream), while one more thread completes fences, flushes,
 * creates and destroys a non-blocking stream and releases idle memory.
 * Each thread writes its tag into a shared shadow array at its blocks'
 * first granule index and checks it before freeing, so two threads holding
 * the same memory would be seen. emm_heap_check and the counters at the
 * end. Built to run clean under helgrind and -fsanitize=thread.
 */
#include <errno.h>
#include <stdatomic.h>
#include <time.h>

#include "allocator/heap.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

#define THREADS       8
#define HELD          64
#define SHARED_STREAM ((emm_stream_t)0x4000)

static unsigned iterations = 60000;
static emm_heap_t *heap;
static struct fake_src src;
static struct fake_fence fence;
static atomic_bool stop;
static atomic_long errors;
static atomic_long total_ops;

/* Shadow ownership: one atomic word per 512 B granule of an 8 GiB window of
 * fake address space starting at this run's first segment, checked at the
 * first granule of each block (blocks never share one). calloc'd, so only
 * touched pages cost memory; addresses past the window are not checked. */
#define SHADOW_SLOTS (1u << 24)
static _Atomic uint32_t *shadow;
static uint64_t shadow_base;
static atomic_long unchecked;

static _Atomic uint32_t *slot_of(emm_addr_t a)
{
	uint64_t i = (a - shadow_base) / 512;
	if (i >= SHADOW_SLOTS) {
		atomic_fetch_add_explicit(&unchecked, 1, memory_order_relaxed);
		return NULL;
	}
	return &shadow[i];
}

struct held {
	emm_addr_t addr;
	size_t size;
	emm_stream_t stream;
};

static uint64_t xs(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dull;
}

static void *worker(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	uint64_t rng = 0x1234567ull * (id + 1);
	struct held held[HELD];
	unsigned n = 0;
	emm_stream_t own = EMM_STREAM_PER_THREAD_KEY(id);
	uint32_t tag = id + 1;

	for (unsigned it = 0; it < iterations; it++) {
		uint64_t r = xs(&rng);
		if (n < HELD && (n == 0 || r % 2)) {
			size_t size = r % 16 ? 1 + (size_t)(xs(&rng) % (64 * KIB))
			                     : 1 + (size_t)(xs(&rng) % (12 * MIB));
			emm_stream_t s = (r >> 8) % 3 == 0   ? EMM_STREAM_SYNC
			                 : (r >> 8) % 3 == 1 ? own
			                                     : SHARED_STREAM;
			emm_addr_t a;
			int rc = emm_heap_alloc(heap, size, s, &a);
			if (rc == -ENOMEM)
				continue;
			if (rc) {
				atomic_fetch_add(&errors, 1);
				continue;
			}
			uint32_t expect = 0;
			_Atomic uint32_t *slot = slot_of(a);
			if (slot && !atomic_compare_exchange_strong(slot, &expect, tag)) {
				fprintf(stderr, "thread %u: 0x%llx already owned by %u\n", id,
				        (unsigned long long)a, expect);
				atomic_fetch_add(&errors, 1);
			}
			held[n++] = (struct held){a, size, s};
		} else {
			unsigned i = (unsigned)(xs(&rng) % n);
			struct held hb = held[i];
			held[i] = held[--n];
			uint32_t expect = tag;
			_Atomic uint32_t *slot = slot_of(hb.addr);
			if (slot && !atomic_compare_exchange_strong(slot, &expect, 0)) {
				fprintf(stderr, "thread %u: lost 0x%llx to %u\n", id,
				        (unsigned long long)hb.addr, expect);
				atomic_fetch_add(&errors, 1);
			}
			size_t req = 0;
			emm_stream_t fs = (r >> 16) % 2 ? EMM_STREAM_SYNC : hb.stream;
			if (emm_heap_free(hb.addr, fs, &req) != 0 || req != hb.size)
				atomic_fetch_add(&errors, 1);
		}
		atomic_fetch_add_explicit(&total_ops, 1, memory_order_relaxed);
	}
	while (n) {
		struct held hb = held[--n];
		_Atomic uint32_t *slot = slot_of(hb.addr);
		if (slot)
			atomic_store(slot, 0);
		if (emm_heap_free(hb.addr, hb.stream, NULL) != 0)
			atomic_fetch_add(&errors, 1);
	}
	return NULL;
}

/* The embedder's side: fences complete, streams come and go, flushes. */
static void *housekeeper(void *arg)
{
	(void)arg;
	uint64_t rng = 42;
	emm_stream_t nb = 0x90000;
	bool nb_live = false;
	while (!atomic_load(&stop)) {
		uint64_t r = xs(&rng) % 100;
		if (r < 50)
			fake_complete(&fence, 0);
		else if (r < 60)
			emm_heap_flush(heap);
		else if (r < 70) {
			if (nb_live) {
				emm_heap_stream_destroyed(heap, nb);
				nb += 0x100;
			} else {
				emm_heap_stream_created(heap, nb, true);
			}
			nb_live = !nb_live;
		} else if (r < 72) {
			emm_heap_release_idle(heap, 64 * MIB);
		} else if (r < 74) {
			struct emm_stats st = heap_stats(heap);
			(void)st;
			size_t idle, largest;
			emm_heap_idle_info(heap, &idle, &largest);
		}
		struct timespec ts = {0, 20000};
		nanosleep(&ts, NULL);
	}
	if (nb_live)
		emm_heap_stream_destroyed(heap, nb);
	return NULL;
}

static void run(enum emm_free_mode mode, size_t release_threshold, unsigned arenas, size_t capacity, bool tcache)
{
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.thread_cache = tcache;
	p.free_mode = mode;
	p.release_threshold = release_threshold;
	p.arenas = arenas;
	heap = NULL;
	if (fake_heap_create(&p, &src, capacity, &fence, &heap) != 0) {
		emm_test_fail_("heap create");
		return;
	}
	pthread_mutex_lock(&fake_bump_lock);
	shadow_base = fake_bump; /* every address this run hands out is above */
	pthread_mutex_unlock(&fake_bump_lock);
	atomic_store(&unchecked, 0);
	atomic_store(&stop, false);
	atomic_store(&errors, 0);

	pthread_t th[THREADS], hk;
	pthread_create(&hk, NULL, housekeeper, NULL);
	for (unsigned i = 0; i < THREADS; i++)
		pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
	for (unsigned i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	atomic_store(&stop, true);
	pthread_join(hk, NULL);

	expect_int_eq(atomic_load(&errors), 0);
	expect_int_eq(emm_heap_check(heap), 0);
	struct emm_stats st = heap_stats(heap);
	expect_u64_eq(st.live_blocks, 0);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_u64_eq(st.requested_bytes, 0);
	expect_u64_eq(st.allocs, st.frees);
	expect_u64_eq(st.reserved_bytes, src.used);
	expect_true(st.allocated_bytes_peak <= st.reserved_bytes_peak);
	expect_true(st.requested_bytes_peak <= st.allocated_bytes_peak);
	fprintf(stderr,
	        "  mode %d%s, %u arenas, %zu MiB: %llu allocs, hits %llu, misses %llu, epochs %llu, stream "
	        "waits %llu, "
	        "oom retries %llu, %ld unchecked, backend %llu/%llu, peak reserved %llu MiB, peak allocated "
	        "%llu MiB\n",
	        (int)mode, tcache ? " (thread cache)" : "", arenas, capacity >> 20, (unsigned long long)st.allocs, (unsigned long long)st.hits,
	        (unsigned long long)st.misses, (unsigned long long)st.epochs_closed,
	        (unsigned long long)st.stream_waits, (unsigned long long)st.oom_retries,
	        atomic_load(&unchecked), (unsigned long long)st.backend_allocs,
	        (unsigned long long)st.backend_frees, (unsigned long long)(st.reserved_bytes_peak >> 20),
	        (unsigned long long)(st.allocated_bytes_peak >> 20));
	emm_heap_destroy(heap, true);
	expect_u64_eq(src.used, 0);
	expect_int_eq(src.bad_frees, 0);
	expect_int_eq(fence.misuse, 0);
	expect_int_eq(fake_live_events(&fence), 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

TEST_BEGIN(test_stress_fence)
{
	run(EMM_FREE_MODE_FENCE, SIZE_MAX, 8, 2048 * MIB, false);
}
TEST_END

TEST_BEGIN(test_stress_strict_release)
{
	run(EMM_FREE_MODE_STRICT, 32 * MIB, 1, 2048 * MIB, false);
}
TEST_END

TEST_BEGIN(test_stress_stream)
{
	run(EMM_FREE_MODE_STREAM, 0, 4, 2048 * MIB, false);
}
TEST_END

/* Tight memory: allocations fail and recover across arenas concurrently. */
TEST_BEGIN(test_stress_oom)
{
	run(EMM_FREE_MODE_FENCE, SIZE_MAX, 4, 160 * MIB, false);
}
TEST_END

/* The same with the per-thread cache (EMM_THREAD_CACHE=1): blocks a thread
 * frees wait in its own epoch and bins; four arenas for eight threads, so
 * two threads share each arena (and free into each other's). */
TEST_BEGIN(test_stress_tcache)
{
	run(EMM_FREE_MODE_FENCE, SIZE_MAX, 4, 2048 * MIB, true);
}
TEST_END

TEST_BEGIN(test_stress_tcache_oom)
{
	run(EMM_FREE_MODE_FENCE, SIZE_MAX, 4, 160 * MIB, true);
}
TEST_END

int main(void)
{
	/* Under valgrind or TSan (EMM_STRESS_ITERS), fewer iterations. */
	const char *e = getenv("EMM_STRESS_ITERS");
	if (e && atoi(e) > 0)
		iterations = (unsigned)atoi(e);
	shadow = calloc(SHADOW_SLOTS, sizeof(*shadow));
	if (!shadow)
		return 1;
	int r = emm_test_run(test_stress_fence, test_stress_strict_release, test_stress_stream,
	                     test_stress_oom, test_stress_tcache, test_stress_tcache_oom, NULL);
	free((void *)shadow);
	return r;
}
