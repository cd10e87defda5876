/* SPDX-License-Identifier: MIT */
/*
 * process/contexts.c - one heap per CUDA context: the registry of
 * context entries, the thread cache that finds the calling thread's entry,
 * building an entry (backend, device heap; its segments come through
 * segments.c) and noticing a reset that bypassed our shims. Dropping a
 * context's heaps when it goes is contexts_drop.c's.
 *
 * Finding the heap of the calling thread: each thread caches (key, entry,
 * generation); any context teardown bumps the generation so every cache
 * misses once, and a change of the thread's own current context through a
 * shim of ours (cuCtxSetCurrent, cuCtxPushCurrent, cuCtxPopCurrent,
 * cuCtxCreate, shared cudart's cudaSetDevice, cudaDeviceReset: interpose/
 * shims_ctx.c, shims_runtime.c) empties that thread's cache
 * (emm_state_current_changed). A miss asks the driver. The key is the
 * context's unique id (cuCtxGetId of the current context): a primary
 * context keeps its handle across a reset, and cudart's cudaDeviceReset
 * resets it without calling any shim of ours, so the handle alone would
 * keep serving the old context's heap, whose segments the driver has
 * freed. An entry whose context handle now carries another id is stale:
 * its heaps are dropped without driver calls (later frees of its blocks go
 * to the driver and get its error) and a new entry is built. Frees check
 * the same (st_validate_current) before the pool takes the block.
 * Without cuCtxGetId (drivers before 12.0) the handle is the key.
 *
 * When may a hit skip the driver (EMM_CONTEXT_CHECK=off, the default)?
 * Only if every change of a thread's current context, and every reset or
 * destruction of a context, passes a shim of ours. For the driver API it
 * does: the calls that change the current context are all shimmed (above;
 * cuCtxDestroy, cuDevicePrimaryCtxReset/Release/Retain in shims_stream.c),
 * whether the program links them, dlsyms them or gets them from
 * cuGetProcAddress (the resolvers substitute every shimmed export,
 * cudart's own lookups included) - except green contexts
 * (cuGreenCtxDestroy is not shimmed) and the deprecated
 * cuCtxAttach/cuCtxDetach. A static cudart's cudaDeviceReset resets the
 * primary context through no exported entry point (tests/shims/
 * probe_ctxid.c, H200), but its next call retains the primary again
 * through our cuDevicePrimaryCtxRetain shim, which finds the heap of the
 * inactive primary stale. On four H200s (RESULTS.md section 26) a static
 * and a shared cudart were right with the cache trusted across
 * cudaSetDevice between devices and across cudaDeviceReset
 * (tests/gpu/ctx_cache.cu), and the whole gpu and race suites passed with
 * it. So the default trusts the cache: one cuCtxGetId per lookup cost a
 * cached cudaMalloc pair 0.41 against 0.15 us (RESULTS.md section 19).
 * EMM_CONTEXT_CHECK=on asks the driver on every lookup, for programs that
 * use green contexts or cuCtxAttach, or change contexts from libraries our
 * shims do not see (dlmopen, RTLD_DEEPBIND) (tests: the -check twins;
 * tests/shims/test_shims_ctx_cache.c counts the calls). The door without
 * the preload (api.c) sees no change at all: it empties the cache on every
 * call. libemm's own pushes and pops (segments.c, api.c, fence_cuda.c)
 * empty the cache like the shims do.
 * Either way, once the driver has named the context in a guarded call
 * (st_tls_ctx.verified), the rest of that call trusts the cache: an epoch
 * closed by the free records its events without asking cuCtxGetCurrent.
 *
 * Entries are never freed (a torn-down one is unlinked), so a stale cache
 * never points at freed memory. A thread's cache dies with it (plain TLS,
 * nothing to flush); a fork child starts with a new generation and an
 * empty registry (st_contexts_fork_child).
 *
 * A heap is destroyed only when its context goes, under the heap guard
 * (guard.c), and never after exit has begun (state.c).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"
#include "process/annotate.h"
#include "process/carrier.h"
#include "process/process_internal.h"
#include "process/process.h"

pthread_mutex_t st_ctx_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_rwlock_t st_heap_life_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct ctx_entry **ctx_list;
static size_t ctx_count, ctx_cap;
atomic_uint_fast64_t st_ctx_generation = 1;
atomic_uint_fast64_t st_ctx_births;

EMM_TLS_IE struct st_tls_ctx st_tls_ctx;
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
	const struct emm_real_driver_table *real = st_real_table();
	const struct emm_state_real_extra *x = st_real_extra();
	CUcontext primary = NULL;

	if (!x->cuDevicePrimaryCtxRetain || !real->cuDevicePrimaryCtxRelease_v2 || st_primary_state(dev) != 1)
		return false;
	if (x->cuDevicePrimaryCtxRetain(&primary, dev) != CUDA_SUCCESS)
		return false;
	(void)real->cuDevicePrimaryCtxRelease_v2(dev);
	return primary == ctx;
}

/* Put `e` in the registry. st_ctx_lock held. False without memory. */
static bool entry_append_locked(struct ctx_entry *e)
{
	if (ctx_count == ctx_cap) {
		size_t cap = ctx_cap ? ctx_cap * 2 : 8;
		struct ctx_entry **list = realloc(ctx_list, cap * sizeof(*list));
		if (!list)
			return false;
		ctx_list = list;
		ctx_cap = cap;
	}
	ctx_list[ctx_count++] = e;
	return true;
}

struct publish_arg {
	struct ctx_entry *entry;  /* the one built */
	struct ctx_entry *winner; /* the one in the registry afterwards (NULL: no memory) */
	uint64_t generation;	  /* st_ctx_generation as the winner was found or published */
};

/* st_ctx_lock held: publish a->entry unless another thread's entry for the
 * same context got there first. */
static void publish_entry_locked(void *arg)
{
	struct publish_arg *a = arg;
	struct ctx_entry *found = entry_find_locked(a->entry->ctx);

	if (found && found->ctx_id == a->entry->ctx_id)
		a->winner = found;
	else if (!found && entry_append_locked(a->entry))
		a->winner = a->entry;
	else
		a->winner = NULL; /* no memory, or a stale entry to drop first: retry */
	a->generation = atomic_load_explicit(&st_ctx_generation, memory_order_relaxed);
}

/* Undo what entry_build did for an entry that was never published. */
static void entry_discard(struct ctx_entry *e)
{
	st_assert_unlocked("discarding an unpublished context entry");
	if (e->heap)
		emm_heap_destroy(e->heap, false); /* new and empty: nothing to give back */
	if (e->backend_state && st_backend.table->fini)
		st_backend.table->fini(e->backend_state, true);
	free(e);
}

int st_entry_heap_create(struct ctx_entry *e, emm_heap_t **ret)
{
	struct emm_heap_params params;
	struct emm_segment_source src;
	struct emm_segment_pages pages;

	st_heap_params(&params);
	st_fit_params(e, e->device, &params);
	src.state = e;
	src.alloc = st_device_segment_alloc;
	src.free = st_device_segment_free;
	return emm_heap_create_paged(&params, &src, st_segment_pages(e, &pages) ? &pages : NULL, &e->fence, e->device,
	                             ret);
}

/*
 * Build the entry (and heap) of the current context `ctx` with no lock
 * held - it makes driver calls (the device, the primary context, the
 * backend's init) and heap calls - and publish it. Returns the entry in the
 * registry afterwards (ours, or another thread's that won the race) and
 * the registry generation it was found at; NULL without memory or when a
 * stale entry must be dropped first. A failed backend gives a failed entry
 * (pass-through for that context).
 */
static struct ctx_entry *entry_create(CUcontext ctx, unsigned long long ctx_id, uint64_t *ret_gen)
{
	const struct emm_real_driver_table *real = st_real_table();
	struct publish_arg pa = {NULL, NULL, 0};
	emm_heap_t *heap = NULL;
	struct ctx_entry *e;
	CUdevice dev = 0;
	int ret;

	st_assert_unlocked("creating a context entry");
	e = calloc(1, sizeof(*e));
	if (!e)
		return NULL;
	e->born = atomic_fetch_add(&st_ctx_births, 1) + 1;
	e->ctx = ctx;
	st_note_context(ctx);
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

	ret = st_backend_init(e, dev);
	if (ret < 0) {
		emm_warn("backend %s: init for device %d failed (%s): this context's allocations go to the "
		         "driver",
		         st_backend.table->name, dev, strerror(-ret));
		e->backend_state = NULL;
		e->failed = true;
		goto publish;
	}
	ret = st_entry_heap_create(e, &heap);
	if (ret == 0)
		e->heap = heap;
	if (ret < 0) {
		emm_warn(
		    "cannot create the heap for device %d (%s): this context's allocations go to the driver",
		    dev, strerror(-ret));
		if (st_backend.table->fini)
			st_backend.table->fini(e->backend_state, true);
		e->backend_state = NULL;
		e->failed = true;
	}
publish:
	pa.entry = e;
	if (e->heap) {
		if (st_publish_heap(e->heap, ctx, publish_entry_locked, &pa) < 0)
			pa.winner = NULL;
	} else {
		st_lock(&st_ctx_lock);
		publish_entry_locked(&pa);
		st_unlock(&st_ctx_lock);
	}
	if (pa.winner != e) {
		entry_discard(e);
		if (!pa.winner)
			return NULL;
	} else if (e->heap) {
		emm_debug("heap for context %p (id %llu, device %d%s)", (void *)ctx, ctx_id, dev,
		          e->primary ? ", primary" : "");
		/* Run our exit handler before the teardown of a runtime that
		 * initialised after us (see state.c). */
		st_atexit_again();
	}
	*ret_gen = pa.generation;
	return pa.winner;
}

/* An entry of an earlier context with the handle `ctx` is in the registry. */
static bool entry_stale_present(CUcontext ctx, unsigned long long id)
{
	struct ctx_entry *e;
	bool stale;

	st_lock(&st_ctx_lock);
	e = entry_find_locked(ctx);
	stale = e && e->ctx_id != id;
	st_unlock(&st_ctx_lock);
	return stale;
}

/* The current context and its key for the thread cache: its unique id, or
 * its handle where the driver has no cuCtxGetId. 0; -ENODEV without a
 * usable current context (none, not initialised); -ESTALE when the current
 * context is destroyed or reset and not retained again (its memory is gone:
 * the caller drops our heaps of it). */
static int current_context_key(uint64_t *ret_key, unsigned long long *ret_id)
{
	const struct emm_state_real_extra *x = st_real_extra();
	const struct emm_real_driver_table *real;
	unsigned long long id = 0;
	CUcontext ctx = NULL;
	CUresult r;

	if (EMM_LIKELY(x->cuCtxGetId != NULL)) {
		/* Under a tool (compute-sanitizer), a thread without a context
		 * is found without the failed cuCtxGetId the tool would report
		 * as the program's error. */
		if (EMM_UNLIKELY(st_tool_injected)) {
			real = st_real_table();
			if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
				return -ENODEV;
			if (st_context_known_dead(ctx))
				return -ESTALE;
		}
		/* NULL: the current context's id; an error without one. */
		r = x->cuCtxGetId(NULL, &id);
		if (EMM_UNLIKELY(r != CUDA_SUCCESS || id == 0))
			return r == CUDA_ERROR_CONTEXT_IS_DESTROYED ? -ESTALE : -ENODEV;
		*ret_key = id;
		*ret_id = id;
		return 0;
	}
	real = st_real_table();
	if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
		return -ENODEV;
	*ret_key = (uint64_t)(uintptr_t)ctx;
	*ret_id = 0;
	return 0;
}

/* An entry left from before a reset of its context is dropped on the way
 * (see the top of this file). */
int st_current_entry_slow(struct ctx_entry **ret, bool create)
{
	const struct emm_real_driver_table *real;
	struct ctx_entry *e;
	unsigned long long id;
	CUcontext ctx = NULL;
	uint64_t gen, key;
	int rc;

	if (!st_is_enabled() || st_is_exiting() || st_tls_in_backend)
		return -ENOSYS;
	if (!st_opts->context_check) {
		/* Every change of the current context is seen (top of file):
		 * the cache stands until a shim or a teardown empties it. */
		gen = atomic_load_explicit(&st_ctx_generation, memory_order_acquire);
		e = st_tls_ctx.entry;
		if (EMM_LIKELY(e && st_tls_ctx.generation == gen)) {
			if (e->failed)
				return -ENOSYS;
			*ret = e;
			return 0;
		}
	}
	rc = current_context_key(&key, &id);
	if (EMM_UNLIKELY(rc < 0)) {
		/* cudaDeviceReset leaves the reset primary context current
		 * until the runtime's next call retains it: a free made in
		 * between (shared cudart's fast path) must not reach the old
		 * heap. */
		if (rc == -ESTALE && (real = st_real_table())->cuCtxGetCurrent &&
		    real->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)
			emm_state_context_destroyed(ctx);
		return -ENODEV;
	}
	gen = atomic_load_explicit(&st_ctx_generation, memory_order_acquire);
	if (EMM_LIKELY(st_tls_ctx.key == key && st_tls_ctx.generation == gen && st_tls_ctx.entry)) {
		e = st_tls_ctx.entry;
	} else {
		real = st_real_table();
		if (!real->cuCtxGetCurrent || real->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx)
			return -ENODEV;
		for (;;) {
			unsigned long long found_id = 0;

			st_lock(&st_ctx_lock);
			e = entry_find_locked(ctx);
			if (e)
				found_id = e->ctx_id;
			gen = atomic_load_explicit(&st_ctx_generation, memory_order_relaxed);
			st_unlock(&st_ctx_lock);
			if (e && found_id != id) {
				/* Same handle, another context: reset behind our back. */
				emm_debug("context %p was reset (id %llu, now %llu): dropping its heaps",
				          (void *)ctx, found_id, id);
				if (!st_drop_entry(e) && st_is_exiting())
					return -ENOSYS;
				continue;
			}
			if (!e && create) {
				e = entry_create(ctx, id, &gen);
				if (!e && entry_stale_present(ctx, id))
					continue; /* dropped on the next round */
			}
			break;
		}
		if (!e)
			return -ENODEV;
		st_tls_ctx.key = key;
		st_tls_ctx.entry = e;
		st_tls_ctx.generation = gen;
	}
	if (e->failed)
		return -ENOSYS;
	/* The driver just named it: good for the rest of this guarded call
	 * (outside one, nothing would clear it). */
	st_tls_ctx.verified = st_tls_guard_depth > 0;
	*ret = e;
	return 0;
}

void emm_state_current_changed(bool every_thread)
{
	st_tls_ctx.entry = NULL;
	if (every_thread)
		atomic_fetch_add(&st_ctx_generation, 1);
}

bool emm_state_context_current(void)
{
	const struct emm_real_driver_table *real;
	CUcontext ctx = NULL;

	if (st_tls_trusted_ctx())
		return true;
	real = st_real_table();
	return real->cuCtxGetCurrent && real->cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx;
}

int emm_state_current_heap_lookup(emm_heap_t **ret_heap)
{
	struct ctx_entry *e;
	int ret = st_current_entry(&e, false);

	if (ret < 0)
		return ret;
	*ret_heap = e->heap;
	return 0;
}

size_t emm_state_pitch_alignment(void)
{
	const struct emm_state_real_extra *x;
	struct ctx_entry *e;
	size_t align;
	int value = 0;

	if (st_current_entry(&e, true) < 0)
		return 512;
	align = atomic_load_explicit(&e->pitch_align, memory_order_relaxed);
	if (align)
		return align;
	x = st_real_extra();
	align = 512;
	if (x->cuDeviceGetAttribute &&
	    x->cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT, e->device) ==
	        CUDA_SUCCESS &&
	    value > 512 && (value & (value - 1)) == 0)
		align = (size_t)value;
	atomic_store_explicit(&e->pitch_align, align, memory_order_relaxed);
	return align;
}

struct ctx_entry *st_ctx_find_locked(st_ctx_match_fn match, const void *arg, bool unlink)
{
	for (size_t i = 0; i < ctx_count; i++) {
		struct ctx_entry *e = ctx_list[i];

		if (!match(e, arg))
			continue;
		if (unlink)
			ctx_list[i] = ctx_list[--ctx_count];
		return e;
	}
	return NULL;
}

size_t st_ctx_collect_locked(st_ctx_match_fn match, const void *arg, struct ctx_entry **out, size_t cap)
{
	size_t n = 0;

	for (size_t i = 0; i < ctx_count && n < cap; i++)
		if (match(ctx_list[i], arg))
			out[n++] = ctx_list[i];
	return n;
}

bool st_ctx_lookup(CUcontext ctx, CUdevice *ret_device, bool *ret_primary)
{
	struct ctx_entry *e;

	st_lock(&st_ctx_lock);
	e = entry_find_locked(ctx);
	if (e) {
		*ret_device = e->device;
		*ret_primary = e->primary;
	}
	st_unlock(&st_ctx_lock);
	return e != NULL;
}

/* --- the heaps of the registry ----------------------------------------- */

/* Entry e's heaps: its device heap and a retired one (the first
 * *ret_device of them), then its pinned heaps. At most ST_CONTEXT_HEAPS. */
static size_t entry_heaps(const struct ctx_entry *e, emm_heap_t **out, size_t *ret_device)
{
	size_t n = 0;

	if (e->heap)
		out[n++] = e->heap;
	if (e->retired)
		out[n++] = e->retired;
	*ret_device = n;
	for (unsigned f = 0; f < PINNED_FLAG_SETS; f++) {
		emm_heap_t *p = atomic_load(&e->pinned[f]);
		if (p)
			out[n++] = p;
	}
	return n;
}

struct heap_ref *st_snapshot_locked(size_t *ret_count)
{
	struct heap_ref *refs = calloc(ctx_count * ST_CONTEXT_HEAPS + 1, sizeof(*refs));
	size_t n = 0;

	if (!refs) {
		*ret_count = 0;
		return NULL;
	}
	for (size_t i = 0; i < ctx_count; i++) {
		struct ctx_entry *e = ctx_list[i];
		emm_heap_t *heaps[ST_CONTEXT_HEAPS];
		size_t ndev, nh = entry_heaps(e, heaps, &ndev);
		for (size_t j = 0; j < nh; j++)
			refs[n++] = (struct heap_ref){heaps[j], j < ndev ? e->device : -2, e->ctx};
	}
	*ret_count = n;
	return refs;
}

size_t st_heaps_of_context_locked(CUcontext ctx, emm_heap_t **out)
{
	struct ctx_entry *e = entry_find_locked(ctx);
	size_t ndev;

	return e && e->heap ? entry_heaps(e, out, &ndev) : 0;
}

struct ctx_entry *st_heap_entry(const emm_heap_t *heap)
{
	struct ctx_entry *found = NULL;

	st_lock(&st_ctx_lock);
	for (size_t i = 0; i < ctx_count && !found; i++) {
		emm_heap_t *heaps[ST_CONTEXT_HEAPS];
		size_t ndev, nh = entry_heaps(ctx_list[i], heaps, &ndev);
		for (size_t j = 0; j < nh && !found; j++)
			if (heaps[j] == heap)
				found = ctx_list[i];
	}
	st_unlock(&st_ctx_lock);
	return found;
}

void st_contexts_fork_child(void)
{
	pthread_mutex_init(&st_ctx_lock, NULL);
	pthread_rwlock_init(&st_heap_life_lock, NULL);
	ctx_list = NULL;
	ctx_count = ctx_cap = 0;
	atomic_fetch_add(&st_ctx_generation, 1);
	st_tls_ctx.key = 0;
	st_tls_ctx.entry = NULL;
}
