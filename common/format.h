/* SPDX-License-Identifier: MIT */
/*
 * common/format.h - byte counts for people ("12.3 MiB") and output paths
 * with the process id (EMM_LOG=trace-%p.csv), formatted into the caller's
 * buffer without allocating.
 */
#ifndef EMM_COMMON_FORMAT_H
#define EMM_COMMON_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/* "512 B", "1.5 KiB", "12.3 MiB", ... up to TiB; returns buf. */
const char *emm_format_bytes(uint64_t bytes, char *buf, size_t size);

#endif

/* `pattern` with %p replaced by the process id and %% by %, into out[n].
 * 0, or -ENAMETOOLONG (then out holds a cut, unusable path). */
int emm_format_path(const char *pattern, char *out, size_t n);
