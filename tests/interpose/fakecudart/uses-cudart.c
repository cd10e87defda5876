/* SPDX-License-Identifier: MIT */
/*
 * tests/interpose/fakecudart/uses-cudart.c - a library linked to shared
 * cudart that test-runtime-local opens with RTLD_LOCAL, as Python opens
 * PyTorch: its libcudart is then outside the global scope, so libemm's
 * cudaMalloc (which its reference binds to) cannot find the real one with
 * RTLD_NEXT and must look among the loaded objects.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>

#define API __attribute__((visibility("default")))

uint64_t fakecudart_calls(const char *name);
API int uses_cudart_malloc(void **p, size_t size);
API int uses_cudart_free(void *p);
API void *uses_cudart_malloc_address(void);
API uint64_t uses_cudart_calls(const char *name);

API int uses_cudart_malloc(void **p, size_t size)
{
	return (int)cudaMalloc(p, size);
}

API int uses_cudart_free(void *p)
{
	return (int)cudaFree(p);
}

API void *uses_cudart_malloc_address(void)
{
	return (void *)&cudaMalloc;
}

API uint64_t uses_cudart_calls(const char *name)
{
	return fakecudart_calls(name);
}
