/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_core.c - global state, the control API, call counters,
 * initialisation, devices, contexts (primary and created, the per-thread
 * context stack) and the error strings.
 */
#include "fake.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fake_global g_fake = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
};

/* --- call counters and fault injection (lock-free) --- */

static const char *const fn_names[FN_COUNT_] = {
#define FAKE_FN_NAME(name) #name,
	FAKE_FUNCTIONS(FAKE_FN_NAME)
#undef FAKE_FN_NAME
};

static _Atomic uint64_t fn_calls[FN_COUNT_];
static _Atomic unsigned fn_fail_count[FN_COUNT_];
static _Atomic int fn_fail_error[FN_COUNT_];
static _Atomic uint64_t failures_injected;

static int fn_index(const char *name);
static _Atomic int fn_hold[FN_COUNT_];
static atomic_int held_waiting, held_release;

/* Park the calling thread (outside the fake's lock) until released. */
static void hold_here(void)
{
	atomic_store(&held_waiting, 1);
	while (!atomic_load(&held_release))
		sched_yield();
	atomic_store(&held_release, 0);
	atomic_store(&held_waiting, 0);
}

FAKECUDA_API int fakecuda_hold_next_call(const char *name)
{
	int i = fn_index(name);
	if (i < 0)
		return -1;
	atomic_store(&held_release, 0);
	atomic_store(&fn_hold[i], 1);
	return 0;
}

FAKECUDA_API int fakecuda_held_waiting(void)
{
	return atomic_load(&held_waiting);
}

FAKECUDA_API void fakecuda_release_held(void)
{
	atomic_store(&held_release, 1);
}

FAKECUDA_API void fakecuda_hold_clear(void)
{
	for (int i = 0; i < FN_COUNT_; i++)
		atomic_store(&fn_hold[i], 0);
}

CUresult fake_enter(enum fake_fn fn)
{
	atomic_fetch_add_explicit(&fn_calls[fn], 1, memory_order_relaxed);
	if (__builtin_expect(atomic_load_explicit(&fn_hold[fn], memory_order_relaxed), 0) &&
	    atomic_exchange(&fn_hold[fn], 0))
		hold_here();
	unsigned n = atomic_load_explicit(&fn_fail_count[fn], memory_order_relaxed);
	while (n > 0) {
		if (atomic_compare_exchange_weak(&fn_fail_count[fn], &n, n - 1)) {
			atomic_fetch_add_explicit(&failures_injected, 1, memory_order_relaxed);
			return (CUresult)atomic_load(&fn_fail_error[fn]);
		}
	}
	return CUDA_SUCCESS;
}

static int fn_index(const char *name)
{
	if (!name)
		return -1;
	for (int i = 0; i < FN_COUNT_; i++)
		if (strcmp(fn_names[i], name) == 0)
			return i;
	return -1;
}

/* --- the lock and thread-local state --- */

void fake_lock(void)
{
	pthread_mutex_lock(&g_fake.lock);
}

void fake_unlock(void)
{
	pthread_mutex_unlock(&g_fake.lock);
}

#define CTX_STACK_MAX 64
#define PTDS_MAX 16

struct fake_tls {
	uint64_t gen;
	int depth;
	struct fake_ctx *stack[CTX_STACK_MAX];
	CUstreamCaptureMode capture_mode;
	int nptds;
	struct {
		struct fake_ctx *ctx;
		uint64_t epoch;        /* ctx->epoch when the stream was made */
		struct fake_stream *stream;
	} ptds[PTDS_MAX];
};

static __thread struct fake_tls tls;

/* Drops what this thread remembered from before a fakecuda_reset. Reading
 * g_fake.gen without the lock is fine: a reset racing with a call of the
 * thread being reset is the test's own race. */
static struct fake_tls *tls_get(void)
{
	uint64_t gen = __atomic_load_n(&g_fake.gen, __ATOMIC_ACQUIRE);
	if (tls.gen != gen) {
		memset(&tls, 0, sizeof(tls));
		tls.gen = gen;
		tls.capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
	}
	return &tls;
}

CUstreamCaptureMode *fake_thread_capture_mode(void)
{
	return &tls_get()->capture_mode;
}

struct fake_stream *fake_per_thread_stream_locked(struct fake_ctx *ctx)
{
	struct fake_tls *t = tls_get();
	int slot = -1;
	for (int i = 0; i < t->nptds; i++) {
		if (t->ptds[i].ctx != ctx)
			continue;
		/* A stream made before the context was last reset is gone. */
		if (t->ptds[i].epoch == ctx->epoch)
			return t->ptds[i].stream;
		slot = i;
	}
	struct fake_stream *s = fake_stream_new_locked(ctx, STREAM_PER_THREAD, 0, 0);
	if (!s)
		return NULL;
	if (slot < 0 && t->nptds < PTDS_MAX)
		slot = t->nptds++;
	if (slot >= 0) {
		t->ptds[slot].ctx = ctx;
		t->ptds[slot].epoch = ctx->epoch;
		t->ptds[slot].stream = s;
	}
	return s;
}

/* --- settings --- */

static size_t parse_size(const char *s, size_t def)
{
	if (!s || !*s)
		return def;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s)
		return def;
	switch (*end) {
	case 'T': case 't': v <<= 10; /* fall through */
	case 'G': case 'g': v <<= 10; /* fall through */
	case 'M': case 'm': v <<= 10; /* fall through */
	case 'K': case 'k': v <<= 10; break;
	case '\0': break;
	default: return def;
	}
	return (size_t)v;
}

void fake_settings_defaults_locked(void)
{
	long n = 1;
	const char *e = getenv("FAKECUDA_DEVICES");
	if (e && *e) {
		n = strtol(e, NULL, 10);
		if (n < 0)
			n = 0;
		if (n > FAKE_MAX_DEVICES)
			n = FAKE_MAX_DEVICES;
	}
	g_fake.device_count = (int)n;
	g_fake.capacity = parse_size(getenv("FAKECUDA_MEM_CAPACITY"), (size_t)80 << 30);
	g_fake.event_delay = (unsigned)parse_size(getenv("FAKECUDA_EVENT_DELAY"), 0);
	g_fake.fail_allocs = 0;
}

static void settings_once_locked(void)
{
	static bool done;
	if (!done) {
		fake_settings_defaults_locked();
		done = true;
	}
}

/* --- the control API --- */

FAKECUDA_API void fakecuda_reset(void)
{
	fake_lock();
	fake_streams_reset_locked();
	fake_mem_reset_locked();
	fake_pool_reset_locked();
	fake_vmm_reset_locked();
	fake_peer_reset_locked();
	for (struct fake_ctx *c = g_fake.contexts, *n; c; c = n) {
		n = c->next;
		free(c);
	}
	g_fake.contexts = NULL;
	memset(g_fake.primary, 0, sizeof(g_fake.primary));
	fake_ptrset_clear(&g_fake.ctx_set);
	g_fake.initialized = false;
	g_fake.forked = false;
	memset(&g_fake.stats, 0, sizeof(g_fake.stats));
	memset(g_fake.used, 0, sizeof(g_fake.used));
	fake_settings_defaults_locked();
	__atomic_add_fetch(&g_fake.gen, 1, __ATOMIC_RELEASE);
	fake_unlock();
	fakecuda_reset_counters();
	for (int i = 0; i < FN_COUNT_; i++)
		atomic_store(&fn_fail_count[i], 0);
}

FAKECUDA_API void fakecuda_set_event_delay(unsigned int queries)
{
	fake_lock();
	settings_once_locked();
	g_fake.event_delay = queries;
	fake_unlock();
}

FAKECUDA_API void fakecuda_complete_all(void)
{
	fake_lock();
	fake_complete_all_locked();
	fake_unlock();
}

FAKECUDA_API void fakecuda_set_mem_capacity(size_t bytes)
{
	fake_lock();
	settings_once_locked();
	g_fake.capacity = bytes;
	fake_unlock();
}

FAKECUDA_API size_t fakecuda_mem_used(int device)
{
	if (device < 0 || device >= FAKE_MAX_DEVICES)
		return 0;
	fake_lock();
	size_t used = g_fake.used[device];
	fake_unlock();
	return used;
}

FAKECUDA_API void fakecuda_fail_next_alloc(unsigned int count)
{
	fake_lock();
	settings_once_locked();
	g_fake.fail_allocs = count;
	fake_unlock();
}

FAKECUDA_API int fakecuda_fail_next_call(const char *name, CUresult error, unsigned int count)
{
	int i = fn_index(name);
	if (i < 0)
		return -1;
	atomic_store(&fn_fail_error[i], (int)error);
	atomic_store(&fn_fail_count[i], count);
	return 0;
}

FAKECUDA_API uint64_t fakecuda_calls(const char *name)
{
	int i = fn_index(name);
	return i < 0 ? 0 : atomic_load(&fn_calls[i]);
}

FAKECUDA_API uint64_t fakecuda_calls_total(const char **ret_top)
{
	uint64_t total = 0, top = 0;

	for (int i = 0; i < FN_COUNT_; i++) {
		uint64_t n = atomic_load(&fn_calls[i]);
		total += n;
		if (n > top) {
			top = n;
			if (ret_top)
				*ret_top = fn_names[i];
		}
	}
	return total;
}

FAKECUDA_API int fakecuda_known_function(const char *name)
{
	return fn_index(name) >= 0;
}

FAKECUDA_API void fakecuda_get_stats(struct fakecuda_stats *out)
{
	if (!out)
		return;
	fake_lock();
	*out = g_fake.stats;
	uint64_t bytes = 0;
	for (int d = 0; d < FAKE_MAX_DEVICES; d++)
		bytes += g_fake.used[d];
	out->device_bytes_in_use = bytes;
	out->pending_events = fake_pending_events_locked();
	fake_unlock();
	out->failures_injected = atomic_load(&failures_injected);
}

FAKECUDA_API void fakecuda_reset_counters(void)
{
	for (int i = 0; i < FN_COUNT_; i++)
		atomic_store(&fn_calls[i], 0);
	atomic_store(&failures_injected, 0);
	fake_lock();
	/* The "now" fields describe live state and stay. */
	struct fakecuda_stats keep = g_fake.stats;
	memset(&g_fake.stats, 0, sizeof(g_fake.stats));
	g_fake.stats.live_device_allocations = keep.live_device_allocations;
	g_fake.stats.live_host_allocations = keep.live_host_allocations;
	fake_unlock();
}

/* --- initialisation and devices --- */

CUresult fake_check_init_locked(void)
{
	return g_fake.initialized && !g_fake.forked ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* fork(): the lock must not be held by a thread that does not exist in the
 * child. A child of an initialised process cannot use CUDA (every call
 * answers CUDA_ERROR_NOT_INITIALIZED, cuInit too) until fakecuda_reset. */
static void atfork_prepare(void)
{
	fake_lock();
}

static void atfork_parent(void)
{
	fake_unlock();
}

static void atfork_child(void)
{
	if (g_fake.initialized)
		g_fake.forked = true;
	fake_mem_after_fork_child_locked();
	fake_unlock();
}

__attribute__((constructor)) static void fake_constructor(void)
{
	pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

bool fake_device_valid(CUdevice dev)
{
	return dev >= 0 && dev < g_fake.device_count;
}

FAKE_API CUresult cuInit(unsigned int Flags)
{
	FAKE_ENTER(cuInit);
	if (Flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	settings_once_locked();
	CUresult r = g_fake.device_count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
	if (g_fake.forked)
		r = CUDA_ERROR_NOT_INITIALIZED;
	if (r == CUDA_SUCCESS)
		g_fake.initialized = true;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuDriverGetVersion(int *driverVersion)
{
	FAKE_ENTER(cuDriverGetVersion);
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = FAKE_DRIVER_VERSION;
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	FAKE_ENTER(cuDeviceGet);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !device)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS && !fake_device_valid(ordinal))
		r = CUDA_ERROR_INVALID_DEVICE;
	else if (r == CUDA_SUCCESS)
		*device = ordinal;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuDeviceGetCount(int *count)
{
	FAKE_ENTER(cuDeviceGetCount);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !count)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS)
		*count = g_fake.device_count;
	fake_unlock();
	return r;
}

static CUresult device_arg_locked(CUdevice dev)
{
	CUresult r = fake_check_init_locked();
	if (r != CUDA_SUCCESS)
		return r;
	return fake_device_valid(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

FAKE_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	FAKE_ENTER(cuDeviceGetName);
	fake_lock();
	CUresult r = device_arg_locked(dev);
	fake_unlock();
	if (r != CUDA_SUCCESS)
		return r;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	snprintf(name, (size_t)len, "NVIDIA H200 (fakecuda %d)", dev);
	return CUDA_SUCCESS;
}

static int attribute_value(CUdevice_attribute a, CUdevice dev)
{
	switch (a) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
	case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
	case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
	case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
	case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
	case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
	case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: return 32;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
	case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x18 + dev;
	case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: return 0;
	case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: return 0;
	case CU_DEVICE_ATTRIBUTE_INTEGRATED: return 0;
	case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
	case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
	case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
	case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
	case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
	case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 6144;
	case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
	case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
	case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
	case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
	case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
	case CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES: return 1;
	case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: return 0;
	case CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS: return 0;
	default: return 0;
	}
}

FAKE_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	FAKE_ENTER(cuDeviceGetAttribute);
	fake_lock();
	CUresult r = device_arg_locked(dev);
	fake_unlock();
	if (r != CUDA_SUCCESS)
		return r;
	if (!pi || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	*pi = attribute_value(attrib, dev);
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	FAKE_ENTER(cuDeviceTotalMem_v2);
	fake_lock();
	CUresult r = device_arg_locked(dev);
	if (r == CUDA_SUCCESS && !bytes)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS)
		*bytes = g_fake.capacity;
	fake_unlock();
	return r;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
	fake_lock();
	CUresult r = device_arg_locked(dev);
	fake_unlock();
	if (r != CUDA_SUCCESS)
		return r;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(uuid->bytes, "fakecuda-device", 16);
	uuid->bytes[15] = (char)dev;
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	FAKE_ENTER(cuDeviceGetUuid);
	return device_uuid(uuid, dev);
}

FAKE_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	FAKE_ENTER(cuDeviceGetUuid_v2);
	return device_uuid(uuid, dev);
}

/* --- contexts --- */

struct fake_ctx *fake_ctx_lookup_locked(CUcontext h)
{
	return fake_ptrset_has(&g_fake.ctx_set, h) ? (struct fake_ctx *)h : NULL;
}

static struct fake_ctx *ctx_new_locked(int dev, unsigned flags, bool primary)
{
	struct fake_ctx *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->device = dev;
	c->flags = flags;
	c->primary = primary;
	c->id = ++g_fake.next_id;
	if (!fake_ptrset_add(&g_fake.ctx_set, c)) {
		free(c);
		return NULL;
	}
	c->next = g_fake.contexts;
	g_fake.contexts = c;
	return c;
}

/* Makes ctx usable: a fresh legacy stream. */
static CUresult ctx_activate_locked(struct fake_ctx *c)
{
	c->epoch = ++g_fake.next_id;
	c->id = c->epoch; /* a reset primary context is a new context: new id, same handle */
	c->legacy = fake_stream_new_locked(c, STREAM_LEGACY, 0, 0);
	if (!c->legacy)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->alive = true;
	return CUDA_SUCCESS;
}

/* Frees everything the context owns; the handle stays known. */
static void ctx_deactivate_locked(struct fake_ctx *c)
{
	if (!c->alive)
		return;
	fake_mem_drop_ctx_locked(c);
	fake_ctx_drop_streams_locked(c);
	fake_peer_drop_ctx_locked(c);
	c->legacy = NULL;
	c->alive = false;
}

CUresult fake_current_ctx_locked(struct fake_ctx **out)
{
	CUresult r = fake_check_init_locked();
	if (r != CUDA_SUCCESS)
		return r;
	struct fake_tls *t = tls_get();
	struct fake_ctx *c = t->depth > 0 ? t->stack[t->depth - 1] : NULL;
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (!c->alive)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	*out = c;
	return CUDA_SUCCESS;
}

CUresult fake_current_ctx_abi_locked(struct fake_ctx **out, bool abi_v1)
{
	CUresult r = fake_current_ctx_locked(out);
	if (r == CUDA_SUCCESS && (*out)->abi_v1 != abi_v1)
		r = CUDA_ERROR_INVALID_CONTEXT;
	return r;
}

static CUresult primary_retain_locked(CUcontext *pctx, CUdevice dev)
{
	CUresult r = device_arg_locked(dev);
	if (r != CUDA_SUCCESS)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	struct fake_ctx *c = g_fake.primary[dev];
	if (!c) {
		c = ctx_new_locked(dev, 0, true);
		if (!c)
			return CUDA_ERROR_OUT_OF_MEMORY;
		g_fake.primary[dev] = c;
	}
	if (!c->alive) {
		r = ctx_activate_locked(c);
		if (r != CUDA_SUCCESS)
			return r;
	}
	c->primary_refs++;
	*pctx = (CUcontext)c;
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	FAKE_ENTER(cuDevicePrimaryCtxRetain);
	fake_lock();
	CUresult r = primary_retain_locked(pctx, dev);
	fake_unlock();
	return r;
}

static CUresult primary_release(CUdevice dev)
{
	fake_lock();
	CUresult r = device_arg_locked(dev);
	if (r == CUDA_SUCCESS) {
		struct fake_ctx *c = g_fake.primary[dev];
		if (!c || c->primary_refs <= 0) {
			r = CUDA_ERROR_INVALID_CONTEXT;
		} else if (--c->primary_refs == 0) {
			ctx_deactivate_locked(c);
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	FAKE_ENTER(cuDevicePrimaryCtxRelease);
	return primary_release(dev);
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	FAKE_ENTER(cuDevicePrimaryCtxRelease_v2);
	return primary_release(dev);
}

/* Resetting frees everything and keeps the retain count and the handle;
 * calls made with it current answer CUDA_ERROR_CONTEXT_IS_DESTROYED until
 * the next cuDevicePrimaryCtxRetain brings it back. */
static CUresult primary_reset(CUdevice dev)
{
	fake_lock();
	CUresult r = device_arg_locked(dev);
	if (r == CUDA_SUCCESS && g_fake.primary[dev])
		ctx_deactivate_locked(g_fake.primary[dev]);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
	FAKE_ENTER(cuDevicePrimaryCtxReset);
	return primary_reset(dev);
}

FAKE_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	FAKE_ENTER(cuDevicePrimaryCtxReset_v2);
	return primary_reset(dev);
}

FAKECUDA_API int fakecuda_device_reset(int device, int retain)
{
	fake_lock();
	int ret = -1;
	if (fake_check_init_locked() == CUDA_SUCCESS && fake_device_valid(device) && g_fake.primary[device]) {
		struct fake_ctx *c = g_fake.primary[device];
		ctx_deactivate_locked(c);
		ret = 0;
		if (retain) {
			CUcontext h;
			ret = primary_retain_locked(&h, device) == CUDA_SUCCESS ? 0 : -1;
		}
	}
	fake_unlock();
	return ret;
}

FAKE_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	FAKE_ENTER(cuDevicePrimaryCtxGetState);
	fake_lock();
	CUresult r = device_arg_locked(dev);
	if (r == CUDA_SUCCESS && (!flags || !active)) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (r == CUDA_SUCCESS) {
		struct fake_ctx *c = g_fake.primary[dev];
		*flags = c ? c->flags : 0;
		*active = c && c->alive;
	}
	fake_unlock();
	return r;
}

static CUresult primary_set_flags(CUdevice dev, unsigned int flags)
{
	if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
		return CUDA_ERROR_INVALID_VALUE;
	fake_lock();
	CUresult r = device_arg_locked(dev);
	if (r == CUDA_SUCCESS) {
		struct fake_ctx *c = g_fake.primary[dev];
		if (!c) {
			c = ctx_new_locked(dev, 0, true);
			g_fake.primary[dev] = c;
		}
		if (c)
			c->flags = flags;
		else
			r = CUDA_ERROR_OUT_OF_MEMORY;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
	FAKE_ENTER(cuDevicePrimaryCtxSetFlags);
	return primary_set_flags(dev, flags);
}

FAKE_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
	FAKE_ENTER(cuDevicePrimaryCtxSetFlags_v2);
	return primary_set_flags(dev, flags);
}

static CUresult push_locked(struct fake_ctx *c)
{
	struct fake_tls *t = tls_get();
	if (t->depth >= CTX_STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	t->stack[t->depth++] = c;
	return CUDA_SUCCESS;
}

/* cuCtxCreate: a new context, pushed on the calling thread's stack. */
static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev, bool abi_v1)
{
	fake_lock();
	CUresult r = device_arg_locked(dev);
	if (r == CUDA_SUCCESS && (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK)))
		r = CUDA_ERROR_INVALID_VALUE;
	struct fake_ctx *c = NULL;
	if (r == CUDA_SUCCESS) {
		c = ctx_new_locked(dev, flags, false);
		r = c ? ctx_activate_locked(c) : CUDA_ERROR_OUT_OF_MEMORY;
		if (c)
			c->abi_v1 = abi_v1;
	}
	if (r == CUDA_SUCCESS)
		r = push_locked(c);
	if (r == CUDA_SUCCESS)
		*pctx = (CUcontext)c;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FAKE_ENTER(cuCtxCreate);
	return ctx_create(pctx, flags, dev, true);
}

FAKE_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	FAKE_ENTER(cuCtxCreate_v2);
	return ctx_create(pctx, flags, dev, false);
}

FAKE_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
				 unsigned int flags, CUdevice dev)
{
	FAKE_ENTER(cuCtxCreate_v3);
	if (numParams < 0 || (numParams > 0 && !paramsArray))
		return CUDA_ERROR_INVALID_VALUE;
	if (numParams > 0)
		return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
	return ctx_create(pctx, flags, dev, false);
}

FAKE_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
				 CUdevice dev)
{
	FAKE_ENTER(cuCtxCreate_v4);
	if (ctxCreateParams && ctxCreateParams->numExecAffinityParams > 0)
		return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
	if (ctxCreateParams && ctxCreateParams->cigParams)
		return CUDA_ERROR_NOT_SUPPORTED;
	return ctx_create(pctx, flags, dev, false);
}

static CUresult ctx_destroy(CUcontext h)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_ctx *c = NULL;
	if (r == CUDA_SUCCESS) {
		c = fake_ctx_lookup_locked(h);
		if (!c)
			r = CUDA_ERROR_INVALID_CONTEXT;
		else if (c->destroyed)
			r = CUDA_ERROR_CONTEXT_IS_DESTROYED; /* the real driver, destroying twice */
		else if (c->primary)
			r = CUDA_ERROR_INVALID_CONTEXT;
	}
	if (r == CUDA_SUCCESS) {
		ctx_deactivate_locked(c);
		c->destroyed = true;
		struct fake_tls *t = tls_get();
		if (t->depth > 0 && t->stack[t->depth - 1] == c)
			t->depth--;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxDestroy(CUcontext ctx)
{
	FAKE_ENTER(cuCtxDestroy);
	return ctx_destroy(ctx);
}

FAKE_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	FAKE_ENTER(cuCtxDestroy_v2);
	return ctx_destroy(ctx);
}

FAKE_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	FAKE_ENTER(cuCtxGetCurrent);
	fake_lock();
	CUresult r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && !pctx) {
		r = CUDA_ERROR_INVALID_VALUE;
	} else if (r == CUDA_SUCCESS) {
		struct fake_tls *t = tls_get();
		*pctx = t->depth > 0 ? (CUcontext)t->stack[t->depth - 1] : NULL;
	}
	fake_unlock();
	return r;
}

/* A context argument that may be made current: known and not destroyed.
 * An inactive primary context is accepted (it may be current while
 * released; using it then fails). */
static CUresult ctx_arg_locked(CUcontext h, struct fake_ctx **out)
{
	struct fake_ctx *c = fake_ctx_lookup_locked(h);
	if (!c)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c->destroyed)
		return CUDA_ERROR_CONTEXT_IS_DESTROYED;
	*out = c;
	return CUDA_SUCCESS;
}

FAKE_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	FAKE_ENTER(cuCtxSetCurrent);
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_tls *t = tls_get();
	if (r == CUDA_SUCCESS && !ctx) {
		if (t->depth > 0)
			t->depth--;
	} else if (r == CUDA_SUCCESS) {
		struct fake_ctx *c;
		r = ctx_arg_locked(ctx, &c);
		if (r == CUDA_SUCCESS) {
			if (t->depth > 0)
				t->stack[t->depth - 1] = c;
			else
				r = push_locked(c);
		}
	}
	fake_unlock();
	return r;
}

static CUresult ctx_push(CUcontext ctx)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_ctx *c = NULL;
	if (r == CUDA_SUCCESS)
		r = ctx_arg_locked(ctx, &c);
	if (r == CUDA_SUCCESS)
		r = push_locked(c);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxPushCurrent(CUcontext ctx)
{
	FAKE_ENTER(cuCtxPushCurrent);
	return ctx_push(ctx);
}

FAKE_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	FAKE_ENTER(cuCtxPushCurrent_v2);
	return ctx_push(ctx);
}

static CUresult ctx_pop(CUcontext *pctx)
{
	fake_lock();
	CUresult r = fake_check_init_locked();
	struct fake_tls *t = tls_get();
	if (r == CUDA_SUCCESS && t->depth == 0) {
		r = CUDA_ERROR_INVALID_CONTEXT;
	} else if (r == CUDA_SUCCESS) {
		struct fake_ctx *c = t->stack[--t->depth];
		if (pctx)
			*pctx = (CUcontext)c;
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxPopCurrent(CUcontext *pctx)
{
	FAKE_ENTER(cuCtxPopCurrent);
	return ctx_pop(pctx);
}

FAKE_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	FAKE_ENTER(cuCtxPopCurrent_v2);
	return ctx_pop(pctx);
}

/* The context a *_v2 call names: NULL means the current one. */
static CUresult ctx_or_current_locked(CUcontext h, struct fake_ctx **out)
{
	if (!h)
		return fake_current_ctx_locked(out);
	CUresult r = fake_check_init_locked();
	if (r != CUDA_SUCCESS)
		return r;
	struct fake_ctx *c;
	r = ctx_arg_locked(h, &c);
	if (r == CUDA_SUCCESS && !c->alive)
		r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
	if (r == CUDA_SUCCESS)
		*out = c;
	return r;
}

FAKE_API CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId)
{
	FAKE_ENTER(cuCtxGetId);
	fake_lock();
	struct fake_ctx *c;
	CUresult r = ctx_or_current_locked(ctx, &c);
	if (r == CUDA_SUCCESS && !ctxId)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS)
		*ctxId = c->id;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxGetDevice(CUdevice *device)
{
	FAKE_ENTER(cuCtxGetDevice);
	fake_lock();
	struct fake_ctx *c;
	CUresult r = fake_current_ctx_locked(&c);
	/* A reset primary context left current still names its device
	 * (driver 580, H200: no error under compute-sanitizer's API check,
	 * RESULTS.md section 24). */
	if (r == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
		struct fake_tls *t = tls_get();
		c = t->stack[t->depth - 1];
		if (fake_device_valid(c->device) && g_fake.primary[c->device] == c)
			r = CUDA_SUCCESS;
	}
	if (r == CUDA_SUCCESS && !device)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS)
		*device = c->device;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
	FAKE_ENTER(cuCtxGetDevice_v2);
	fake_lock();
	struct fake_ctx *c;
	CUresult r = ctx_or_current_locked(ctx, &c);
	if (r == CUDA_SUCCESS && !device)
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS)
		*device = c->device;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxSynchronize(void)
{
	FAKE_ENTER(cuCtxSynchronize);
	fake_lock();
	struct fake_ctx *c;
	CUresult r = fake_current_ctx_locked(&c);
	if (r == CUDA_SUCCESS)
		r = fake_ctx_sync_locked(c);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxSynchronize_v2(CUcontext ctx)
{
	FAKE_ENTER(cuCtxSynchronize_v2);
	fake_lock();
	struct fake_ctx *c;
	CUresult r = ctx_or_current_locked(ctx, &c);
	if (r == CUDA_SUCCESS)
		r = fake_ctx_sync_locked(c);
	fake_unlock();
	return r;
}

FAKE_API CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
	FAKE_ENTER(cuCtxGetStreamPriorityRange);
	fake_lock();
	struct fake_ctx *c;
	CUresult r = fake_current_ctx_locked(&c);
	fake_unlock();
	if (r != CUDA_SUCCESS)
		return r;
	if (leastPriority)
		*leastPriority = 0;
	if (greatestPriority)
		*greatestPriority = -5;
	return CUDA_SUCCESS;
}

/* --- error names and strings --- */

#define FAKE_ERRORS(X)                                                                          \
	X(CUDA_SUCCESS, "no error")                                                             \
	X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                         \
	X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                            \
	X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                                   \
	X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                     \
	X(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled while using external profiling tool") \
	X(CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized: call cudaProfilerInitialize()") \
	X(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started")                      \
	X(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped")                      \
	X(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                             \
	X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "API call is not supported in the installed CUDA driver")            \
	X(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable")   \
	X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                           \
	X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                  \
	X(CUDA_ERROR_DEVICE_NOT_LICENSED, "device doesn't have valid Grid license")             \
	X(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid")                           \
	X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                 \
	X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")                        \
	X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                             \
	X(CUDA_ERROR_UNMAP_FAILED, "unmapping of buffer object failed")                         \
	X(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped")                                        \
	X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                                 \
	X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device") \
	X(CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired")                             \
	X(CUDA_ERROR_NOT_MAPPED, "resource not mapped")                                         \
	X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "resource not mapped as array")                       \
	X(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "resource not mapped as pointer")                   \
	X(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered")                  \
	X(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit is not supported on this architecture")          \
	X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "exclusive-thread device already in use by a different thread") \
	X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices") \
	X(CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed")                               \
	X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid OpenGL or DirectX context")             \
	X(CUDA_ERROR_NVLINK_UNCORRECTABLE, "uncorrectable NVLink error detected during the execution") \
	X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "PTX JIT compiler library not found")              \
	X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "the provided PTX was compiled with an unsupported toolchain.") \
	X(CUDA_ERROR_JIT_COMPILATION_DISABLED, "PTX JIT compilation was disabled")              \
	X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "the provided execution affinity is not supported") \
	X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "the provided PTX contains unsupported call to cudaDeviceSynchronize") \
	X(CUDA_ERROR_CONTAINED, "Invalid access of peer GPU memory over nvlink or a hardware error") \
	X(CUDA_ERROR_INVALID_SOURCE, "device kernel image is invalid")                          \
	X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                          \
	X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found")          \
	X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed")          \
	X(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS")  \
	X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                 \
	X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state")   \
	X(CUDA_ERROR_LOSSY_QUERY, "attempted introspection would be semantically lossy")        \
	X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                       \
	X(CUDA_ERROR_NOT_READY, "device not ready")                                             \
	X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")               \
	X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")        \
	X(CUDA_ERROR_LAUNCH_TIMEOUT, "the launch timed out and was terminated")                 \
	X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "launch uses incompatible texturing mode")   \
	X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled")             \
	X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled")               \
	X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process") \
	X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                              \
	X(CUDA_ERROR_ASSERT, "device-side assert triggered")                                    \
	X(CUDA_ERROR_TOO_MANY_PEERS, "peer mapping resources exhausted")                        \
	X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "part or all of the requested memory range is already mapped") \
	X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "pointer does not correspond to a registered memory region") \
	X(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error")                              \
	X(CUDA_ERROR_ILLEGAL_INSTRUCTION, "an illegal instruction was encountered")             \
	X(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")                                  \
	X(CUDA_ERROR_INVALID_ADDRESS_SPACE, "operation not supported on global/shared address space") \
	X(CUDA_ERROR_INVALID_PC, "invalid program counter")                                     \
	X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                               \
	X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "too many blocks in cooperative launch")     \
	X(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory not completely freed")                  \
	X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                  \
	X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                  \
	X(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized")                            \
	X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system has unsupported display driver / cuda driver combination") \
	X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "forward compatibility was attempted on non supported HW") \
	X(CUDA_ERROR_MPS_CONNECTION_FAILED, "MPS client failed to connect to the MPS control daemon or the MPS server") \
	X(CUDA_ERROR_MPS_RPC_FAILURE, "the remote procedural call between the MPS server and the MPS client failed") \
	X(CUDA_ERROR_MPS_SERVER_NOT_READY, "MPS server is not ready to accept new MPS client requests") \
	X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "the hardware resources required to create MPS client have been exhausted") \
	X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "the hardware resources required to support device connections have been exhausted") \
	X(CUDA_ERROR_MPS_CLIENT_TERMINATED, "the MPS client has been terminated by the server") \
	X(CUDA_ERROR_CDP_NOT_SUPPORTED, "is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not support it") \
	X(CUDA_ERROR_CDP_VERSION_MISMATCH, "unsupported interaction between different versions of CUDA Dynamic Parallelism") \
	X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
	X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture") \
	X(CUDA_ERROR_STREAM_CAPTURE_MERGE, "operation would result in a merge of separate capture sequences") \
	X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began") \
	X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work")             \
	X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "dependency created on uncaptured work in another stream") \
	X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "operation would make the legacy stream depend on a capturing blocking stream") \
	X(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a capturing stream") \
	X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "attempt to terminate a thread-local capture sequence from another thread") \
	X(CUDA_ERROR_TIMEOUT, "wait operation timed out")                                       \
	X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update") \
	X(CUDA_ERROR_EXTERNAL_DEVICE, "an async error has occured in external entity outside of CUDA") \
	X(CUDA_ERROR_INVALID_CLUSTER_SIZE, "a kernel launch error has occurred due to cluster misconfiguration") \
	X(CUDA_ERROR_FUNCTION_NOT_LOADED, "the function handle is not loaded when calling an API that requires a loaded function") \
	X(CUDA_ERROR_INVALID_RESOURCE_TYPE, "one or more resources passed in are not valid resource types for the operation") \
	X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "one or more resources are insufficient or non-applicable for the operation") \
	X(CUDA_ERROR_KEY_ROTATION, "an error happened during the key rotation sequence")                     \
	X(CUDA_ERROR_UNKNOWN, "unknown error")

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} error_table[] = {
#define FAKE_ERROR_ROW(code, text) {code, #code, text},
	FAKE_ERRORS(FAKE_ERROR_ROW)
#undef FAKE_ERROR_ROW
};

static int error_index(CUresult e)
{
	for (size_t i = 0; i < sizeof(error_table) / sizeof(error_table[0]); i++)
		if (error_table[i].code == e)
			return (int)i;
	return -1;
}

FAKE_API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	FAKE_ENTER(cuGetErrorName);
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	int i = error_index(error);
	*pStr = i < 0 ? NULL : error_table[i].name;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

FAKE_API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	FAKE_ENTER(cuGetErrorString);
	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	int i = error_index(error);
	*pStr = i < 0 ? NULL : error_table[i].text;
	return i < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* --- the pointer set --- */

#define SLOT_TOMB ((void *)1)

static size_t slot_of(const void *p, size_t cap)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
	return (size_t)(h >> 17) & (cap - 1);
}

static bool ptrset_grow(struct fake_ptrset *s)
{
	size_t ncap = s->cap ? s->cap * 2 : 64;
	if (s->used * 2 < s->cap)
		ncap = s->cap; /* mostly tombstones: rehash in place */
	void **slots = calloc(ncap, sizeof(void *));
	if (!slots)
		return false;
	for (size_t i = 0; i < s->cap; i++) {
		void *p = s->slots[i];
		if (p && p != SLOT_TOMB) {
			size_t j = slot_of(p, ncap);
			while (slots[j])
				j = (j + 1) & (ncap - 1);
			slots[j] = p;
		}
	}
	free(s->slots);
	s->slots = slots;
	s->cap = ncap;
	s->tombs = 0;
	return true;
}

bool fake_ptrset_add(struct fake_ptrset *s, void *p)
{
	if ((s->used + s->tombs + 1) * 4 >= s->cap * 3 && !ptrset_grow(s))
		return false;
	size_t i = slot_of(p, s->cap);
	while (s->slots[i] && s->slots[i] != SLOT_TOMB) {
		if (s->slots[i] == p)
			return true;
		i = (i + 1) & (s->cap - 1);
	}
	if (s->slots[i] == SLOT_TOMB)
		s->tombs--;
	s->slots[i] = p;
	s->used++;
	return true;
}

static void **ptrset_find(const struct fake_ptrset *s, const void *p)
{
	if (!s->cap || !p || p == SLOT_TOMB)
		return NULL;
	size_t i = slot_of(p, s->cap);
	while (s->slots[i]) {
		if (s->slots[i] == p)
			return &s->slots[i];
		i = (i + 1) & (s->cap - 1);
	}
	return NULL;
}

bool fake_ptrset_has(const struct fake_ptrset *s, const void *p)
{
	return ptrset_find(s, p) != NULL;
}

bool fake_ptrset_del(struct fake_ptrset *s, const void *p)
{
	void **slot = ptrset_find(s, p);
	if (!slot)
		return false;
	*slot = SLOT_TOMB;
	s->used--;
	s->tombs++;
	return true;
}

void *fake_ptrset_any(const struct fake_ptrset *s)
{
	for (size_t i = 0; i < s->cap; i++)
		if (s->slots[i] && s->slots[i] != SLOT_TOMB)
			return s->slots[i];
	return NULL;
}

void fake_ptrset_clear(struct fake_ptrset *s)
{
	free(s->slots);
	memset(s, 0, sizeof(*s));
}
