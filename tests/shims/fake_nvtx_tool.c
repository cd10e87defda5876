/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/fake_nvtx_tool.c - a stand-in for compute-sanitizer's NVTX
 * injection library: loaded through NVTX_INJECTION64_PATH like the real
 * one, it takes the memory extension's heap and region calls and keeps a
 * table of the live heaps and regions, which test_annotate reads through
 * fake_nvtx_* (found with dlopen(RTLD_NOLOAD) + dlsym). It checks what a
 * real tool would complain about: a region outside its heap, a heap or
 * region registered twice or unregistered when not live; each such misuse
 * is counted in fake_nvtx_errors. Like compute-sanitizer, it drops the
 * regions of a device's heaps when another device gains access to that
 * device's memory (the fake driver's cuCtxEnablePeerAccess calls
 * fake_nvtx_peer_access), so a later unregister of one is an error.
 *
 * FAKE_NVTX_SLOTS=none makes it fill no slot (a tool that ignores the
 * memory API). FAKE_NVTX_EXIT_HEAPS=N makes its destructor (after every
 * exit handler, where a real tool runs its leak check) end the process with
 * status 3 unless exactly N heaps and N regions are live then.
 */
#define NVTX_AS_SYSTEM_HEADER
#include <nvtx3/nvToolsExtMem.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX    4096

struct range {
	uintptr_t addr;
	size_t size;
	uintptr_t heap; /* a region's heap; a heap's device */
};

EXPORT int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t *info);
EXPORT unsigned long long fake_nvtx_count(int which);
EXPORT size_t fake_nvtx_region(uintptr_t addr);
EXPORT size_t fake_nvtx_heap(uintptr_t addr);
EXPORT void fake_nvtx_peer_access(int device);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct range heaps[MAX], regions[MAX];
static unsigned n_heaps, n_regions;
/* NVTX's core init loads and unloads this library once before the memory
 * extension loads it for good: only that copy checks at exit. */
static int attached;
static unsigned long long errors, heap_regs, heap_unregs, region_regs, region_unregs;

static int find(struct range *t, unsigned n, uintptr_t addr)
{
	for (unsigned i = 0; i < n; i++)
		if (t[i].addr == addr)
			return (int)i;
	return -1;
}

static void error(const char *what, uintptr_t addr)
{
	fprintf(stderr, "fake_nvtx_tool: %s %#lx\n", what, (unsigned long)addr);
	errors++;
}

/* Pinned host memory stays accepted: a host address is one malloc'd or
 * mmapped by the driver, which the process can read. */
static int refuse_host_ok(uintptr_t a)
{
	int (*attr)(void *, int, unsigned long long) =
	    (int (*)(void *, int, unsigned long long))dlsym(RTLD_DEFAULT, "cuPointerGetAttribute");
	unsigned int type = 0;

	return attr && attr(&type, 2 /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE */, a) == 0 && type == 1 /* HOST */;
}

/* The device of the memory at a, from the driver; -1 if it does not say. */
static int device_of(uintptr_t a)
{
	int (*attr)(void *, int, unsigned long long) =
	    (int (*)(void *, int, unsigned long long))dlsym(RTLD_DEFAULT, "cuPointerGetAttribute");
	int dev = -1;

	if (!attr || attr(&dev, 9 /* CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL */, a) != 0)
		return -1;
	return dev;
}

/* compute-sanitizer's handlers call the driver; during a global-mode
 * capture such a call fails unless the caller relaxed its thread's mode.
 * A "potentially unsafe" call stands for them (an error if refused). */
static void driver_call_allowed(uintptr_t a)
{
	int (*query)(void *) = (int (*)(void *))dlsym(RTLD_DEFAULT, "cuStreamQuery");
	int r = query ? query(NULL) : 0;

	if (r >= 900 && r <= 907)
		error("the tool's driver call refused (stream capture)", a);
}

static nvtxMemHeapHandle_t heap_register(nvtxDomainHandle_t d, nvtxMemHeapDesc_t const *desc)
{
	const nvtxMemVirtualRangeDesc_t *r = desc->typeSpecificDesc;
	uintptr_t a = (uintptr_t)r->ptr;

	(void)d;
	driver_call_allowed(a);
	int dev = device_of(a); /* as the real tool's handlers, outside its lock */
	pthread_mutex_lock(&lock);
	heap_regs++;
	/* FAKE_NVTX_REFUSE_DEVICE=1: refuse heaps whose first byte the
	 * driver calls device memory (compute-sanitizer refuses the vmm and
	 * async backends' segments), answering NULL as it does. */
	if (getenv("FAKE_NVTX_REFUSE_DEVICE") && !refuse_host_ok(a)) {
		pthread_mutex_unlock(&lock);
		return NULL;
	}
	if (desc->usage != NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR || desc->type != NVTX_MEM_TYPE_VIRTUAL_ADDRESS)
		error("heap of an unexpected kind", a);
	else if (find(heaps, n_heaps, a) >= 0)
		error("heap registered twice", a);
	else if (n_heaps < MAX)
		heaps[n_heaps++] = (struct range){a, r->size, (uintptr_t)(intptr_t)dev};
	pthread_mutex_unlock(&lock);
	return (nvtxMemHeapHandle_t)a;
}

static void heap_unregister(nvtxDomainHandle_t d, nvtxMemHeapHandle_t h)
{
	uintptr_t a = (uintptr_t)h;
	int i;

	(void)d;
	pthread_mutex_lock(&lock);
	heap_unregs++;
	i = find(heaps, n_heaps, a);
	if (i < 0) {
		error("unknown heap unregistered", a);
	} else {
		heaps[i] = heaps[--n_heaps];
		for (unsigned j = 0; j < n_regions;) /* its regions go with it */
			if (regions[j].heap == a)
				regions[j] = regions[--n_regions];
			else
				j++;
	}
	pthread_mutex_unlock(&lock);
}

/* Another device gained access to `device`'s memory: its heaps' regions
 * are dropped (the heaps stay). */
EXPORT void fake_nvtx_peer_access(int device)
{
	pthread_mutex_lock(&lock);
	for (unsigned j = 0; j < n_regions;) {
		int i = find(heaps, n_heaps, regions[j].heap);
		if (i >= 0 && (intptr_t)heaps[i].heap == device)
			regions[j] = regions[--n_regions];
		else
			j++;
	}
	pthread_mutex_unlock(&lock);
}

static void regions_register(nvtxDomainHandle_t d, nvtxMemRegionsRegisterBatch_t const *b)
{
	const nvtxMemVirtualRangeDesc_t *r = b->regionDescElements;

	(void)d;
	driver_call_allowed((uintptr_t)r[0].ptr);
	pthread_mutex_lock(&lock);
	for (size_t k = 0; k < b->regionCount; k++) {
		uintptr_t a = (uintptr_t)r[k].ptr, h = (uintptr_t)b->heap;
		int i = find(heaps, n_heaps, h);

		region_regs++;
		if (i < 0 || a < heaps[i].addr || a + r[k].size > heaps[i].addr + heaps[i].size)
			error("region outside its heap", a);
		else if (find(regions, n_regions, a) >= 0)
			error("region registered twice", a);
		else if (n_regions < MAX)
			regions[n_regions++] = (struct range){a, r[k].size, h};
	}
	pthread_mutex_unlock(&lock);
}

static void regions_unregister(nvtxDomainHandle_t d, nvtxMemRegionsUnregisterBatch_t const *b)
{
	(void)d;
	pthread_mutex_lock(&lock);
	for (size_t k = 0; k < b->refCount; k++) {
		uintptr_t a = (uintptr_t)b->refElements[k].pointer;
		int i = find(regions, n_regions, a);

		region_unregs++;
		if (i < 0)
			error("unknown region unregistered", a);
		else
			regions[i] = regions[--n_regions];
	}
	pthread_mutex_unlock(&lock);
}

EXPORT int InitializeInjectionNvtxExtension(nvtxExtModuleInfo_t *info)
{
	const char *slots = getenv("FAKE_NVTX_SLOTS");
	intptr_t *s;

	if (info->moduleId != NVTX_EXT_MODULEID_MEM || info->segmentsCount < 1)
		return 1;
	attached = 1;
	if (slots && strcmp(slots, "none") == 0)
		return 1;
	s = info->segments[0].functionSlots;
	s[NVTX3EXT_CBID_nvtxMemHeapRegister] = (intptr_t)heap_register;
	s[NVTX3EXT_CBID_nvtxMemHeapUnregister] = (intptr_t)heap_unregister;
	s[NVTX3EXT_CBID_nvtxMemRegionsRegister] = (intptr_t)regions_register;
	s[NVTX3EXT_CBID_nvtxMemRegionsUnregister] = (intptr_t)regions_unregister;
	return 1;
}

/* What the test reads. which: 0 live heaps, 1 live regions, 2 errors,
 * 3 heap registrations, 4 heap unregistrations, 5 region registrations,
 * 6 region unregistrations. */
EXPORT unsigned long long fake_nvtx_count(int which)
{
	unsigned long long v[] = {n_heaps, n_regions, errors, heap_regs, heap_unregs, region_regs, region_unregs};

	return which >= 0 && which < 7 ? v[which] : 0;
}

static size_t size_at(const struct range *t, const unsigned *n, uintptr_t addr)
{
	size_t size = 0;
	int i;

	pthread_mutex_lock(&lock);
	i = find((struct range *)t, *n, addr);
	if (i >= 0)
		size = t[i].size;
	pthread_mutex_unlock(&lock);
	return size;
}

/* The size of the live heap at addr, 0 if none. */
EXPORT size_t fake_nvtx_heap(uintptr_t addr)
{
	return size_at(heaps, &n_heaps, addr);
}

/* The size of the live region at addr, 0 if none. */
EXPORT size_t fake_nvtx_region(uintptr_t addr)
{
	return size_at(regions, &n_regions, addr);
}

__attribute__((destructor)) static void at_exit_check(void)
{
	const char *want = getenv("FAKE_NVTX_EXIT_HEAPS");

	if (!want || !attached)
		return;
	fprintf(stderr, "fake_nvtx_tool at exit: %u heaps, %u regions live, %llu errors\n", n_heaps, n_regions,
	        errors);
	if (n_heaps != (unsigned)atoi(want) || n_regions != (unsigned)atoi(want) || errors)
		_exit(3);
}
