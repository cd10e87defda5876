/* SPDX-License-Identifier: MIT */
/*
 * common/format.c - owns the human-readable byte counts of libemm's output
 * (format.h).
 */
#include "common/format.h"

#include <inttypes.h>
#include <stdio.h>

const char *emm_format_bytes(uint64_t bytes, char *buf, size_t size)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	double v = (double)bytes;
	unsigned u = 0;

	while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
		v /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, size, "%" PRIu64 " B", bytes);
	else
		snprintf(buf, size, "%.1f %s", v, units[u]);
	return buf;
}
