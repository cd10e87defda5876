/* SPDX-License-Identifier: MIT */
/*
 * The backend ABI: how libemm gets memory. A backend is a shared object that
 * exports one function, EMM_BACKEND_ENTRY ("emm_backend_get"), which
 * negotiates an interface version with libemm and hands back a table of
 * function pointers. libemm dlopens the backend named by EMM_BACKEND once, at
 * first use, and never switches backend during a run.
 *
 * Negotiation (Vulkan-loader style): libemm calls
 *     emm_backend_get(&version, &table)
 * with version = EMM_BACKEND_INTERFACE_VERSION (the newest it speaks). The
 * backend lowers *version to the newest it speaks that is not above it and
 * returns 0, or returns -ENOTSUP if it speaks nothing that old. libemm then
 * rejects a version below EMM_BACKEND_INTERFACE_VERSION_MIN with a clear
 * error, and calls only the methods that version defines. Methods are only
 * ever appended; a NULL optional method means "not supported".
 *
 * Version history:
 *   1 - initial: init/fini per context, segment alloc/free, mem_info, trim,
 *       host (pinned) segment alloc/free, capabilities.
 *   2 - page-granular segments (virtual memory management): granularity,
 *       segment_unmap, segment_map (EMM_BACKEND_CAP_REMAP) and segment_grow
 *       (EMM_BACKEND_CAP_GROW). A table that negotiates version 1 is never
 *       asked for them, whatever its caps say; one that negotiates 2 and
 *       advertises a cap must have that cap's methods (the loader checks).
 *
 * Conventions: every method returns 0 or a negative errno (-ENOMEM when the
 * memory is not there), and writes its out-parameters only on success.
 * Addresses are 64-bit device (or host) virtual addresses.
 */
#ifndef EMM_BACKEND_H
#define EMM_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EMM_BACKEND_INTERFACE_VERSION 2
#define EMM_BACKEND_INTERFACE_VERSION_MIN 1
#define EMM_BACKEND_ENTRY "emm_backend_get"

/* Capability bits in emm_backend.caps. */
#define EMM_BACKEND_CAP_DEVICE (UINT64_C(1) << 0)	  /* serves device memory */
#define EMM_BACKEND_CAP_HOST_PINNED (UINT64_C(1) << 1)	  /* serves pinned host memory */
#define EMM_BACKEND_CAP_STREAM_ORDERED (UINT64_C(1) << 2) /* alloc/free honour the stream */
#define EMM_BACKEND_CAP_SIMULATED (UINT64_C(1) << 3)	  /* no GPU: addresses are never touched */
#define EMM_BACKEND_CAP_IPC (UINT64_C(1) << 4)		  /* segments can be exported with cuIpcGetMemHandle */
/* Version 2 and up (ignored in a table that negotiated version 1): */
#define EMM_BACKEND_CAP_REMAP (UINT64_C(1) << 5) /* granularity, segment_unmap, segment_map */
#define EMM_BACKEND_CAP_GROW (UINT64_C(1) << 6)	 /* granularity, segment_grow */

/* Log levels for emm_backend_host.log. */
enum emm_backend_log_level {
	EMM_BACKEND_LOG_DEBUG = 0,
	EMM_BACKEND_LOG_INFO = 1,
	EMM_BACKEND_LOG_WARNING = 2,
	EMM_BACKEND_LOG_ERROR = 3,
};

/* Services libemm offers a backend. Valid from init until fini. */
struct emm_backend_host {
	uint32_t interface_version; /* the negotiated version */
	uint32_t struct_size;

	/*
	 * The real driver's entry point for an exact exported name
	 * ("cuMemAlloc_v2"), bypassing libemm's own shims; NULL when there is
	 * no driver or no such symbol. Backends must use this rather than
	 * dlsym, which libemm intercepts.
	 */
	void *(*driver_proc)(const char *name);

	/* Logging that never allocates; msg is one line without newline. */
	void (*log)(enum emm_backend_log_level level, const char *msg);

	/* A backend-specific option string (EMM_BACKEND_OPTIONS), or "". */
	const char *options;
};

struct emm_backend {
	uint32_t interface_version; /* EMM_BACKEND_INTERFACE_VERSION the table was built for */
	uint32_t struct_size;	    /* sizeof(struct emm_backend) the backend was built with */
	const char *name;	    /* short name: "driver", "hostsim", ... */
	uint64_t caps;		    /* EMM_BACKEND_CAP_* */

	/*
	 * int init(const struct emm_backend_host *host, int device,
	 *          uint64_t context, void **ret_state)
	 * Called once per CUDA context (the context handle, current on the
	 * calling thread) before any other call for it. Returns 0 and a state
	 * pointer passed to every later call for that context.
	 */
	int (*init)(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state);

	/*
	 * void fini(void *state, bool driver_alive)
	 * The context is going away. If driver_alive is false the context is
	 * already destroyed (the driver freed its memory with it) or the
	 * driver is gone: release host-side state, and call nothing that needs
	 * that context. Driver objects that outlive a context (a device's
	 * memory pool: the built-in async backend's) may be released through
	 * another context while the driver still answers.
	 */
	void (*fini)(void *state, bool driver_alive);

	/*
	 * int segment_alloc(void *state, size_t size, uint64_t stream,
	 *                   uint64_t *ret_addr)
	 * Get `size` bytes of device memory (size is a multiple of 2 MiB for
	 * large segments, or the small segment size). `stream` is the stream
	 * the first block will be used on (a CUstream value), or 0 when
	 * unknown; only stream-ordered backends use it. -ENOMEM when out of
	 * memory.
	 */
	int (*segment_alloc)(void *state, size_t size, uint64_t stream, uint64_t *ret_addr);

	/*
	 * int segment_free(void *state, uint64_t addr, size_t size,
	 *                  uint64_t stream)
	 * Give back a segment from segment_alloc. libemm only calls this once
	 * all GPU work that used the segment is known complete, or with the
	 * stream it was last used on for stream-ordered backends.
	 */
	int (*segment_free)(void *state, uint64_t addr, size_t size, uint64_t stream);

	/*
	 * int mem_info(void *state, size_t *ret_free, size_t *ret_total)
	 * Free and total memory as the backend sees it (driver's cuMemGetInfo).
	 */
	int (*mem_info)(void *state, size_t *ret_free, size_t *ret_total);

	/*
	 * int trim(void *state, size_t keep)   (optional)
	 * Release backend-internal caches down to `keep` bytes.
	 */
	int (*trim)(void *state, size_t keep);

	/*
	 * int host_segment_alloc(void *state, size_t size, unsigned flags,
	 *                        uint64_t *ret_addr)   (optional)
	 * Pinned host memory with cuMemHostAlloc flags.
	 */
	int (*host_segment_alloc)(void *state, size_t size, unsigned flags, uint64_t *ret_addr);

	/* int host_segment_free(void *state, uint64_t addr, size_t size)  (optional) */
	int (*host_segment_free)(void *state, uint64_t addr, size_t size);

	/* --- version 2 -------------------------------------------------------- */

	/*
	 * int granularity(void *state, size_t *ret_granularity)
	 *   (required with CAP_REMAP or CAP_GROW)
	 * The page size of a segment's physical backing (e.g. 2 MiB): a power
	 * of two, a multiple of 512. Device segments start on a multiple of
	 * it; offsets and lengths passed to segment_unmap/segment_map and the
	 * sizes passed to segment_grow are multiples of it. Constant for the
	 * life of the state.
	 */
	int (*granularity)(void *state, size_t *ret_granularity);

	/*
	 * int segment_unmap(void *state, uint64_t seg_addr, size_t seg_size,
	 *                   size_t offset, size_t length)   (CAP_REMAP)
	 * Release the physical memory behind [seg_addr + offset, + length) of
	 * a device segment of seg_size bytes (its current size), keeping the
	 * address range reserved: the device may not touch it until it is
	 * mapped again. The range lies inside the segment and is mapped (libemm
	 * never unmaps a range twice). libemm calls this only once every GPU
	 * operation that used the range is known complete. On failure nothing
	 * of the range was released.
	 */
	int (*segment_unmap)(void *state, uint64_t seg_addr, size_t seg_size, size_t offset, size_t length);

	/*
	 * int segment_map(void *state, uint64_t seg_addr, size_t seg_size,
	 *                 size_t offset, size_t length)   (CAP_REMAP)
	 * Back an unmapped range of a segment with physical memory again,
	 * readable and writable by the segment's device. Contents are
	 * undefined. -ENOMEM when the memory is not there; on any failure the
	 * range stays unmapped. segment_free of a segment releases whatever
	 * is still mapped and the reservation, whatever was unmapped before.
	 */
	int (*segment_map)(void *state, uint64_t seg_addr, size_t seg_size, size_t offset, size_t length);

	/*
	 * int segment_grow(void *state, uint64_t seg_addr, size_t old_size,
	 *                  size_t new_size)   (CAP_GROW)
	 * Extend a segment in place: [seg_addr + old_size, seg_addr + new_size)
	 * becomes mapped, accessible memory, and later calls name the segment
	 * with new_size (segment_free included). -ENOSPC when the segment's
	 * reserved range cannot hold new_size (libemm then opens a new
	 * segment), -ENOMEM when the memory is not there; on failure the
	 * segment is unchanged.
	 */
	int (*segment_grow)(void *state, uint64_t seg_addr, size_t old_size, size_t new_size);
};

/*
 * The one symbol a backend exports.
 * In: *inout_version = the newest version libemm speaks.
 * Out: *inout_version = the version of *ret_table; 0 on success, -ENOTSUP if
 * the backend speaks no version <= the one offered.
 */
typedef int (*emm_backend_get_fn)(uint32_t *inout_version, const struct emm_backend **ret_table);

#ifdef __cplusplus
}
#endif

#endif
