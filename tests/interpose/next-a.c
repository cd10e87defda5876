/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/next-a.c - a second interposer preloaded beside libemm,
 * written the usual way: its getenv wrapper finds the real one with
 * dlsym(RTLD_NEXT, "getenv"). If libemm's dlsym answered RTLD_NEXT for
 * itself instead of for this library, the wrapper would get itself (libemm
 * before it in LD_PRELOAD) and recurse, or skip a definition. No malloc.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef char *(*getenv_fn)(const char *);

API int next_a_getenv_calls(void);
API void *next_a_real_getenv(void);
API int interpose_probe(void);
API void *next_a_lookup(const char *name);
API int next_a_probe_next(void);

static __thread int getenv_depth;
static atomic_int getenv_calls;
static getenv_fn real_getenv;

API char *getenv(const char *name)
{
	char *value;

	if (getenv_depth++ > 0) {
		static const char msg[] = "next-a: getenv recursed: RTLD_NEXT found the wrapper itself\n";
		ssize_t w = write(2, msg, sizeof(msg) - 1);
		(void)w;
		_exit(3);
	}
	atomic_fetch_add(&getenv_calls, 1);
	if (!real_getenv)
		real_getenv = (getenv_fn)dlsym(RTLD_NEXT, "getenv");
	value = real_getenv && real_getenv != getenv ? real_getenv(name) : NULL;
	getenv_depth--;
	return value;
}

API int next_a_getenv_calls(void)
{
	return atomic_load(&getenv_calls);
}

API void *next_a_real_getenv(void)
{
	return (void *)real_getenv;
}

API int interpose_probe(void)
{
	return 'a';
}

/* dlsym(RTLD_NEXT, name) as seen from this library. */
API void *next_a_lookup(const char *name)
{
	void *p = dlsym(RTLD_NEXT, name);

	/* Not a tail call: glibc must see this library as the caller. */
	__asm__ volatile("" ::: "memory");
	return p;
}

/* The next interpose_probe after this library, called. */
API int next_a_probe_next(void)
{
	int (*next)(void) = (int (*)(void))dlsym(RTLD_NEXT, "interpose_probe");

	return next ? next() : 0;
}
