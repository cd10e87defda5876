/* SPDX-License-Identifier: MIT */
/*
 * interpose/shims.h - the table that maps an exact exported driver name to
 * libemm's replacement. The resolvers (dlsym, cuGetProcAddress*,
 * cudaGetDriverEntryPoint*) call the real resolver first, take the exported
 * name of what it returned (dladdr), and substitute emm_shim_for(name) when
 * it is not NULL. This keeps the caller's ABI choice (cudaVersion, _v2,
 * _ptsz) exactly: a shim exists per exported ABI, never per base name.
 */
#ifndef EMM_INTERPOSE_SHIMS_H
#define EMM_INTERPOSE_SHIMS_H

/* libemm's replacement for the driver export `exported_name`, or NULL. */
void *emm_shim_for(const char *exported_name);

/* The resolvers' own replacements (interpose/resolve.c), for the table. */
void *emm_resolver_shim_for(const char *exported_name);

#endif
