/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_report.h - what emm-replay prints: the trace summary, one
 * run's report, the failing event, the --compare Markdown table and the
 * --timeline CSV. Column meanings are documented in README.md ("Replaying
 * a trace").
 */
#ifndef EMM_TOOLS_REPLAY_REPORT_H
#define EMM_TOOLS_REPLAY_REPORT_H

#include <stdio.h>

#include "tools/replay_run.h"
#include "tools/replay_trace.h"

/* "48.0 MiB" style, exact for small values ("512 B"). */
const char *replay_format_size(uint64_t bytes, char *buf, size_t size);

void replay_print_trace(FILE *out, const char *path, const struct replay_trace *t);

/* "1196 MiB" when a whole number of MiB, else "N B". */
const char *replay_format_mib(uint64_t bytes, char *buf, size_t size);

/* One run's numbers, "name   value   (meaning)" lines. */
void replay_print_report(FILE *out, const struct replay_trace *t, const struct replay_result *r);

/* The failing event: line, thread, size, and the heap's bytes then. */
void replay_print_failure(FILE *out, const struct replay_trace *t, const struct replay_result *r);

/* A short cell for tables: "ok", or "fails at line N". */
const char *replay_result_cell(const struct replay_trace *t, const struct replay_result *r, char *buf,
			       size_t size);

void replay_print_table_header(FILE *out);
void replay_print_table_row(FILE *out, const char *setting, const struct replay_trace *t,
			    const struct replay_result *r);

/* Line,Time,Thread,Action,Size,Requested,Allocated,Reserved per event. */
int replay_write_timeline(const char *path, const struct replay_trace *t, const struct replay_result *r);

#endif
