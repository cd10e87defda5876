/* SPDX-License-Identifier: MIT */
/*
 * process/process_internal.h - what the files of libemm's process state
 * share with one another and with nobody else:
 *   state.c    - initialisation, the loaded backend, exit and fork;
 *   guard.c    - the heap guard (the teardown side is declared here);
 *   contexts.c - the context entries, the thread cache, teardown;
 *   pinned.c   - the pinned-host heaps;
 *   streams.c  - stream keys and the live-stream registry;
 *   stats.c    - the counters and the walks over the heaps for statistics.
 * Names shared this way start with st_ (hidden like every symbol of
 * libemm: -fvisibility=hidden). The other interpose files see state.h and
 * state_priv.h only.
 *
 * The fast paths the hot paths inlined when all of this was one file (is
 * libemm enabled, is it exiting, the real entry points, the device of the
 * thread cache) are static inline here, so a cached allocation still costs
 * what it did.
 */
#ifndef EMM_PROCESS_INTERNAL_H
#define EMM_PROCESS_INTERNAL_H

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/backend_loader.h"
#include "allocator/heap.h"
#include "allocator/snapshot.h"
#include "common/compiler.h"
#include "config/options.h"
#include "process/process.h"

/* Hidden on the declarations too, so that the other state files reach
 * these symbols directly rather than through the GOT. */
#pragma GCC visibility push(hidden)

/* Thread-locals in the initial-exec model: libemm is preloaded (its TLS is
 * in the static block), and the hot paths read them on every call, which
 * the general-dynamic model would turn into __tls_get_addr calls. */
#define EMM_TLS_IE _Thread_local __attribute__((tls_model("initial-exec")))

/* A number for the calling thread, never 0 and never reused in the process
 * (a thread that exits and one created after it differ): state.c. */
uint64_t st_thread_uid(void);

#define PINNED_FLAG_SETS 8u /* PORTABLE | DEVICEMAP | WRITECOMBINED */
#define MAX_DEVICES      64

/* --- the lock rule ------------------------------------------------------ */

/*
 * No lock of the process layer (st_ctx_lock, the stream registry, the
 * capture lock) is held across a driver call or a heap call: a driver call
 * can block or re-enter (callbacks, tools such as compute-sanitizer), and a
 * heap call may reach the driver through the fence ops or the backend.
 * Those locks are taken through st_lock()/st_unlock() (and the rwlock
 * forms), which count per thread in a debug build; st_assert_unlocked(what)
 * stands before every such call and aborts with a message when a lock is
 * held. st_heap_life_lock is the exception by design: it is the heap
 * guard's teardown side, held shared around heap walks.
 */
#ifndef NDEBUG
extern EMM_TLS_IE int st_locks_held;
__attribute__((cold, noreturn)) void st_lock_violation(const char *what);
#define st_lock_count(d) ((void)(st_locks_held += (d)))
#define st_assert_unlocked(what)                                                                           \
	do {                                                                                               \
		if (EMM_UNLIKELY(st_locks_held != 0))                                                      \
			st_lock_violation(what);                                                           \
	} while (0)
#else
#define st_lock_count(d) ((void)0)
#define st_assert_unlocked(what) ((void)0)
#endif

static inline void st_lock(pthread_mutex_t *m)
{
	pthread_mutex_lock(m);
	st_lock_count(1);
}

static inline void st_unlock(pthread_mutex_t *m)
{
	st_lock_count(-1);
	pthread_mutex_unlock(m);
}

static inline void st_rdlock(pthread_rwlock_t *l)
{
	pthread_rwlock_rdlock(l);
	st_lock_count(1);
}

static inline void st_wrlock(pthread_rwlock_t *l)
{
	pthread_rwlock_wrlock(l);
	st_lock_count(1);
}

static inline void st_rwunlock(pthread_rwlock_t *l)
{
	st_lock_count(-1);
	pthread_rwlock_unlock(l);
}

/* --- state.c: initialisation, backend, exit ----------------------------- */

extern atomic_bool st_init_done; /* state_init has finished */
extern bool st_enabled;          /* written once inside state_init */
extern atomic_bool st_exiting;
/* Enabled, not exiting, EMM_CONTEXT_CHECK off (st_current_entry's hit). */
extern atomic_bool st_fast_ctx;
extern const struct emm_options *st_opts;
extern struct emm_backend_loaded st_backend;
/* Where pinned host segments come from: st_backend when it serves them
 * (EMM_BACKEND_CAP_HOST_PINNED), else the built-in driver backend, so a
 * device backend without pinned memory (vmm, async, managed) does not
 * turn pinned caching off; NULL table when neither can (hostsim). */
extern struct emm_backend_loaded st_host_backend;
extern struct emm_backend_host st_host;
extern _Atomic(const struct emm_real_driver_table *) st_real;
extern struct emm_state_real_extra st_extra;
extern pthread_once_t st_extra_once;
extern atomic_bool st_extra_ready; /* st_extra_init has run (its last store) */

void st_extra_init(void);

/* emm_state_enabled, emm_state_exiting, emm_state_real and
 * emm_state_real_extra, inlined: their slow paths are the real ones. */
static inline bool st_is_enabled(void)
{
	if (EMM_LIKELY(atomic_load_explicit(&st_init_done, memory_order_acquire)))
		return st_enabled;
	return emm_state_enabled();
}

static inline bool st_is_exiting(void)
{
	return atomic_load_explicit(&st_exiting, memory_order_relaxed);
}

static inline const struct emm_real_driver_table *st_real_table(void)
{
	const struct emm_real_driver_table *t = atomic_load_explicit(&st_real, memory_order_acquire);

	if (EMM_LIKELY(t))
		return t;
	return emm_state_real();
}

/* One load once the table is built (the context lookup asks twice a
 * cached pair); pthread_once only before. */
static inline const struct emm_state_real_extra *st_real_extra(void)
{
	if (EMM_LIKELY(atomic_load_explicit(&st_extra_ready, memory_order_acquire)))
		return &st_extra;
	pthread_once(&st_extra_once, st_extra_init);
	return &st_extra;
}

/* Register the exit handler once more (up to a bound): a thread or context
 * new to CUDA may come after a runtime whose teardown ours must precede
 * (see state.c). */
void st_atexit_again(void);

/* The heap parameters the options ask for. */
void st_heap_params(struct emm_heap_params *p);

/* --- guard.c: the teardown side of the heap guard ---------------------- */

/* Called from state_init, before any thread can enter. */
void st_guard_setup(void);
/* A teardown started from inside the guard steps out before it takes any
 * lock (so that it never waits on a thread that waits on it), and back in
 * after. */
void st_guard_step_out(void);
void st_guard_step_in(void);
/* How deep the calling thread is in guarded calls (st_enter). */
extern EMM_TLS_IE unsigned st_tls_guard_depth;

/* A thread's slot: where it says it is inside. */
struct guard_slot {
	atomic_uint active;  /* this thread is inside a heap */
	atomic_uint gate[2]; /* its fence ops in flight past the capture gate, per phase (capture.c) */
	atomic_bool used;    /* owned by a live thread */
	struct guard_slot *next;
} __attribute__((aligned(64)));
extern EMM_TLS_IE struct guard_slot *st_tls_guard_slot;
extern atomic_uint st_guard_dropping; /* teardowns running */
extern bool st_guard_asymmetric;      /* membarrier registered: the entry barrier is the compiler's */
void st_enter_slow(void);

static inline void st_guard_barrier(void)
{
	if (st_guard_asymmetric)
		atomic_signal_fence(memory_order_seq_cst);
	else
		atomic_thread_fence(memory_order_seq_cst);
}

/* Wait until no other thread is inside a heap, at most wait_ms; new
 * arrivals wait until st_guard_end. The caller is outside
 * (st_guard_step_out). False when a thread is still inside at the end:
 * the caller must then not destroy what that thread may be using. */
bool st_guard_begin(unsigned wait_ms);
void st_guard_end(void);
void st_guard_fork_child(void);
/* The capture gate's per-thread counters (capture.c): this thread's of a
 * phase (its slot made first with `make`; NULL without a slot), and the
 * sum of every thread's. */
atomic_uint *st_guard_gate_counter(unsigned phase, bool make);
unsigned st_guard_gate_sum(unsigned phase);

/* --- contexts.c: the context registry ---------------------------------- */

struct ctx_entry;

/* The segment source of a pinned heap: its context and flag set. */
struct pinned_source {
	struct ctx_entry *entry;
	unsigned flags;
};

struct ctx_entry {
	CUcontext ctx;
	unsigned long long ctx_id; /* cuCtxGetId at creation; 0 if unknown */
	uint64_t born;             /* st_ctx_births when its creation began (contexts_drop.c) */
	CUdevice device;
	bool primary; /* the device's primary context */
	bool failed;  /* no heap (backend init failed): pass through */
	void *backend_state;
	/* st_host_backend's state for this context when it is not st_backend
	 * (created with the first pinned heap, under st_ctx_lock's publish) */
	_Atomic(void *) host_backend_state;
	_Atomic(emm_heap_t *) heap;
	/* The heap `heap` replaced (contexts_retire.c): it serves no allocation,
	 * takes its blocks' frees, and goes with the context. */
	_Atomic(emm_heap_t *) retired;
	_Atomic(emm_heap_t *) pinned[PINNED_FLAG_SETS];
	struct pinned_source pinned_src[PINNED_FLAG_SETS];
	struct emm_fence_pool *pool;
	struct emm_fence_ops fence;
	atomic_size_t pitch_align; /* 0 until asked */
	_Atomic(CUstream) carrier; /* carrier.c: made at the first need, gone with the context */
};

extern pthread_mutex_t st_ctx_lock;
/* Held shared by walks over the heaps, exclusive while one is destroyed. */
extern pthread_rwlock_t st_heap_life_lock;
extern atomic_uint_fast64_t st_ctx_generation;
/* Entries whose creation has begun, ever: an entry's `born` is its number. */
extern atomic_uint_fast64_t st_ctx_births;

/* Registry lookups (contexts.c), st_ctx_lock held: the first entry that
 * `match` accepts, or NULL; with `unlink` it leaves the registry. */
typedef bool (*st_ctx_match_fn)(const struct ctx_entry *e, const void *arg);
struct ctx_entry *st_ctx_find_locked(st_ctx_match_fn match, const void *arg, bool unlink);
/* Takes st_ctx_lock: whether the registry has an entry for ctx, and then
 * its device and whether it is the device's primary context. */
bool st_ctx_lookup(CUcontext ctx, CUdevice *ret_device, bool *ret_primary);
/* Drop `stale` and its heaps (contexts_drop.c); false if it was gone
 * already or exit has begun. */
bool st_drop_entry(struct ctx_entry *stale);

/* The thread cache. key: the context's id, or its handle without
 * cuCtxGetId. verified: the driver confirmed it during the current
 * guarded call (set by st_current_entry inside one only, cleared when the
 * outermost call leaves). */
struct st_tls_ctx {
	uint64_t key;
	struct ctx_entry *entry;
	uint64_t generation;
	bool verified;
};
extern EMM_TLS_IE struct st_tls_ctx st_tls_ctx;

/* Bracket everything that touches a heap (a heap pointer, emm_heap_* on
 * one of our addresses): a heap is destroyed (context teardown) only while
 * no thread is between the two. Nest freely; inlined, since every
 * allocation and free enters once: a store, a barrier and a load. */
static inline void st_enter(void)
{
	struct guard_slot *slot;

	if (st_tls_guard_depth++ > 0)
		return;
	slot = st_tls_guard_slot;
	if (EMM_LIKELY(slot)) {
		atomic_store_explicit(&slot->active, 1, memory_order_relaxed);
		st_guard_barrier();
		if (EMM_LIKELY(atomic_load_explicit(&st_guard_dropping, memory_order_relaxed) == 0))
			return;
		atomic_store_explicit(&slot->active, 0, memory_order_release);
	}
	st_enter_slow();
}

static inline void st_leave(void)
{
	if (--st_tls_guard_depth > 0)
		return;
	st_tls_ctx.verified = false;
	if (EMM_LIKELY(st_tls_guard_slot != NULL))
		atomic_store_explicit(&st_tls_guard_slot->active, 0, memory_order_release);
}

/* The thread's current context as its cache knows it, when the cache may
 * be trusted (EMM_CONTEXT_CHECK off, or confirmed by the driver during
 * this call) and is not stale; NULL otherwise. */
static inline CUcontext st_tls_trusted_ctx(void)
{
	if ((!st_opts->context_check || st_tls_ctx.verified) && st_tls_ctx.entry &&
	    st_tls_ctx.generation == atomic_load_explicit(&st_ctx_generation, memory_order_acquire))
		return st_tls_ctx.entry->ctx;
	return NULL;
}

/* The device of the thread's cached context; -1 if the cache is stale. */
static inline int st_tls_device(void)
{
	if (st_tls_ctx.entry &&
	    st_tls_ctx.generation == atomic_load_explicit(&st_ctx_generation, memory_order_relaxed))
		return st_tls_ctx.entry->device;
	return -1;
}

/* Open the EMM_LOG trace (%p expanded; beside another process's trace,
 * never over it); in a fork child, stop tracing into the parent's file
 * when the path has %p (trace_file.c). */
void st_trace_start(void);
void st_trace_fork_child(void);

/* EMM_SNAPSHOT (snapshot.c): on when the option is set (read once, at
 * initialisation); pool and segment events noted into a ring while on;
 * the snapshot written to the path (%p expanded), 0 or a negative errno. */
extern bool st_snapshot_on;
void st_snapshot_setup(void);
void st_snapshot_note(enum emm_snap_action action, uint64_t addr, uint64_t size, uint64_t stream);
void st_snapshot_fork_child(void);
int emm_snapshot_write(const char *pattern, const char *reason);

/* The statistics at exit as EMM_STATS says, and the snapshot
 * (stats_dump.c); the EMM_STATS_SIGNAL handler and its helper thread,
 * installed at initialisation and again in a fork child. */
void st_stats_exit_report(void);
void st_stats_signal_setup(void);
void st_stats_signal_fork_child(void);

/* Segment sizes larger than the device `e`'s backend reports are cut to
 * fit, and the user told once per device (device_fit.c). */
void st_fit_params(struct ctx_entry *e, int device, struct emm_heap_params *p);

/* The entry of the current context. 0; -ENODEV (no context, or `create`
 * false and none yet); -ENOSYS (disabled, exiting, or the context passes
 * through). st_current_entry is the thread cache's hit, inlined (every
 * allocation and every free asks); the rest is st_current_entry_slow's. */
int st_current_entry_slow(struct ctx_entry **ret, bool create);

/* Make `ctx` current around a driver call made outside the shims. */
bool st_push_ctx(CUcontext ctx);
void st_pop_ctx(bool pushed);

/* --- segments.c: the backend behind a context's heaps -------------------- */

/* Set while this thread is inside the backend: a backend that calls a
 * driver export (rather than host->driver_proc) reaches the driver. */
extern EMM_TLS_IE bool st_tls_in_backend;

static inline int st_current_entry(struct ctx_entry **ret, bool create)
{
	struct ctx_entry *e = st_tls_ctx.entry;

	/* Every change of the current context is seen without EMM_CONTEXT_CHECK
	 * (contexts.c): the cache stands until a shim or a teardown empties it. */
	if (EMM_LIKELY(e && atomic_load_explicit(&st_fast_ctx, memory_order_acquire) && !st_tls_in_backend &&
	               st_tls_ctx.generation == atomic_load_explicit(&st_ctx_generation, memory_order_acquire) &&
	               !e->failed)) {
		*ret = e;
		return 0;
	}
	return st_current_entry_slow(ret, create);
}

/* The heap of the context current on this thread, created on first use.
 * 0 and the heap; -ENODEV if no context is current or the driver is not
 * initialised (the shim then calls the real function so the program gets
 * the driver's own error); -ENOSYS if libemm is disabled. */
static inline int st_current_heap(emm_heap_t **ret_heap)
{
	struct ctx_entry *e;
	int ret = st_current_entry(&e, true);

	if (ret < 0)
		return ret;
	*ret_heap = e->heap;
	return 0;
}

/* Before a free of one of our blocks: make sure the heap of the current
 * context still belongs to the live context (a reset that bypassed our
 * shims is noticed here, so the stale block goes to the driver). Cheap:
 * one cuCtxGetId and a thread-local compare (no call with
 * EMM_CONTEXT_CHECK off and the thread's cache valid). */
static inline void st_validate_current(void)
{
	struct ctx_entry *e;

	(void)st_current_entry(&e, false);
}

/* The backend's init for the context of `e` (current) on device `dev`. */
int st_backend_init(struct ctx_entry *e, CUdevice dev);
/* The pinned-host backend's state for `e` (st_host_backend); created by
 * st_host_backend_init with the first pinned heap (0, or a negative errno:
 * no pinned caching for this context), dropped with the context. */
void *st_host_state(struct ctx_entry *e);
int st_host_backend_init(struct ctx_entry *e);
void st_host_backend_fini(struct ctx_entry *e, bool driver_alive);
/* The segment source callbacks of a context's device heap (state: e). */
int st_device_segment_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret_addr);
int st_device_segment_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream);
/* The backend's page operations for the entry's heap (a version 2 backend
 * with CAP_REMAP or CAP_GROW); false: none. */
bool st_segment_pages(struct ctx_entry *e, struct emm_segment_pages *ret);

/* Take a segment from / give one back to the backend of `e`: device
 * memory, or pinned host memory of the flag set `flags` when `host`. */
int st_segment_alloc(struct ctx_entry *e, bool host, unsigned flags, size_t size, emm_stream_t stream,
                     emm_addr_t *ret_addr);
int st_segment_free(struct ctx_entry *e, bool host, emm_addr_t addr, size_t size, emm_stream_t stream);

struct heap_ref {
	emm_heap_t *heap;
	int device;
	CUcontext ctx;
};

/* Snapshot the live heaps (caller frees). st_ctx_lock held. */
struct heap_ref *st_snapshot_locked(size_t *ret_count);
/* The most heaps a context has: its device heap, a retired one, pinned. */
#define ST_CONTEXT_HEAPS (2 + PINNED_FLAG_SETS)
/* The heaps of ctx (device first; at most ST_CONTEXT_HEAPS).
 * st_ctx_lock held. */
size_t st_heaps_of_context_locked(CUcontext ctx, emm_heap_t **out);
/* Every registered entry `match` accepts, at most `cap` in out: how many.
 * st_ctx_lock held. */
size_t st_ctx_collect_locked(st_ctx_match_fn match, const void *arg, struct ctx_entry **out, size_t cap);
/* A fresh device heap for entry e (not published). */
int st_entry_heap_create(struct ctx_entry *e, emm_heap_t **ret);
/* contexts_retire.c: device `device`'s contexts get fresh heaps, their
 * old ones retired. */
void st_contexts_retire_heaps(int device);
/* The heap of the block at addr if it is a retired one (its idle memory
 * goes back after the free), else NULL; no look-up before any retirement. */
emm_heap_t *st_retired_heap_of(emm_addr_t addr);

void st_contexts_fork_child(void);

/* The entry whose heap `heap` is (device or pinned); NULL if none. */
struct ctx_entry *st_heap_entry(const emm_heap_t *heap);
/* Drops the heaps of primary contexts found inactive (released or reset
 * where libemm could not see it: a program using libemm through its
 * package, without the preload, whose framework released the context), so
 * that a release of idle memory makes no driver call in a dead context. */
void st_drop_inactive_primaries(void);
/* The primary context of `dev`: 1 active, 0 inactive (released or reset:
 * its memory is gone), -1 unknown (the driver did not answer). */
int st_primary_state(CUdevice dev);
/* Under a tool: `ctx` is dead though a thread may have it current: a
 * primary context reset (through our shims or not) and not retained since,
 * or a context the program destroyed (contexts_drop.c). */
bool st_context_known_dead(CUcontext ctx);

/* --- pinned.c ------------------------------------------------------------ */

void st_pinned_fork_child(void);

/* --- streams.c ----------------------------------------------------------- */

/*
 * Make a new heap of `ctx`, which no other thread sees yet, known: announce
 * the context's live streams to it (heap calls, no lock held), then call
 * publish_locked(arg) under st_ctx_lock - but only once no stream was
 * created or destroyed since the announcement (else announce again), so
 * every stream is either announced here or finds the published heap
 * itself. 0, or -ENOMEM (nothing published).
 */
int st_publish_heap(emm_heap_t *heap, CUcontext ctx, void (*publish_locked)(void *arg), void *arg);
/* Forget every stream of a context. */
void st_stream_remove_context(CUcontext ctx);

void st_streams_fork_child(void);

/* The keys of the live non-blocking streams of ctx: how many there are
 * (only the first `cap` are written). */
size_t st_stream_nonblocking_keys(CUcontext ctx, emm_stream_t *keys, size_t cap);

/* --- vmm.c, vmm_idle.c: the VMM cache ------------------------------------ */

/* Idle cached VMM bytes of `device` (-1 all). */
size_t st_vmm_idle_bytes(int device);
/* Make pending deferrals real and give idle VMM memory of `device` (-1
 * all) back; the bytes released. */
size_t st_vmm_release_idle(int device);
/* The VMM counters of `device` (-1 all, -2 none) added into *out. */
void st_vmm_add_stats(int device, struct emm_stats *out);
void st_vmm_fork_prepare(void);
void st_vmm_fork_child(void);

/* --- stats.c ------------------------------------------------------------- */

/* Idle bytes libemm holds on `device`: its heaps' free blocks (every
 * context of the device) and its idle VMM buffers. */
size_t st_idle_bytes_device(int device);
/* A heap is about to be destroyed: keep its counters for EMM_STATS.
 * st_heap_life_lock held exclusive. */
void st_stats_retire(emm_heap_t *heap);
void st_stats_fork_child(void);

/* --- ipc_export.c and ipc.c ---------------------------------------------- */

/* The heap of `entry` gives back device segment `base`: true when the
 * segment has IPC exports that a process still has open, so it stays
 * allocated (the backend free is skipped; ipc_export.c). Also gives back
 * retired segments nobody holds any more. */
bool st_ipc_keep_segment(struct ctx_entry *entry, emm_addr_t base, size_t size);
/* emm_release_idle: give back the retired segments of `device` (-1 all)
 * that nobody holds any more; the bytes. */
size_t st_ipc_release_retired(int device);
/* Context ctx is gone: forget its exports, kept segments and imports (no
 * driver calls: its memory went with it). entry: its registry entry, NULL
 * when libemm kept none (its imports only). */
void st_ipc_context_dropped(CUcontext ctx, struct ctx_entry *entry);
void st_ipc_fork_child(void);

/* --- capture.c and quarantine.c: one idea in two files ------------------- */

/* Over captures, quarantine sets, blocks and graph objects; a leaf. */
extern pthread_mutex_t st_capture_lock;
/* Active captures (tracked or not); read without the lock on fast paths. */
extern atomic_uint st_capture_count;

/* The blocks one capture's graph (and everything derived) may touch. */
struct st_qset;

/* Blocks to free into their heaps once st_capture_lock is dropped. */
struct st_release_item {
	emm_addr_t addr;
	emm_heap_t *heap;
};
struct st_release {
	struct st_release_item *items;
	size_t n, cap;
	size_t lost; /* could not be recorded (no memory): leaked */
};
/* Free them (no lock held), under the heap guard. */
void st_release_run(struct st_release *rel);

/* quarantine.c, st_capture_lock held: a new set for a capture (NULL
 * without memory); drop a reference; the capture that owned qs ended with
 * `graph` (NULL: it failed) - the graph inherits the set; a context is
 * gone (its blocks are forgotten, its graphs dropped); fork. */
struct st_qset *st_qset_new_locked(void);
void st_qset_put_locked(struct st_qset *qs, struct st_release *rel);
void st_qset_capture_ended_locked(struct st_qset *qs, CUgraph graph, CUcontext ctx, struct st_release *rel);
void st_quarantine_context_dropped_locked(CUcontext ctx, emm_heap_t *const *heaps, size_t nheaps,
                                          struct st_release *rel);
void st_quarantine_fork_child(void);

/* capture.c, st_capture_lock held: is any capture recorded; is any active
 * (recorded or not); may the calling thread be capturing (it began an
 * active capture, or a capture has no record); call fn with each recorded
 * capture's set (NULL for a capture without one). */
bool st_captures_listed_locked(void);
bool st_captures_active_locked(void);
bool st_capture_by_this_thread_locked(void);
void st_capture_each_set_locked(void (*fn)(struct st_qset *qs, void *arg), void *arg);

/* capture.c, the gate of the fence ops (no lock held): an event record or
 * query for stream key `key` (EMM_STREAM_SYNC: not tied to one stream)
 * enters, and is refused (false) when a recorded capture forbids it
 * (emm_state_capture_forbids); a capture begun meanwhile waits for it to
 * leave. A host wait only checks (true: allowed), and is not waited for. */
bool st_capture_gate_enter(emm_stream_t key, unsigned *ret_phase);
/* The same for a cuStreamWaitEvent on `key`: refused only while `key`
 * itself (or a stream libemm cannot name) is being captured. */
bool st_capture_gate_enter_wait(emm_stream_t key, unsigned *ret_phase);
void st_capture_gate_leave(unsigned phase);
bool st_capture_gate_check(emm_stream_t key);

/* capture.c: switch the calling thread to relaxed capture mode (around a
 * backend call); the mode to give st_capture_unrelax, -1 if none was
 * switched. */
int st_capture_relax(void);
void st_capture_unrelax(int previous);

#pragma GCC visibility pop

#endif
