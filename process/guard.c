/* SPDX-License-Identifier: MIT */
/*
 * process/guard.c - the heap guard: a heap is destroyed only while no
 * thread is inside it.
 *
 * A heap is destroyed only when its context goes (cuCtxDestroy, a primary
 * context reset or last release, a reset noticed through the context id;
 * contexts.c) - possibly while other threads are inside it (a runtime's
 * exit-time teardown while worker threads still allocate). Every shim path
 * that touches a heap runs between st_enter and st_leave (process_internal.h),
 * which publish "this thread is inside" in a per-thread slot; the thread
 * tearing down raises `dropping`, waits until no other thread is inside,
 * destroys, and lowers it; threads arriving meanwhile wait at the door.
 * The wait is bounded (EMM_TEARDOWN_WAIT): a thread stuck inside (in a
 * driver call that waits on the tearing-down thread, say) must not stall
 * the teardown, usually an exit, for ever. Past the bound the teardown
 * leaves the heaps to the threads inside - unlinked, never destroyed, their
 * memory the driver's to reclaim with the context - and says so. The
 * hot path is a store, a barrier and a load: with membarrier(2) (private
 * expedited) the barrier is a compiler barrier and the teardown pays the
 * full fence for every thread; without it, a full fence on each entry.
 */
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/compiler.h"
#include "common/log.h"
#include "process/process_internal.h"
#include "process/process.h"

static _Atomic(struct guard_slot *) guard_slots; /* never freed; slots are reused */
atomic_uint st_guard_dropping;
bool st_guard_asymmetric; /* membarrier registered: cheap entry barrier */
static pthread_key_t guard_key;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
EMM_TLS_IE struct guard_slot *st_tls_guard_slot;
EMM_TLS_IE unsigned st_tls_guard_depth;

static void guard_slot_release(void *arg)
{
	struct guard_slot *slot = arg;

	atomic_store_explicit(&slot->active, 0, memory_order_release);
	atomic_store_explicit(&slot->used, false, memory_order_release);
}

static void guard_init(void)
{
	long cmds = syscall(__NR_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);

	(void)pthread_key_create(&guard_key, guard_slot_release);
	if (cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
	    syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
		st_guard_asymmetric = true;
	emm_debug("heap guard: %s", st_guard_asymmetric ? "membarrier" : "fences");
}

void st_guard_setup(void)
{
	pthread_once(&guard_once, guard_init);
}

/* Out of line: the first entry of a thread only; st_enter's fast path
 * stays a few instructions without a frame. */
__attribute__((noinline)) static struct guard_slot *guard_slot_get(void)
{
	struct guard_slot *slot;

	for (slot = atomic_load(&guard_slots); slot; slot = slot->next) {
		bool expected = false;
		if (!atomic_load_explicit(&slot->used, memory_order_relaxed) &&
		    atomic_compare_exchange_strong(&slot->used, &expected, true))
			break;
	}
	if (!slot) {
		if (posix_memalign((void **)&slot, 64, sizeof(*slot)) != 0)
			return NULL;
		memset(slot, 0, sizeof(*slot));
		atomic_init(&slot->active, 0);
		atomic_init(&slot->gate[0], 0);
		atomic_init(&slot->gate[1], 0);
		atomic_init(&slot->used, true);
		slot->next = atomic_load(&guard_slots);
		while (!atomic_compare_exchange_weak(&guard_slots, &slot->next, slot))
			;
	}
	(void)pthread_setspecific(guard_key, slot);
	st_tls_guard_slot = slot;
	/* A new thread using CUDA: run our exit handler before the teardown
	 * of whatever initialised before it (see state.c). */
	st_atexit_again();
	return slot;
}

/* Publish "inside", then wait at the door while a teardown runs. */
static void guard_publish(struct guard_slot *slot)
{
	for (;;) {
		atomic_store_explicit(&slot->active, 1, memory_order_relaxed);
		st_guard_barrier();
		if (EMM_LIKELY(atomic_load_explicit(&st_guard_dropping, memory_order_relaxed) == 0))
			return;
		atomic_store_explicit(&slot->active, 0, memory_order_release);
		while (atomic_load_explicit(&st_guard_dropping, memory_order_acquire) != 0)
			sched_yield();
	}
}

/* st_enter's other cases: the thread's first entry (no slot yet), or a
 * teardown running (wait at the door). The depth is counted already. */
void st_enter_slow(void)
{
	struct guard_slot *slot = st_tls_guard_slot;

	if (EMM_UNLIKELY(!slot)) {
		slot = guard_slot_get();
		if (!slot)
			return; /* no memory for a slot: unguarded */
	}
	guard_publish(slot);
}

/* A teardown started from inside the guard (a reset noticed in
 * st_current_entry, which has not touched a heap yet) steps out before it
 * takes any lock, so that it never waits on a thread that waits on it. */
void st_guard_step_out(void)
{
	if (st_tls_guard_depth && st_tls_guard_slot)
		atomic_store_explicit(&st_tls_guard_slot->active, 0, memory_order_release);
}

void st_guard_step_in(void)
{
	if (st_tls_guard_depth && st_tls_guard_slot)
		guard_publish(st_tls_guard_slot);
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Wait until no other thread is inside a heap, at most `wait_ms`; new
 * arrivals wait until st_guard_end. The caller is outside
 * (st_guard_step_out). False when a thread is still inside at the end. */
bool st_guard_begin(unsigned wait_ms)
{
	uint64_t deadline = now_ns() + (uint64_t)wait_ms * 1000000u;

	atomic_fetch_add(&st_guard_dropping, 1);
	if (st_guard_asymmetric)
		(void)syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
	else
		atomic_thread_fence(memory_order_seq_cst);
	for (struct guard_slot *slot = atomic_load(&guard_slots); slot; slot = slot->next) {
		if (slot == st_tls_guard_slot)
			continue;
		while (atomic_load_explicit(&slot->active, memory_order_acquire) != 0) {
			if (now_ns() >= deadline)
				return false;
			sched_yield();
		}
	}
	return true;
}

void st_guard_end(void)
{
	atomic_fetch_sub(&st_guard_dropping, 1);
}

/* The capture gate's counters (capture.c) live in the guard's per-thread
 * slots, so that the fence ops of different threads touch no shared cache
 * line: this thread's counter of `phase`, its slot made first with `make`
 * if it has none (NULL without one: the caller counts elsewhere). A
 * thread's leave finds the slot its enter used: st_tls_guard_slot changes only at
 * its exit and in a fork child. */
atomic_uint *st_guard_gate_counter(unsigned phase, bool make)
{
	struct guard_slot *slot = st_tls_guard_slot;

	if (EMM_UNLIKELY(!slot) && make) {
		st_guard_setup(); /* its key, if no heap was entered yet */
		slot = guard_slot_get();
	}
	return slot ? &slot->gate[phase & 1u] : NULL;
}

/* Every thread's fence ops in flight in `phase`. */
unsigned st_guard_gate_sum(unsigned phase)
{
	unsigned n = 0;

	for (struct guard_slot *slot = atomic_load(&guard_slots); slot; slot = slot->next)
		n += atomic_load(&slot->gate[phase & 1u]);
	return n;
}

void st_guard_fork_child(void)
{
	/* Only this thread exists; slots of the others are forgotten. */
	atomic_store(&guard_slots, NULL);
	atomic_store(&st_guard_dropping, 0);
	st_tls_guard_slot = NULL;
	st_tls_guard_depth = 0;
}
