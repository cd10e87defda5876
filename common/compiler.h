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
/*
 * No sanitizer instrumentation in this function: for code that a sanitizer
 * runtime reaches before it is initialised (its start-up looks up the real
 * functions with dlsym, which is libemm's). Expands to nothing in the
 * ordinary build, so the code generated there is unchanged.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define EMM_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(undefined_behavior_sanitizer)
#define EMM_SANITIZED 1
#endif
#endif
#if defined(EMM_SANITIZED)
#define EMM_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))
#else
#define EMM_NO_SANITIZE
#endif

/* One step of a spin-wait: tells the CPU (and a sibling hyper-thread)
 * that this thread is waiting. */
static inline void emm_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield");
#endif
}

#define EMM_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Round x up to a multiple of align (a power of two). */
#define EMM_ALIGN_UP(x, align) (((x) + ((align) - 1)) & ~((__typeof__(x))(align) - 1))

#endif
