/* SPDX-License-Identifier: MIT */
/*
 * config/parse.c - the grammar of one EMM_* value (config/options.h):
 * booleans (1/true/yes/on, 0/false/no/off), sizes with K/M/G/T and KiB-style
 * suffixes or "unlimited", and bounded unsigned integers.
 */
#include <errno.h>
#include <limits.h>
#include <stdint.h>

#include "common/compiler.h"
#include "config/ascii.h"
#include "config/options.h"

int emm_parse_bool(const char *s, bool *ret)
{
	static const char *const yes[] = {"1", "true", "yes", "on"};
	static const char *const no[] = {"0", "false", "no", "off"};

	if (!s)
		return -EINVAL;
	for (size_t i = 0; i < EMM_ARRAY_SIZE(yes); i++) {
		if (ascii_eq_nocase(s, yes[i])) {
			*ret = true;
			return 0;
		}
		if (ascii_eq_nocase(s, no[i])) {
			*ret = false;
			return 0;
		}
	}
	return -EINVAL;
}

/* Decimal digits only (no sign, no space, no base prefix), no overflow. */
static int parse_digits(const char **sp, uintmax_t max, uintmax_t *ret)
{
	const char *s = *sp;
	uintmax_t v = 0;

	if (!is_digit(*s))
		return -EINVAL;
	for (; is_digit(*s); s++) {
		unsigned d = (unsigned)(*s - '0');
		if (v > (max - d) / 10)
			return -EINVAL;
		v = v * 10 + d;
	}
	*sp = s;
	*ret = v;
	return 0;
}

int emm_parse_size(const char *s, bool allow_unlimited, size_t *ret)
{
	uintmax_t v;
	unsigned shift = 0;

	if (!s)
		return -EINVAL;
	if (allow_unlimited && (ascii_eq_nocase(s, "unlimited") || ascii_eq_nocase(s, "none"))) {
		*ret = SIZE_MAX;
		return 0;
	}
	if (parse_digits(&s, SIZE_MAX, &v) < 0)
		return -EINVAL;
	switch (ascii_lower(*s)) {
	case 'k':
		shift = 10;
		break;
	case 'm':
		shift = 20;
		break;
	case 'g':
		shift = 30;
		break;
	case 't':
		shift = 40;
		break;
	}
	if (shift)
		s++;
	if (shift && ascii_lower(s[0]) == 'i' && ascii_lower(s[1]) == 'b')
		s += 2; /* KiB, MiB, ... */
	else if (ascii_lower(*s) == 'b')
		s++; /* KB, MB, ... or plain bytes: 512B */
	if (*s)
		return -EINVAL;
	/* Saturating would silently turn a typo into "all memory": refuse. */
	if (v > (uintmax_t)(SIZE_MAX >> shift))
		return -EINVAL;
	*ret = (size_t)v << shift;
	return 0;
}

int emm_parse_uint(const char *s, unsigned min, unsigned max, unsigned *ret)
{
	uintmax_t v;

	if (!s || parse_digits(&s, UINT_MAX, &v) < 0 || *s)
		return -EINVAL;
	if (v < min || v > max)
		return -EINVAL;
	*ret = (unsigned)v;
	return 0;
}
