/* SPDX-License-Identifier: MIT */
/*
 * tests/allocator/test-heap-tcache-reuse.c - a thread cache bound to a
 * destroyed heap is never counted for a new heap created at the same
 * address (allocator/heap_tcache.c, emm_tcache_add_counters): a thread
 * frees into its cache, the heap is destroyed while the thread lives, and
 * a new heap gets the old heap's and arenas' memory back. Linked with
 * -Wl,--wrap=calloc,--wrap=posix_memalign,--wrap=free (the heap with
 * calloc, its arenas on cache lines of their own; tests/allocator/
 * meson.build) so the reuse
 * is forced here, not left to the C library's allocator (nor to a
 * sanitizer's quarantine).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/heap.h"
#include "allocator/heap_internal.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define NARENAS 2

/* The memory of the heap and its arenas: kept at their free, handed back
 * (zeroed, in this order) by the callocs of the next heap's creation. */
void *__real_calloc(size_t n, size_t size);
int __real_posix_memalign(void **ret, size_t align, size_t size);
void __real_free(void *p);

static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
struct watched {
	void *p;
	size_t size;
	bool parked;
};
static struct watched watch[1 + NARENAS];
static unsigned nwatch;

void *__wrap_calloc(size_t n, size_t size);
int __wrap_posix_memalign(void **ret, size_t align, size_t size);
void __wrap_free(void *p);

/* A parked chunk of `size` bytes, zeroed, or NULL. */
static void *unpark(size_t size)
{
	pthread_mutex_lock(&watch_lock);
	for (unsigned i = 0; i < nwatch; i++) {
		if (watch[i].parked && watch[i].size == size) {
			void *p = watch[i].p;
			watch[i].parked = false;
			watch[i].p = NULL;
			pthread_mutex_unlock(&watch_lock);
			memset(p, 0, size);
			return p;
		}
	}
	pthread_mutex_unlock(&watch_lock);
	return NULL;
}

void *__wrap_calloc(size_t n, size_t size)
{
	void *p = unpark(n * size);

	return p ? p : __real_calloc(n, size);
}

int __wrap_posix_memalign(void **ret, size_t align, size_t size)
{
	void *p = unpark(size);

	if (!p)
		return __real_posix_memalign(ret, align, size);
	*ret = p;
	return 0;
}

void __wrap_free(void *p)
{
	pthread_mutex_lock(&watch_lock);
	for (unsigned i = 0; p && i < nwatch; i++) {
		if (watch[i].p == p && !watch[i].parked) {
			watch[i].parked = true;
			pthread_mutex_unlock(&watch_lock);
			return;
		}
	}
	pthread_mutex_unlock(&watch_lock);
	__real_free(p);
}

static void watch_heap(emm_heap_t *h)
{
	pthread_mutex_lock(&watch_lock);
	nwatch = 0;
	watch[nwatch++] = (struct watched){h, sizeof(*h), false};
	for (unsigned i = 0; i < h->narenas; i++)
		watch[nwatch++] = (struct watched){h->arenas[i], heap_lines_size(sizeof(*h->arenas[i])), false};
	pthread_mutex_unlock(&watch_lock);
}

static struct fake_src src;
static struct fake_fence fence;

static emm_heap_t *setup(bool thread_cache)
{
	struct emm_heap_params p;
	emm_heap_t *h = NULL;

	emm_heap_params_default(&p);
	p.arenas = NARENAS;
	p.thread_cache = thread_cache;
	p.free_mode = EMM_FREE_MODE_STREAM;
	if (fake_heap_create(&p, &src, SIZE_MAX, &fence, &h))
		return NULL;
	return h;
}

static void teardown(emm_heap_t *h, bool release)
{
	emm_heap_destroy(h, release);
	expect_u64_eq(src.used, 0);
	expect_int_eq(fence.misuse, 0);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

static pthread_barrier_t barrier;

/* A miss (counted in the arena) freed into the thread's cache: its
 * counters hold -1 MiB allocated, not yet added to the arena. The thread
 * then waits, bound to the heap, while the heap is destroyed and another
 * takes its place. */
static void *worker(void *arg)
{
	emm_heap_t *h = arg;

	xfree(xalloc(h, 1 * MIB, 0), 0);
	pthread_barrier_wait(&barrier);
	pthread_barrier_wait(&barrier);
	return NULL;
}

static void new_heap_at_the_same_address(bool thread_cache)
{
	emm_heap_t *h = setup(true), *old;
	struct arena *arenas[NARENAS];
	pthread_t t;
	assert_ptr_not_null(h);

	assert_int_eq(pthread_barrier_init(&barrier, NULL, 2), 0);
	assert_int_eq(pthread_create(&t, NULL, worker, h), 0);
	pthread_barrier_wait(&barrier);
	struct emm_stats st = heap_stats(h);
	expect_u64_eq(st.allocs, 1);
	expect_u64_eq(st.frees, 1);
	expect_u64_eq(st.allocated_bytes, 0);

	old = h;
	memcpy(arenas, h->arenas, sizeof(arenas));
	watch_heap(h);
	teardown(h, true);
	h = setup(thread_cache);
	assert_ptr_not_null(h);
	/* The condition under test, forced: same heap, same arenas. */
	pthread_mutex_lock(&watch_lock);
	for (unsigned i = 0; i < nwatch; i++)
		if (watch[i].parked)
			__real_free(watch[i].p); /* not handed back: the C library's again */
	nwatch = 0;
	pthread_mutex_unlock(&watch_lock);
	expect_ptr_eq(h, old);
	for (unsigned i = 0; i < NARENAS; i++)
		expect_ptr_eq(h->arenas[i], arenas[i]);

	/* A new heap starts from nothing: no frees, no negative (wrapped)
	 * allocated bytes or peak from the old heap's thread cache. */
	st = heap_stats(h);
	expect_u64_eq(st.allocs, 0);
	expect_u64_eq(st.frees, 0);
	expect_u64_eq(st.live_blocks, 0);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_u64_eq(st.requested_bytes, 0);
	expect_u64_eq(st.allocated_bytes_total, 0);
	expect_u64_eq(st.allocated_bytes_peak, 0);
	expect_u64_eq(st.requested_bytes_peak, 0);
	expect_u64_eq(st.allocated_bytes_peak_error, 0);
	size_t idle = 1, largest = 1;
	emm_heap_idle_info(h, &idle, &largest);
	expect_u64_eq(idle, 0);

	/* And it counts its own blocks only. */
	emm_addr_t a = xalloc(h, 64 * KIB, 0);
	st = heap_stats(h);
	expect_u64_eq(st.allocs, 1);
	expect_u64_eq(st.allocated_bytes, 64 * KIB);
	expect_u64_eq(st.allocated_bytes_peak, 64 * KIB);
	xfree(a, 0);

	pthread_barrier_wait(&barrier);
	pthread_join(t, NULL);
	pthread_barrier_destroy(&barrier);
	expect_int_eq(emm_heap_flush(h), 0);
	expect_u64_eq(heap_stats(h).allocated_bytes, 0);
	teardown(h, true);
}

TEST_BEGIN(test_new_heap_with_a_thread_cache_at_the_same_address)
{
	new_heap_at_the_same_address(true);
}
TEST_END

TEST_BEGIN(test_new_heap_without_a_thread_cache_at_the_same_address)
{
	/* emm-replay --compare: an EMM_FREE_MODE=stream row after an
	 * EMM_THREAD_CACHE=1 row. */
	new_heap_at_the_same_address(false);
}
TEST_END

int main(void)
{
	return emm_test_run(test_new_heap_with_a_thread_cache_at_the_same_address,
	                    test_new_heap_without_a_thread_cache_at_the_same_address, NULL);
}
