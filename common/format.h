/* SPDX-License-Identifier: MIT */
/*
 * common/format.h - byte counts for people ("12.3 MiB"), formatted into the
 * caller's buffer without allocating (for log lines and the statistics).
 */
#ifndef EMM_COMMON_FORMAT_H
#define EMM_COMMON_FORMAT_H

#include <stddef.h>
#include <stdint.h>

/* "512 B", "1.5 KiB", "12.3 MiB", ... up to TiB; returns buf. */
const char *emm_format_bytes(uint64_t bytes, char *buf, size_t size);

#endif
