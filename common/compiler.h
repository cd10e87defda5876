/* SPDX-License-Identifier: MIT */
/* Compiler attributes and tiny helpers every folder uses, defined once. */
#ifndef EMM_COMMON_COMPILER_H
#define EMM_COMMON_COMPILER_H

/* Marks a symbol libemm exports; everything else is hidden. The exported set
 * is checked against interpose/exports.txt by a test. */
#define EMM_EXPORT __attribute__((visibility("default")))

#define EMM_LIKELY(x) __builtin_expect(!!(x), 1)
#define EMM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define EMM_UNUSED __attribute__((unused))
#define EMM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define EMM_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Round x up to a multiple of align (a power of two). */
#define EMM_ALIGN_UP(x, align) (((x) + ((align) - 1)) & ~((__typeof__(x))(align) - 1))

#endif
