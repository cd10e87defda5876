/* SPDX-License-Identifier: MIT */
/*
 * process/serve.c - what a shim asks of the process layer to serve one call:
 * an allocation from the current context's heap (device) or a pinned heap
 * (host), a free of one of libemm's blocks, the accounting of a call the
 * driver served instead, and the lookup of the live block behind an address
 * (for the query shims). Each runs under the heap guard, traces to EMM_LOG
 * and tells the capture tracker what it needs; the shims only translate
 * arguments and results (errno values to CUresult or cudaError_t).
 *
 * The trace and the statistics count the same events: an "allocate" line
 * is one of `allocs` (the pool) or `passthrough_allocs` (the driver), a
 * "free" line one of `frees` or `passthrough_frees`, an "allocate failure"
 * line one of `ooms` (a request the pool could not serve after its retry).
 * A request of 0 bytes is in neither (the driver answers it), nor is a
 * failure of a call libemm passed to the driver. A program request that
 * fails in the runtime shim's fast path (report false) and then reaches the
 * driver shim through the real runtime is one failure: the second attempt,
 * the same size on the same thread right after, is answered at once.
 *
 * A free of a pointer libemm did not hand out is an "unknown free", unless
 * the code freeing it is a driver component (libnvcuvid, the driver's own
 * libraries): that memory came from the driver's private tables, and is
 * counted with its driver-reported size as "passed by, driver components".
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "allocator/ptrmap.h"
#include "allocator/trace.h"
#include "common/compiler.h"
#include "common/log.h"
#include "process/annotate.h"
#include "process/block_free.h"
#include "process/poison.h"
#include "process/process.h"
#include "process/carrier.h"
#include "process/process_internal.h"

static void trace(enum emm_trace_action action, emm_addr_t addr, size_t size, const void *stream,
                  enum emm_trace_memory memory)
{
	if (emm_trace_enabled())
		emm_trace_event_memory(action, addr, size, (uint64_t)(uintptr_t)stream, memory);
}

/* The size of this thread's last unreported pool failure (0: none), and
 * when (CLOCK_MONOTONIC, ns): the runtime's own attempt follows within
 * microseconds; a later request of the same size is tried afresh. */
static EMM_TLS_IE size_t tls_failed_size;
static EMM_TLS_IE uint64_t tls_failed_ns;
#define RETRY_WINDOW_NS 20000000ull

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Allocate from `heap`; -ENOMEM is reported (once per call) when `report`. */
static inline __attribute__((always_inline)) int heap_alloc(emm_heap_t *heap, bool pinned, size_t size,
                                                            emm_stream_t key, const void *stream, bool report,
                                                            emm_addr_t *ret_addr)
{
	emm_addr_t addr;
	int r;

	enum emm_trace_memory memory = pinned ? EMM_TRACE_PINNED : EMM_TRACE_DEVICE;
	bool just_failed = EMM_UNLIKELY(tls_failed_size == size) && now_ns() - tls_failed_ns < RETRY_WINDOW_NS;

	st_assert_unlocked("emm_heap_alloc");
	tls_failed_size = 0;
	/* The same request again right after it failed unreported: the real
	 * runtime's driver call after the fast path's failure. */
	r = report && just_failed ? -ENOMEM : emm_heap_alloc(heap, size, key, &addr);

	if (r == 0) {
		/* A graph being captured may use it (capture.c). */
		emm_capture_note_alloc(addr, heap);
		st_annotate_block(addr, true, memory == EMM_TRACE_PINNED); /* a region for a memory checker */
		trace(EMM_TRACE_ALLOCATE, addr, size, stream, memory);
		if (st_snapshot_on && memory == EMM_TRACE_DEVICE)
			st_snapshot_note(EMM_SNAP_ALLOC, addr, size, (uint64_t)(uintptr_t)stream);
		*ret_addr = addr;
	} else if (r == -ENOMEM && report) {
		emm_state_report_oom(heap, size);
		trace(EMM_TRACE_ALLOCATE_FAILURE, 0, size, stream, memory);
		if (st_snapshot_on && memory == EMM_TRACE_DEVICE)
			st_snapshot_note(EMM_SNAP_OOM, 0, size, (uint64_t)(uintptr_t)stream);
	} else if (r == -ENOMEM) {
		tls_failed_size = size;
		tls_failed_ns = now_ns();
	}
	return r;
}

int emm_serve_device_alloc(size_t size, emm_stream_t key, const void *stream, bool report, emm_addr_t *ret_addr)
{
	emm_heap_t *heap;
	int r;

	if (size == 0)
		return -EINVAL;
	st_enter();
	r = st_current_heap(&heap);
	/* After: the current context's entry is noted now (carrier.c). */
	if (r == 0 && EMM_UNLIKELY(st_stream_foreign(key)))
		r = -EXDEV; /* the driver's: on the stream's device */
	if (r == 0)
		r = heap_alloc(heap, false, size, key, stream, report, ret_addr);
	st_leave();
	return r;
}

int emm_serve_host_alloc(size_t size, unsigned int flags, bool report, emm_addr_t *ret_addr)
{
	emm_heap_t *heap;
	int r;

	if (size == 0)
		return -EINVAL;
	st_enter();
	r = emm_state_pinned_heap(flags, &heap);
	if (r == 0)
		r = heap_alloc(heap, true, size, EMM_STREAM_SYNC, NULL, report, ret_addr);
	st_leave();
	return r;
}

static void bad_free(const char *what, emm_addr_t addr)
{
	static atomic_uint_fast64_t bad_frees;
	uint64_t n = atomic_fetch_add(&bad_frees, 1) + 1;

	emm_state_count(EMM_COUNT_BAD_FREE);
	if (n == 1 || n % 1000 == 0)
		emm_warn("%s(%#llx): not the start of a live block (double free or interior pointer): refused "
		         "with CUDA_ERROR_INVALID_VALUE (%llu such frees so far)",
		         what, (unsigned long long)addr, (unsigned long long)n);
}

int emm_serve_free(const char *what, emm_addr_t addr, emm_stream_t key, const void *stream, bool pinned)
{
	size_t requested = 0;
	int r;

	if (addr == 0)
		return -ENOENT;
	st_assert_unlocked("a free of a libemm block");
	tls_failed_size = 0; /* memory may have come back */
	st_enter();
	if (!pinned)
		key = st_free_key(addr, key); /* another context's stream: as cuMemFree */
	/* Before the heap may hand it out again; the fill while the block is
	 * still a region a memory checker knows (st_free_block removes
	 * the region). Only device blocks are filled, so not at a pinned
	 * free: one of a device block is refused below, untouched. */
	if (!pinned)
		st_poison_block(addr, key);
	r = st_free_block(addr, key, pinned, &requested);
	st_leave();
	if (r == 0) {
		trace(EMM_TRACE_FREE, addr, requested, stream, pinned ? EMM_TRACE_PINNED : EMM_TRACE_DEVICE);
		if (st_snapshot_on && !pinned) {
			st_snapshot_note(EMM_SNAP_FREE_REQUESTED, addr, requested, (uint64_t)(uintptr_t)stream);
			st_snapshot_note(EMM_SNAP_FREE_COMPLETED, addr, requested, (uint64_t)(uintptr_t)stream);
		}
	}
	else if (r == -EINVAL && what)
		bad_free(what, addr);
	return r;
}

static enum emm_trace_memory memory_of(enum emm_state_counter which)
{
	switch (which) {
	case EMM_COUNT_PASS_HOST_ALLOC:
	case EMM_COUNT_PASS_HOST_FREE:
		return EMM_TRACE_PINNED;
	case EMM_COUNT_MANAGED_ALLOC:
		return EMM_TRACE_MANAGED;
	default:
		return EMM_TRACE_DEVICE;
	}
}

void emm_serve_passed_alloc(enum emm_state_counter which, int result, emm_addr_t addr, size_t size,
                            const void *stream)
{
	/* Counted and traced alike: a success with memory behind it (a
	 * driver that answers a 0-byte request with success and NULL gives
	 * nothing to free). Failures the driver returned are its own. */
	if (result == 0 && size && addr) {
		emm_state_count(which);
		if (which == EMM_COUNT_MANAGED_ALLOC)
			emm_state_passby(EMM_PASSBY_MANAGED, size);
		else if (which == EMM_COUNT_CAPTURE_ALLOC)
			emm_state_passby(EMM_PASSBY_CAPTURE, size);
		trace(EMM_TRACE_ALLOCATE, addr, size, stream, memory_of(which));
	}
}

static void passed_free_as(enum emm_state_counter which, emm_addr_t addr, const void *stream,
                           enum emm_passby family, uint64_t bytes)
{
	if (addr) {
		emm_state_count(which);
		if (which == EMM_COUNT_PASS_FREE || which == EMM_COUNT_PASS_HOST_FREE)
			emm_state_passby(family, bytes);
		trace(EMM_TRACE_FREE, addr, 0, stream, memory_of(which));
	}
}

void emm_serve_passed_free(enum emm_state_counter which, emm_addr_t addr, const void *stream)
{
	passed_free_as(which, addr, stream, EMM_PASSBY_UNKNOWN_FREE, 0);
}

void emm_serve_foreign_free_end(enum emm_state_counter which, emm_addr_t addr, const void *stream,
                                const struct emm_foreign_free *ff)
{
	if (ff && ff->driver_component)
		passed_free_as(which, addr, stream, EMM_PASSBY_DRIVER, ff->bytes);
	else
		passed_free_as(which, addr, stream, EMM_PASSBY_UNKNOWN_FREE, 0);
}

/* EMM_VERBOSE=2: what the driver says of a foreign pointer and who frees it. */
static void describe_foreign(emm_addr_t addr, const void *caller, bool driver_component)
{
	const struct emm_real_driver_table *real = emm_state_real();
	CUpointer_attribute attrs[] = {
		CU_POINTER_ATTRIBUTE_MEMORY_TYPE,      CU_POINTER_ATTRIBUTE_IS_MANAGED,
		CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
		CU_POINTER_ATTRIBUTE_RANGE_SIZE,       CU_POINTER_ATTRIBUTE_MAPPED,
		CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
	};
	/* Every attribute written into a zeroed 8-byte slot (the narrower
	 * ones, unsigned int and bool, land in its low bytes). */
	uint64_t v[sizeof(attrs) / sizeof(attrs[0])] = {0};
	void *data[sizeof(attrs) / sizeof(attrs[0])];
	CUresult r = CUDA_ERROR_NOT_SUPPORTED;
	Dl_info who;

	for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++)
		data[i] = &v[i];
	if (real && real->cuPointerGetAttributes)
		r = real->cuPointerGetAttributes(sizeof(attrs) / sizeof(attrs[0]), attrs, data, addr);
	if (!dladdr(caller, &who) || !who.dli_fname)
		who.dli_fname = "?";
	if (r != CUDA_SUCCESS) {
		emm_debug("free of %#llx, not libemm's, from %s: the driver knows nothing of it (%d)",
		          (unsigned long long)addr, who.dli_fname, (int)r);
		return;
	}
	emm_debug("free of %#llx, not libemm's, from %s: memory type %u, managed %u, pool %#llx, "
	          "range %#llx+%llu, mapped %u, shareable handle types %#llx%s",
	          (unsigned long long)addr, who.dli_fname, (unsigned)(v[0] & 0xffffffffu), (unsigned)(v[1] & 0xff),
	          (unsigned long long)v[2], (unsigned long long)v[3], (unsigned long long)v[4],
	          (unsigned)(v[5] & 0xff), (unsigned long long)v[6],
	          driver_component ? "; a driver component's (passed by, driver components)" : "");
}

void emm_serve_foreign_free_begin(emm_addr_t addr, const void *caller, struct emm_foreign_free *out)
{
	const struct emm_real_driver_table *real;
	size_t size = 0;

	out->driver_component = false;
	out->bytes = 0;
	if (!addr)
		return;
	/* Only on this path: a free that libemm did not serve. The size is
	 * the driver's, asked before its free makes the pointer unknown. */
	if (emm_real_is_driver_component_address(caller)) {
		out->driver_component = true;
		real = emm_state_real();
		if (real && real->cuPointerGetAttribute &&
		    real->cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, addr) == CUDA_SUCCESS)
			out->bytes = size;
	}
	if (EMM_UNLIKELY(emm_log_debug_enabled()))
		describe_foreign(addr, caller, out->driver_component);
}

int emm_serve_find_block(emm_addr_t addr, struct emm_block_range *ret_range)
{
	struct emm_block_range range;
	uint64_t base;
	size_t size;
	void *value;
	int r;

	st_enter();
	r = emm_heap_find_block(addr, &range);
	if (r == 0)
		*ret_range = range;
	else if (emm_segmap_find(addr, &base, &size, &value) == 0)
		r = -ENXIO; /* in our segment, in no live block: the driver would not know it */
	st_leave();
	return r;
}

int emm_serve_block_context(emm_addr_t addr, CUcontext *ret_ctx)
{
	struct emm_block_range range;
	struct ctx_entry *e = NULL;

	st_enter(); /* the entry outlives the look-up (ipc_export.c's way) */
	if (emm_serve_find_block(addr, &range) == 0 && !emm_state_heap_is_pinned(range.heap))
		e = st_heap_entry(range.heap);
	if (e)
		*ret_ctx = e->ctx;
	st_leave();
	return e ? 0 : -ENOENT;
}
