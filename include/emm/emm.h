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

#define EMM_STATS_VERSION 5

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

	/* version 4: calls that reached the driver without libemm serving them
	 * (process-wide: device -1 only; 0 in a device's row). _calls counts
	 * successful calls, _bytes what they asked for where the arguments say
	 * (arrays: width x height x depth x channels x element size of the
	 * descriptor, every mipmap level; the driver may round up). */
	uint64_t passby_array_calls;		/* cuArrayCreate, cuArray3DCreate, cuMipmappedArrayCreate */
	uint64_t passby_array_bytes;
	uint64_t passby_graph_mem_calls;	/* graph memory-allocation nodes added */
	uint64_t passby_graph_mem_bytes;
	uint64_t passby_managed_calls;		/* cuMemAllocManaged */
	uint64_t passby_managed_bytes;
	uint64_t passby_host_register_calls;	/* cuMemHostRegister */
	uint64_t passby_host_register_bytes;
	uint64_t passby_vmm_calls;		/* cuMemCreate made by the driver */
	uint64_t passby_vmm_bytes;
	uint64_t passby_pool_calls;		/* allocations from explicit pools */
	uint64_t passby_pool_bytes;
	uint64_t passby_capture_calls;		/* stream-ordered allocations during a capture */
	uint64_t passby_capture_bytes;
	uint64_t passby_unknown_free_calls;	/* frees of pointers libemm did not hand out */
	uint64_t passby_unknown_free_bytes;	/* always 0: the size is the driver's */
	/* version 4 too: the true allocated/requested peak lies in [peak - error, peak]: 0
	 * means exact. A heap with several arenas (several threads) keeps
	 * heap-wide peaks from per-arena deltas (no shared counter on the hot
	 * path); the bound is what those allow. Row "all" adds the devices'. */
	uint64_t allocated_bytes_peak_error;
	uint64_t requested_bytes_peak_error;

	/* version 5: frees of memory a driver component (libnvcuvid: NVDEC,
	 * nvJPEG's hardware path; the driver's own libraries) obtained inside
	 * the driver, where libemm cannot serve it, and freed through
	 * cuMemFree_v2, cuMemFreeAsync or cuMemFreeHost (process-wide, as the
	 * version 4 fields). Not in passby_unknown_free_calls. */
	uint64_t passby_driver_calls;
	uint64_t passby_driver_bytes;		/* the driver's sizes of those allocations */
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

/*
 * === Allocation without LD_PRELOAD ===========================================
 *
 * The door for frameworks that load libemm with dlopen (Python's ctypes):
 * PyTorch's CUDAPluggableAllocator, Numba's external memory manager, CuPy's
 * allocator hook. Loaded that way libemm intercepts nothing: it finds the
 * driver itself (libcuda.so.1) and serves only these calls. When it is also
 * preloaded (the same file), both doors share one heap and one set of
 * statistics.
 *
 * `device` is a CUDA device ordinal: the call runs in the context current
 * on the calling thread if it is on that device, else in the device's
 * primary context (retained once; the driver is initialised if nobody did).
 * A negative device means the current context (device 0's primary one when
 * none is current).
 *
 * `stream` is a CUstream or cudaStream_t (NULL: the legacy default stream).
 * A block freed on a stream is reusable at once on that stream and on
 * another only behind an event recorded on it, as with cuMemFreeAsync;
 * EMM_STREAM_NONE frees like cuMemFree: fenced, without waiting for the
 * device, against earlier work on the legacy and blocking streams and on
 * every non-blocking stream libemm knows. Preloaded, it knows them all;
 * loaded alone it knows the non-blocking streams passed to emm_device_alloc
 * or emm_alloc (each looked up once, so such a stream must outlive libemm's
 * use of it, as PyTorch's do). An allocation on a capturing stream is the
 * driver's (a graph memory node, cuMemAllocAsync). Pointers libemm did not
 * hand out, and everything under EMM_DISABLE=1, go to the driver.
 */
struct CUstream_st;

/* "No stream": allocate for, or free behind, any stream (cuMemAlloc /
 * cuMemFree semantics). */
#define EMM_STREAM_NONE ((struct CUstream_st *)~(uintptr_t)0)

/*
 * Device memory of `size` bytes for use on `stream`: 0 and *ret_ptr;
 * -EINVAL (size 0, NULL ret_ptr), -ENOMEM (out of memory after releasing
 * the idle cache), -ENODEV (no driver, no such device), -EIO (another driver
 * error). *ret_ptr is untouched on failure.
 */
int emm_device_alloc(size_t size, int device, struct CUstream_st *stream, void **ret_ptr);

/* Free device memory from emm_device_alloc or emm_alloc (or any cuMemAlloc
 * pointer, which goes to the driver) on `stream`. 0 (also for NULL);
 * -EINVAL for a double or interior free; -ENODEV, -EIO as above. */
int emm_device_free(void *ptr, int device, struct CUstream_st *stream);

/* PyTorch's CUDAPluggableAllocator signatures, usable as they are:
 *   torch.cuda.memory.CUDAPluggableAllocator(path, "emm_alloc", "emm_free")
 * emm_alloc returns NULL on failure; emm_free ignores `size`. */
void *emm_alloc(size_t size, int device, struct CUstream_st *stream);
void emm_free(void *ptr, size_t size, int device, struct CUstream_st *stream);

/* CuPy's CFunctionAllocator signatures (a `param` pointer first), the stream
 * as the param: emm_param_alloc(stream, size, device) is emm_alloc(size,
 * device, stream), emm_param_free(stream, ptr, device) is emm_device_free.
 *   cupy.cuda.memory.CFunctionAllocator(stream, emm_param_alloc, emm_param_free, owner)
 * NULL on failure, and CuPy does not check it: python/emm/cupy.py calls its
 * malloc from Python and turns a NULL into CuPy's OutOfMemoryError. */
void *emm_param_alloc(struct CUstream_st *stream, size_t size, int device);
void emm_param_free(struct CUstream_st *stream, void *ptr, int device);

/* Pinned host memory (cuMemHostAlloc flags; 0 for cuMemAllocHost's), from
 * the pinned caches, in the current context (device 0's primary context
 * when none is current). Errors as emm_device_alloc. */
int emm_host_alloc(size_t size, unsigned int flags, void **ret_ptr);
int emm_host_free(void *ptr);

/* Free and total bytes of `device`, idle cached memory counted as free
 * (as cuMemGetInfo under the preload; EMM_MEMINFO_CACHED). 0 or -EINVAL,
 * -ENODEV, -EIO; outputs untouched on failure. */
int emm_mem_info(int device, size_t *ret_free, size_t *ret_total);

/*
 * The settings libemm runs with (from the EMM_* environment at its first
 * use), one "EMM_NAME=value<TAB>source\n" line per option, source being
 * default, env or invalid (a bad value: the default is used). Written into
 * buf as snprintf does (at most size bytes, NUL-terminated when size > 0);
 * returns the length of the whole text, so a caller can size its buffer
 * with emm_settings(NULL, 0).
 */
size_t emm_settings(char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
