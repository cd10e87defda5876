/* SPDX-License-Identifier: MIT */
/*
 * interpose/state.c - libemm's process state: lazy initialisation, one heap
 * per CUDA context, pinned-host heaps per (context, flag set), stream keys,
 * the registry of live streams, context teardown (and detecting a reset
 * that bypassed our shims), fork and exit, and the counters kept outside
 * any heap. Captures and the graph quarantine live in capture.c.
 *
 * Initialisation runs once, on the first call of a shim (pthread_once):
 * options, the backend (a failure leaves libemm a pure pass-through, never a
 * crash), the EMM_LOG trace and the atexit handler. The constructor only
 * registers the fork handlers.
 *
 * Finding the heap of the calling thread costs one real driver call and a
 * thread-local compare: each thread caches (context id, entry, generation),
 * and any context teardown bumps the generation so every cache misses once.
 * The key is the context's unique id (cuCtxGetId of the current context):
 * a primary context keeps its handle across a reset, and cudart's
 * cudaDeviceReset resets it without calling any shim of ours, so the handle
 * alone would keep serving the old context's heap, whose segments the
 * driver has freed. An entry whose context handle now carries another id is
 * stale: its heaps are dropped without driver calls (later frees of its
 * blocks go to the driver and get its error) and a new entry is built.
 * Frees check the same (emm_state_validate_current) before the pool takes
 * the block. Without cuCtxGetId (drivers before 12.0) the handle is the key.
 * Entries are never freed (a torn-down one is unlinked), so a stale cache
 * never points at freed memory.
 *
 * Pinned heaps are per context too: the driver frees cuMemHostAlloc memory
 * with the context that allocated it. Their fences are the context's events,
 * recorded on its legacy stream and its live non-blocking streams (the
 * streams are announced to the pinned heaps as to the device heap), because
 * pinned memory is read by asynchronous copies on those streams.
 *
 * Exit: the atexit handler and the library destructor set `exiting`. The
 * handler is registered at initialisation and again when each of the first
 * contexts gets its heap: atexit handlers run last-registered first, and a
 * runtime's teardown (cudart's, registered when it initialises, which may
 * be after our initialisation: cudart's own cuGetProcAddress calls
 * initialise us) releases or resets the primary context, so ours must come
 * first. From then on nothing libemm owns is freed or invalidated (other
 * threads may still be in the shims until the process dies): context
 * teardown no longer destroys heaps, allocations go to the driver, frees of
 * our blocks succeed without any driver call (fences read as complete,
 * segments are not returned), and EMM_STATS prints from counters alone. No
 * exit handler of ours calls the driver.
 *
 * Heap guard: a heap is destroyed only when its context goes (cuCtxDestroy,
 * a primary context reset or last release, a reset noticed through the
 * context id) - possibly while other threads are inside it (a runtime's
 * exit-time teardown while worker threads still allocate). Every shim path
 * that touches a heap runs between emm_state_enter and emm_state_leave,
 * which publish "this thread is inside" in a per-thread slot; the thread
 * tearing down raises `dropping`, waits until no other thread is inside,
 * destroys, and lowers it; threads arriving meanwhile wait at the door. The
 * hot path is a store, a barrier and a load: with membarrier(2) (private
 * expedited) the barrier is a compiler barrier and the teardown pays the
 * full fence for every thread; without it, a full fence on each entry.
 *
 * Fork: the child forgets every heap, context, stream, capture, event pool
 * and address map without calling CUDA (the parent's objects are not its
 * own) and starts empty; its first allocation builds a new heap.
 */
#include "interpose/state.h"

#include <errno.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "allocator/backend_loader.h"
#include "allocator/ptrmap.h"
#include "allocator/trace.h"
#include "common/compiler.h"
#include "common/log.h"
#include "config/options.h"
#include "emm/emm_version.h"
#include "interpose/real.h"
#include "interpose/state_priv.h"

/* Thread-locals in the initial-exec model: libemm is preloaded (its TLS is
 * in the static block), and the hot paths read them on every call, which
 * the general-dynamic model would turn into __tls_get_addr calls. */
#define EMM_TLS_IE _Thread_local __attribute__((tls_model("initial-exec")))

#define PINNED_FLAG_SETS 8u /* PORTABLE | DEVICEMAP | WRITECOMBINED */
#define MAX_DEVICES      64
#define STREAM_BUCKETS   256
#define MAX_ATEXIT       16 /* registrations of state_atexit (see above) */

/* --- initialisation ---------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static atomic_uint atexit_registrations;
static atomic_bool init_done; /* state_init has finished */
static bool st_enabled;       /* written once inside state_init */
static atomic_bool st_exiting;
static EMM_TLS_IE bool tls_in_init;
/* Set while this thread is inside the backend: a backend that calls a
 * driver export (rather than host->driver_proc) reaches the driver. */
static EMM_TLS_IE bool tls_in_backend;

static const struct emm_options *st_opts;
static struct emm_backend_loaded st_backend;
static struct emm_backend_host st_host;

static const struct emm_real_driver_table st_null_real;
static _Atomic(const struct emm_real_driver_table *) st_real;
static struct emm_state_real_extra st_extra;
static pthread_once_t extra_once = PTHREAD_ONCE_INIT;

const struct emm_real_driver_table *emm_state_real(void)
{
	const struct emm_real_driver_table *t = atomic_load_explicit(&st_real, memory_order_acquire);

	if (EMM_LIKELY(t))
		return t;
	t = emm_real_driver_table();
	if (!t)
		return &st_null_real; /* no driver yet: every member NULL */
	atomic_store_explicit(&st_real, t, memory_order_release);
	return t;
}

static void extra_init(void)
{
#define EXTRA(name) st_extra.name = (__typeof__(st_extra.name))emm_real_driver(#name)
	EXTRA(cuCtxPushCurrent_v2);
	EXTRA(cuCtxPopCurrent_v2);
	EXTRA(cuDeviceGetAttribute);
	EXTRA(cuDevicePrimaryCtxRetain);
	EXTRA(cuStreamBeginCapture_v2_ptsz);
	EXTRA(cuStreamEndCapture_ptsz);
	EXTRA(cuStreamBeginCaptureToGraph);
	EXTRA(cuStreamBeginCaptureToGraph_ptsz);
	EXTRA(cuStreamIsCapturing_ptsz);
	EXTRA(cuCtxGetId);
	EXTRA(cuStreamBeginCapture_ptsz);
	EXTRA(cuGraphInstantiateWithFlags);
	EXTRA(cuGraphClone);
	EXTRA(cuGraphDestroy);
	EXTRA(cuGraphExecDestroy);
	EXTRA(cuGraphAddChildGraphNode);
	EXTRA(cuGraphExecChildGraphNodeSetParams);
	EXTRA(cuGraphExecNodeSetParams);
	EXTRA(cuGraphNodeSetParams);
#undef EXTRA
#define EXTRA_AS(member, name) st_extra.member = (__typeof__(st_extra.member))emm_real_driver(name)
	EXTRA_AS(stream_begin_capture_v1, "cuStreamBeginCapture");
	EXTRA_AS(graph_instantiate_v1, "cuGraphInstantiate");
	EXTRA_AS(graph_instantiate_v2, "cuGraphInstantiate_v2");
	EXTRA_AS(graph_instantiate_with_params, "cuGraphInstantiateWithParams");
	EXTRA_AS(graph_instantiate_with_params_ptsz, "cuGraphInstantiateWithParams_ptsz");
	EXTRA_AS(graph_add_node_v1, "cuGraphAddNode");
	EXTRA_AS(graph_add_node_v2, "cuGraphAddNode_v2");
	EXTRA_AS(graph_exec_update_v1, "cuGraphExecUpdate");
	EXTRA_AS(graph_exec_update_v2, "cuGraphExecUpdate_v2");
#undef EXTRA_AS
}

const struct emm_state_real_extra *emm_state_real_extra(void)
{
	pthread_once(&extra_once, extra_init);
	return &st_extra;
}

static void backend_log(enum emm_backend_log_level level, const char *msg)
{
	static const enum emm_log_level map[] = {
	    [EMM_BACKEND_LOG_DEBUG] = EMM_LOG_DEBUG,
	    [EMM_BACKEND_LOG_INFO] = EMM_LOG_INFO,
	    [EMM_BACKEND_LOG_WARNING] = EMM_LOG_WARNING,
	    [EMM_BACKEND_LOG_ERROR] = EMM_LOG_ERROR,
	};

	emm_log((unsigned)level < EMM_ARRAY_SIZE(map) ? map[level] : EMM_LOG_ERROR, "backend %s: %s",
	        st_backend.table ? st_backend.table->name : "?", msg);
}

static void state_atexit(void);
static void guard_setup(void);

static void state_init(void)
{
	const struct emm_options *opts;
	int ret;

	tls_in_init = true;
	opts = emm_options_get();
	st_opts = opts;
	if (opts->verbose >= 2)
		emm_log_set_debug(true);

	if (opts->disable) {
		if (opts->verbose >= 1) {
			emm_info("libemm %s disabled (EMM_DISABLE): every call goes to the driver",
			         EMM_VERSION_STRING);
			emm_options_print(opts, emm_options_sources());
		}
		goto out;
	}

	ret = emm_backend_load(opts->backend, &st_backend);
	if (ret < 0) {
		emm_error("backend \"%s\" could not be loaded (reason above): libemm passes every call "
		          "through to the driver",
		          opts->backend);
		memset(&st_backend, 0, sizeof(st_backend));
		goto out;
	}
	if (!(st_backend.table->caps & EMM_BACKEND_CAP_DEVICE)) {
		emm_error(
		    "backend \"%s\" (%s) does not serve device memory: libemm passes every call through "
		    "to the driver",
		    st_backend.table->name, st_backend.path);
		memset(&st_backend, 0, sizeof(st_backend));
		goto out;
	}

	st_host.interface_version = st_backend.version;
	st_host.struct_size = sizeof(st_host);
	st_host.driver_proc = emm_real_driver;
	st_host.log = backend_log;
	st_host.options = opts->backend_options;

	if (opts->verbose >= 1) {
		emm_info("libemm %s, backend %s (%s)", EMM_VERSION_STRING, st_backend.table->name,
		         st_backend.path);
		emm_options_print(opts, emm_options_sources());
	}
	if (opts->log_file[0]) {
		ret = emm_trace_open(opts->log_file);
		if (ret < 0 && ret != -EBUSY)
			emm_warn("EMM_LOG: cannot open %s: %s (no trace is written)", opts->log_file,
			         strerror(-ret));
	}
	atomic_fetch_add(&atexit_registrations, 1);
	if (atexit(state_atexit) != 0)
		emm_warn("atexit failed: EMM_STATS will not print");
	guard_setup();
	st_enabled = true;
out:
	tls_in_init = false;
	atomic_store_explicit(&init_done, true, memory_order_release);
}

bool emm_state_enabled(void)
{
	if (EMM_LIKELY(atomic_load_explicit(&init_done, memory_order_acquire)))
		return st_enabled;
	if (tls_in_init)
		return false; /* re-entered from our own initialisation: pass through */
	pthread_once(&init_once, state_init);
	return st_enabled;
}

const struct emm_options *emm_state_options(void)
{
	return st_opts ? st_opts : emm_options_get();
}

bool emm_state_exiting(void)
{
	return atomic_load_explicit(&st_exiting, memory_order_relaxed);
}

void emm_state_driver_gone(void)
{
	atomic_store(&st_exiting, true);
}

const char *emm_state_backend_name(void)
{
	return st_backend.table ? st_backend.table->name : "none";
}

const char *emm_state_backend_path(void)
{
	return st_backend.table ? st_backend.path : "";
}

/* --- heap guard (see the top of this file) ---------------------------- */

struct guard_slot {
	atomic_uint active; /* this thread is inside a heap */
	atomic_bool used;   /* owned by a live thread */
	struct guard_slot *next;
} __attribute__((aligned(64)));

static _Atomic(struct guard_slot *) guard_slots; /* never freed; slots are reused */
static atomic_uint guard_dropping;
static bool guard_asymmetric; /* membarrier registered: cheap entry barrier */
static pthread_key_t guard_key;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static EMM_TLS_IE struct guard_slot *tls_slot;
static EMM_TLS_IE unsigned tls_guard_depth;

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
		guard_asymmetric = true;
	emm_debug("heap guard: %s", guard_asymmetric ? "membarrier" : "fences");
}

/* Called from state_init, before any thread can enter. */
static void guard_setup(void)
{
	pthread_once(&guard_once, guard_init);
}

static struct guard_slot *guard_slot_get(void)
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
		atomic_init(&slot->used, true);
		slot->next = atomic_load(&guard_slots);
		while (!atomic_compare_exchange_weak(&guard_slots, &slot->next, slot))
			;
	}
	(void)pthread_setspecific(guard_key, slot);
	tls_slot = slot;
	/* A new thread using CUDA: run our exit handler before the teardown
	 * of whatever initialised before it (see the top of this file). */
	if (atomic_fetch_add(&atexit_registrations, 1) < MAX_ATEXIT)
		(void)atexit(state_atexit);
	return slot;
}

static inline void guard_barrier(void)
{
	if (guard_asymmetric)
		atomic_signal_fence(memory_order_seq_cst);
	else
		atomic_thread_fence(memory_order_seq_cst);
}

/* Publish "inside", then wait at the door while a teardown runs. */
static void guard_publish(struct guard_slot *slot)
{
	for (;;) {
		atomic_store_explicit(&slot->active, 1, memory_order_relaxed);
		guard_barrier();
		if (EMM_LIKELY(atomic_load_explicit(&guard_dropping, memory_order_relaxed) == 0))
			return;
		atomic_store_explicit(&slot->active, 0, memory_order_release);
		while (atomic_load_explicit(&guard_dropping, memory_order_acquire) != 0)
			sched_yield();
	}
}

void emm_state_enter(void)
{
	struct guard_slot *slot;

	if (tls_guard_depth++ > 0)
		return;
	slot = tls_slot;
	if (EMM_UNLIKELY(!slot)) {
		slot = guard_slot_get();
		if (!slot)
			return; /* no memory for a slot: unguarded */
	}
	guard_publish(slot);
}

void emm_state_leave(void)
{
	if (--tls_guard_depth > 0)
		return;
	if (EMM_LIKELY(tls_slot != NULL))
		atomic_store_explicit(&tls_slot->active, 0, memory_order_release);
}

/* A teardown started from inside the guard (a reset noticed in
 * current_entry, which has not touched a heap yet) steps out before it
 * takes any lock, so that it never waits on a thread that waits on it. */
static void guard_step_out(void)
{
	if (tls_guard_depth && tls_slot)
		atomic_store_explicit(&tls_slot->active, 0, memory_order_release);
}

static void guard_step_in(void)
{
	if (tls_guard_depth && tls_slot)
		guard_publish(tls_slot);
}

/* Wait until no other thread is inside a heap; new arrivals wait until
 * guard_end. The caller is outside (guard_step_out). */
static void guard_begin(void)
{
	atomic_fetch_add(&guard_dropping, 1);
	if (guard_asymmetric)
		(void)syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
	else
		atomic_thread_fence(memory_order_seq_cst);
	for (struct guard_slot *slot = atomic_load(&guard_slots); slot; slot = slot->next) {
		if (slot == tls_slot)
			continue;
		while (atomic_load_explicit(&slot->active, memory_order_acquire) != 0)
			sched_yield();
	}
}

static void guard_end(void)
{
	atomic_fetch_sub(&guard_dropping, 1);
}

static void guard_fork_child(void)
{
	/* Only this thread exists; slots of the others are forgotten. */
	atomic_store(&guard_slots, NULL);
	atomic_store(&guard_dropping, 0);
	tls_slot = NULL;
	tls_guard_depth = 0;
}

/* --- stream keys ------------------------------------------------------- */

static atomic_uint_fast64_t next_thread_index = 1;
static EMM_TLS_IE uint64_t tls_thread_index;

static emm_stream_t per_thread_key(void)
{
	if (EMM_UNLIKELY(!tls_thread_index))
		tls_thread_index = atomic_fetch_add(&next_thread_index, 1);
	return EMM_STREAM_PER_THREAD_KEY(tls_thread_index);
}

emm_stream_t emm_state_stream_key(CUstream stream, bool per_thread_default)
{
	if (stream == NULL)
		return per_thread_default ? per_thread_key() : EMM_STREAM_LEGACY;
	if (stream == CU_STREAM_LEGACY)
		return EMM_STREAM_LEGACY;
	if (stream == CU_STREAM_PER_THREAD)
		return per_thread_key();
	return (emm_stream_t)(uintptr_t)stream;
}

CUstream emm_state_stream_handle(emm_stream_t key)
{
	if (key == EMM_STREAM_SYNC || key == EMM_STREAM_LEGACY)
		return CU_STREAM_LEGACY;
	if (EMM_STREAM_IS_PER_THREAD(key))
		/* Our own per-thread stream exactly; another thread's is ordered
		 * by the legacy stream (a barrier for every per-thread stream). */
		return key == per_thread_key() ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
	return (CUstream)(uintptr_t)key;
}

static bool key_is_real_stream(emm_stream_t key)
{
	return key != EMM_STREAM_SYNC && key != EMM_STREAM_LEGACY && !EMM_STREAM_IS_PER_THREAD(key);
}

/* --- counters ---------------------------------------------------------- */

enum { COL_ALLOC, COL_FREE, COL_BAD, COL__COUNT };

static atomic_uint_fast64_t counters[EMM_COUNT__COUNT];
/* [0..MAX_DEVICES) devices, MAX_DEVICES pinned, MAX_DEVICES+1 unknown. */
static atomic_uint_fast64_t dev_counters[MAX_DEVICES + 2][COL__COUNT];

/* --- context registry -------------------------------------------------- */

struct pinned_source {
	struct ctx_entry *entry;
	unsigned flags;
};

struct ctx_entry {
	CUcontext ctx;
	unsigned long long ctx_id; /* cuCtxGetId at creation; 0 if unknown */
	CUdevice device;
	bool primary; /* the device's primary context */
	bool failed;  /* no heap (backend init failed): pass through */
	void *backend_state;
	emm_heap_t *heap;
	_Atomic(emm_heap_t *) pinned[PINNED_FLAG_SETS];
	struct pinned_source pinned_src[PINNED_FLAG_SETS];
	struct emm_fence_pool *pool;
	struct emm_fence_ops fence;
	atomic_size_t pitch_align; /* 0 until asked */
};

static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
/* Held shared by walks over the heaps, exclusive while one is destroyed. */
static pthread_rwlock_t heap_life_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct ctx_entry **ctx_list;
static size_t ctx_count, ctx_cap;
static atomic_uint_fast64_t ctx_generation = 1;
static atomic_bool have_pinned;

/* key: the context's id, or its handle without cuCtxGetId */
static EMM_TLS_IE struct {
	uint64_t key;
	struct ctx_entry *entry;
	uint64_t generation;
} tls_ctx;

/* Counters of heaps already destroyed, so EMM_STATS still shows a device
 * whose context was reset before exit. Current values are zeroed. */
static struct emm_stats retired[MAX_DEVICES + 1];

static int device_slot(int device)
{
	if (device == -2)
		return MAX_DEVICES;
	if (device >= 0 && device < MAX_DEVICES)
		return device;
	return MAX_DEVICES + 1;
}

static int tls_device(void)
{
	if (tls_ctx.entry &&
	    tls_ctx.generation == atomic_load_explicit(&ctx_generation, memory_order_relaxed))
		return tls_ctx.entry->device;
	return -1;
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
		count_at(which, tls_device());
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

void emm_state_counters(uint64_t out[EMM_COUNT__COUNT])
{
	for (int i = 0; i < EMM_COUNT__COUNT; i++)
		out[i] = atomic_load_explicit(&counters[i], memory_order_relaxed);
}

void emm_state_add_counter_stats(int device, struct emm_stats *out)
{
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

/* --- heap parameters and segment sources ------------------------------- */

static void heap_params(struct emm_heap_params *p)
{
	const struct emm_options *o = st_opts;

	emm_heap_params_default(p);
	p->small_max = o->small_size;
	p->small_segment = o->small_segment;
	p->large_segment = o->large_segment;
	p->large_round = o->large_round;
	p->max_split = o->max_split;
	p->roundup_divisions = o->roundup_divisions;
	p->release_threshold = o->release_threshold;
	p->oom_retry = o->oom_retry;
	switch (o->free_mode) {
	case EMM_OPT_FREE_STRICT:
		p->free_mode = EMM_FREE_MODE_STRICT;
		break;
	case EMM_OPT_FREE_STREAM:
		p->free_mode = EMM_FREE_MODE_STREAM;
		break;
	case EMM_OPT_FREE_FENCE:
	default:
		p->free_mode = EMM_FREE_MODE_FENCE;
		break;
	}
	p->epoch_max_blocks = o->epoch_blocks;
	p->epoch_max_bytes = o->epoch_bytes;
	p->arenas = o->arenas;
}

/* The stream value a backend sees: 0 when unknown, else a CUstream. */
static uint64_t backend_stream(emm_stream_t key)
{
	if (key == EMM_STREAM_SYNC)
		return 0;
	return (uint64_t)(uintptr_t)emm_state_stream_handle(key);
}

/* Make `ctx` current around a driver call made outside the shims. */
static bool push_ctx(CUcontext ctx)
{
	const struct emm_state_real_extra *x = emm_state_real_extra();
	CUcontext cur = NULL;

	if (!emm_state_real()->cuCtxGetCurrent || emm_state_real()->cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
		cur = NULL;
	if (cur == ctx || !x->cuCtxPushCurrent_v2 || !x->cuCtxPopCurrent_v2)
		return false;
	return x->cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS;
}

static void pop_ctx(bool pushed)
{
	CUcontext popped;

	if (pushed)
		(void)emm_state_real_extra()->cuCtxPopCurrent_v2(&popped);
}

static int seg_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret_addr)
{
	struct ctx_entry *e = state;

	int ret;

	if (emm_state_exiting())
		return -ENOMEM;
	tls_in_backend = true;
	ret = st_backend.table->segment_alloc(e->backend_state, size, backend_stream(stream), ret_addr);
	tls_in_backend = false;
	return ret;
}

static int seg_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	struct ctx_entry *e = state;
	bool pushed;
	int ret;

	if (emm_state_exiting())
		return 0; /* the driver frees everything with the process */
	pushed = push_ctx(e->ctx);
	tls_in_backend = true;
	ret = st_backend.table->segment_free(e->backend_state, addr, size, backend_stream(stream));
	tls_in_backend = false;
	pop_ctx(pushed);
	return ret;
}

static int host_seg_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret_addr)
{
	struct pinned_source *src = state;

	int ret;

	(void)stream;
	if (emm_state_exiting())
		return -ENOMEM;
	tls_in_backend = true;
	ret = st_backend.table->host_segment_alloc(src->entry->backend_state, size, src->flags, ret_addr);
	tls_in_backend = false;
	return ret;
}

static int host_seg_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	struct pinned_source *src = state;
	bool pushed;
	int ret;

	(void)stream;
	if (emm_state_exiting())
		return 0;
	pushed = push_ctx(src->entry->ctx);
	tls_in_backend = true;
	ret = st_backend.table->host_segment_free(src->entry->backend_state, addr, size);
	tls_in_backend = false;
	pop_ctx(pushed);
	return ret;
}

/* --- stream registry --------------------------------------------------- */

struct stream_node {
	emm_stream_t key;
	CUcontext ctx;
	bool nonblocking;
	struct stream_node *next;
};

static pthread_rwlock_t stream_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct stream_node *stream_buckets[STREAM_BUCKETS];

static unsigned stream_bucket(emm_stream_t key)
{
	return (unsigned)(((key >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> 56) % STREAM_BUCKETS;
}

static void stream_insert(emm_stream_t key, CUcontext ctx, bool nonblocking)
{
	struct stream_node *n, **head = &stream_buckets[stream_bucket(key)];

	pthread_rwlock_wrlock(&stream_lock);
	for (n = *head; n; n = n->next)
		if (n->key == key)
			break;
	if (!n) {
		n = calloc(1, sizeof(*n));
		if (n) {
			n->key = key;
			n->next = *head;
			*head = n;
		}
	}
	if (n) {
		n->ctx = ctx;
		n->nonblocking = nonblocking;
	}
	pthread_rwlock_unlock(&stream_lock);
}

/* Remove a stream; its context (NULL if unknown). */
static CUcontext stream_remove(emm_stream_t key)
{
	struct stream_node **link, *n = NULL;
	CUcontext ctx = NULL;

	pthread_rwlock_wrlock(&stream_lock);
	for (link = &stream_buckets[stream_bucket(key)]; *link; link = &(*link)->next) {
		if ((*link)->key == key) {
			n = *link;
			*link = n->next;
			break;
		}
	}
	pthread_rwlock_unlock(&stream_lock);
	if (n) {
		ctx = n->ctx;
		free(n);
	}
	return ctx;
}

/* Forget every stream of a context. */
static void stream_remove_context(CUcontext ctx)
{
	pthread_rwlock_wrlock(&stream_lock);
	for (unsigned b = 0; b < STREAM_BUCKETS; b++) {
		struct stream_node **link = &stream_buckets[b];
		while (*link) {
			struct stream_node *n = *link;
			if (n->ctx == ctx) {
				*link = n->next;
				free(n);
			} else {
				link = &n->next;
			}
		}
	}
	pthread_rwlock_unlock(&stream_lock);
}

CUcontext emm_state_stream_context(emm_stream_t key)
{
	struct stream_node *n;
	CUcontext ctx = NULL;

	if (!key_is_real_stream(key))
		return NULL;
	pthread_rwlock_rdlock(&stream_lock);
	for (n = stream_buckets[stream_bucket(key)]; n; n = n->next) {
		if (n->key == key) {
			ctx = n->ctx;
			break;
		}
	}
	pthread_rwlock_unlock(&stream_lock);
	return ctx;
}

/* Announce every live stream of the context to a new heap. */
static void announce_streams(emm_heap_t *heap, CUcontext ctx)
{
	pthread_rwlock_rdlock(&stream_lock);
	for (unsigned b = 0; b < STREAM_BUCKETS; b++)
		for (struct stream_node *n = stream_buckets[b]; n; n = n->next)
			if (n->ctx == ctx)
				emm_heap_stream_created(heap, n->key, n->nonblocking);
	pthread_rwlock_unlock(&stream_lock);
}

/* --- entries ----------------------------------------------------------- */

static struct ctx_entry *entry_find_locked(CUcontext ctx)
{
	for (size_t i = 0; i < ctx_count; i++)
		if (ctx_list[i]->ctx == ctx)
			return ctx_list[i];
	return NULL;
}

/* Is ctx the primary context of dev? Retaining an active primary context
 * only bumps its count, so retain + release leaves it as it was. */
static bool is_primary_context(CUcontext ctx, CUdevice dev)
{
	const struct emm_real_driver_table *real = emm_state_real();
	const struct emm_state_real_extra *x = emm_state_real_extra();
	unsigned int flags = 0;
	int active = 0;
	CUcontext primary = NULL;

	if (!real->cuDevicePrimaryCtxGetState || !x->cuDevicePrimaryCtxRetain ||
	    !real->cuDevicePrimaryCtxRelease_v2)
		return false;
	if (real->cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS || !active)
		return false;
	if (x->cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS)
		return false;
	(void)real->cuDevicePrimaryCtxRelease_v2(dev);
	return primary == ctx;
}

/* Build the entry (and heap) of the current context `ctx`. ctx_lock held.
 * Returns NULL only without memory; a failed backend gives a failed entry
 * (pass-through for that context). */
static struct ctx_entry *entry_create_locked(CUcontext ctx, unsigned long long ctx_id)
{
	const struct emm_real_driver_table *real = emm_state_real();
	struct emm_heap_params params;
	struct emm_segment_source src;
	struct ctx_entry *e;
	CUdevice dev = 0;
	int ret;

	if (ctx_count == ctx_cap) {
		size_t cap = ctx_cap ? ctx_cap * 2 : 8;
		struct ctx_entry **list = realloc(ctx_list, cap * sizeof(*list));
		if (!list)
			return NULL;
		ctx_list = list;
		ctx_cap = cap;
	}
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->ctx = ctx;
	e->ctx_id = ctx_id;
	for (unsigned i = 0; i < PINNED_FLAG_SETS; i++) {
		e->pinned_src[i].entry = e;
		e->pinned_src[i].flags = i;
	}

	if (!real->cuCtxGetDevice || real->cuCtxGetDevice(&dev) != CUDA_SUCCESS) {
		e->failed = true;
		goto publish;
	}
	e->device = dev;
	e->primary = is_primary_context(ctx, dev);
	e->pool = emm_fence_pool_get(ctx);
	if (!e->pool) {
		e->failed = true;
		goto publish;
	}
	emm_fence_ops_init(e->pool, &e->fence);

	tls_in_backend = true;
	ret = st_backend.table->init(&st_host, dev, (uint64_t)(uintptr_t)ctx, &e->backend_state);
	tls_in_backend = false;
	if (ret < 0) {
		emm_warn("backend %s: init for device %d failed (%s): this context's allocations go to the "
		         "driver",
		         st_backend.table->name, dev, strerror(-ret));
		e->failed = true;
		goto publish;
	}
	heap_params(&params);
	src.state = e;
	src.alloc = seg_alloc;
	src.free = seg_free;
	ret = emm_heap_create(&params, &src, &e->fence, dev, &e->heap);
	if (ret < 0) {
		emm_warn(
		    "cannot create the heap for device %d (%s): this context's allocations go to the driver",
		    dev, strerror(-ret));
		if (st_backend.table->fini)
			st_backend.table->fini(e->backend_state, true);
		e->backend_state = NULL;
		e->failed = true;
		goto publish;
	}
	announce_streams(e->heap, ctx);
	emm_debug("heap for context %p (id %llu, device %d%s)", (void *)ctx, ctx_id, dev,
	          e->primary ? ", primary" : "");
	/* Run our exit handler before the teardown of a runtime that
	 * initialised after us (see the top of this file). */
	if (atomic_fetch_add(&atexit_registrations, 1) < MAX_ATEXIT)
		(void)atexit(state_atexit);
publish:
	ctx_list[ctx_count++] = e;
	return e;
}

static bool drop_entry(struct ctx_entry *stale);

/* The current context and its key for the thread cache: its unique id, or
 * its handle where the driver has no cuCtxGetId. 0; -ENODEV without a
 * usable current context (none, not initialised); -ESTALE when the current
 * context is destroyed or reset and not retained again (its memory is gone:
 * the caller drops our heaps of it). */
static int current_context_key(uint64_t *ret_key, unsigned long long *ret_id)
{
	const struct emm_state_real_extra *x = emm_state_real_extra();
	const struct emm_real_driver_table *real;
	unsigned long long id = 0;
	CUcontext ctx = NULL;
	CUresult r;

	if (EMM_LIKELY(x->cuCtxGetId != NULL)) {
		/* NULL: the current context's id; an error without one. */
		r = x->cuCtxGetId(NULL, &id);
		if (EMM_UNLIKELY(r != CUDA_SUCCESS || id == 0))
			return r == CUDA_ERROR_CONTEXT_IS_DESTROYED ? -ESTALE : -ENODEV;
		*ret_key = id;
		*ret_id = id;
		return 0;
	}
	real = emm_state_real();
	if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		return -ENODEV;
	*ret_key = (uint64_t)(uintptr_t)ctx;
	*ret_id = 0;
	return 0;
}

/* The entry of the current context. 0; -ENODEV (no context, or `create`
 * false and none yet); -ENOSYS (disabled, exiting, or the context passes
 * through). An entry left from before a reset of its context is dropped on
 * the way (see the top of this file). */
static int current_entry(struct ctx_entry **ret, bool create)
{
	const struct emm_real_driver_table *real;
	struct ctx_entry *e;
	unsigned long long id;
	CUcontext ctx = NULL;
	uint64_t gen, key;
	int rc;

	if (!emm_state_enabled() || emm_state_exiting() || tls_in_backend)
		return -ENOSYS;
	rc = current_context_key(&key, &id);
	if (EMM_UNLIKELY(rc < 0)) {
		/* cudaDeviceReset leaves the reset primary context current
		 * until the runtime's next call retains it: a free made in
		 * between (shared cudart's fast path) must not reach the old
		 * heap. */
		if (rc == -ESTALE && (real = emm_state_real())->cuCtxGetCurrent &&
		    real->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)
			emm_state_context_destroyed(ctx);
		return -ENODEV;
	}
	gen = atomic_load_explicit(&ctx_generation, memory_order_acquire);
	if (EMM_LIKELY(tls_ctx.key == key && tls_ctx.generation == gen && tls_ctx.entry)) {
		e = tls_ctx.entry;
	} else {
		real = emm_state_real();
		if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
			return -ENODEV;
		for (;;) {
			pthread_mutex_lock(&ctx_lock);
			e = entry_find_locked(ctx);
			if (e && e->ctx_id != id) {
				/* Same handle, another context: reset behind our back. */
				struct ctx_entry *stale = e;
				pthread_mutex_unlock(&ctx_lock);
				emm_debug("context %p was reset (id %llu, now %llu): dropping its heaps",
				          (void *)ctx, stale->ctx_id, id);
				if (!drop_entry(stale) && emm_state_exiting())
					return -ENOSYS;
				continue;
			}
			if (!e && create)
				e = entry_create_locked(ctx, id);
			gen = atomic_load_explicit(&ctx_generation, memory_order_relaxed);
			pthread_mutex_unlock(&ctx_lock);
			break;
		}
		if (!e)
			return -ENODEV;
		tls_ctx.key = key;
		tls_ctx.entry = e;
		tls_ctx.generation = gen;
	}
	if (e->failed)
		return -ENOSYS;
	*ret = e;
	return 0;
}

void emm_state_validate_current(void)
{
	struct ctx_entry *e;

	(void)current_entry(&e, false);
}

int emm_state_current_heap(emm_heap_t **ret_heap)
{
	struct ctx_entry *e;
	int ret = current_entry(&e, true);

	if (ret < 0)
		return ret;
	*ret_heap = e->heap;
	return 0;
}

int emm_state_current_heap_lookup(emm_heap_t **ret_heap)
{
	struct ctx_entry *e;
	int ret = current_entry(&e, false);

	if (ret < 0)
		return ret;
	*ret_heap = e->heap;
	return 0;
}

int emm_state_pinned_heap(unsigned int flags, emm_heap_t **ret_heap)
{
	const struct emm_backend *b;
	struct emm_heap_params params;
	struct emm_segment_source src;
	struct ctx_entry *e;
	emm_heap_t *heap;
	int ret;

	if (!emm_state_enabled())
		return -ENOSYS;
	b = st_backend.table;
	if (!st_opts->pinned || !(b->caps & EMM_BACKEND_CAP_HOST_PINNED) || !b->host_segment_alloc ||
	    !b->host_segment_free)
		return -ENOSYS;
	if (flags >= PINNED_FLAG_SETS)
		return -EINVAL;
	ret = current_entry(&e, true);
	if (ret < 0)
		return ret;
	heap = atomic_load_explicit(&e->pinned[flags], memory_order_acquire);
	if (EMM_LIKELY(heap)) {
		*ret_heap = heap;
		return 0;
	}

	pthread_mutex_lock(&ctx_lock);
	heap = atomic_load_explicit(&e->pinned[flags], memory_order_relaxed);
	if (!heap) {
		heap_params(&params);
		/* The program writes pinned blocks from the host: reuse only after
		 * the free's fence events complete. */
		params.host_accessible = true;
		src.state = &e->pinned_src[flags];
		src.alloc = host_seg_alloc;
		src.free = host_seg_free;
		ret = emm_heap_create(&params, &src, &e->fence, -2, &heap);
		if (ret == 0) {
			announce_streams(heap, e->ctx);
			atomic_store_explicit(&e->pinned[flags], heap, memory_order_release);
			atomic_store(&have_pinned, true);
		}
	}
	pthread_mutex_unlock(&ctx_lock);
	if (!heap)
		return ret < 0 ? ret : -ENOMEM;
	*ret_heap = heap;
	return 0;
}

bool emm_state_heap_is_pinned(const emm_heap_t *heap)
{
	return emm_heap_device(heap) == -2;
}

bool emm_state_have_pinned(void)
{
	return atomic_load_explicit(&have_pinned, memory_order_relaxed);
}

size_t emm_state_pitch_alignment(void)
{
	const struct emm_state_real_extra *x;
	struct ctx_entry *e;
	size_t align;
	int value = 0;

	if (current_entry(&e, true) < 0)
		return 512;
	align = atomic_load_explicit(&e->pitch_align, memory_order_relaxed);
	if (align)
		return align;
	x = emm_state_real_extra();
	align = 512;
	if (x->cuDeviceGetAttribute &&
	    x->cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, e->device) ==
	        CUDA_SUCCESS &&
	    value > 512 && (value & (value - 1)) == 0)
		align = (size_t)value;
	atomic_store_explicit(&e->pitch_align, align, memory_order_relaxed);
	return align;
}

/* --- walking the heaps ------------------------------------------------- */

struct heap_ref {
	emm_heap_t *heap;
	int device;
	CUcontext ctx;
};

/* Snapshot the live heaps (caller frees). ctx_lock held. */
static struct heap_ref *snapshot_locked(size_t *ret_count)
{
	struct heap_ref *refs = calloc(ctx_count * (1 + PINNED_FLAG_SETS) + 1, sizeof(*refs));
	size_t n = 0;

	if (!refs) {
		*ret_count = 0;
		return NULL;
	}
	for (size_t i = 0; i < ctx_count; i++) {
		struct ctx_entry *e = ctx_list[i];
		if (e->heap)
			refs[n++] = (struct heap_ref){e->heap, e->device, e->ctx};
		for (unsigned f = 0; f < PINNED_FLAG_SETS; f++) {
			emm_heap_t *p = atomic_load(&e->pinned[f]);
			if (p)
				refs[n++] = (struct heap_ref){p, -2, e->ctx};
		}
	}
	*ret_count = n;
	return refs;
}

void emm_state_for_each_heap(void (*fn)(emm_heap_t *heap, int device, void *arg), void *arg, bool push)
{
	struct heap_ref *refs;
	size_t n;

	if (!atomic_load_explicit(&init_done, memory_order_acquire) || !st_enabled)
		return;
	pthread_rwlock_rdlock(&heap_life_lock);
	pthread_mutex_lock(&ctx_lock);
	refs = snapshot_locked(&n);
	pthread_mutex_unlock(&ctx_lock);
	for (size_t i = 0; i < n; i++) {
		bool pushed = push && !emm_state_exiting() ? push_ctx(refs[i].ctx) : false;
		fn(refs[i].heap, refs[i].device, arg);
		pop_ctx(pushed);
	}
	pthread_rwlock_unlock(&heap_life_lock);
	free(refs);
}

size_t emm_state_idle_bytes_current_device(void)
{
	struct ctx_entry *e;
	struct heap_ref *refs;
	size_t n, total = 0;

	if (current_entry(&e, false) < 0)
		return 0;
	pthread_rwlock_rdlock(&heap_life_lock);
	pthread_mutex_lock(&ctx_lock);
	refs = snapshot_locked(&n);
	pthread_mutex_unlock(&ctx_lock);
	for (size_t i = 0; i < n; i++) {
		size_t idle = 0, largest = 0;
		if (refs[i].device != e->device)
			continue;
		emm_heap_idle_info(refs[i].heap, &idle, &largest);
		total += idle;
	}
	pthread_rwlock_unlock(&heap_life_lock);
	free(refs);
	return total;
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
	/* Peaks of a destroyed heap: the larger of it and the live ones. */
	if (r->allocated_bytes_peak > out->allocated_bytes_peak)
		out->allocated_bytes_peak = r->allocated_bytes_peak;
	if (r->requested_bytes_peak > out->requested_bytes_peak)
		out->requested_bytes_peak = r->requested_bytes_peak;
	if (r->reserved_bytes_peak > out->reserved_bytes_peak)
		out->reserved_bytes_peak = r->reserved_bytes_peak;
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
	pthread_rwlock_rdlock(&heap_life_lock);
	for (int slot = 0; slot <= MAX_DEVICES; slot++) {
		int d = slot == MAX_DEVICES ? -2 : slot;
		if (device == -1 || device == d)
			add_retired(out, &retired[slot]);
	}
	pthread_rwlock_unlock(&heap_life_lock);
	emm_state_add_counter_stats(device, out);
}

void emm_state_report_oom(emm_heap_t *heap, size_t size)
{
	struct emm_stats s;
	size_t idle = 0, largest = 0;

	if (emm_state_options()->verbose < 1)
		return;
	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	emm_heap_add_stats(heap, &s);
	emm_heap_idle_info(heap, &idle, &largest);
	emm_warn("out of memory: %zu bytes requested on %s %d; libemm holds %llu bytes (%llu allocated, "
	         "%zu idle, %llu pending), largest free block %zu bytes",
	         size, emm_heap_device(heap) == -2 ? "pinned host heap" : "device", emm_heap_device(heap),
	         (unsigned long long)s.reserved_bytes, (unsigned long long)s.allocated_bytes, idle,
	         (unsigned long long)s.pending_bytes, largest);
}

/* --- context teardown -------------------------------------------------- */

/* Unlink one entry matching `match`, destroy its heaps without driver calls
 * and forget its streams, events, captures and graphs. Returns false when
 * none matched. After exit has begun nothing is torn down (other threads
 * may still be using the heaps; the process is about to end anyway). */
static bool drop_one(bool (*match)(const struct ctx_entry *e, const void *arg), const void *arg)
{
	struct ctx_entry *e = NULL;
	emm_heap_t *heaps[1 + PINNED_FLAG_SETS];
	size_t n = 0;
	bool any = false;

	if (emm_state_exiting())
		return false;
	pthread_mutex_lock(&ctx_lock);
	for (size_t i = 0; i < ctx_count && !any; i++)
		any = match(ctx_list[i], arg);
	pthread_mutex_unlock(&ctx_lock);
	if (!any)
		return false;

	guard_step_out();
	pthread_rwlock_wrlock(&heap_life_lock);
	/* No other thread inside a heap from here to guard_end. */
	guard_begin();
	pthread_mutex_lock(&ctx_lock);
	for (size_t i = 0; i < ctx_count; i++) {
		if (match(ctx_list[i], arg)) {
			e = ctx_list[i];
			ctx_list[i] = ctx_list[--ctx_count];
			break;
		}
	}
	if (e) {
		atomic_fetch_add(&ctx_generation, 1);
		if (e->heap)
			heaps[n++] = e->heap;
		for (unsigned f = 0; f < PINNED_FLAG_SETS; f++) {
			emm_heap_t *p = atomic_exchange(&e->pinned[f], NULL);
			if (p)
				heaps[n++] = p;
		}
		e->heap = NULL;
		e->failed = true;
	}
	pthread_mutex_unlock(&ctx_lock);
	if (!e) {
		guard_end();
		pthread_rwlock_unlock(&heap_life_lock);
		guard_step_in();
		return false;
	}

	emm_debug("dropping the heaps of context %p (device %d)", (void *)e->ctx, e->device);
	emm_fence_pool_drop(e->ctx);
	for (size_t i = 0; i < n; i++) {
		struct emm_stats s;
		int slot = device_slot(emm_heap_device(heaps[i]));

		memset(&s, 0, sizeof(s));
		s.struct_size = sizeof(s);
		emm_heap_add_stats(heaps[i], &s);
		if (slot <= MAX_DEVICES)
			add_retired(&retired[slot], &s);
		emm_heap_destroy(heaps[i], false);
	}
	guard_end();
	pthread_rwlock_unlock(&heap_life_lock);
	guard_step_in();
	if (e->backend_state && st_backend.table->fini)
		st_backend.table->fini(e->backend_state, false);
	e->backend_state = NULL;
	stream_remove_context(e->ctx);
	/* Its captures and graphs went with it; quarantined blocks of these
	 * heaps are forgotten (the pointers are only compared). */
	emm_capture_context_dropped(e->ctx, heaps, n);
	/* e stays allocated: stale thread caches may still read it. */
	return true;
}

static bool match_ctx(const struct ctx_entry *e, const void *arg)
{
	return e->ctx == (CUcontext)arg;
}

static bool match_entry(const struct ctx_entry *e, const void *arg)
{
	return e == arg;
}

static bool drop_entry(struct ctx_entry *stale)
{
	return drop_one(match_entry, stale);
}

static bool match_primary(const struct ctx_entry *e, const void *arg)
{
	return e->primary && e->device == *(const CUdevice *)arg;
}

void emm_state_context_destroyed(CUcontext ctx)
{
	while (drop_one(match_ctx, ctx))
		;
}

void emm_state_primary_reset(CUdevice dev)
{
	while (drop_one(match_primary, &dev))
		;
}

void emm_state_primary_released(CUdevice dev)
{
	const struct emm_real_driver_table *real = emm_state_real();
	unsigned int flags = 0;
	int active = 1;

	if (emm_state_exiting() || !real->cuDevicePrimaryCtxGetState ||
	    real->cuDevicePrimaryCtxGetState(dev, &flags, &active) != CUDA_SUCCESS)
		return;
	if (!active)
		emm_state_primary_reset(dev);
}

void emm_state_primary_retaining(CUdevice dev)
{
	/* An inactive primary context has no memory: any heap we keep for it
	 * is left from before a reset we did not see. */
	emm_state_primary_released(dev);
}

/* --- streams ----------------------------------------------------------- */

/* The heaps of ctx (device first). ctx_lock held. */
static size_t heaps_of_context_locked(CUcontext ctx, emm_heap_t **out)
{
	struct ctx_entry *e = entry_find_locked(ctx);
	size_t n = 0;

	if (e && e->heap) {
		out[n++] = e->heap;
		for (unsigned f = 0; f < PINNED_FLAG_SETS; f++) {
			emm_heap_t *p = atomic_load(&e->pinned[f]);
			if (p)
				out[n++] = p;
		}
	}
	return n;
}

static CUcontext current_context(void)
{
	const struct emm_real_driver_table *real = emm_state_real();
	CUcontext ctx = NULL;

	if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
		return NULL;
	return ctx;
}

void emm_state_stream_created(CUstream stream, bool nonblocking)
{
	emm_heap_t *heaps[1 + PINNED_FLAG_SETS];
	emm_stream_t key = emm_state_stream_key(stream, false);
	CUcontext ctx;
	size_t n;

	if (!emm_state_enabled() || !key_is_real_stream(key))
		return;
	ctx = current_context();
	if (!ctx)
		return;
	emm_state_enter();
	/* Insert and look up under ctx_lock, so a heap created concurrently
	 * either sees the stream in its announcement or is seen here (never
	 * both). */
	pthread_mutex_lock(&ctx_lock);
	stream_insert(key, ctx, nonblocking);
	n = heaps_of_context_locked(ctx, heaps);
	pthread_mutex_unlock(&ctx_lock);
	/* A new non-blocking stream is not ordered by the legacy-stream
	 * markers of epochs already closed: the heap makes it wait on the
	 * latest one as it learns of it, so blocks released before the stream
	 * existed are safe on it. */
	for (size_t i = 0; i < n; i++)
		emm_heap_stream_created(heaps[i], key, nonblocking);
	emm_state_leave();
}

void emm_state_stream_destroyed(CUstream stream)
{
	emm_heap_t *heaps[1 + PINNED_FLAG_SETS];
	emm_stream_t key = emm_state_stream_key(stream, false);
	CUcontext ctx;
	size_t n;

	if (!emm_state_enabled() || !key_is_real_stream(key))
		return;
	ctx = stream_remove(key);
	if (!ctx)
		ctx = current_context();
	if (!ctx)
		return;
	emm_state_enter();
	pthread_mutex_lock(&ctx_lock);
	n = heaps_of_context_locked(ctx, heaps);
	pthread_mutex_unlock(&ctx_lock);
	for (size_t i = 0; i < n; i++)
		emm_heap_stream_destroyed(heaps[i], key);
	emm_state_leave();
}

/* --- fork and exit ----------------------------------------------------- */

static void fork_child(void)
{
	/* Everything the parent built refers to its CUDA objects: forget it
	 * (leaked, never freed: its locks may be held by threads that do not
	 * exist here). Locks are re-created. */
	pthread_mutex_init(&ctx_lock, NULL);
	pthread_rwlock_init(&heap_life_lock, NULL);
	pthread_rwlock_init(&stream_lock, NULL);
	ctx_list = NULL;
	ctx_count = ctx_cap = 0;
	atomic_fetch_add(&ctx_generation, 1);
	tls_ctx.key = 0;
	tls_ctx.entry = NULL;
	atomic_store(&have_pinned, false);
	memset(stream_buckets, 0, sizeof(stream_buckets));
	emm_capture_fork_child();
	for (int i = 0; i < EMM_COUNT__COUNT; i++)
		atomic_store(&counters[i], 0);
	for (int i = 0; i < MAX_DEVICES + 2; i++)
		for (int c = 0; c < COL__COUNT; c++)
			atomic_store(&dev_counters[i][c], 0);
	memset(retired, 0, sizeof(retired));
	emm_ptrmap_reset();
	guard_fork_child();
	emm_fence_fork_child();
	if (emm_trace_enabled())
		emm_trace_fork_child();
}

__attribute__((constructor)) static void state_constructor(void)
{
	/* Nothing heavy here: initialisation waits for the first shim call. */
	(void)pthread_atfork(NULL, NULL, fork_child);
}

static void state_atexit(void)
{
	/* Registered up to MAX_ATEXIT times (see above): the first call to run
	 * prints the statistics, every call flushes the trace. */
	static atomic_bool stats_printed;

	atomic_store(&st_exiting, true);
	if (st_opts && st_opts->stats && !atomic_exchange(&stats_printed, true))
		emm_stats_print_exit();
	emm_trace_flush();
}

__attribute__((destructor)) static void state_destructor(void)
{
	atomic_store(&st_exiting, true);
	emm_trace_close();
}
