/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/next-local.c - opened with RTLD_LOCAL by test-rtld-next.
 * glibc answers dlsym(RTLD_DEFAULT, ...) from here in this library's scope,
 * which includes its own dependency (next-dep); a dlsym wrapper that made
 * the call from its own library would search the global scope only.
 */
#include <dlfcn.h>

#define API __attribute__((visibility("default")))

int dep_only_symbol(void);
API void *next_local_default_lookup(const char *name);
API int next_local_call_dep(void);

API void *next_local_default_lookup(const char *name)
{
	void *p = dlsym(RTLD_DEFAULT, name);

	/* Not a tail call: glibc must see this library as the caller. */
	__asm__ volatile("" ::: "memory");
	return p;
}

API int next_local_call_dep(void)
{
	return dep_only_symbol();
}
