/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/rtld_next_wrap.c - libgpuwrapnext.so, a second preloaded
 * library in the style of every other interposer: it wraps cudaMalloc and
 * finds the next definition with dlsym(RTLD_NEXT, ...). Its dlsym reference
 * binds to libemm's dlsym, which must forward so that RTLD_NEXT still means
 * "after libgpuwrapnext.so", in either preload order. tests/gpu/rtld_next.c
 * asks it for lookups and checks where they landed.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

#define WRAP_EXPORT __attribute__((visibility("default")))

typedef int (*cuda_malloc_fn)(void **, size_t);

WRAP_EXPORT void *gpuwrap_next(const char *name);
WRAP_EXPORT int gpuwrap_calls(void);
WRAP_EXPORT int cudaMalloc(void **ptr, size_t size);

static cuda_malloc_fn next_cuda_malloc;
static int calls;

/* dlsym(RTLD_NEXT) from inside this library. The empty asm after the call
 * keeps it out of tail position: glibc resolves RTLD_NEXT relative to the
 * return address, which must be here, not in our caller. */
void *gpuwrap_next(const char *name)
{
	void *r = dlsym(RTLD_NEXT, name);

	__asm__ volatile("" : : "r"(r) : "memory");
	return r;
}

int gpuwrap_calls(void)
{
	return __atomic_load_n(&calls, __ATOMIC_SEQ_CST);
}

static int wrap_cuda_malloc(void **ptr, size_t size)
{
	cuda_malloc_fn fn = __atomic_load_n(&next_cuda_malloc, __ATOMIC_ACQUIRE);

	if (!fn) {
		void *sym = gpuwrap_next("cudaMalloc");
		memcpy(&fn, &sym, sizeof(fn));
		__atomic_store_n(&next_cuda_malloc, fn, __ATOMIC_RELEASE);
	}
	if (!fn || fn == wrap_cuda_malloc)
		return 999; /* cudaErrorUnknown: RTLD_NEXT found ourselves */
	__atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
	return fn(ptr, size);
}

int cudaMalloc(void **ptr, size_t size) __attribute__((alias("wrap_cuda_malloc")));
