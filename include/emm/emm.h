/* SPDX-License-Identifier: MIT */
/*
 * libemm's public query API: the few functions libemm exports besides the
 * CUDA entry points it replaces. A program (or a test, or Python through
 * ctypes.CDLL(None)) finds them with dlsym(RTLD_DEFAULT, ...) when libemm is
 * preloaded, so nothing needs to link against libemm.
 *
 * Structs handed out begin with struct_size, which the caller fills in; libemm
 * writes at most that many bytes, so old callers keep working when fields are
 * appended.
 */
#ifndef EMM_H
#define EMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EMM_STATS_VERSION 3

/* One scope's counters (a device, or the whole process with device -1). */
struct emm_stats {
	uint32_t struct_size;	/* in: sizeof(struct emm_stats) of the caller */
	uint32_t version;	/* out: EMM_STATS_VERSION */

	/* requests */
	uint64_t allocs;		/* allocations served by the pool */
	uint64_t frees;			/* frees of pool blocks */
	uint64_t hits;			/* allocations served from cached blocks */
	uint64_t misses;		/* allocations that needed a new segment */
	uint64_t passthrough_allocs;	/* allocations forwarded to the driver unchanged */
	uint64_t passthrough_frees;	/* frees forwarded to the driver unchanged */
	uint64_t bad_frees;		/* double, interior or unknown frees refused */

	/* backend traffic */
	uint64_t backend_allocs;	/* segments obtained from the backend */
	uint64_t backend_frees;		/* segments returned to the backend */
	uint64_t oom_retries;		/* backend failures retried after releasing cache */
	uint64_t ooms;			/* allocations that failed after the retry */

	/* block surgery */
	uint64_t splits;
	uint64_t merges;

	/* fences */
	uint64_t events_recorded;	/* completion markers recorded by libemm */
	uint64_t event_queries;
	uint64_t stream_waits;		/* GPU-side waits inserted (no host wait) */
	uint64_t host_waits;		/* host blocked on a fence */
	uint64_t epochs_closed;

	/* bytes: current, peak, and total ever */
	uint64_t allocated_bytes;	/* handed to the program (rounded) */
	uint64_t allocated_bytes_peak;
	uint64_t allocated_bytes_total;
	uint64_t requested_bytes;	/* what the program asked for */
	uint64_t requested_bytes_peak;
	uint64_t requested_bytes_total;
	uint64_t reserved_bytes;	/* held from the backend (mapped bytes only) */
	uint64_t reserved_bytes_peak;
	uint64_t reserved_bytes_total;
	uint64_t pending_bytes;		/* freed, waiting for a fence */
	uint64_t segments;		/* live segments */
	uint64_t live_blocks;		/* blocks the program holds */

	/* version 2: page-granular backends (vmm) */
	uint64_t page_unmaps;		/* backend calls releasing the pages under free blocks */
	uint64_t page_maps;		/* backend calls backing such pages again */
	uint64_t unmapped_bytes_total;	/* bytes given back that way */
	uint64_t remapped_bytes_total;	/* bytes backed again */
	uint64_t unmapped_bytes;	/* segment address space with no memory behind it now */
	uint64_t segment_grows;		/* segments extended in place */
	uint64_t grown_bytes_total;	/* bytes they grew by */

	/* version 3: the VMM calls (cuMemCreate, cuMemMap, ...) and explicit pools */
	uint64_t vmm_allocs;		/* cuMemCreate handles given to the program */
	uint64_t vmm_hits;		/* ... of which from the VMM cache (no driver call) */
	uint64_t vmm_misses;		/* ... of which made by the driver */
	uint64_t vmm_frees;		/* cuMemRelease of the program's handles */
	uint64_t vmm_hit_bytes_total;	/* bytes served from the VMM cache */
	uint64_t vmm_idle_bytes;	/* freed VMM buffers kept mapped for reuse, now */
	uint64_t vmm_materializations;	/* deferred VMM frees made real for the program */
	uint64_t vmm_idle_released;	/* idle VMM buffers given back to the driver */
	uint64_t pool_allocs;		/* cuMemAllocFromPoolAsync, cudaMallocFromPoolAsync (driver) */
	uint64_t pool_creates;		/* cuMemPoolCreate */
	uint64_t pool_destroys;		/* cuMemPoolDestroy */
};

/* libemm's version string, e.g. "0.1.0". */
const char *emm_version_string(void);

/*
 * Fill *out with the counters of device `device` (its CUDA ordinal; pinned
 * host memory counts as device -2), or of the whole process when device is
 * -1. Returns 0, or a negative errno: -EINVAL for a NULL out or a struct_size
 * smaller than the first two fields.
 */
int emm_stats_get(int device, struct emm_stats *out);

/*
 * Return idle cached memory to the backend (after its fences complete), down
 * to keep_bytes per heap. Returns the number of bytes released (>= 0) or a
 * negative errno.
 */
long long emm_release_idle(int device, size_t keep_bytes);

#ifdef __cplusplus
}
#endif

#endif
