/* SPDX-License-Identifier: MIT */
/*
 * process/annotate.c - the NVTX memory annotations that let a memory
 * checker see through libemm's cache: every segment, device or pinned
 * host, is registered as a sub-allocator heap
 * (NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR) while libemm holds it, every
 * block as a region while the program owns it, so that compute-sanitizer's
 * memcheck reports an access past a block's end or into a freed (cached)
 * block as it would without libemm.
 *
 * How the header-only NVTX finds a tool: nvToolsExtMem.h defines each call
 * (static inline) over a hidden weak table of function slots, all 0
 * (NVTX_EXTENSION_FRESH) at load. The first call runs the extension's init
 * once: it reads NVTX_INJECTION64_PATH (compute-sanitizer sets it), dlopens
 * that library and lets its InitializeInjectionNvtxExtension fill the slots
 * it handles; every slot left empty, and all of them when no tool is
 * there, becomes NVTX_EXTENSION_DISABLED. After that a call with no tool is
 * a load, a compare and a return, but the caller still builds its
 * descriptor and makes the call. libemm probes once (st_annotate_probe, at
 * its first segment, when a context exists as the tool requires) and
 * keeps one flag, st_annotate_on, so that without a tool an annotation is a
 * load and a branch (annotate.h) and no NVTX code runs on the cached pair.
 *
 * At exit (st_annotate_exit) idle segments go back, with a tool attached
 * only, so that a leak check lists the program's own blocks.
 *
 * Segments that grow in place (EMM_BACKEND=vmm) get one heap per grown
 * piece, remembered here so that the segment's free unregisters them all;
 * a block is a region of the heap holding its start (one that straddles a
 * grown piece's boundary is a region past its heap's end, which a tool may
 * refuse). Pinned host segments and blocks are annotated like device
 * ones: nvToolsExtMem.h names cudaHostAlloc and cudaMallocHost among the
 * allocations a heap of NVTX_MEM_TYPE_VIRTUAL_ADDRESS describes (UVA: a
 * kernel reaches pinned memory at its host address), so memcheck checks a
 * kernel's access to a pinned block against its region.
 * Each kind of heap (device segments, pinned host segments) is offered to
 * the tool until it refuses one: compute-sanitizer (CUDA 13.0) refuses
 * every heap of the vmm and async backends, and each refusal is a warning
 * in its error count, so after the first the kind is left alone. Freed VMM
 * buffers are not annotated at all: the tool takes no VMM range as a heap
 * (probe-nvtx-heaps), so under a memory checker the VMM cache is off and
 * each free reaches the driver (vmm_idle.c). The tool does not see a
 * kernel's access to a region of another device's heap (probe-nvtx-peer:
 * every peer read is reported), so once peer access to a device is
 * enabled, or a second device has segments, new segments are not offered
 * as heaps (annotate_peer.c). The heaps of a context that is gone leave
 * the tool with it (st_annotate_gone): the driver freed their memory, and
 * the tool refuses a heap at an address it still holds once the driver
 * reuses it. EMM_ANNOTATE=off: no annotation (st_annotate_on stays false).
 * No NVTX call is made under a lock: a tool's handler may call the driver.
 * For the same reason each is made in relaxed capture mode (as a segment's
 * backend calls are, capture.c): during a global-mode capture the tool's
 * own driver calls would fail, and a block served then would be left out
 * of its books (every access to it reported as out of bounds).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "allocator/heap.h"
#include "allocator/heap_walk.h"
#include "common/log.h"
#include "process/annotate.h"
#include "process/process_internal.h"
#include "process/process.h"

/* NVTX finds the tool's entry point with dlsym: the C library's, not
 * libemm's exported one (interpose/resolve.c). */
#define dlsym(handle, name) emm_real_dlsym((handle), (name))
#define NVTX_AS_SYSTEM_HEADER
#include <nvtx3/nvToolsExtMem.h>

atomic_bool st_annotate_on;
atomic_bool st_annotate_probed;
bool st_tool_injected;

void st_annotate_detect(void)
{
	const char *path = getenv("NVTX_INJECTION64_PATH");

	st_tool_injected = path && *path;
}

#define SLOT(name) (NVTX_EXT_MEM_VERSIONED_ID(nvtxExtMemSlots)[NVTX3EXT_CBID_##name + 1])

static bool slot_live(intptr_t slot)
{
	return slot != NVTX_EXTENSION_DISABLED && slot != NVTX_EXTENSION_FRESH;
}

void st_annotate_probe(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	/* A tool whose initialisation allocates through libemm comes back
	 * here on the same thread: it gets no annotation rather than a
	 * deadlock in pthread_once. */
	static _Thread_local bool in_probe;
	void (*init)(void) = NVTX_EXT_MEM_VERSIONED_ID(nvtxExtMemInitOnce);

	if (in_probe)
		return;
	in_probe = true;
	(void)pthread_once(&once, init);
	in_probe = false;
	if (!st_opts->annotate)
		emm_debug("a memory checker may be attached: EMM_ANNOTATE=off, no annotation");
	else if (slot_live(SLOT(nvtxMemHeapRegister)) && slot_live(SLOT(nvtxMemHeapUnregister)) &&
	    slot_live(SLOT(nvtxMemRegionsRegister)) && slot_live(SLOT(nvtxMemRegionsUnregister))) {
		if (!atomic_exchange(&st_annotate_on, true))
			emm_debug("a memory checker is attached (NVTX): segments and blocks are annotated");
	}
	atomic_store_explicit(&st_annotate_probed, true, memory_order_release);
}

/* --- grown pieces of a segment ---------------------------------------- */

#define MAX_PIECES 256

static pthread_mutex_t pieces_lock = PTHREAD_MUTEX_INITIALIZER;
static struct piece {
	uint64_t addr;
	size_t size;
} pieces[MAX_PIECES];
static unsigned n_pieces;

static bool piece_add(uint64_t addr, size_t size)
{
	bool ok = false;

	pthread_mutex_lock(&pieces_lock);
	if (n_pieces < MAX_PIECES) {
		pieces[n_pieces++] = (struct piece){addr, size};
		ok = true;
	}
	pthread_mutex_unlock(&pieces_lock);
	return ok;
}

/* Takes the first piece inside [addr, addr+size) out of the table. */
static bool piece_take(uint64_t addr, size_t size, uint64_t *ret_addr)
{
	bool found = false;

	pthread_mutex_lock(&pieces_lock);
	for (unsigned i = 0; i < n_pieces; i++) {
		if (pieces[i].addr >= addr && pieces[i].addr < addr + size) {
			*ret_addr = pieces[i].addr;
			pieces[i] = pieces[--n_pieces];
			found = true;
			break;
		}
	}
	pthread_mutex_unlock(&pieces_lock);
	return found;
}

/* --- the calls --------------------------------------------------------- */

/* --- heaps not registered ---------------------------------------------- */

/* compute-sanitizer (CUDA 13.0) refuses heaps over the vmm backend's mapped
 * ranges and the async backend's pool memory ("parameters invalid"): their
 * blocks get no regions (each would be refused too), and the tool sees
 * them as the backend's plain memory. The segments of a device turned off
 * (annotate_peer.c) are listed here too. */
static uint64_t *refused;
static unsigned n_refused, cap_refused;

static bool refused_has(uint64_t heap, bool take)
{
	bool found = false;

	pthread_mutex_lock(&pieces_lock);
	for (unsigned i = 0; i < n_refused; i++)
		if (refused[i] == heap) {
			if (take)
				refused[i] = refused[--n_refused];
			found = true;
			break;
		}
	pthread_mutex_unlock(&pieces_lock);
	return found;
}

/* --- kinds of heap the tool takes, devices left alone ------------------- */

enum { KIND_UNKNOWN, KIND_TAKEN, KIND_REFUSED };
/* [0] device segments, [1] pinned host segments (device -2) */
static atomic_int kind_state[2];
/* Devices (ordinal < 64) whose heaps are no longer annotated (peer access). */
static atomic_uint_fast64_t devices_off;

static atomic_int *kind_of(int device)
{
	return &kind_state[device == -2];
}

bool st_annotate_device_off(int device)
{
	return device >= 0 && device < 64 &&
	       (atomic_load_explicit(&devices_off, memory_order_relaxed) >> device & 1);
}

bool st_annotate_set_device_off(int device)
{
	uint_fast64_t bit = (uint_fast64_t)1 << device;

	return device >= 0 && device < 64 && !(atomic_fetch_or(&devices_off, bit) & bit);
}

/* Whether heaps of `device`'s kind (-2: pinned host) are offered to the
 * tool (a device turned off still has heaps from before: not checked here). */
static bool kind_taken(int device)
{
	return atomic_load_explicit(kind_of(device), memory_order_relaxed) != KIND_REFUSED;
}

/* A heap not registered (refused, or of a device turned off): its blocks
 * get no region call and its free no unregister. */
static void remember_unregistered(uint64_t addr)
{
	pthread_mutex_lock(&pieces_lock);
	if (n_refused == cap_refused) {
		unsigned cap = cap_refused ? 2 * cap_refused : 64;
		uint64_t *r = realloc(refused, cap * sizeof(*r));
		if (r) {
			refused = r;
			cap_refused = cap;
		}
	}
	if (n_refused < cap_refused)
		refused[n_refused++] = addr;
	pthread_mutex_unlock(&pieces_lock);
}

static void heap_register(uint64_t addr, size_t size, int device)
{
	nvtxMemVirtualRangeDesc_t range = {.size = size, .ptr = (const void *)(uintptr_t)addr};
	nvtxMemHeapDesc_t desc = {
	    .extCompatID = NVTX_EXT_COMPATID_MEM,
	    .structSize = sizeof(desc),
	    .usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR,
	    .type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS,
	    .typeSpecificDescSize = sizeof(range),
	    .typeSpecificDesc = &range,
	};

	static atomic_bool warned;

	if (st_annotate_device_off(device)) {
		emm_debug("annotations: segment %#llx (%zu bytes), device %d: not offered (device off)",
		          (unsigned long long)addr, size, device);
		remember_unregistered(addr);
		return;
	}
	int mode = st_capture_relax(); /* see the top of this file */
	nvtxMemHeapHandle_t h = nvtxMemHeapRegister(NULL, &desc);

	st_capture_unrelax(mode);

	/* A heap of virtual addresses is named by its address (the header's
	 * contract); the unregister and the regions rely on it. */
	int unknown = KIND_UNKNOWN;
	if (h == (nvtxMemHeapHandle_t)(uintptr_t)addr) {
		emm_debug("annotations: heap + %#llx (%zu bytes), device %d", (unsigned long long)addr, size, device);
		atomic_compare_exchange_strong(kind_of(device), &unknown, KIND_TAKEN);
		return;
	}
	/* The first of its kind refused: none of that kind is tried again
	 * (and none was taken, so no unregister is owed). A refusal after
	 * the kind was taken is remembered by address. */
	if (!atomic_compare_exchange_strong(kind_of(device), &unknown, KIND_REFUSED))
		remember_unregistered(addr);
	if (!atomic_exchange(&warned, true))
		emm_warn("annotations: the memory checker refused segment %#llx (%zu bytes) as a heap (it answered %p): "
		         "the %s backend's blocks are not annotated, so it cannot see errors inside them; "
		         "EMM_BACKEND=driver annotates every device block",
		         (unsigned long long)addr, size, (void *)h, emm_state_backend_name());
}

static void heap_unregister(uint64_t addr)
{
	/* A heap of virtual addresses is named by its address. */
	if (!refused_has(addr, true)) {
		int mode = st_capture_relax();

		emm_debug("annotations: heap - %#llx", (unsigned long long)addr);
		nvtxMemHeapUnregister(NULL, (nvtxMemHeapHandle_t)(uintptr_t)addr);
		st_capture_unrelax(mode);
	}
}

void st_annotate_heap_slow(uint64_t addr, size_t size, bool add, int device)
{
	uint64_t piece;

	if (add)
		st_annotate_device_used(device);
	if (!kind_taken(device))
		return;
	if (add) {
		heap_register(addr, size, device);
		return;
	}
	while (piece_take(addr, size, &piece))
		heap_unregister(piece);
	heap_unregister(addr);
	st_region_forget_range(addr, size); /* the tool dropped the heap's regions */
}

/* The grown part [addr+old_size, addr+new_size) of a segment: a heap of its
 * own (the tool's heaps cannot grow). */
void st_annotate_heap_grow(uint64_t addr, size_t old_size, size_t new_size, int device)
{
	if (!atomic_load_explicit(&st_annotate_on, memory_order_relaxed) || new_size <= old_size ||
	    !kind_taken(device))
		return;
	if (!piece_add(addr + old_size, new_size - old_size)) {
		emm_warn("annotations: more than %u grown segment pieces; the rest go unannotated", MAX_PIECES);
		return;
	}
	heap_register(addr + old_size, new_size - old_size, device);
}

/* The heap a block lies in: its segment, or the grown piece holding it. */
static uint64_t heap_of(uint64_t addr, uint64_t base)
{
	pthread_mutex_lock(&pieces_lock);
	for (unsigned i = 0; i < n_pieces; i++)
		if (addr >= pieces[i].addr && addr < pieces[i].addr + pieces[i].size && pieces[i].addr > base)
			base = pieces[i].addr;
	pthread_mutex_unlock(&pieces_lock);
	return base;
}

void st_annotate_block_slow(uint64_t addr, bool add, bool pinned)
{
	struct emm_block_range b;

	/* Only the start of a live block of the space the call names: a bad
	 * free (or a cuMemFreeHost of a device block) is the driver's error,
	 * not an unregister of a region the tool never saw or still needs. */
	if (emm_heap_find_block(addr, &b) != 0 || b.base != addr || emm_state_heap_is_pinned(b.heap) != pinned ||
	    !kind_taken(emm_heap_device(b.heap)))
		return;
	uint64_t heap = heap_of(addr, b.segment_base);

	if (refused_has(heap, false))
		return; /* the tool refused its heap: it would refuse the region */
	if (EMM_UNLIKELY(emm_log_debug_enabled()))
		emm_debug("annotations: region %s %#llx (%zu bytes) in heap %#llx, device %d", add ? "+" : "-",
		          (unsigned long long)addr, b.requested ? b.requested : b.size, (unsigned long long)heap,
		          emm_heap_device(b.heap));
	/* Only what libemm registered is unregistered (annotate_regions.c). */
	if (add ? !st_region_note(addr, emm_heap_device(b.heap)) : !st_region_forget(addr)) {
		emm_debug("annotations: region %s %#llx: %s", add ? "+" : "-", (unsigned long long)addr,
		          add ? "no memory to remember it: not registered" : "never registered: no call");
		return;
	}
	int mode = st_capture_relax();
	if (add) {
		size_t size = b.requested ? b.requested : b.size;
		nvtxMemVirtualRangeDesc_t range = {.size = size, .ptr = (const void *)(uintptr_t)addr};
		nvtxMemRegionsRegisterBatch_t batch = {
		    .extCompatID = NVTX_EXT_COMPATID_MEM,
		    .structSize = sizeof(batch),
		    .regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS,
		    .heap = (nvtxMemHeapHandle_t)(uintptr_t)heap,
		    .regionCount = 1,
		    .regionDescElementSize = sizeof(range),
		    .regionDescElements = &range,
		};
		nvtxMemRegionsRegister(NULL, &batch);
	} else {
		nvtxMemRegionRef_t ref = {.pointer = (const void *)(uintptr_t)addr};
		nvtxMemRegionsUnregisterBatch_t batch = {
		    .extCompatID = NVTX_EXT_COMPATID_MEM,
		    .structSize = sizeof(batch),
		    .refType = NVTX_MEM_REGION_REF_TYPE_POINTER,
		    .refCount = 1,
		    .refElementSize = sizeof(ref),
		    .refElements = &ref,
		};
		nvtxMemRegionsUnregister(NULL, &batch);
	}
	st_capture_unrelax(mode);
}

/* --- heaps of a context that is gone ------------------------------------ */

struct seg_list {
	struct gone_segment *v;
	size_t n, cap;
	int device;
};

static int collect(void *arg, const struct emm_walk_segment *s)
{
	struct seg_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 16;
		struct gone_segment *v = realloc(l->v, cap * sizeof(*v));
		if (!v)
			return -1; /* the rest stay registered */
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = (struct gone_segment){s->base, s->size, l->device};
	return 0;
}

static int skip_block(void *arg, const struct emm_walk_block *b)
{
	(void)arg;
	(void)b;
	return 0;
}

size_t st_annotate_collect(emm_heap_t *const *heaps, size_t n, struct gone_segment **ret)
{
	struct seg_list l = {NULL, 0, 0, 0};

	*ret = NULL;
	if (!atomic_load_explicit(&st_annotate_on, memory_order_relaxed))
		return 0;
	for (size_t i = 0; i < n; i++) {
		l.device = emm_heap_device(heaps[i]);
		(void)emm_heap_walk(heaps[i], collect, skip_block, &l);
	}
	*ret = l.v;
	return l.n;
}

void st_annotate_gone(struct gone_segment *segs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		st_annotate_heap_slow(segs[i].base, segs[i].size, false, segs[i].device);
	free(segs);
}

void st_annotate_exit(void)
{
	static atomic_bool done;
	long long released = 0;

	if (!atomic_load_explicit(&st_annotate_on, memory_order_relaxed) || atomic_exchange(&done, true) ||
	    emm_state_exiting())
		return;
	(void)emm_state_release_idle(-1, 0, &released);
	emm_debug("annotations: %lld idle bytes given back before the tool's leak check", released);
}
