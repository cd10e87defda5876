/* SPDX-License-Identifier: MIT */
/*
 * allocator/backend_loader.h - choosing and loading the backend (the ABI is
 * include/emm/emm_backend.h). A name without a slash ("driver", "hostsim")
 * is a built-in ("vmm" too): first libemm-backend-NAME.so beside libemm.so, else the copy
 * compiled into libemm. A name with a slash is a path to dlopen. The version
 * is negotiated; a missing entry symbol, a refused or too-old version, or a
 * table without its required methods is an error with a clear message.
 */
#ifndef EMM_ALLOCATOR_BACKEND_LOADER_H
#define EMM_ALLOCATOR_BACKEND_LOADER_H

#include "emm/emm_backend.h"

struct emm_backend_loaded {
	const struct emm_backend *table;
	uint32_t version;	/* negotiated */
	void *dl_handle;	/* NULL for a compiled-in backend */
	char path[512];		/* where it came from ("built-in" for compiled-in) */
};

/* How the loader finds the entry symbol in a loaded .so: dlsym's
 * signature. libemm passes the real dlsym (its own exported dlsym is a
 * layer above the allocator, which the allocator never calls). */
typedef void *(*emm_symbol_lookup_fn)(void *handle, const char *name);

/* 0, or -ENOENT (not found), -ENOTSUP (version), -EINVAL (bad table, no
 * name or no lookup). The reason is logged with emm_error. */
int emm_backend_load(const char *name, emm_symbol_lookup_fn lookup, struct emm_backend_loaded *ret);

/* Does the loaded backend have every capability bit in `cap`, counting
 * only the bits its negotiated version defines (a table that negotiated
 * version 1 never has CAP_REMAP or CAP_GROW, whatever its caps say)? */
bool emm_backend_has_cap(const struct emm_backend_loaded *loaded, uint64_t cap);

/* dlclose a backend loaded from a file and clear *loaded (tests; libemm
 * itself keeps its backend for the life of the process). */
void emm_backend_unload(struct emm_backend_loaded *loaded);

/* Compiled-in entry functions (allocator/backends/<name>.c built with
 * -DEMM_BACKEND_BUILTIN). */
int emm_backend_builtin_driver(uint32_t *inout_version, const struct emm_backend **ret_table);
int emm_backend_builtin_hostsim(uint32_t *inout_version, const struct emm_backend **ret_table);
int emm_backend_builtin_vmm(uint32_t *inout_version, const struct emm_backend **ret_table);

#endif
