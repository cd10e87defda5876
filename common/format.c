/* SPDX-License-Identifier: MIT */
/*
 * common/format.c - owns the human-readable byte counts of libemm's output
 * and the expansion of %p in its output paths (format.h).
 */
#include "common/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

int emm_format_path(const char *pattern, char *out, size_t n)
{
	char pid[24];
	size_t used = 0;

	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	for (const char *p = pattern; *p; p++) {
		const char *piece = p;
		size_t len = 1;

		if (p[0] == '%' && p[1] == 'p') {
			piece = pid;
			len = strlen(pid);
			p++;
		} else if (p[0] == '%' && p[1] == '%') {
			p++;
		}
		if (used + len >= n)
			return -ENAMETOOLONG;
		memcpy(out + used, piece, len);
		used += len;
	}
	if (used >= n)
		return -ENAMETOOLONG;
	out[used] = '\0';
	return 0;
}
