/* SPDX-License-Identifier: MIT */
/*
 * config/text.c - text helpers of the option parser (text.h): echoing a
 * value from the environment safely, how far a misspelt name is from an
 * option's, and sizes written the way a user writes them
 * (emm_options_format_size, options.h).
 */
#include "config/text.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "config/ascii.h"
#include "config/options.h"

/* A value from the environment, safe to echo: printable ASCII only, cut. */
void emm_cfg_echo(const char *s, char *buf, size_t n)
{
	size_t i = 0;
	const size_t keep = n - 4; /* room for "..." and NUL */

	for (; s[i] && i < keep; i++)
		buf[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	if (s[i])
		memcpy(buf + i, "...", 3), i += 3;
	buf[i] = '\0';
}

/* Levenshtein distance, ASCII case-insensitive, of a[0..la) (la <=
 * EMM_CFG_NAME_MAX) and b. One row of the matrix, indexed by a position. */
size_t emm_cfg_edit_distance(const char *a, size_t la, const char *b)
{
	size_t row[EMM_CFG_NAME_MAX + 1];

	for (size_t i = 0; i <= la; i++)
		row[i] = i;
	for (size_t j = 1; b[j - 1]; j++) {
		size_t diag = row[0];
		row[0] = j;
		for (size_t i = 1; i <= la; i++) {
			size_t up = row[i];
			size_t best = diag + (ascii_lower(a[i - 1]) != ascii_lower(b[j - 1]));
			if (up + 1 < best)
				best = up + 1;
			if (row[i - 1] + 1 < best)
				best = row[i - 1] + 1;
			row[i] = best;
			diag = up;
		}
	}
	return row[la];
}

/* A size the way a user would write it: the largest binary unit that
 * divides it exactly, so the text parses back to the same value. */
void emm_options_format_size(size_t z, char *buf, size_t n)
{
	static const char units[] = "KMGT";
	int u = -1;

	if (z == SIZE_MAX) {
		snprintf(buf, n, "unlimited");
		return;
	}
	while (z != 0 && u < 3 && (z & 1023) == 0) {
		z >>= 10;
		u++;
	}
	if (u < 0)
		snprintf(buf, n, "%zu", z);
	else
		snprintf(buf, n, "%zu%c", z, units[u]);
}
