/* SPDX-License-Identifier: MIT */
/*
 * process/stats.c - the counters kept outside any heap (pass-through,
 * refused and forwarded calls, process-wide and per device), the counters
 * of heaps already destroyed, and the walks over the live heaps that
 * statistics and cuMemGetInfo make (the OOM report is oom_report.c's).
 *
 * A destroyed heap's counters are kept (`retired`) so that EMM_STATS still
 * shows a device whose context was reset before exit. The per-device
 * counters go to the device of the calling thread's cached context (the
 * thread cache of contexts.c), "unknown" when it has none.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "process/process_internal.h"
#include "process/process.h"

/* --- counters ---------------------------------------------------------- */

enum { COL_ALLOC, COL_FREE, COL_BAD, COL__COUNT };

static atomic_uint_fast64_t counters[EMM_COUNT__COUNT];
/* [0..MAX_DEVICES) devices, MAX_DEVICES pinned, MAX_DEVICES+1 unknown. */
static atomic_uint_fast64_t dev_counters[MAX_DEVICES + 2][COL__COUNT];

/* The "passed by" families: successful calls and their bytes. */
static atomic_uint_fast64_t passby_calls[EMM_PASSBY__COUNT];
static atomic_uint_fast64_t passby_bytes[EMM_PASSBY__COUNT];

/* Counters of heaps already destroyed. Current values are zeroed. */
static struct emm_stats retired[MAX_DEVICES + 1];

static int device_slot(int device)
{
	if (device == -2)
		return MAX_DEVICES;
	if (device >= 0 && device < MAX_DEVICES)
		return device;
	return MAX_DEVICES + 1;
}

static void count_at(enum emm_state_counter which, int device)
{
	int col;

	atomic_fetch_add_explicit(&counters[which], 1, memory_order_relaxed);
	switch (which) {
	case EMM_COUNT_PASS_ALLOC:
	case EMM_COUNT_MANAGED_ALLOC:
	case EMM_COUNT_CAPTURE_ALLOC:
		col = COL_ALLOC;
		break;
	case EMM_COUNT_PASS_HOST_ALLOC:
	case EMM_COUNT_HOST_REGISTER:
		col = COL_ALLOC;
		device = -2;
		break;
	case EMM_COUNT_PASS_FREE:
		col = COL_FREE;
		break;
	case EMM_COUNT_PASS_HOST_FREE:
	case EMM_COUNT_HOST_UNREGISTER:
		col = COL_FREE;
		device = -2;
		break;
	case EMM_COUNT_BAD_FREE:
		col = COL_BAD;
		break;
	default:
		return;
	}
	atomic_fetch_add_explicit(&dev_counters[device_slot(device)][col], 1, memory_order_relaxed);
}

void emm_state_count(enum emm_state_counter which)
{
	if (st_enabled)
		count_at(which, st_tls_device());
}

void emm_state_count_passthrough_alloc(void)
{
	emm_state_count(EMM_COUNT_PASS_ALLOC);
}

void emm_state_count_passthrough_free(void)
{
	emm_state_count(EMM_COUNT_PASS_FREE);
}

void emm_state_count_bad_free(void)
{
	emm_state_count(EMM_COUNT_BAD_FREE);
}

void emm_state_passby(enum emm_passby family, uint64_t bytes)
{
	if (!st_enabled || (unsigned)family >= EMM_PASSBY__COUNT)
		return;
	atomic_fetch_add_explicit(&passby_calls[family], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&passby_bytes[family], bytes, memory_order_relaxed);
}

static void add_passby(struct emm_stats *out)
{
#define PASSBY(fam, field)                                                                                   \
	out->passby_##field##_calls += atomic_load_explicit(&passby_calls[fam], memory_order_relaxed);       \
	out->passby_##field##_bytes += atomic_load_explicit(&passby_bytes[fam], memory_order_relaxed)
	PASSBY(EMM_PASSBY_ARRAY, array);
	PASSBY(EMM_PASSBY_GRAPH_MEM, graph_mem);
	PASSBY(EMM_PASSBY_MANAGED, managed);
	PASSBY(EMM_PASSBY_HOST_REGISTER, host_register);
	PASSBY(EMM_PASSBY_VMM, vmm);
	PASSBY(EMM_PASSBY_POOL, pool);
	PASSBY(EMM_PASSBY_CAPTURE, capture);
	PASSBY(EMM_PASSBY_UNKNOWN_FREE, unknown_free);
	PASSBY(EMM_PASSBY_DRIVER, driver);
#undef PASSBY
}

void emm_state_counters(uint64_t out[EMM_COUNT__COUNT])
{
	for (int i = 0; i < EMM_COUNT__COUNT; i++)
		out[i] = atomic_load_explicit(&counters[i], memory_order_relaxed);
}

void emm_state_add_counter_stats(int device, struct emm_stats *out)
{
	if (device == -1)
		add_passby(out);
	for (int slot = 0; slot < MAX_DEVICES + 2; slot++) {
		if (device != -1 && slot != device_slot(device))
			continue;
		out->passthrough_allocs +=
		    atomic_load_explicit(&dev_counters[slot][COL_ALLOC], memory_order_relaxed);
		out->passthrough_frees +=
		    atomic_load_explicit(&dev_counters[slot][COL_FREE], memory_order_relaxed);
		out->bad_frees += atomic_load_explicit(&dev_counters[slot][COL_BAD], memory_order_relaxed);
	}
}

/* --- walking the heaps ------------------------------------------------- */

void emm_state_for_each_heap(void (*fn)(emm_heap_t *heap, int device, void *arg), void *arg, bool push)
{
	struct heap_ref *refs;
	size_t n;

	if (!atomic_load_explicit(&st_init_done, memory_order_acquire) || !st_enabled)
		return;
	pthread_rwlock_rdlock(&st_heap_life_lock);
	st_lock(&st_ctx_lock);
	refs = st_snapshot_locked(&n);
	st_unlock(&st_ctx_lock);
	for (size_t i = 0; i < n; i++) {
		bool pushed = push && !st_is_exiting() ? st_push_ctx(refs[i].ctx) : false;
		st_assert_unlocked("a walk over the heaps");
		fn(refs[i].heap, refs[i].device, arg);
		st_pop_ctx(pushed);
	}
	pthread_rwlock_unlock(&st_heap_life_lock);
	free(refs);
}

size_t st_idle_bytes_device(int device)
{
	struct heap_ref *refs;
	size_t n, total = st_vmm_idle_bytes(device);

	if (!atomic_load_explicit(&st_init_done, memory_order_acquire) || !st_enabled || st_is_exiting())
		return total;
	pthread_rwlock_rdlock(&st_heap_life_lock);
	st_lock(&st_ctx_lock);
	refs = st_snapshot_locked(&n);
	st_unlock(&st_ctx_lock);
	for (size_t i = 0; i < n; i++) {
		size_t idle = 0, largest = 0;
		if (refs[i].device != device)
			continue;
		emm_heap_idle_info(refs[i].heap, &idle, &largest);
		total += idle;
	}
	pthread_rwlock_unlock(&st_heap_life_lock);
	free(refs);
	return total;
}

size_t emm_state_idle_bytes_current_device(void)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUdevice dev;

	/* Every heap of the device counts (another context's too: the
	 * driver's free memory is the device's), and its idle VMM buffers (a
	 * program that allocates only through the VMM calls has no heap). */
	if (!real->cuCtxGetDevice || real->cuCtxGetDevice(&dev) != CUDA_SUCCESS)
		return 0;
	return st_idle_bytes_device(dev);
}

static void add_retired(struct emm_stats *out, const struct emm_stats *r)
{
	out->allocs += r->allocs;
	out->frees += r->frees;
	out->hits += r->hits;
	out->misses += r->misses;
	out->backend_allocs += r->backend_allocs;
	out->backend_frees += r->backend_frees;
	out->oom_retries += r->oom_retries;
	out->ooms += r->ooms;
	out->splits += r->splits;
	out->merges += r->merges;
	out->events_recorded += r->events_recorded;
	out->event_queries += r->event_queries;
	out->stream_waits += r->stream_waits;
	out->host_waits += r->host_waits;
	out->epochs_closed += r->epochs_closed;
	out->allocated_bytes_total += r->allocated_bytes_total;
	out->requested_bytes_total += r->requested_bytes_total;
	out->reserved_bytes_total += r->reserved_bytes_total;
	/* Peaks of a destroyed heap: the larger of it and the live ones
	 * (with its error bound). */
	if (r->allocated_bytes_peak > out->allocated_bytes_peak) {
		out->allocated_bytes_peak = r->allocated_bytes_peak;
		out->allocated_bytes_peak_error = r->allocated_bytes_peak_error;
	}
	if (r->requested_bytes_peak > out->requested_bytes_peak) {
		out->requested_bytes_peak = r->requested_bytes_peak;
		out->requested_bytes_peak_error = r->requested_bytes_peak_error;
	}
	if (r->reserved_bytes_peak > out->reserved_bytes_peak)
		out->reserved_bytes_peak = r->reserved_bytes_peak;
}

void st_stats_retire(emm_heap_t *heap)
{
	struct emm_stats s;
	int slot = device_slot(emm_heap_device(heap));

	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	emm_heap_add_stats(heap, &s);
	if (slot <= MAX_DEVICES)
		add_retired(&retired[slot], &s);
}

struct collect_arg {
	int device;
	struct emm_stats *out;
};

static void collect_one(emm_heap_t *heap, int device, void *arg)
{
	struct collect_arg *c = arg;

	if (c->device == -1 || c->device == device)
		emm_heap_add_stats(heap, c->out);
}

void emm_state_collect_stats(int device, struct emm_stats *out)
{
	struct collect_arg c = {device, out};

	emm_state_for_each_heap(collect_one, &c, false);
	pthread_rwlock_rdlock(&st_heap_life_lock);
	for (int slot = 0; slot <= MAX_DEVICES; slot++) {
		int d = slot == MAX_DEVICES ? -2 : slot;
		if (device == -1 || device == d)
			add_retired(out, &retired[slot]);
	}
	pthread_rwlock_unlock(&st_heap_life_lock);
	emm_state_add_counter_stats(device, out);
	st_vmm_add_stats(device, out);
}

void st_stats_fork_child(void)
{
	for (int i = 0; i < EMM_COUNT__COUNT; i++)
		atomic_store(&counters[i], 0);
	for (int i = 0; i < MAX_DEVICES + 2; i++)
		for (int c = 0; c < COL__COUNT; c++)
			atomic_store(&dev_counters[i][c], 0);
	for (int i = 0; i < EMM_PASSBY__COUNT; i++) {
		atomic_store(&passby_calls[i], 0);
		atomic_store(&passby_bytes[i], 0);
	}
	memset(retired, 0, sizeof(retired));
}
