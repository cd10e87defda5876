/* SPDX-License-Identifier: MIT */
/*
 * Logging to stderr that never allocates: each line is formatted into a stack
 * buffer and written with one write(2), so it is safe inside malloc-free
 * paths, signal-adjacent code and the interposed entry points. Prefixes are
 * fixed: "emm: ", "emm: warning: ", "emm: error: ". Debug lines print only
 * when emm_log_set_debug(true) was called (EMM_VERBOSE >= 2).
 */
#ifndef EMM_COMMON_LOG_H
#define EMM_COMMON_LOG_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/compiler.h"

enum emm_log_level {
	EMM_LOG_DEBUG,
	EMM_LOG_INFO,
	EMM_LOG_WARNING,
	EMM_LOG_ERROR,
};

void emm_log(enum emm_log_level level, const char *fmt, ...) EMM_PRINTF(2, 3);
void emm_vlog(enum emm_log_level level, const char *fmt, va_list ap);

#define emm_debug(...) emm_log(EMM_LOG_DEBUG, __VA_ARGS__)
#define emm_info(...) emm_log(EMM_LOG_INFO, __VA_ARGS__)
#define emm_warn(...) emm_log(EMM_LOG_WARNING, __VA_ARGS__)
#define emm_error(...) emm_log(EMM_LOG_ERROR, __VA_ARGS__)

void emm_log_set_debug(bool on);
bool emm_log_debug_enabled(void);

/* Redirect output to another fd (tests); -1 restores stderr. */
void emm_log_set_fd(int fd);

/* For a message a failure may repeat at every call: count it in *count and
 * say whether to print it this time (the 1st, 2nd, 4th, 8th ... time). The
 * count so far is in *ret_n for the message. */
bool emm_log_sparingly(atomic_uint *count, unsigned *ret_n);

#endif
