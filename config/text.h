/* SPDX-License-Identifier: MIT */
/*
 * config/text.h - text helpers of the option parser's warnings
 * (options.c): no allocation.
 */
#ifndef EMM_CONFIG_TEXT_H
#define EMM_CONFIG_TEXT_H

#include <stddef.h>

#define EMM_CFG_NAME_MAX 32 /* longer names are never close to an option's */

/* `s` as printable ASCII ('?' for the rest), cut with "..." to fit n. */
void emm_cfg_echo(const char *s, char *buf, size_t n);

/* Levenshtein distance, ASCII case-insensitive, of a[0..la) (la <=
 * EMM_CFG_NAME_MAX) and the string b. */
size_t emm_cfg_edit_distance(const char *a, size_t la, const char *b);

#endif
