/* SPDX-License-Identifier: MIT */
/*
 * tests/common/emm_partial.h - the partial-skip line of the test protocol
 * (tests/common/README.md), for C and CUDA C++ test programs:
 *
 *   exit 0   passed            exit 77  skipped as a whole (nothing tested)
 *   exit 1   failed            (other non-zero: failed)
 *
 * A program that passes but skipped some of its cases (a check it could not
 * make here: no peer access, an unsupported feature, nothing to observe)
 * prints, on stdout, exactly one line
 *
 *   EMM-PARTIAL: ran R, skipped S (REASONS)
 *
 * R and S count the program's own cases (tests, parts or checks: the reasons
 * say which), REASONS is "case: why" items separated by "; " on one line.
 * scripts/test and scripts/gpu-check list such tests as "partial".
 *
 *   struct emm_partial pt = {0};
 *   emm_partial_ran(&pt);                            a case ran
 *   emm_partial_skip(&pt, "peer access: %s", why);   a case was skipped
 *   return failed ? 1 : emm_partial_finish(&pt);     marker line; 0, or 77
 *                                                    if nothing ran at all
 */
#ifndef EMM_PARTIAL_H
#define EMM_PARTIAL_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define EMM_PARTIAL_PREFIX "EMM-PARTIAL:"
#define EMM_SKIP_EXIT 77

struct emm_partial {
	unsigned ran, skipped;
	char why[1024]; /* "case: why; case: why" */
};

static inline void emm_partial_ran(struct emm_partial *p)
{
	p->ran++;
}

/* One case skipped; the reason is printed now ("SKIP part: ...") and kept
 * for the marker line. */
#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static inline void emm_partial_skip(struct emm_partial *p, const char *fmt, ...)
{
	char one[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(one, sizeof(one), fmt, ap);
	va_end(ap);
	for (char *c = one; *c; c++)
		if (*c == '\n' || *c == '\r')
			*c = ' ';
	printf("SKIP part: %s\n", one);
	p->skipped++;
	size_t len = strlen(p->why);
	if (len + 8 < sizeof(p->why))
		snprintf(p->why + len, sizeof(p->why) - len, "%s%s", len ? "; " : "", one);
}

/* Print the marker line if anything was skipped. */
static inline void emm_partial_print(unsigned ran, unsigned skipped, const char *why)
{
	if (skipped == 0)
		return;
	printf(EMM_PARTIAL_PREFIX " ran %u, skipped %u (%s)\n", ran, skipped, why && *why ? why : "no reason given");
	fflush(stdout);
}

/* The exit status of a program that has not failed: 77 when every case was
 * skipped, else 0 (after the marker line, if some were). */
static inline int emm_partial_finish(const struct emm_partial *p)
{
	if (p->ran == 0 && p->skipped > 0) {
		printf("SKIP: every case skipped (%s)\n", p->why);
		fflush(stdout);
		return EMM_SKIP_EXIT;
	}
	emm_partial_print(p->ran, p->skipped, p->why);
	return 0;
}

#endif
