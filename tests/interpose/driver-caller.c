/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/driver-caller.c - lookups made from a library libemm must
 * never substitute: built as libnvidia-emmtest.so (stands for a driver
 * library: libcuda.so*, libnvidia-*) and as libemm-backend-emmtest.so (a
 * libemm backend, which must reach the real driver). The calls are not
 * tail calls, so libemm sees this library as the caller.
 */
#include <cuda.h>
#include <dlfcn.h>

#define API __attribute__((visibility("default")))

typedef CUresult (*gpa2_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

API void *caller_dlsym(void *handle, const char *name);
API void *caller_gpa2(gpa2_fn gpa, const char *name, int version, cuuint64_t flags);

API void *caller_dlsym(void *handle, const char *name)
{
	void *p = dlsym(handle, name);

	__asm__ volatile("" ::: "memory");
	return p;
}

API void *caller_gpa2(gpa2_fn gpa, const char *name, int version, cuuint64_t flags)
{
	void *p = NULL;

	if (gpa(name, &p, version, flags, NULL) != CUDA_SUCCESS)
		p = NULL;
	__asm__ volatile("" ::: "memory");
	return p;
}
