/* SPDX-License-Identifier: MIT */
/*
 * common/outbuf.h - buffered output to a file descriptor without
 * allocation: the statistics JSON and the memory snapshot are written
 * through one of these (its buffer lives in the struct, on the caller's
 * stack or in static storage). A file is written under a temporary name
 * and renamed into place when complete, so a reader never sees half of one
 * and a dump on a signal replaces the previous one whole.
 */
#ifndef EMM_COMMON_OUTBUF_H
#define EMM_COMMON_OUTBUF_H

#include <stddef.h>

#include "common/compiler.h"

struct emm_outbuf {
	int fd;
	int error;	     /* first write error (negative errno), 0 if none */
	size_t used;
	char path[256];	     /* final name ("" when writing to an fd we did not open) */
	char tmp[288];	     /* the name written to until emm_outbuf_commit */
	char buf[8192];
};

/* Write to an open fd (stderr); emm_outbuf_commit only flushes. */
void emm_outbuf_fd(struct emm_outbuf *ob, int fd);

/* Write to `path` (through "path.tmp.PID"). 0 or a negative errno. */
int emm_outbuf_open(struct emm_outbuf *ob, const char *path);

void emm_outbuf_write(struct emm_outbuf *ob, const void *data, size_t len);
void emm_outbuf_printf(struct emm_outbuf *ob, const char *fmt, ...) EMM_PRINTF(2, 3);

/* Flush; for a file also close it and rename it into place (on an error
 * the temporary file is removed). 0 or the first negative errno. */
int emm_outbuf_commit(struct emm_outbuf *ob);

#endif
