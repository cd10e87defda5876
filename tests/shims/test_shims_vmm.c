/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/test_shims_vmm.c - libemm's VMM shims and cache over the
 * test-double driver (tests/fakecuda/fake_vmm.c), run with
 * LD_PRELOAD=libemm.so. Modes (argv[1]):
 *   (none)     the cache: XLA's pattern served without the driver on the
 *              second round, the sleep pattern gives memory back, shared
 *              handles and foreign ranges pass through, the fence holds a
 *              freed buffer until its events complete, OOM, cuMemGetInfo,
 *              emm_release_idle, fork, threads
 *   codes      error codes of misuse (the same list passes under
 *              EMM_DISABLE=1, so libemm's answers are the driver's)
 *   count      EMM_VMM=count: passed through, counted
 *   off        EMM_VMM=off: passed through, not counted
 *   threshold  EMM_RELEASE_THRESHOLD=0: nothing stays idle
 * Without the fake's VMM calls every mode exits 77.
 */
#include <pthread.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "emm_test.h"
#include "shims_common.h"
#include "vmm_calls.h"

#define MIB ((size_t)1 << 20)

static const char *const vmm_names[] = {"cuMemAddressReserve", "cuMemCreate", "cuMemMap", "cuMemSetAccess",
                                        "cuMemUnmap", "cuMemRelease", "cuMemAddressFree"};

static CUmemAllocationProp prop0(CUmemAllocationHandleType types)
{
	return vmm_call_prop(0, types);
}

static CUmemAccessDesc access0(void)
{
	return vmm_call_access(0);
}

/* XLA's allocation on device 0: reserve, create, map, set access. */
static CUresult xla_alloc_t(struct vmm_buf *b, size_t size, CUmemAllocationHandleType types)
{
	CUmemAllocationProp p = prop0(types);
	CUmemAccessDesc d = access0();

	return vmm_call_alloc(b, size, &p, &d, 1);
}

static CUresult xla_alloc(struct vmm_buf *b, size_t size)
{
	return xla_alloc_t(b, size, CU_MEM_HANDLE_TYPE_NONE);
}

static uint64_t vmm_calls(void)
{
	uint64_t n = 0;

	for (size_t i = 0; i < sizeof(vmm_names) / sizeof(vmm_names[0]); i++)
		n += fakecuda_calls(vmm_names[i]);
	return n;
}

static bool wait_used_at_most(size_t bytes, int ms)
{
	for (int i = 0; i < ms; i++) {
		if (fakecuda_mem_used(0) <= bytes)
			return true;
		usleep(1000);
	}
	return fakecuda_mem_used(0) <= bytes;
}

/* Round after round of the same shapes: from the second on, no driver
 * VMM call at all, and the data written is there. */
TEST_BEGIN(test_xla_pattern_served_from_cache)
{
	static const size_t sizes[] = {2 * MIB, 4 * MIB, 2 * MIB, 16 * MIB};
	struct vmm_buf b[4];
	struct emm_stats s0, s1;

	shims_stats(-1, &s0);
	for (int round = 0; round < 3; round++) {
		fakecuda_reset_counters();
		for (int i = 0; i < 4; i++) {
			assert_int_eq(xla_alloc(&b[i], sizes[i]), CUDA_SUCCESS);
			memset((void *)(uintptr_t)b[i].va, 0x40 + i, sizes[i]);
		}
		for (int i = 0; i < 4; i++) {
			const unsigned char *p = (const unsigned char *)(uintptr_t)b[i].va;
			expect_true(p[0] == 0x40 + i && p[sizes[i] - 1] == 0x40 + i);
		}
		for (int i = 3; i >= 0; i--)
			assert_int_eq(vmm_call_free(&b[i]), CUDA_SUCCESS);
		if (round > 0)
			expect_u64_eq(vmm_calls(), 0);
	}
	shims_stats(-1, &s1);
	expect_u64_eq(s1.vmm_allocs - s0.vmm_allocs, 12);
	expect_u64_eq(s1.vmm_hits - s0.vmm_hits, 8);
	expect_u64_eq(s1.vmm_misses - s0.vmm_misses, 4);
	expect_u64_eq(s1.vmm_hit_bytes_total - s0.vmm_hit_bytes_total, 2 * 24 * MIB);
	expect_u64_eq(s1.vmm_idle_bytes, 24 * MIB);
}
TEST_END

/* vLLM's sleep: unmap + release keeping the range gives the memory back
 * (by the reaper, or at once through the thread's next VMM call or
 * cuMemGetInfo); mapping again works. */
TEST_BEGIN(test_sleep_pattern_gives_memory_back)
{
	CUmemAllocationProp p = prop0(CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = access0();
	struct vmm_buf b, other;
	size_t base, fr, tot;

	shims_release_idle(-1, 0);
	base = fakecuda_mem_used(0);
	for (int how = 0; how < 3; how++) {
		assert_int_eq(xla_alloc(&b, 16 * MIB), CUDA_SUCCESS);
		assert_u64_eq(fakecuda_mem_used(0), base + 16 * MIB);
		assert_int_eq(cuMemUnmap(b.va, b.size), CUDA_SUCCESS);
		assert_int_eq(cuMemRelease(b.h), CUDA_SUCCESS);
		if (how == 0) {
			expect_true(wait_used_at_most(base, 1000)); /* the reaper */
		} else if (how == 1) {
			assert_int_eq(cuMemGetInfo(&fr, &tot), CUDA_SUCCESS);
			expect_u64_eq(fakecuda_mem_used(0), base);
		} else {
			assert_int_eq(cuMemAddressReserve(&other.va, 2 * MIB, 0, 0, 0), CUDA_SUCCESS);
			expect_u64_eq(fakecuda_mem_used(0), base);
			assert_int_eq(cuMemAddressFree(other.va, 2 * MIB), CUDA_SUCCESS);
		}
		/* Wake up: a new handle in the same range. */
		assert_int_eq(cuMemCreate(&b.h, b.size, &p, 0), CUDA_SUCCESS);
		assert_int_eq(cuMemMap(b.va, b.size, 0, b.h, 0), CUDA_SUCCESS);
		assert_int_eq(cuMemSetAccess(b.va, b.size, &d, 1), CUDA_SUCCESS);
		memset((void *)(uintptr_t)b.va, 7, b.size);
		assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
		shims_release_idle(-1, 0);
		expect_u64_eq(fakecuda_mem_used(0), base);
	}
}
TEST_END

/* XLA's real order (seen on an H100 with JAX 0.11): the handle first
 * (POSIX file descriptors requested, GPUDirect RDMA capable), then the range
 * aligned to its size, map, access. From the second round on libemm answers
 * all of it without the driver, and the data are the program's. */
TEST_BEGIN(test_xla_create_first_order)
{
	CUmemAllocationProp p = prop0(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	CUmemAccessDesc d = access0();
	struct vmm_buf b;

	p.allocFlags.gpuDirectRDMACapable = 1;
	for (int round = 0; round < 4; round++) {
		if (round == 1)
			fakecuda_reset_counters();
		b.size = 2 * MIB;
		assert_int_eq(cuMemCreate(&b.h, b.size, &p, 0), CUDA_SUCCESS);
		assert_int_eq(cuMemAddressReserve(&b.va, b.size, b.size, 0, 0), CUDA_SUCCESS);
		assert_int_eq(cuMemMap(b.va, b.size, 0, b.h, 0), CUDA_SUCCESS);
		assert_int_eq(cuMemSetAccess(b.va, b.size, &d, 1), CUDA_SUCCESS);
		memset((void *)(uintptr_t)b.va, round + 1, b.size);
		expect_int_eq(((unsigned char *)(uintptr_t)b.va)[b.size - 1], round + 1);
		assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	}
	expect_u64_eq(vmm_calls(), 0);
}
TEST_END

/* A freed buffer nobody takes goes back to the device after a second. */
TEST_BEGIN(test_idle_buffer_given_back_after_a_second)
{
	size_t base;
	struct vmm_buf b;

	shims_release_idle(-1, 0);
	base = fakecuda_mem_used(0);
	assert_int_eq(xla_alloc(&b, 12 * MIB), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	expect_true(fakecuda_mem_used(0) >= base + 12 * MIB); /* kept for reuse */
	expect_true(wait_used_at_most(base, 3000));          /* the reaper, after ~1 s */
}
TEST_END

/* A handle that only may be shared (a shareable type requested, as XLA
 * does for every buffer) is cached like any other until it is exported
 * (the GPU test vmm-cache checks that an exported one never is: the fake
 * has no export); retained handles are never cached; a range mapped in part
 * or by a foreign handle size passes through. */
TEST_BEGIN(test_shared_and_partial_pass_through)
{
	CUmemAllocationProp p = prop0(CU_MEM_HANDLE_TYPE_NONE);
	CUmemGenericAllocationHandle h;
	CUdeviceptr va;
	struct vmm_buf b;

	for (int round = 0; round < 2; round++) {
		assert_int_eq(xla_alloc_t(&b, 4 * MIB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), CUDA_SUCCESS);
		fakecuda_reset_counters();
		assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
		expect_u64_eq(vmm_calls(), 0);
	}
	for (int round = 0; round < 2; round++) {
		assert_int_eq(xla_alloc(&b, 6 * MIB), CUDA_SUCCESS);
		assert_int_eq(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)b.va), CUDA_SUCCESS);
		assert_int_eq(cuMemRelease(h), CUDA_SUCCESS);
		fakecuda_reset_counters();
		assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
		expect_u64_eq(vmm_calls(), 3);
	}
	/* Half of a reservation mapped (PyTorch's expandable segments). */
	assert_int_eq(cuMemAddressReserve(&va, 8 * MIB, 0, 0, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemCreate(&h, 4 * MIB, &p, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemMap(va, 4 * MIB, 0, h, 0), CUDA_SUCCESS);
	fakecuda_reset_counters();
	assert_int_eq(cuMemUnmap(va, 4 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemRelease(h), CUDA_SUCCESS);
	assert_int_eq(cuMemAddressFree(va, 8 * MIB), CUDA_SUCCESS);
	expect_u64_eq(vmm_calls(), 3);
	/* A partial unmap of a cacheable buffer is the driver's to refuse; the
	 * whole free afterwards still works. */
	assert_int_eq(xla_alloc(&b, 4 * MIB), CUDA_SUCCESS);
	expect_int_eq(cuMemUnmap(b.va, 2 * MIB), CUDA_ERROR_INVALID_VALUE);
	fakecuda_reset_counters();
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	expect_u64_eq(vmm_calls(), 3);
	/* A handle mapped twice is never cached. */
	assert_int_eq(xla_alloc(&b, 4 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemAddressReserve(&va, 4 * MIB, 0, 0, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemMap(va, 4 * MIB, 0, b.h, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemUnmap(va, 4 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemAddressFree(va, 4 * MIB), CUDA_SUCCESS);
	fakecuda_reset_counters();
	assert_int_eq(vmm_call_free(&b), CUDA_SUCCESS);
	expect_u64_eq(vmm_calls(), 3);
}
TEST_END

/* Freed buffer `a` (`size` bytes) is still in use: the next allocation of
 * its size, into *b, gets a new one from the driver, without a host wait. */
static void expect_not_reused(const struct vmm_buf *a, size_t size, struct vmm_buf *b)
{
	assert_int_eq(xla_alloc(b, size), CUDA_SUCCESS);
	expect_true(b->va != a->va);
	expect_u64_eq(fakecuda_calls("cuMemCreate"), 1);
	expect_u64_eq(fake_stats().event_syncs + fake_stats().ctx_syncs, 0); /* no host wait */
}

/* Once its work is done (events complete from here on), `a`'s buffer is
 * the next allocation of its size, with no driver call; then that buffer
 * and b are freed. */
static void expect_reused(const struct vmm_buf *a, size_t size, struct vmm_buf *b)
{
	struct vmm_buf c;

	fakecuda_set_event_delay(0);
	fakecuda_reset_counters();
	assert_int_eq(xla_alloc(&c, size), CUDA_SUCCESS);
	expect_true(c.va == a->va);
	expect_u64_eq(vmm_calls(), 0);
	assert_int_eq(vmm_call_free(b), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&c), CUDA_SUCCESS);
}

/* A freed buffer is not handed out before the work issued before its free
 * has finished (its events complete); then it is. */
TEST_BEGIN(test_fence_holds_freed_buffer)
{
	struct vmm_buf a, b;
	CUstream nb;

	assert_int_eq(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	shims_release_idle(-1, 0);
	fakecuda_set_event_delay(1000000);
	assert_int_eq(xla_alloc(&a, 10 * MIB), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&a), CUDA_SUCCESS);
	fakecuda_reset_counters();
	assert_(expect_not_reused(&a, 10 * MIB, &b));
	fakecuda_complete_all();
	assert_(expect_reused(&a, 10 * MIB, &b));
	assert_int_eq(cuStreamDestroy(nb), CUDA_SUCCESS);
}
TEST_END

/* XLA's platform allocator synchronizes the context before every free:
 * such a free records no event and queries no stream (process/vmm_sync.c);
 * the buffer is taken once a later synchronisation covers it, and the last
 * one freed before the allocations (no synchronisation since) is fenced
 * by events at its reuse. Without the synchronisations every free records
 * its event, as before. */
TEST_BEGIN(test_sync_before_free_needs_no_fence)
{
	enum { NS = 18, NB = 3, ROUNDS = 3 };
	CUstream s[NS];
	struct vmm_buf b[NB];
	unsigned long long records[2], queries[2], driver[2];

	for (int i = 0; i < NS; i++)
		assert_int_eq(cuStreamCreate(&s[i], CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	for (int sync = 1; sync >= 0; sync--) {
		shims_release_idle(-1, 0);
		for (int round = 0; round <= ROUNDS; round++) {
			if (round == 1)
				fakecuda_reset_counters();
			for (int i = 0; i < NB; i++)
				assert_int_eq(xla_alloc(&b[i], 4 * MIB), CUDA_SUCCESS);
			for (int i = 0; i < NB; i++) {
				if (sync)
					assert_int_eq(cuCtxSynchronize(), CUDA_SUCCESS);
				assert_int_eq(vmm_call_free(&b[i]), CUDA_SUCCESS);
			}
		}
		records[sync] = fakecuda_calls("cuEventRecord");
		queries[sync] = fakecuda_calls("cuStreamQuery");
		driver[sync] = vmm_calls();
	}
	/* Every round's allocations from the cache, with or without. */
	expect_u64_eq(driver[0], 0);
	expect_u64_eq(driver[1], 0);
	/* Without: an event and a query of each stream per free. */
	expect_u64_eq(records[0], ROUNDS * NB);
	expect_u64_eq(queries[0], ROUNDS * NB * NS);
	/* With: per round, only the last buffer freed is fenced by events. */
	expect_u64_eq(records[1], ROUNDS);
	expect_u64_eq(queries[1], ROUNDS * NS);
	for (int i = 0; i < NS; i++)
		assert_int_eq(cuStreamDestroy(s[i]), CUDA_SUCCESS);
}
TEST_END

/* A free made after a synchronisation takes no event (the lazy path), but
 * work issued after that synchronisation may still use the buffer: it is
 * not handed back before a later synchronisation or its events say so. */
TEST_BEGIN(test_lazy_free_waits_for_later_work)
{
	struct vmm_buf a, b;
	CUstream nb;

	assert_int_eq(cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
	shims_release_idle(-1, 0);
	assert_int_eq(xla_alloc(&a, 6 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuCtxSynchronize(), CUDA_SUCCESS);
	fakecuda_set_event_delay(1000000); /* the work issued from here on runs on */
	fakecuda_reset_counters();
	assert_int_eq(vmm_call_free(&a), CUDA_SUCCESS);
	expect_u64_eq(fakecuda_calls("cuEventRecord"), 0); /* lazy: fenced by the next sync */
	/* Not covered: its events, recorded now, are not done. */
	assert_(expect_not_reused(&a, 6 * MIB, &b));
	assert_int_eq(cuCtxSynchronize(), CUDA_SUCCESS); /* covers a's free */
	assert_(expect_reused(&a, 6 * MIB, &b));
	assert_int_eq(cuStreamDestroy(nb), CUDA_SUCCESS);
}
TEST_END

/* Idle VMM memory is free memory: cuMemGetInfo counts it, emm_release_idle
 * and an out-of-memory cuMemCreate or cuMemAlloc give it back. */
TEST_BEGIN(test_idle_is_free_memory)
{
	struct vmm_buf b[6];
	size_t fr, tot, used;
	CUmemAllocationProp p = prop0(CU_MEM_HANDLE_TYPE_NONE);
	CUmemGenericAllocationHandle h;
	CUdeviceptr d;

	shims_release_idle(-1, 0);
	used = fakecuda_mem_used(0);
	for (int i = 0; i < 6; i++)
		assert_int_eq(xla_alloc(&b[i], 8 * MIB), CUDA_SUCCESS);
	for (int i = 0; i < 6; i++)
		assert_int_eq(vmm_call_free(&b[i]), CUDA_SUCCESS);
	expect_u64_eq(fakecuda_mem_used(0), used + 48 * MIB);
	assert_int_eq(cuMemGetInfo(&fr, &tot), CUDA_SUCCESS);
	expect_u64_eq(fr, tot - used);
	expect_true(shims_release_idle(-1, 0) >= (long long)(48 * MIB));
	expect_u64_eq(fakecuda_mem_used(0), used);

	/* Out of memory: 48 MiB idle, 64 MiB of room left, 32 MiB asked. */
	fakecuda_set_mem_capacity(used + 64 * MIB);
	for (int i = 0; i < 6; i++)
		assert_int_eq(xla_alloc(&b[i], 8 * MIB), CUDA_SUCCESS);
	for (int i = 0; i < 6; i++)
		assert_int_eq(vmm_call_free(&b[i]), CUDA_SUCCESS);
	assert_int_eq(cuMemCreate(&h, 32 * MIB, &p, 0), CUDA_SUCCESS);
	assert_int_eq(cuMemRelease(h), CUDA_SUCCESS);
	for (int i = 0; i < 6; i++)
		assert_int_eq(xla_alloc(&b[i], 8 * MIB), CUDA_SUCCESS);
	for (int i = 0; i < 6; i++)
		assert_int_eq(vmm_call_free(&b[i]), CUDA_SUCCESS);
	assert_int_eq(cuMemAlloc(&d, 40 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemFree(d), CUDA_SUCCESS);
	shims_release_idle(-1, 0);
	fakecuda_set_mem_capacity((size_t)80 << 30);
}
TEST_END

static CUcontext g_ctx;

static void *thread_rounds(void *arg)
{
	size_t size = (size_t)(uintptr_t)arg;
	intptr_t bad = 0;

	if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS)
		return (void *)1;
	for (int round = 0; round < 50; round++) {
		struct vmm_buf b;
		if (xla_alloc(&b, size) != CUDA_SUCCESS)
			return (void *)1;
		memset((void *)(uintptr_t)b.va, round, 4096);
		bad |= ((unsigned char *)(uintptr_t)b.va)[4095] != (unsigned char)round;
		if (vmm_call_free(&b) != CUDA_SUCCESS)
			return (void *)1;
	}
	return (void *)bad;
}

TEST_BEGIN(test_threads)
{
	pthread_t t[4];
	void *ret;

	for (int i = 0; i < 4; i++)
		assert_int_eq(pthread_create(&t[i], NULL, thread_rounds, (void *)(uintptr_t)((size_t)(1 + i % 2) * 2 * MIB)), 0);
	for (int i = 0; i < 4; i++) {
		pthread_join(t[i], &ret);
		expect_ptr_null(ret);
	}
}
TEST_END

/* fork with live, pending and idle VMM buffers: the parent's pending
 * deferral is made real before the child exists; the child does not touch
 * the parent's objects; the parent goes on; exit with live mappings. */
TEST_BEGIN(test_fork_and_exit_with_live_mappings)
{
	struct vmm_buf live, idle, sleep;
	size_t used;
	pid_t pid;
	int status;

	assert_int_eq(xla_alloc(&live, 2 * MIB), CUDA_SUCCESS);
	assert_int_eq(xla_alloc(&idle, 4 * MIB), CUDA_SUCCESS);
	assert_int_eq(vmm_call_free(&idle), CUDA_SUCCESS);
	assert_int_eq(xla_alloc(&sleep, 6 * MIB), CUDA_SUCCESS);
	used = fakecuda_mem_used(0);
	assert_int_eq(cuMemUnmap(sleep.va, sleep.size), CUDA_SUCCESS);
	assert_int_eq(cuMemRelease(sleep.h), CUDA_SUCCESS);
	pid = fork();
	if (pid == 0) {
		struct vmm_buf c;
		/* CUDA is unusable in the child: the call fails, nothing crashes. */
		_exit(xla_alloc(&c, 4 * MIB) == CUDA_SUCCESS ? 3 : 0);
	}
	assert_true(pid > 0);
	expect_true(fakecuda_mem_used(0) <= used - 6 * MIB);
	assert_int_eq(waitpid(pid, &status, 0), pid);
	expect_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_eq(cuMemAddressFree(sleep.va, sleep.size), CUDA_SUCCESS);
	/* A child that exits with live mappings and idle buffers of its own
	 * is not our concern here: the parent exits so, after main. */
	(void)live;
}
TEST_END

/* dlsym on libcuda.so.1 (XLA) and cuGetProcAddress (cudart) hand out
 * libemm's shims for the VMM calls. */
TEST_BEGIN(test_lookups_substituted)
{
	static const char *const names[] = {"cuMemCreate", "cuMemRelease", "cuMemAddressReserve", "cuMemAddressFree",
	                                    "cuMemMap", "cuMemUnmap", "cuMemSetAccess", "cuMemGetAccess"};
	void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	CUdriverProcAddressQueryResult q;
	Dl_info info;
	void *fn;

	assert_ptr_not_null(lib);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		fn = dlsym(lib, names[i]);
		expect_true(fn && dladdr(fn, &info) && strstr(info.dli_fname, "libemm"));
		fn = NULL;
		expect_int_eq(cuGetProcAddress(names[i], &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q), CUDA_SUCCESS);
		expect_true(fn && dladdr(fn, &info) && strstr(info.dli_fname, "libemm"));
	}
}
TEST_END

/* The other orders a program may free in: the handle released while
 * mapped (then unmap, free the range), or the range freed before the
 * handle. Both are cached; mapping a released handle is the driver's
 * error. */
TEST_BEGIN(test_free_orders)
{
	struct vmm_buf b;

	for (int round = 0; round < 3; round++) {
		fakecuda_reset_counters();
		assert_int_eq(xla_alloc(&b, 12 * MIB), CUDA_SUCCESS);
		assert_int_eq(cuMemRelease(b.h), CUDA_SUCCESS);
		memset((void *)(uintptr_t)b.va, 1, b.size); /* still mapped */
		assert_int_eq(cuMemUnmap(b.va, b.size), CUDA_SUCCESS);
		assert_int_eq(cuMemAddressFree(b.va, b.size), CUDA_SUCCESS);
		assert_int_eq(xla_alloc(&b, 12 * MIB), CUDA_SUCCESS);
		assert_int_eq(cuMemUnmap(b.va, b.size), CUDA_SUCCESS);
		assert_int_eq(cuMemAddressFree(b.va, b.size), CUDA_SUCCESS);
		assert_int_eq(cuMemRelease(b.h), CUDA_SUCCESS);
		if (round > 0)
			expect_u64_eq(vmm_calls(), 0);
	}
	assert_int_eq(xla_alloc(&b, 12 * MIB), CUDA_SUCCESS);
	assert_int_eq(cuMemRelease(b.h), CUDA_SUCCESS);
	assert_int_eq(cuMemUnmap(b.va, b.size), CUDA_SUCCESS);
	expect_int_eq(cuMemMap(b.va, b.size, 0, b.h, 0), CUDA_ERROR_INVALID_VALUE);
	assert_int_eq(cuMemAddressFree(b.va, b.size), CUDA_SUCCESS);
}
TEST_END

/* --- modes ----------------------------------------------------------------- */

/* Misuse answered the same with and without libemm (run both ways). */
static int mode_codes(void)
{
	CUmemAllocationProp p = prop0(CU_MEM_HANDLE_TYPE_NONE);
	CUmemAccessDesc d = access0();
	CUmemGenericAllocationHandle h;
	unsigned long long fl;
	CUdeviceptr va;
	struct vmm_buf b, c;
	int bad = 0;

#define CODE(call, want)                                                                                     \
	do {                                                                                                 \
		CUresult r_ = (call);                                                                        \
		printf("RC %-60s %d\n", #call, (int)r_);                                                     \
		if (r_ != (want)) {                                                                          \
			fprintf(stderr, "%s: %d, want %d\n", #call, (int)r_, (int)(want));                   \
			bad = 1;                                                                             \
		}                                                                                            \
	} while (0)
	CODE(cuMemAddressReserve(&va, 2 * MIB, 3 * MIB, 0, 0), CUDA_ERROR_INVALID_VALUE);
	CODE(cuMemCreate(&h, 2 * MIB, &p, 1), CUDA_ERROR_INVALID_VALUE);
	CODE(cuMemCreate(NULL, 2 * MIB, &p, 0), CUDA_ERROR_INVALID_VALUE);
	for (int round = 0; round < 2; round++) {
		CODE(xla_alloc(&b, 4 * MIB), CUDA_SUCCESS);
		CODE(cuMemUnmap(b.va, 2 * MIB), CUDA_ERROR_INVALID_VALUE);
		CODE(xla_alloc(&c, 4 * MIB), CUDA_SUCCESS);
		CODE(cuMemAddressFree(c.va, c.size), CUDA_ERROR_INVALID_VALUE); /* still mapped */
		CODE(vmm_call_free(&c), CUDA_SUCCESS);
		CODE(vmm_call_free(&b), CUDA_SUCCESS);
		/* A freed (in libemm: cached) range, handle and address used again. */
#define STALE(call) (xla_alloc(&b, 4 * MIB), vmm_call_free(&b), (call))
		CODE(STALE(cuMemRelease(b.h)), CUDA_ERROR_INVALID_VALUE);
		CODE(STALE(cuMemGetAccess(&fl, &d.location, b.va)), CUDA_ERROR_INVALID_VALUE);
		CODE(STALE(cuMemGetAllocationPropertiesFromHandle(&p, b.h)), CUDA_ERROR_INVALID_VALUE);
		p = prop0(CU_MEM_HANDLE_TYPE_NONE);
		CODE(STALE(cuMemUnmap(b.va, b.size)), CUDA_ERROR_INVALID_VALUE);
		CODE(STALE(cuMemAddressFree(b.va, b.size)), CUDA_ERROR_INVALID_VALUE);
		CODE(STALE(cuMemSetAccess(b.va, b.size, &d, 1)), CUDA_ERROR_INVALID_VALUE);
		CODE(STALE(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)b.va)), CUDA_ERROR_INVALID_VALUE);
		CODE(cuMemCreate(&h, 4 * MIB, &p, 0), CUDA_SUCCESS);
		CODE(STALE(cuMemMap(b.va, 4 * MIB, 0, h, 0)), CUDA_ERROR_INVALID_VALUE);
		CODE(cuMemRelease(h), CUDA_SUCCESS);
#undef STALE
		/* Unmapped and released, the range kept: access and map again. */
		CODE(xla_alloc(&c, 4 * MIB), CUDA_SUCCESS);
		CODE(cuMemUnmap(c.va, c.size), CUDA_SUCCESS);
		CODE(cuMemRelease(c.h), CUDA_SUCCESS);
		CODE(cuMemSetAccess(c.va, c.size, &d, 1), CUDA_ERROR_INVALID_VALUE);
		CODE(cuMemRetainAllocationHandle(&h, (void *)(uintptr_t)c.va), CUDA_ERROR_INVALID_VALUE);
		CODE(cuMemMap(c.va, c.size, 0, c.h, 0), CUDA_ERROR_INVALID_VALUE);
		CODE(cuMemAddressFree(c.va, c.size), CUDA_SUCCESS);
	}
#undef CODE
	printf("%s\n", bad ? "codes: FAILED" : "codes: ok");
	return bad;
}

/* EMM_VMM=count or off: every call reaches the driver; count counts. */
static int mode_passthrough(bool counted)
{
	struct emm_stats s;
	struct vmm_buf b;
	int bad = 0;

	for (int round = 0; round < 3; round++) {
		fakecuda_reset_counters();
		bad |= xla_alloc(&b, 4 * MIB) != CUDA_SUCCESS || vmm_call_free(&b) != CUDA_SUCCESS;
		bad |= vmm_calls() != 7;
	}
	shims_stats(-1, &s);
	bad |= s.vmm_hits != 0 || s.vmm_idle_bytes != 0;
	bad |= s.vmm_allocs != (counted ? 3u : 0u) || s.vmm_frees != (counted ? 3u : 0u);
	printf("%s mode: %s (allocs %llu frees %llu hits %llu)\n", counted ? "count" : "off", bad ? "FAILED" : "ok",
	       (unsigned long long)s.vmm_allocs, (unsigned long long)s.vmm_frees, (unsigned long long)s.vmm_hits);
	return bad;
}

/* EMM_LOG=argv[2]: a VMM buffer's map and unmap are traced. */
static int mode_trace(const char *path)
{
	struct emm_stats s;
	char line[256], want[64];
	int found = 0;
	struct vmm_buf b;
	FILE *f;

	if (xla_alloc(&b, 4 * MIB) != CUDA_SUCCESS || vmm_call_free(&b) != CUDA_SUCCESS)
		return 1;
	shims_stats(-1, &s); /* flushes the trace */
	snprintf(want, sizeof(want), ",%#llx,%zu,", (unsigned long long)b.va, b.size);
	f = fopen(path, "r");
	while (f && fgets(line, sizeof(line), f))
		if (strstr(line, want))
			found |= strstr(line, ",allocate,") ? 1 : strstr(line, ",free,") ? 2 : 0;
	if (f)
		fclose(f);
	printf("trace: %s\n", found == 3 ? "ok" : "FAILED (no allocate and free line of the buffer)");
	return found == 3 ? 0 : 1;
}

/* EMM_RELEASE_THRESHOLD=0: a freed buffer is given back at once. */
static int mode_threshold(void)
{
	size_t used = fakecuda_mem_used(0);
	struct vmm_buf b;
	int bad = 0;

	bad |= xla_alloc(&b, 8 * MIB) != CUDA_SUCCESS || vmm_call_free(&b) != CUDA_SUCCESS;
	bad |= fakecuda_mem_used(0) != used;
	printf("threshold: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

/* EMM_FREE_MODE=stream: the program's ordering is trusted, as the real VMM
 * frees trust it: a freed buffer comes back at once, its events unfinished. */
static int mode_stream(void)
{
	struct vmm_buf a, b;
	CUstream nb;
	int bad = 0;

	bad |= cuStreamCreate(&nb, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS;
	fakecuda_set_event_delay(1000000);
	bad |= xla_alloc(&a, 10 * MIB) != CUDA_SUCCESS || vmm_call_free(&a) != CUDA_SUCCESS;
	fakecuda_reset_counters();
	bad |= xla_alloc(&b, 10 * MIB) != CUDA_SUCCESS;
	bad |= b.va != a.va || vmm_calls() != 0;
	bad |= vmm_call_free(&b) != CUDA_SUCCESS;
	fakecuda_set_event_delay(0);
	fakecuda_complete_all();
	printf("stream: %s\n", bad ? "FAILED" : "ok");
	return bad;
}

int main(int argc, char **argv)
{
	if (!fakecuda_known_function("cuMemCreate")) {
		printf("the test-double driver has no VMM calls: skipped\n");
		return 77;
	}
	g_ctx = shims_setup();
	if (argc > 1) {
		if (!strcmp(argv[1], "codes"))
			return mode_codes();
		if (!strcmp(argv[1], "count") || !strcmp(argv[1], "off"))
			return mode_passthrough(!strcmp(argv[1], "count"));
		if (!strcmp(argv[1], "threshold"))
			return mode_threshold();
		if (!strcmp(argv[1], "stream"))
			return mode_stream();
		if (!strcmp(argv[1], "trace") && argc > 2)
			return mode_trace(argv[2]);
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		return 2;
	}
	return emm_test_run(test_xla_pattern_served_from_cache, test_xla_create_first_order,
	                    test_idle_buffer_given_back_after_a_second, test_sync_before_free_needs_no_fence,
	                    test_lazy_free_waits_for_later_work,
	                    test_sleep_pattern_gives_memory_back,
	                    test_shared_and_partial_pass_through, test_fence_holds_freed_buffer,
	                    test_idle_is_free_memory, test_threads, test_lookups_substituted, test_free_orders,
	                    test_fork_and_exit_with_live_mappings, NULL);
}
