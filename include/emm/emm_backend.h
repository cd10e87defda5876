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

#define EMM_BACKEND_INTERFACE_VERSION 1
#define EMM_BACKEND_INTERFACE_VERSION_MIN 1
#define EMM_BACKEND_ENTRY "emm_backend_get"

/* Capability bits in emm_backend.caps. */
#define EMM_BACKEND_CAP_DEVICE (UINT64_C(1) << 0)	  /* serves device memory */
#define EMM_BACKEND_CAP_HOST_PINNED (UINT64_C(1) << 1)	  /* serves pinned host memory */
#define EMM_BACKEND_CAP_STREAM_ORDERED (UINT64_C(1) << 2) /* alloc/free honour the stream */
#define EMM_BACKEND_CAP_SIMULATED (UINT64_C(1) << 3)	  /* no GPU: addresses are never touched */
#define EMM_BACKEND_CAP_IPC (UINT64_C(1) << 4)		  /* segments can be exported with cuIpcGetMemHandle */

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
	 * The context is going away. If driver_alive is false the driver is
	 * gone or the context already destroyed: release host-side state only,
	 * call nothing.
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
