/* SPDX-License-Identifier: MIT */
/*
 * process/vmm_idle.c - the VMM cache's lists and what happens to freed
 * VMM buffers (vbufs, vmm_internal.h) over time: the fence recorded at
 * their free and queried at their reuse, giving idle memory back
 * (EMM_RELEASE_THRESHOLD, out of memory, emm_release_idle, cuMemGetInfo),
 * the reaper that makes pending deferrals real, fork, and the counters.
 *
 * Fence (the rule cuMemFree follows, README "Free without the device
 * sync"): when a vbuf goes idle an event is recorded on the legacy stream of
 * its context (a barrier for every blocking and per-thread stream) and on
 * each live non-blocking stream of it that is still busy; a reservation
 * takes the vbuf only once every event has completed (cuEventQuery; never a
 * host wait), else it goes to the driver. A vbuf that cannot be fenced (a
 * capture forbids the record, too many streams, no event) is not cached:
 * its free is made real.
 *
 * Idle non-blocking streams get no event, as when the heaps close an epoch
 * (allocator/heap_fence.c): each is asked first (one cuStreamQuery, after
 * the free), and one whose work has all completed has nothing left that
 * was issued before the free. XLA synchronizes the context before every
 * free, so at its frees every one of its 18 streams is idle: one legacy
 * record per buffer instead of 19, one event query at the reuse instead of
 * 19. The legacy event stays: a query of the legacy stream does not cover
 * the blocking and per-thread streams it orders.
 *
 * The reaper: a deferral that is not the whole free of a buffer (unmap +
 * release keeping the range: vLLM's sleep mode, PyTorch's expandable
 * segments shrinking) means to give memory back, so it must not wait for
 * the program's next VMM call. A thread, created on the first pending
 * deferral with every signal blocked, makes real each deferral pending for
 * EMM_VMM_REAP_MS (5 ms). XLA's free (unmap, release, free the range) comes back to back
 * from one thread, a few microseconds apart once deferred, so 5 ms is
 * far beyond a free sequence (and if a thread is descheduled in the
 * middle of one, the cost is one buffer not cached), while memory comes
 * back well within what another process or NVML can observe. It never
 * calls the driver once exit has begun; a fork child starts without it.
 *
 * The reaper also gives back idle buffers nobody took for IDLE_MS (1 s):
 * programs that allocate with the VMM calls chose them to give memory
 * back (JAX's platform mode exists to share a GPU), and a training step
 * reuses its buffers within milliseconds, so a buffer idle for a second
 * is one a shape change left behind.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "allocator/trace.h"
#include "common/log.h"
#include "process/annotate.h"
#include "process/process_internal.h"
#include "process/vmm_internal.h"

#define IDLE_MS	   1000
#define IDLE_NS	   ((uint64_t)IDLE_MS * 1000000u)
#define MAX_CHECKS 4 /* idle vbufs whose fences one reservation queries */

static struct vbuf *pending_head, *pending_tail, *idle_head, *idle_tail;
static size_t idle_bytes[MAX_DEVICES + 2];

static pthread_cond_t reap_cond;
static bool reaper_running, reap_cond_ready;

/* [0..MAX_DEVICES) devices, MAX_DEVICES+1 unknown. */
static atomic_uint_fast64_t counters[MAX_DEVICES + 2][VC__COUNT];
static EMM_TLS_IE int tls_runtime_pool;

static int slot(int device)
{
	return device >= 0 && device < MAX_DEVICES ? device : MAX_DEVICES + 1;
}

void vmm_count(enum vmm_counter which, int device, uint64_t n)
{
	atomic_fetch_add_explicit(&counters[slot(device)][which], n, memory_order_relaxed);
}

/* --- the lists (vmm_lock held) -------------------------------------------- */

void vmm_list_add_locked(struct vbuf *v, enum vbuf_list list)
{
	struct vbuf **head = list == VB_IDLE ? &idle_head : &pending_head;
	struct vbuf **tail = list == VB_IDLE ? &idle_tail : &pending_tail;

	vmm_list_del_locked(v);
	v->list = list;
	v->since_ns = vmm_now_ns();
	v->next = NULL;
	v->prev = *tail;
	if (*tail)
		(*tail)->next = v;
	else
		*head = v;
	*tail = v;
	if (list == VB_IDLE)
		idle_bytes[slot(v->device)] += v->size;
}

void vmm_list_del_locked(struct vbuf *v)
{
	struct vbuf **head = v->list == VB_IDLE ? &idle_head : &pending_head;
	struct vbuf **tail = v->list == VB_IDLE ? &idle_tail : &pending_tail;

	if (v->list == VB_NONE)
		return;
	if (v->list == VB_IDLE)
		idle_bytes[slot(v->device)] -= v->size;
	if (v->prev)
		v->prev->next = v->next;
	else
		*head = v->next;
	if (v->next)
		v->next->prev = v->prev;
	else
		*tail = v->prev;
	v->prev = v->next = NULL;
	v->list = VB_NONE;
}

struct vbuf *vmm_pending_head_locked(void)
{
	return pending_head;
}

size_t vmm_idle_bytes_locked(int device)
{
	size_t total = 0;

	if (device != -1)
		return device >= 0 && device < MAX_DEVICES ? idle_bytes[device] : 0;
	for (int i = 0; i < MAX_DEVICES + 2; i++)
		total += idle_bytes[i];
	return total;
}

/* --- fences ---------------------------------------------------------------- */

static void fences_drop(struct vbuf *v)
{
	struct emm_fence_ops ops;

	if (!v->nfences)
		return;
	emm_fence_ops_init(v->pool, &ops);
	for (unsigned i = 0; i < v->nfences; i++)
		ops.release(ops.ctx, v->fences[i]);
	v->nfences = 0;
}

/* Events on the legacy stream and every live non-blocking stream of the
 * vbuf's context that is not idle now. 0, or a negative errno (nothing
 * recorded). */
static int fences_record(struct vbuf *v)
{
	emm_stream_t keys[VMM_MAX_FENCES];
	struct emm_fence_ops ops;
	uint64_t ev;
	size_t n;

	/* EMM_FREE_MODE=stream trusts the program's ordering, as the real VMM
	 * frees do (they never wait: tests/bench/RESULTS.md section 7): no
	 * marker, reusable at once. */
	if (st_opts->free_mode == EMM_OPT_FREE_STREAM)
		return 0;

	v->pool = emm_fence_pool_get(v->ctx);
	if (!v->pool)
		return -ENOMEM;
	emm_fence_ops_init(v->pool, &ops);
	keys[0] = EMM_STREAM_LEGACY;
	n = st_stream_nonblocking_keys(v->ctx, keys + 1, VMM_MAX_FENCES - 1);
	if (n > VMM_MAX_FENCES - 1)
		return -E2BIG;
	for (size_t i = 0; i <= n; i++) {
		if (ops.capturing(ops.ctx, keys[i])) {
			fences_drop(v);
			return -EBUSY;
		}
		/* All its work done: nothing issued before the free is left. */
		if (i > 0 && ops.stream_idle(ops.ctx, keys[i]) == 0)
			continue;
		if (ops.record(ops.ctx, keys[i], &ev) < 0) {
			fences_drop(v);
			return -EBUSY;
		}
		if (ev) /* 0: the null marker, complete */
			v->fences[v->nfences++] = ev;
	}
	return 0;
}

/* The host waits for v's events (v busy; no lock held). */
static void fences_wait(struct vbuf *v)
{
	struct emm_fence_ops ops;

	if (!v->nfences)
		return;
	emm_fence_ops_init(v->pool, &ops);
	for (unsigned i = 0; i < v->nfences; i++)
		(void)ops.synchronize(ops.ctx, v->fences[i]);
}

/* Have all of v's events completed? (v busy; no lock held) */
static bool fences_ready(struct vbuf *v)
{
	struct emm_fence_ops ops;

	emm_fence_ops_init(v->pool, &ops);
	for (unsigned i = 0; i < v->nfences; i++)
		if (ops.query(ops.ctx, v->fences[i]) != 0)
			return false;
	fences_drop(v);
	return true;
}

/* --- idle ------------------------------------------------------------------ */

static size_t release_idle(int device, size_t keep);

void vmm_make_idle(struct vbuf *v)
{
	size_t threshold = st_opts->release_threshold, idle;

	bool checker, lazy;

	st_assert_unlocked("fencing a freed VMM buffer");
	st_annotate_ensure_probed();
	checker = atomic_load_explicit(&st_annotate_on, memory_order_relaxed);
	/* Fenced by the program's next cuCtxSynchronize, or by events now. */
	v->ticket = 0;
	lazy = !checker && st_opts->free_mode == EMM_OPT_FREE_FENCE && vmm_sync_lazy_free(v);
	if (st_is_exiting() || (!lazy && fences_record(v) < 0)) {
		vmm_materialize(v);
		return;
	}
	/* Under a memory checker the free reaches the driver once the work
	 * before it is done: the checker takes no VMM range as a heap
	 * (annotate.c), so a buffer kept mapped for reuse would hide a use
	 * after free that it reports without libemm. */
	if (checker) {
		fences_wait(v);
		vmm_materialize(v);
		return;
	}
	st_lock(&vmm_lock);
	v->busy = false;
	vmm_list_add_locked(v, VB_IDLE);
	vmm_reaper_kick_locked(); /* it gives back what stays idle (IDLE_MS) */
	pthread_cond_broadcast(&vmm_busy_cond);
	st_unlock(&vmm_lock);
	if (threshold == SIZE_MAX)
		return;
	/* Idle VMM memory counts with the heaps' idle memory of its device
	 * (v's, not the current context's: the program may free a buffer of
	 * device 1 while device 0's context is current). */
	idle = st_idle_bytes_device(v->device);
	if (idle > threshold) {
		size_t mine = st_vmm_idle_bytes(v->device), excess = idle - threshold;
		(void)release_idle(v->device, mine > excess ? mine - excess : 0);
	}
}

struct vbuf *vmm_idle_take_locked(size_t size, size_t align, CUcontext ctx, const CUmemAllocationProp *prop)
{
	struct vbuf *checked[MAX_CHECKS];
	unsigned nchecked = 0;

	for (;;) {
		struct vbuf *v;
		bool ready;

		for (v = idle_head; v; v = v->next) {
			bool seen = false;
			if (v->busy || v->size != size || (align && v->va % align) || (ctx && v->ctx != ctx) ||
			    (prop && !vmm_prop_equal(prop, &v->prop)))
				continue;
			for (unsigned i = 0; i < nchecked; i++)
				seen |= checked[i] == v;
			if (!seen)
				break;
		}
		if (!v)
			return NULL;
		if (v->ticket && vmm_sync_covered(v)) {
			v->ticket = 0; /* a synchronisation came after its free */
		} else if (v->ticket || v->nfences) {
			/* Events: recorded now for a buffer no synchronisation
			 * has covered (they cover what was issued before its
			 * free too), then queried. */
			if (nchecked == MAX_CHECKS)
				return NULL;
			checked[nchecked++] = v;
			v->busy = true;
			st_unlock(&vmm_lock);
			if (v->ticket && fences_record(v) == 0)
				v->ticket = 0;
			ready = !v->ticket && fences_ready(v);
			st_lock(&vmm_lock);
			v->busy = false;
			pthread_cond_broadcast(&vmm_busy_cond);
			if (!ready)
				continue;
		}
		vmm_list_del_locked(v);
		v->busy = true;
		return v;
	}
}

/* Make real the free of idle vbufs of `device` (-1 all), oldest first,
 * until at most `keep` idle bytes are left there; the bytes released. */
static size_t release_idle(int device, size_t keep)
{
	struct vbuf *batch[16];
	size_t released = 0;
	unsigned n;

	do {
		n = 0;
		st_lock(&vmm_lock);
		for (struct vbuf *v = idle_head, *next; v && n < 16; v = next) {
			next = v->next;
			if (vmm_idle_bytes_locked(device) <= keep)
				break;
			if (v->busy || (device != -1 && v->device != device))
				continue;
			vmm_list_del_locked(v);
			v->busy = true;
			batch[n++] = v;
			released += v->size;
		}
		st_unlock(&vmm_lock);
		for (unsigned i = 0; i < n; i++)
			vmm_materialize(batch[i]);
	} while (n == 16);
	return released;
}

size_t st_vmm_idle_bytes(int device)
{
	size_t n;

	if (!st_is_enabled())
		return 0;
	st_lock(&vmm_lock);
	n = vmm_idle_bytes_locked(device);
	st_unlock(&vmm_lock);
	return n;
}

size_t st_vmm_release_idle(int device)
{
	if (device == -2 || emm_vmm_mode() != EMM_VMM_MODE_CACHE)
		return 0;
	emm_vmm_flush_pending();
	return release_idle(device, 0);
}

bool emm_vmm_oom_release(void)
{
	size_t idle;

	if (emm_vmm_mode() != EMM_VMM_MODE_CACHE || !st_opts->oom_retry)
		return false;
	st_lock(&vmm_lock);
	idle = vmm_idle_bytes_locked(-1) + (pending_head != NULL);
	st_unlock(&vmm_lock);
	if (!idle)
		return false;
	emm_vmm_flush_pending();
	(void)release_idle(-1, 0);
	return true;
}

/* --- the reaper -------------------------------------------------------------- */

static void *reaper_main(void *arg)
{
	(void)arg;
	/* libemm's own thread: its unmaps and releases must not invalidate a
	 * global-mode capture of the program's (capture.c). */
	(void)st_capture_relax();
	st_lock(&vmm_lock);
	for (;;) {
		struct vbuf *batch[16];
		uint64_t now = vmm_now_ns(), wake = 0;
		unsigned n = 0;
		struct timespec ts;

		for (int idle = 0; idle < 2; idle++) {
			uint64_t age = idle ? IDLE_NS : (uint64_t)st_opts->vmm_reap_ms * 1000000u;
			for (struct vbuf *v = idle ? idle_head : pending_head, *next; v && !st_is_exiting();
			     v = next) {
				next = v->next;
				if (v->busy)
					continue;
				if (v->since_ns + age <= now && n < 16) {
					vmm_list_del_locked(v);
					v->busy = true;
					batch[n++] = v;
				} else if (!wake || v->since_ns + age < wake) {
					wake = v->since_ns + age;
				}
			}
		}
		if (n) {
			st_unlock(&vmm_lock);
			for (unsigned i = 0; i < n; i++)
				vmm_materialize(batch[i]);
			st_lock(&vmm_lock);
			continue;
		}
		if (!wake || st_is_exiting()) {
			pthread_cond_wait(&reap_cond, &vmm_lock);
			continue;
		}
		ts.tv_sec = (time_t)(wake / 1000000000u);
		ts.tv_nsec = (long)(wake % 1000000000u);
		pthread_cond_timedwait(&reap_cond, &vmm_lock, &ts);
	}
	return NULL;
}

void vmm_reaper_kick_locked(void)
{
	pthread_condattr_t attr;
	sigset_t all, old;
	pthread_attr_t ta;
	pthread_t t;

	if (!reap_cond_ready) {
		pthread_condattr_init(&attr);
		pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
		pthread_cond_init(&reap_cond, &attr);
		pthread_condattr_destroy(&attr);
		reap_cond_ready = true;
	}
	if (!reaper_running) {
		/* No signal of the program's lands on our thread. */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		pthread_attr_init(&ta);
		pthread_attr_setdetachstate(&ta, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&ta, 64 * 1024);
		reaper_running = pthread_create(&t, &ta, reaper_main, NULL) == 0;
		pthread_attr_destroy(&ta);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		if (!reaper_running)
			emm_debug("no VMM reaper thread: pending deferrals wait for the next VMM call");
	}
	pthread_cond_signal(&reap_cond);
}

/* --- fork, statistics, explicit pools ---------------------------------------- */

void st_vmm_fork_prepare(void)
{
	/* The parent gives back what is pending before the child exists; the
	 * child forgets everything (its first VMM calls are the driver's). */
	if (atomic_load_explicit(&st_init_done, memory_order_acquire) && st_enabled && !st_is_exiting())
		emm_vmm_flush_pending();
}

void st_vmm_fork_child(void)
{
	pthread_mutex_init(&vmm_lock, NULL);
	pthread_cond_init(&vmm_busy_cond, NULL);
	reap_cond_ready = false;
	reaper_running = false;
	pending_head = pending_tail = idle_head = idle_tail = NULL;
	memset(idle_bytes, 0, sizeof(idle_bytes));
	vmm_tables_fork_child();
	vmm_sync_fork_child();
	for (int i = 0; i < MAX_DEVICES + 2; i++)
		for (int c = 0; c < VC__COUNT; c++)
			atomic_store(&counters[i][c], 0);
}

void st_vmm_add_stats(int device, struct emm_stats *out)
{
	uint64_t c[VC__COUNT] = {0};

	if (device == -2)
		return;
	for (int s = 0; s < MAX_DEVICES + 2; s++) {
		if (device != -1 && s != slot(device))
			continue;
		for (int i = 0; i < VC__COUNT; i++)
			c[i] += atomic_load_explicit(&counters[s][i], memory_order_relaxed);
	}
	out->vmm_allocs += c[VC_ALLOCS];
	out->vmm_hits += c[VC_HITS];
	out->vmm_misses += c[VC_MISSES];
	out->vmm_frees += c[VC_FREES];
	out->vmm_hit_bytes_total += c[VC_HIT_BYTES];
	out->vmm_materializations += c[VC_MATERIALIZED];
	out->vmm_idle_released += c[VC_IDLE_RELEASED];
	out->pool_allocs += c[VC_POOL_ALLOCS];
	out->pool_creates += c[VC_POOL_CREATES];
	out->pool_destroys += c[VC_POOL_DESTROYS];
	out->vmm_idle_bytes += st_vmm_idle_bytes(device);
}

void emm_vmm_count_pool(enum emm_pool_event what, CUdeviceptr ptr, size_t size, const void *stream)
{
	if (!st_is_enabled())
		return;
	switch (what) {
	case EMM_POOL_ALLOC:
		if (tls_runtime_pool)
			return; /* cudaMallocFromPoolAsync counts it */
		vmm_count(VC_POOL_ALLOCS, st_tls_device(), 1);
		emm_state_passby(EMM_PASSBY_POOL, size);
		if (emm_trace_enabled())
			emm_trace_event(EMM_TRACE_ALLOCATE, ptr, size, (uint64_t)(uintptr_t)stream);
		break;
	case EMM_POOL_CREATE:
		vmm_count(VC_POOL_CREATES, st_tls_device(), 1);
		break;
	case EMM_POOL_DESTROY:
		vmm_count(VC_POOL_DESTROYS, st_tls_device(), 1);
		break;
	}
}

void emm_vmm_runtime_pool_enter(void)
{
	tls_runtime_pool++;
}

void emm_vmm_runtime_pool_leave(void)
{
	tls_runtime_pool--;
}
