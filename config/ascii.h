/* SPDX-License-Identifier: MIT */
/*
 * config/ascii.h - case-insensitive ASCII comparisons for the option
 * parser (options.c) and the value grammar (parse.c): the C locale's rules,
 * whatever locale the program set.
 */
#ifndef EMM_CONFIG_ASCII_H
#define EMM_CONFIG_ASCII_H

#include <stdbool.h>

/* ASCII only: the C locale's rules, whatever locale the program set. */
static inline char ascii_lower(char c)
{
	return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static inline bool ascii_eq_nocase(const char *a, const char *b)
{
	for (; *a && *b; a++, b++)
		if (ascii_lower(*a) != ascii_lower(*b))
			return false;
	return *a == *b;
}

static inline bool is_digit(char c)
{
	return c >= '0' && c <= '9';
}

#endif
