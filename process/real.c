/* SPDX-License-Identifier: MIT */
/*
 * process/real.c - owns the way libemm reaches the real functions behind
 * its shims: glibc's dlsym (found with dlvsym, because our own exported dlsym
 * shadows it), the libcuda.so.1 handle, the driver's exports by exact name
 * (cached, no malloc), the typed table of hot driver functions, and the next
 * definition of a runtime function (shared libcudart's cudaMalloc), and the
 * typed table of the virtual-memory and explicit-pool calls (vmm.c).
 *
 * Every lookup here uses the real dlsym on an explicit handle or on
 * RTLD_NEXT evaluated from inside libemm, so it can never return one of
 * libemm's own shims. Nothing here takes a lock except the pthread_once of
 * the driver table; the caches are lock-free fixed tables.
 */
#include "process/process.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/compiler.h"
#include "common/log.h"

/* --- the real dlsym ----------------------------------------------------- */

/*
 * Read by the dlsym trampoline in resolve.c without a call (an aligned
 * pointer load is atomic on every target we build for); written once with
 * release order. NULL until first use. `used`: the trampoline's asm is its
 * only other reader, which link-time optimisation cannot see.
 */
__attribute__((used)) void *emm_real_dlsym_ptr;

/*
 * The versions glibc has given dlsym: 2.34 (dlsym moved into libc.so.6),
 * then the original version on each architecture (x86_64 2.2.5; aarch64,
 * ppc64le 2.17; i386 2.0; riscv64 2.27). dlvsym with an explicit version
 * never matches an unversioned dlsym of another interposer, so this finds
 * glibc's own even when several interposers are preloaded.
 */
static const char *const dlsym_versions[] = {
    "GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0", "GLIBC_2.27",
};

/*
 * Under a sanitizer this is the first libemm code to run: the runtime's
 * start-up (__interception::GetFuncAddr) calls dlsym(RTLD_NEXT, ...), which
 * is libemm's trampoline, before the runtime can serve instrumented code
 * (ASan's shadow is not mapped yet). So it carries no instrumentation and
 * touches nothing but emm_real_dlsym_ptr, dlsym_versions and dlvsym.
 * `used`: the trampoline calls it from asm, out of link-time optimisation's
 * sight.
 */
EMM_NO_SANITIZE __attribute__((used)) emm_dlsym_fn emm_real_dlsym_get(void)
{
	void *fn = __atomic_load_n(&emm_real_dlsym_ptr, __ATOMIC_ACQUIRE);

	if (EMM_LIKELY(fn != NULL))
		return (emm_dlsym_fn)fn;
	for (size_t i = 0; i < EMM_ARRAY_SIZE(dlsym_versions) && !fn; i++)
		fn = dlvsym(RTLD_NEXT, "dlsym", dlsym_versions[i]);
	if (!fn) {
		/* Without it no program that uses dlsym can run; say why. */
		emm_error(
		    "cannot find the C library's dlsym (dlvsym of dlsym failed for every known version)");
		abort();
	}
	/* Racing threads find the same function; any store wins. */
	__atomic_store_n(&emm_real_dlsym_ptr, fn, __ATOMIC_RELEASE);
	return (emm_dlsym_fn)fn;
}

void *emm_real_dlsym(void *handle, const char *name)
{
	/* Only libemm calls this, so RTLD_NEXT means "after libemm". */
	return emm_real_dlsym_get()(handle, name);
}

/* --- which library an address belongs to -------------------------------- */

static const char *path_basename(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

bool emm_real_is_driver_path(const char *path)
{
	const char *base;

	if (!path)
		return false;
	base = path_basename(path);
	return strncmp(base, "libcuda.so", 10) == 0 || strncmp(base, "libnvidia-", 10) == 0;
}

bool emm_real_is_driver_address(const void *addr)
{
	Dl_info info;

	if (!addr || !dladdr(addr, &info))
		return false;
	return emm_real_is_driver_path(info.dli_fname);
}

bool emm_real_is_driver_component_address(const void *addr)
{
	Dl_info info;

	if (!addr || !dladdr(addr, &info) || !info.dli_fname)
		return false;
	return emm_real_is_driver_path(info.dli_fname) ||
	       strncmp(path_basename(info.dli_fname), "libnvcuvid.so", 13) == 0;
}

static void *libemm_base;

bool emm_real_is_libemm_address(const void *addr)
{
	Dl_info info;
	void *base = __atomic_load_n(&libemm_base, __ATOMIC_ACQUIRE);

	if (!base) {
		if (!dladdr((const void *)&emm_real_is_libemm_address, &info))
			return false;
		base = info.dli_fbase;
		__atomic_store_n(&libemm_base, base, __ATOMIC_RELEASE);
	}
	if (!addr || !dladdr(addr, &info))
		return false;
	/* libemm itself, or a libemm backend (libemm-backend-*.so), which must
	 * reach the driver through driver_proc, never through our shims. */
	return info.dli_fbase == base ||
	       strncmp(path_basename(info.dli_fname ? info.dli_fname : ""), "libemm", 6) == 0;
}

/* --- lock-free name caches ---------------------------------------------- */

/*
 * Open addressing over a fixed array; a slot goes EMPTY -> WRITING -> READY
 * once and never changes after. Two threads may insert the same name into
 * two slots; both hold the same value, so that is harmless. Names longer
 * than the slot are simply not cached.
 */
#define NAME_CACHE_NAME_MAX 64
#define NAME_CACHE_PROBES   16

enum { SLOT_EMPTY, SLOT_WRITING, SLOT_READY };

struct name_cache_slot {
	unsigned state;
	void *value;
	char name[NAME_CACHE_NAME_MAX];
};

struct name_cache {
	unsigned mask;
	struct name_cache_slot *slots;
};

static uint32_t name_hash(const char *s)
{
	uint32_t h = 2166136261u; /* FNV-1a */

	while (*s)
		h = (h ^ (unsigned char)*s++) * 16777619u;
	return h;
}

static bool name_cache_get(const struct name_cache *c, const char *name, void **ret_value)
{
	uint32_t h = name_hash(name);

	for (unsigned i = 0; i < NAME_CACHE_PROBES; i++) {
		struct name_cache_slot *s = &c->slots[(h + i) & c->mask];
		unsigned state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);

		if (state == SLOT_EMPTY)
			return false;
		if (state == SLOT_READY && strcmp(s->name, name) == 0) {
			*ret_value = s->value;
			return true;
		}
	}
	return false;
}

static void name_cache_put(struct name_cache *c, const char *name, void *value)
{
	size_t len = strlen(name);
	uint32_t h;

	if (len >= NAME_CACHE_NAME_MAX)
		return;
	h = name_hash(name);
	for (unsigned i = 0; i < NAME_CACHE_PROBES; i++) {
		struct name_cache_slot *s = &c->slots[(h + i) & c->mask];
		unsigned expected = SLOT_EMPTY;

		if (__atomic_compare_exchange_n(&s->state, &expected, SLOT_WRITING, false, __ATOMIC_ACQUIRE,
		                                __ATOMIC_RELAXED)) {
			memcpy(s->name, name, len + 1);
			s->value = value;
			__atomic_store_n(&s->state, SLOT_READY, __ATOMIC_RELEASE);
			return;
		}
	}
}

static struct name_cache_slot driver_slots[512];
static struct name_cache driver_cache = {EMM_ARRAY_SIZE(driver_slots) - 1, driver_slots};
static struct name_cache_slot runtime_slots[64];
static struct name_cache runtime_cache = {EMM_ARRAY_SIZE(runtime_slots) - 1, runtime_slots};

/* --- the driver ---------------------------------------------------------- */

static void *libcuda_handle;

void *emm_real_libcuda_handle(void)
{
	void *h = __atomic_load_n(&libcuda_handle, __ATOMIC_ACQUIRE);
	void *expected = NULL;

	if (EMM_LIKELY(h != NULL))
		return h;
	/* The program's own copy first; load it only if nobody has (a CUDA
	 * entry point of ours was called, so the program is using CUDA). The
	 * reference is never dropped, so the handle stays valid even if the
	 * program dlcloses its own. A racing thread's extra reference is
	 * kept too (dlclose here could run destructors at a bad time). */
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h)
		return NULL;
	if (!__atomic_compare_exchange_n(&libcuda_handle, &expected, h, false, __ATOMIC_ACQ_REL,
	                                 __ATOMIC_ACQUIRE))
		h = expected;
	return h;
}

bool emm_real_is_driver_export(const void *fn, const char *exported_name)
{
	void *h = __atomic_load_n(&libcuda_handle, __ATOMIC_ACQUIRE);
	void *expected = NULL;

	if (!fn || !exported_name)
		return false;
	if (!h) {
		/* Never load the driver for this question. */
		h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
		if (!h)
			return false;
		__atomic_compare_exchange_n(&libcuda_handle, &expected, h, false, __ATOMIC_ACQ_REL,
		                            __ATOMIC_ACQUIRE);
	}
	return emm_real_driver(exported_name) == fn;
}

void *emm_real_driver(const char *exported_name)
{
	void *h, *fn;

	if (!exported_name)
		return NULL;
	if (name_cache_get(&driver_cache, exported_name, &fn))
		return fn;
	h = emm_real_libcuda_handle();
	if (!h)
		return NULL; /* no driver: not cached, a later call retries */
	/* An explicit handle searches libcuda and its dependencies only, so
	 * this is the driver's own export, never a libemm shim. A missing
	 * export is cached as NULL (the driver does not change). */
	fn = emm_real_dlsym(h, exported_name);
	name_cache_put(&driver_cache, exported_name, fn);
	return fn;
}

/* --- the typed driver table ---------------------------------------------- */

static struct emm_real_driver_table driver_table;
static const struct emm_real_driver_table *driver_table_ptr;
static pthread_once_t driver_table_once = PTHREAD_ONCE_INIT;

#define LOAD(member) (*(void **)&driver_table.member = emm_real_driver(#member))

static void driver_table_init(void)
{
	if (!emm_real_libcuda_handle())
		return;
	LOAD(cuInit);
	LOAD(cuGetProcAddress_v2);
	/* "cuGetProcAddress" is a macro for cuGetProcAddress_v2 in cuda.h:
	 * the 4-argument ABI is the bare exported name. */
	*(void **)&driver_table.cuGetProcAddress_v1 = emm_real_driver("cuGetProcAddress");
	LOAD(cuCtxGetCurrent);
	LOAD(cuCtxGetDevice);
	LOAD(cuCtxGetDevice_v2);
	LOAD(cuCtxSynchronize);
	LOAD(cuDevicePrimaryCtxGetState);
	LOAD(cuMemAlloc_v2);
	LOAD(cuMemFree_v2);
	LOAD(cuMemAllocPitch_v2);
	LOAD(cuMemAllocAsync);
	LOAD(cuMemAllocAsync_ptsz);
	LOAD(cuMemFreeAsync);
	LOAD(cuMemFreeAsync_ptsz);
	LOAD(cuMemAllocHost_v2);
	LOAD(cuMemHostAlloc);
	LOAD(cuMemFreeHost);
	LOAD(cuMemHostRegister_v2);
	LOAD(cuMemHostUnregister);
	LOAD(cuMemAllocManaged);
	LOAD(cuMemGetInfo_v2);
	LOAD(cuMemGetAddressRange_v2);
	LOAD(cuPointerGetAttribute);
	LOAD(cuPointerGetAttributes);
	LOAD(cuIpcGetMemHandle);
	LOAD(cuIpcOpenMemHandle_v2);
	LOAD(cuIpcCloseMemHandle);
	LOAD(cuStreamCreate);
	LOAD(cuStreamCreateWithPriority);
	LOAD(cuStreamDestroy_v2);
	LOAD(cuStreamGetFlags);
	LOAD(cuStreamWaitEvent);
	LOAD(cuStreamIsCapturing);
	LOAD(cuStreamQuery);
	LOAD(cuStreamBeginCapture_v2);
	LOAD(cuStreamEndCapture);
	LOAD(cuEventCreate);
	LOAD(cuEventRecord);
	LOAD(cuEventQuery);
	LOAD(cuEventSynchronize);
	LOAD(cuEventDestroy_v2);
	LOAD(cuCtxDestroy_v2);
	LOAD(cuDevicePrimaryCtxRelease_v2);
	LOAD(cuDevicePrimaryCtxReset_v2);
	__atomic_store_n(&driver_table_ptr, &driver_table, __ATOMIC_RELEASE);
}

#undef LOAD

const struct emm_real_driver_table *emm_real_driver_table(void)
{
	const struct emm_real_driver_table *t = __atomic_load_n(&driver_table_ptr, __ATOMIC_ACQUIRE);

	if (EMM_LIKELY(t != NULL))
		return t;
	pthread_once(&driver_table_once, driver_table_init);
	return __atomic_load_n(&driver_table_ptr, __ATOMIC_ACQUIRE);
}

/* --- the virtual-memory calls --------------------------------------------- */

static struct emm_real_vmm_table vmm_table;
static pthread_once_t vmm_table_once = PTHREAD_ONCE_INIT;

#define LOAD_VMM(member) (*(void **)&vmm_table.member = emm_real_driver(#member))

static void vmm_table_init(void)
{
	if (!emm_real_libcuda_handle())
		return;
	LOAD_VMM(cuMemCreate);
	LOAD_VMM(cuMemRelease);
	LOAD_VMM(cuMemAddressReserve);
	LOAD_VMM(cuMemAddressFree);
	LOAD_VMM(cuMemMap);
	LOAD_VMM(cuMemUnmap);
	LOAD_VMM(cuMemSetAccess);
	LOAD_VMM(cuMemGetAccess);
	LOAD_VMM(cuMemRetainAllocationHandle);
	LOAD_VMM(cuMemGetAllocationPropertiesFromHandle);
	LOAD_VMM(cuMemExportToShareableHandle);
	LOAD_VMM(cuMemImportFromShareableHandle);
	LOAD_VMM(cuMemPoolCreate);
	LOAD_VMM(cuMemPoolDestroy);
	LOAD_VMM(cuMemPoolGetAttribute);
	LOAD_VMM(cuMemPoolSetAttribute);
	LOAD_VMM(cuMemPoolTrimTo);
	LOAD_VMM(cuDeviceGetDefaultMemPool);
	LOAD_VMM(cuDeviceGetMemPool);
	LOAD_VMM(cuDeviceGetCount);
	LOAD_VMM(cuMemsetD8Async);
	/* cuda.h renames cuMemAllocFromPoolAsync for per-thread builds only;
	 * both exports are named explicitly. */
	*(void **)&vmm_table.alloc_from_pool = emm_real_driver("cuMemAllocFromPoolAsync");
	*(void **)&vmm_table.alloc_from_pool_ptsz = emm_real_driver("cuMemAllocFromPoolAsync_ptsz");
}

#undef LOAD_VMM

const struct emm_real_vmm_table *emm_real_vmm(void)
{
	/* Without a driver the table stays all NULL; the shims then answer
	 * CUDA_ERROR_NOT_INITIALIZED, as for every other call. */
	pthread_once(&vmm_table_once, vmm_table_init);
	return &vmm_table;
}

/* --- the runtime ---------------------------------------------------------- */

struct cudart_search {
	char path[512];
};

static int find_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
	struct cudart_search *search = data;
	const char *name = info->dlpi_name;

	(void)size;
	if (!name || !*name || strncmp(path_basename(name), "libcudart.so", 12) != 0)
		return 0;
	if (strlen(name) >= sizeof(search->path))
		return 0;
	strcpy(search->path, name);
	return 1;
}

/*
 * RTLD_NEXT only sees the objects loaded at start-up and those opened with
 * RTLD_GLOBAL. A libcudart that a dlopened library (PyTorch, under Python's
 * RTLD_LOCAL) brought in is outside that scope, yet that library's cudaMalloc
 * reference binds to libemm (global scope first). Fall back to the first
 * libcudart.so* mapped in the process.
 */
static void *runtime_from_loaded_cudart(const char *name)
{
	struct cudart_search search = {.path = ""};
	void *h, *fn;

	/* Copy the path out first: no dlopen under dl_iterate_phdr's lock. */
	if (!dl_iterate_phdr(find_cudart, &search) || !search.path[0])
		return NULL;
	h = dlopen(search.path, RTLD_NOW | RTLD_NOLOAD);
	if (!h)
		return NULL;
	fn = emm_real_dlsym(h, name);
	/* The handle keeps libcudart mapped while a cached pointer may be
	 * used; it is deliberately never closed. */
	if (fn && emm_real_is_libemm_address(fn))
		fn = NULL;
	return fn;
}

void *emm_real_runtime(const char *name)
{
	void *fn;

	if (!name)
		return NULL;
	if (name_cache_get(&runtime_cache, name, &fn))
		return fn;
	fn = emm_real_dlsym(RTLD_NEXT, name);
	if (!fn)
		fn = runtime_from_loaded_cudart(name);
	/* Only hits are cached: a libcudart may be dlopened later. */
	if (fn)
		name_cache_put(&runtime_cache, name, fn);
	return fn;
}
