/* SPDX-License-Identifier: MIT */
/*
 * process/state.c - libemm's process state: lazy initialisation (options,
 * backend, trace, exit handler), the real entry points, the heap
 * parameters the options ask for, a number per thread, fork and exit. The rest of the state has
 * a file each (state_internal.h lists them): the heap guard (guard.c), one
 * heap per CUDA context (contexts.c), pinned-host heaps (pinned.c), stream
 * keys and the live-stream registry (streams.c), counters and statistics
 * (stats.c). Captures and the graph quarantine live in capture.c.
 *
 * Initialisation runs once, on the first call of a shim (pthread_once):
 * options, the backend (a failure leaves libemm a pure pass-through, never a
 * crash), the EMM_LOG trace and the atexit handler. The constructor only
 * registers the fork handlers.
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
 * Fork: the child forgets every heap, context, stream, capture, event pool
 * and address map without calling CUDA (the parent's objects are not its
 * own) and starts empty; its first allocation builds a new heap.
 */
#include "process/process.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/backend_loader.h"
#include "allocator/heap_options.h"
#include "allocator/ptrmap.h"
#include "allocator/trace.h"
#include "common/compiler.h"
#include "common/log.h"
#include "config/options.h"
#include "emm/emm_version.h"
#include "process/annotate.h"
#include "process/carrier.h"
#include "process/process_internal.h"

#define MAX_ATEXIT 16 /* registrations of state_atexit (see above) */

/* --- initialisation ---------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static atomic_uint atexit_registrations;
atomic_bool st_init_done;
bool st_enabled;
atomic_bool st_exiting;
atomic_bool st_fast_ctx; /* set last in state_init, cleared with st_exiting (set_exiting) */
static EMM_TLS_IE bool tls_in_init;
static EMM_TLS_IE uint64_t tls_uid;
static atomic_uint_fast64_t uid_next;

uint64_t st_thread_uid(void)
{
	if (EMM_UNLIKELY(!tls_uid))
		tls_uid = atomic_fetch_add_explicit(&uid_next, 1, memory_order_relaxed) + 1;
	return tls_uid;
}

const struct emm_options *st_opts;
#ifndef NDEBUG
EMM_TLS_IE int st_locks_held;

void st_lock_violation(const char *what)
{
	emm_error("internal: %s with a process-layer lock held (%d): lock order broken", what, st_locks_held);
	abort();
}
#endif
struct emm_backend_loaded st_backend;
struct emm_backend_loaded st_host_backend;
struct emm_backend_host st_host;

static const struct emm_real_driver_table st_null_real;
_Atomic(const struct emm_real_driver_table *) st_real;
struct emm_state_real_extra st_extra;
pthread_once_t st_extra_once = PTHREAD_ONCE_INIT;
atomic_bool st_extra_ready;

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

void st_extra_init(void)
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
	EXTRA(cuThreadExchangeStreamCaptureMode);
	EXTRA(cuStreamBeginCapture_ptsz);
	EXTRA(cuGraphInstantiateWithFlags);
	EXTRA(cuGraphClone);
	EXTRA(cuGraphDestroy);
	EXTRA(cuGraphExecDestroy);
	EXTRA(cuGraphAddChildGraphNode);
	EXTRA(cuGraphExecChildGraphNodeSetParams);
	EXTRA(cuGraphExecNodeSetParams);
	EXTRA(cuGraphNodeSetParams);
	EXTRA(cuArrayCreate_v2);
	EXTRA(cuArray3DCreate_v2);
	EXTRA(cuMipmappedArrayCreate);
	EXTRA(cuGraphAddMemAllocNode);
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
	atomic_store_explicit(&st_extra_ready, true, memory_order_release);
}

const struct emm_state_real_extra *emm_state_real_extra(void)
{
	return st_real_extra();
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

	st_annotate_detect();
	ret = emm_backend_load(opts->backend, emm_real_dlsym, &st_backend);
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

	/* Pinned host memory: from the device backend if it serves it, else
	 * from the built-in driver backend (a GPU backend without it). */
	if (st_backend.table->caps & EMM_BACKEND_CAP_HOST_PINNED) {
		st_host_backend = st_backend;
	} else if (!(st_backend.table->caps & EMM_BACKEND_CAP_SIMULATED) &&
	           emm_backend_load("driver", emm_real_dlsym, &st_host_backend) < 0) {
		memset(&st_host_backend, 0, sizeof(st_host_backend));
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
	st_trace_start();
	atomic_fetch_add(&atexit_registrations, 1);
	if (atexit(state_atexit) != 0)
		emm_warn("atexit failed: EMM_STATS will not print");
	st_guard_setup();
	st_enabled = true;
	st_snapshot_setup();
	st_stats_signal_setup();
	if (!opts->context_check)
		atomic_store_explicit(&st_fast_ctx, true, memory_order_release);
out:
	tls_in_init = false;
	atomic_store_explicit(&st_init_done, true, memory_order_release);
}

/* Exit (or the driver's unloading) has begun: every shim passes through. */
static void set_exiting(void)
{
	atomic_store(&st_fast_ctx, false);
	atomic_store(&st_exiting, true);
}

bool emm_state_enabled(void)
{
	if (EMM_LIKELY(atomic_load_explicit(&st_init_done, memory_order_acquire)))
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
	return st_is_exiting();
}

void emm_state_driver_gone(void)
{
	set_exiting();
}

const char *emm_state_backend_name(void)
{
	return st_backend.table ? st_backend.table->name : "none";
}

bool emm_state_backend_can_ipc(void)
{
	return st_backend.table && (st_backend.table->caps & EMM_BACKEND_CAP_IPC);
}

const char *emm_state_backend_path(void)
{
	return st_backend.table ? st_backend.path : "";
}

/* --- heap parameters --------------------------------------------------- */

void st_heap_params(struct emm_heap_params *p)
{
	emm_heap_params_from_options(st_opts, emm_options_sources(), p);
}

/* --- fork and exit ----------------------------------------------------- */

static void fork_child(void)
{
	/* Everything the parent built refers to its CUDA objects: forget it
	 * (leaked, never freed: its locks may be held by threads that do not
	 * exist here). Locks are re-created. */
	st_contexts_fork_child();
	st_streams_fork_child();
	st_carrier_fork_child();
	st_pinned_fork_child();
	emm_capture_fork_child();
	st_stats_fork_child();
	emm_ptrmap_reset();
	st_guard_fork_child();
	st_regions_fork_child();
	emm_fence_fork_child();
	st_vmm_fork_child();
	st_trace_fork_child();
	st_snapshot_fork_child();
	st_stats_signal_fork_child();
	st_ipc_fork_child();
}

__attribute__((constructor)) static void state_constructor(void)
{
	/* Nothing heavy here: initialisation waits for the first shim call. */
	(void)pthread_atfork(st_vmm_fork_prepare, NULL, fork_child);
}

void st_atexit_again(void)
{
	if (atomic_fetch_add(&atexit_registrations, 1) < MAX_ATEXIT)
		(void)atexit(state_atexit);
}

static atomic_bool stats_printed;

static void state_atexit(void)
{
	/* Registered up to MAX_ATEXIT times (see above): the first call to run
	 * prints the statistics, every call flushes the trace. */
	st_annotate_exit(); /* only under a memory checker (annotate.c) */
	set_exiting();
	if (st_opts && !atomic_exchange(&stats_printed, true))
		st_stats_exit_report();
	emm_trace_flush();
}

__attribute__((destructor)) static void state_destructor(void)
{
	set_exiting();
	/* EMM_STATS=1 prints even when no CUDA call reached libemm (no exit
	 * handler was registered then): the table says so. */
	if (!atomic_load(&stats_printed) && !atomic_exchange(&stats_printed, true))
		st_stats_exit_report();
	emm_trace_close();
}
