/* SPDX-License-Identifier: MIT */
/*
 * process/annotate.h - telling a memory-checking tool (compute-sanitizer,
 * through the NVTX memory API) which parts of libemm's segments the program
 * owns: each segment (device or pinned host) a sub-allocator heap, each
 * block handed to the program a region in it. Private to process/;
 * annotate.c owns it.
 *
 * With no tool attached an annotation costs one load of st_annotate_on and
 * a not-taken branch: the calls below are inline and reach annotate.c only
 * when a tool injected itself. Call them with no lock held: a tool's
 * handler may be slow or call the driver.
 */
#ifndef EMM_PROCESS_ANNOTATE_H
#define EMM_PROCESS_ANNOTATE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/compiler.h"

#pragma GCC visibility push(hidden)

/* True once st_annotate_probe found a tool that handles the NVTX memory
 * calls; never set otherwise. */
extern atomic_bool st_annotate_on;
/* False until the first probe ran. */
extern atomic_bool st_annotate_probed;
/* A tool named itself to NVTX (NVTX_INJECTION64_PATH, which
 * compute-sanitizer sets) before libemm started: set once by
 * st_annotate_detect, before any context lookup. libemm then makes no
 * driver call it knows would fail (contexts.c), since the tool reports
 * every failed call as the program's error. */
extern bool st_tool_injected;
void st_annotate_detect(void);

/* Loads the NVTX memory extension (which loads the tool named by
 * NVTX_INJECTION64_PATH, if any) once, and sets st_annotate_on when a tool
 * took the heap and region calls. Call after a CUDA context exists (the
 * tool requires it) and with no lock held. */
void st_annotate_probe(void);

/* The probe, once, at the first point a context surely exists (a segment,
 * a VMM buffer going idle). */
static inline void st_annotate_ensure_probed(void)
{
	if (EMM_UNLIKELY(!atomic_load_explicit(&st_annotate_probed, memory_order_acquire)))
		st_annotate_probe();
}

void st_annotate_heap_slow(uint64_t addr, size_t size, bool add, int device);
/* The regions registered and not yet unregistered (annotate_regions.c):
 * note one of `device` before registering it (false without memory: then
 * it is not registered), forget one before unregistering it (false:
 * libemm never registered it, so no call), forget a gone heap's, forget a
 * device's (the count) once peer access to it may be on, and start empty
 * in a fork child. */
bool st_region_note(uint64_t addr, int device);
bool st_region_forget(uint64_t addr);
void st_region_forget_range(uint64_t base, size_t size);
size_t st_regions_forget_device(int device);
void st_regions_fork_child(void);
void st_annotate_block_slow(uint64_t addr, bool add, bool pinned);
/* The part [addr+old_size, addr+new_size) a segment of `device` grew by (a
 * heap of its own: the tool's heaps do not grow); the segment's free
 * unregisters it. */
void st_annotate_heap_grow(uint64_t addr, size_t old_size, size_t new_size, int device);
/* Device `device`'s new segments are no longer annotated (peer access is
 * possible, annotate_peer.c): true for the call that turned it off. */
bool st_annotate_set_device_off(int device);
bool st_annotate_device_off(int device);
/* A segment of `device` is being annotated: a second device turns every
 * device's new segments' annotations off (annotate_peer.c). */
void st_annotate_device_used(int device);

/* The segments of heaps whose context is gone (the driver freed their
 * memory with it): collected by st_annotate_collect under the teardown's
 * locks (a walk, no NVTX call), unregistered by st_annotate_gone after
 * (which frees the list), so that the tool takes the addresses again when
 * the driver reuses them. */
struct gone_segment {
	uint64_t base;
	size_t size;
	int device; /* -2: pinned host */
};
struct emm_heap;
size_t st_annotate_collect(struct emm_heap *const *heaps, size_t n, struct gone_segment **ret);
void st_annotate_gone(struct gone_segment *segs, size_t n);

/* At exit, with a tool attached only (a debugging run): idle segments go
 * back to the backend before the tool's leak check, so that
 * `compute-sanitizer --leak-check full` lists the program's unfreed blocks,
 * not libemm's cache. The first exit handler of libemm runs before any
 * runtime's teardown (state.c), so the driver is still there. */
void st_annotate_exit(void);

/* A segment [addr, addr+size) of `device` (-2: pinned host) came from the
 * backend (add) or is going back to it. */
static inline void st_annotate_heap(uint64_t addr, size_t size, bool add, int device)
{
	if (EMM_UNLIKELY(atomic_load_explicit(&st_annotate_on, memory_order_relaxed)))
		st_annotate_heap_slow(addr, size, add, device);
}

/* The block starting at addr, live in a heap, was handed to the program
 * (add: after the heap's alloc, as a region of the size the program asked
 * for) or is being freed by it (before the heap's free, so that no new
 * owner's region is registered first). `pinned`: the space the call names
 * (pinned host or device); a block of the other space is left alone, as
 * the free that names the wrong space is refused. */
static inline void st_annotate_block(uint64_t addr, bool add, bool pinned)
{
	if (EMM_UNLIKELY(atomic_load_explicit(&st_annotate_on, memory_order_relaxed)))
		st_annotate_block_slow(addr, add, pinned);
}

#pragma GCC visibility pop

#endif
