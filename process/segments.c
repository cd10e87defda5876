/* SPDX-License-Identifier: MIT */
/*
 * process/segments.c - what feeds a context's heaps: the backend's init for
 * a context, its segment allocations and frees (device memory, and pinned
 * host memory of a flag set), made with the owning context current and
 * with no lock of the process layer held and the calling thread in relaxed
 * capture mode (capture.c says why), and the stream value a backend sees.
 */
#include <errno.h>
#include <stdint.h>

#include "process/annotate.h"
#include "process/process.h"
#include "process/process_internal.h"

/* Set while this thread is inside the backend: a backend that calls a
 * driver export (rather than host->driver_proc) reaches the driver. */
EMM_TLS_IE bool st_tls_in_backend;

/* Around every backend call: the thread is inside the backend, in relaxed
 * capture mode, so a segment's driver calls during a global capture (this
 * thread's or another's) neither fail nor invalidate it (capture.c). */
static int backend_enter(void)
{
	st_tls_in_backend = true;
	return st_capture_relax();
}

static void backend_leave(int mode)
{
	st_capture_unrelax(mode);
	st_tls_in_backend = false;
}

/* The stream value a backend sees: 0 when unknown, else a CUstream. */
static uint64_t backend_stream(emm_stream_t key)
{
	if (key == EMM_STREAM_SYNC)
		return 0;
	return (uint64_t)(uintptr_t)emm_state_stream_handle(key);
}

bool st_push_ctx(CUcontext ctx)
{
	const struct emm_state_real_extra *x = st_real_extra();
	CUcontext cur = NULL;

	if (!st_real_table()->cuCtxGetCurrent || st_real_table()->cuCtxGetCurrent(&cur) != CUDA_SUCCESS)
		cur = NULL;
	if (cur == ctx || !x->cuCtxPushCurrent_v2 || !x->cuCtxPopCurrent_v2)
		return false;
	if (x->cuCtxPushCurrent_v2(ctx) != CUDA_SUCCESS)
		return false;
	emm_state_current_changed(false); /* the thread's context cache */
	return true;
}

void st_pop_ctx(bool pushed)
{
	CUcontext popped;

	if (pushed) {
		(void)st_real_extra()->cuCtxPopCurrent_v2(&popped);
		emm_state_current_changed(false);
	}
}

void *st_host_state(struct ctx_entry *e)
{
	return st_host_backend.table == st_backend.table ? e->backend_state
	                                                  : atomic_load_explicit(&e->host_backend_state,
	                                                                         memory_order_acquire);
}

int st_host_backend_init(struct ctx_entry *e)
{
	void *state = NULL;
	int ret, mode;

	if (!st_host_backend.table)
		return -ENOSYS;
	if (st_host_state(e))
		return 0;
	st_assert_unlocked("the pinned backend's init");
	mode = backend_enter();
	ret = st_host_backend.table->init(&st_host, e->device, (uint64_t)(uintptr_t)e->ctx, &state);
	backend_leave(mode);
	if (ret < 0)
		return ret;
	void *expected = NULL;
	if (!atomic_compare_exchange_strong(&e->host_backend_state, &expected, state) &&
	    st_host_backend.table->fini)
		st_host_backend.table->fini(state, true); /* another thread's won */
	return 0;
}

void st_host_backend_fini(struct ctx_entry *e, bool driver_alive)
{
	void *state;

	if (!st_host_backend.table || st_host_backend.table == st_backend.table)
		return;
	state = atomic_exchange(&e->host_backend_state, NULL);
	if (state && st_host_backend.table->fini)
		st_host_backend.table->fini(state, driver_alive);
}

int st_segment_alloc(struct ctx_entry *e, bool host, unsigned flags, size_t size, emm_stream_t stream,
                     emm_addr_t *ret_addr)
{
	int ret, mode;

	if (st_is_exiting())
		return -ENOMEM;
	st_assert_unlocked("a backend segment allocation");
	mode = backend_enter();
	if (host)
		ret = st_host_backend.table->host_segment_alloc(st_host_state(e), size, flags, ret_addr);
	else
		ret = st_backend.table->segment_alloc(e->backend_state, size, backend_stream(stream), ret_addr);
	backend_leave(mode);
	/* Idle VMM buffers hold device memory too: give them back and try
	 * once more. */
	if (ret == -ENOMEM && !host && emm_vmm_oom_release()) {
		mode = backend_enter();
		ret = st_backend.table->segment_alloc(e->backend_state, size, backend_stream(stream), ret_addr);
		backend_leave(mode);
	}
	st_annotate_ensure_probed(); /* a context exists now, as a tool requires */
	if (ret == 0) /* pinned segments too: kernels reach them through UVA */
		st_annotate_heap(*ret_addr, size, true, host ? -2 : e->device);
	if (ret == 0 && !host && st_snapshot_on)
		st_snapshot_note(EMM_SNAP_SEGMENT_ALLOC, *ret_addr, size, backend_stream(stream));
	return ret;
}

/* With the entry's context current: a heap may return a segment from a
 * thread where another context is current. */
int st_segment_free(struct ctx_entry *e, bool host, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	bool pushed;
	int ret, mode;

	if (st_is_exiting())
		return 0; /* the driver frees everything with the process */
	st_assert_unlocked("a backend segment free");
	/* Gone from the program either way: a memory checker forgets it. */
	st_annotate_heap(addr, size, false, host ? -2 : e->device);
	/* A segment with IPC exports stays allocated (ipc_export.c). */
	if (!host && st_ipc_keep_segment(e, addr, size))
		return 0;
	pushed = st_push_ctx(e->ctx);
	mode = backend_enter();
	if (host)
		ret = st_host_backend.table->host_segment_free(st_host_state(e), addr, size);
	else
		ret = st_backend.table->segment_free(e->backend_state, addr, size, backend_stream(stream));
	backend_leave(mode);
	st_pop_ctx(pushed);
	if (ret == 0 && !host && st_snapshot_on)
		st_snapshot_note(EMM_SNAP_SEGMENT_FREE, addr, size, backend_stream(stream));
	return ret;
}

int st_device_segment_alloc(void *state, size_t size, emm_stream_t stream, emm_addr_t *ret_addr)
{
	return st_segment_alloc(state, false, 0, size, stream, ret_addr);
}

int st_device_segment_free(void *state, emm_addr_t addr, size_t size, emm_stream_t stream)
{
	return st_segment_free(state, false, addr, size, stream);
}

/* Version 2 backends (vmm): the pages of a device segment, with the
 * entry's context current, like a segment free. */
enum page_op { PAGE_UNMAP, PAGE_MAP, PAGE_GROW };

static int page_call(struct ctx_entry *e, enum page_op op, emm_addr_t seg, size_t a, size_t b, size_t c)
{
	bool pushed;
	int ret, mode;

	if (st_is_exiting())
		return -ECANCELED; /* nothing changes: the driver frees it all with the process */
	st_assert_unlocked("a backend page operation");
	pushed = st_push_ctx(e->ctx);
	mode = backend_enter();
	if (op == PAGE_UNMAP)
		ret = st_backend.table->segment_unmap(e->backend_state, seg, a, b, c);
	else if (op == PAGE_MAP)
		ret = st_backend.table->segment_map(e->backend_state, seg, a, b, c);
	else
		ret = st_backend.table->segment_grow(e->backend_state, seg, a, b);
	backend_leave(mode);
	st_pop_ctx(pushed);
	return ret;
}

static int st_device_segment_unmap(void *state, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	return page_call(state, PAGE_UNMAP, seg, seg_size, off, len);
}

static int st_device_segment_map(void *state, emm_addr_t seg, size_t seg_size, size_t off, size_t len)
{
	return page_call(state, PAGE_MAP, seg, seg_size, off, len);
}

static int st_device_segment_grow(void *state, emm_addr_t seg, size_t old_size, size_t new_size)
{
	int ret = page_call(state, PAGE_GROW, seg, old_size, new_size, 0);

	if (ret == 0)
		st_annotate_heap_grow(seg, old_size, new_size, ((struct ctx_entry *)state)->device);
	return ret;
}

bool st_segment_pages(struct ctx_entry *e, struct emm_segment_pages *ret)
{
	bool remap = emm_backend_has_cap(&st_backend, EMM_BACKEND_CAP_REMAP);
	bool grow = emm_backend_has_cap(&st_backend, EMM_BACKEND_CAP_GROW);
	size_t g = 0;

	if ((!remap && !grow) || st_backend.table->granularity(e->backend_state, &g) != 0)
		return false;
	*ret = (struct emm_segment_pages){
	    .state = e,
	    .granularity = g,
	    .unmap = remap ? st_device_segment_unmap : NULL,
	    .map = remap ? st_device_segment_map : NULL,
	    .grow = grow ? st_device_segment_grow : NULL,
	};
	return true;
}

int st_backend_init(struct ctx_entry *e, CUdevice dev)
{
	int ret, mode;

	st_assert_unlocked("a backend's init");
	mode = backend_enter();
	ret = st_backend.table->init(&st_host, dev, (uint64_t)(uintptr_t)e->ctx, &e->backend_state);
	backend_leave(mode);
	return ret;
}
