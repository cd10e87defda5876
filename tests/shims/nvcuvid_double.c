/* SPDX-License-Identifier: MIT */
/*
 * tests/shims/nvcuvid_double.c - a stand-in for the driver's video and JPEG
 * engine library, built as libnvcuvid.so.1 and dlopen'ed by
 * test_shims_driver_component.c. As the real one does, it links no CUDA
 * library: it dlopens libcuda.so.1 and looks its functions up by name with
 * dlsym (under the preload it gets libemm's shims for cuMemAlloc_v2,
 * cuMemFree_v2, cuMemFreeAsync and cuGetProcAddress_v2, through which it
 * resolves cuMemFreeHost). It gets memory from the driver through a
 * private export table (the test double's FAKECUDA_PRIVATE_TABLE_ID, for
 * the real driver's tables), where libemm cannot see it, and frees it
 * through the public entry points: libemm must count those frees as a
 * driver component's, with their sizes, not as unknown frees.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stddef.h>

#include "fakecuda.h"
#include "nvcuvid_double.h"

static struct {
	const struct fakecuda_private_table *table;
	CUresult (*mem_alloc)(CUdeviceptr *, size_t);
	CUresult (*mem_free)(CUdeviceptr);
	CUresult (*mem_free_async)(CUdeviceptr, CUstream);
	CUresult (*mem_free_host)(void *);
} d;

/* Each code a freeing call returned, stored after the call so that the
 * call is not a tail call: a tail call would leave the return address the
 * program's, and the free would look like the program's own (as it would
 * for a real driver component that tail-calls the driver). */
static volatile CUresult last;

static CUresult kept(CUresult r)
{
	last = r;
	return r;
}

/* CUDA_SUCCESS once every function is found; the driver's code, or
 * CUDA_ERROR_NOT_FOUND, otherwise. */
static CUresult setup(void)
{
	CUresult (*get_export_table)(const void **, const CUuuid *);
	CUresult (*get_proc)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
	static const CUuuid id = FAKECUDA_PRIVATE_TABLE_ID;
	const void *table = NULL;
	void *free_host = NULL;
	void *h;
	CUresult r;

	if (d.table)
		return CUDA_SUCCESS;
	h = dlopen("libcuda.so.1", RTLD_NOW);
	if (!h)
		return CUDA_ERROR_NOT_FOUND;
	get_export_table = (CUresult(*)(const void **, const CUuuid *))dlsym(h, "cuGetExportTable");
	get_proc = (CUresult(*)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *))dlsym(
	    h, "cuGetProcAddress_v2");
	d.mem_alloc = (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
	d.mem_free = (CUresult(*)(CUdeviceptr))dlsym(h, "cuMemFree_v2");
	d.mem_free_async = (CUresult(*)(CUdeviceptr, CUstream))dlsym(h, "cuMemFreeAsync");
	if (!get_export_table || !get_proc || !d.mem_alloc || !d.mem_free || !d.mem_free_async)
		return CUDA_ERROR_NOT_FOUND;
	r = get_proc("cuMemFreeHost", &free_host, 12000, CU_GET_PROC_ADDRESS_DEFAULT, NULL);
	if (r != CUDA_SUCCESS)
		return r;
	if (!free_host)
		return CUDA_ERROR_NOT_FOUND;
	d.mem_free_host = (CUresult(*)(void *))free_host;
	r = get_export_table(&table, &id);
	if (r != CUDA_SUCCESS)
		return r;
	if (!table || ((const struct fakecuda_private_table *)table)->size < sizeof(*d.table))
		return CUDA_ERROR_NOT_FOUND;
	d.table = table;
	return CUDA_SUCCESS;
}

CUresult nvcuvid_double_device_cycle(size_t size, int async)
{
	CUdeviceptr p = 0;
	CUresult r = setup();

	if (r == CUDA_SUCCESS)
		r = d.table->alloc(&p, size);
	if (r == CUDA_SUCCESS)
		r = kept(async ? d.mem_free_async(p, NULL) : d.mem_free(p));
	return r;
}

CUresult nvcuvid_double_host_cycle(size_t size)
{
	void *p = NULL;
	CUresult r = setup();

	if (r == CUDA_SUCCESS)
		r = d.table->host_alloc(&p, size);
	if (r == CUDA_SUCCESS)
		r = kept(d.mem_free_host(p));
	return r;
}

CUresult nvcuvid_double_alloc(CUdeviceptr *p, size_t size)
{
	CUresult r = setup();

	return r == CUDA_SUCCESS ? d.mem_alloc(p, size) : r;
}

CUresult nvcuvid_double_free(CUdeviceptr p)
{
	CUresult r = setup();

	return r == CUDA_SUCCESS ? kept(d.mem_free(p)) : r;
}
