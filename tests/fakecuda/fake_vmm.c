/* SPDX-License-Identifier: MIT */
/*
 * tests/fakecuda/fake_vmm.c - virtual memory management: address
 * reservations (cuMemAddressReserve/Free), physical allocations
 * (cuMemCreate/Release, cuMemRetainAllocationHandle,
 * cuMemGetAllocationPropertiesFromHandle), mappings (cuMemMap/Unmap) and
 * access (cuMemSetAccess/GetAccess), the granularity query.
 *
 * A reservation is host address space (mmap PROT_NONE, MAP_NORESERVE). A
 * physical allocation is a range of one sparse memfd of this file's own,
 * counted against the device's capacity like cuMemAlloc (g_fake.used), so
 * out-of-memory tests work; a mapping maps that range MAP_SHARED|MAP_FIXED
 * into the reservation, PROT_NONE until cuMemSetAccess makes it readable or
 * writable, so a test writes through a mapped device address and a missing
 * cuMemSetAccess faults. Unmapping puts PROT_NONE address space back; the
 * memory is freed (hole punched, capacity returned) when the handle is
 * released and no mapping uses it. Handles are small integers (1, 2, ...).
 *
 * Error codes: the documented ones (cuda.h's comments list each call's
 * codes; which argument gives which is inferred): CUDA_ERROR_INVALID_VALUE
 * for NULL outputs, nonzero flags, sizes/addresses not multiples of the
 * granularity, a sub-range unmap, an unknown handle; checked against the
 * real driver (580, H100, probe-driver's vmm cases): a nonzero map offset and
 * a map larger than the handle are CUDA_ERROR_NOT_SUPPORTED, and unmapping a
 * range already unmapped succeeds;
 * CUDA_ERROR_OUT_OF_MEMORY past capacity; CUDA_ERROR_INVALID_DEVICE for a
 * bad location id. Unverified (the fake's choice, probe-driver's vmm cases
 * check them on a GPU): the granularity (2 MiB, both flags, as on Hopper),
 * mapping over a mapped range, freeing a reservation that still has
 * mappings, cuMemSetAccess of a range not wholly mapped, cuMemGetAccess of
 * an unmapped address (all CUDA_ERROR_INVALID_VALUE), a released handle
 * used again (CUDA_ERROR_INVALID_VALUE; the docs call it undefined), and
 * that none of these calls needs a current context (only cuInit).
 */
#include "fake.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define VMM_GRAN ((size_t)2 << 20)

struct vmm_reservation {
	struct vmm_reservation *next;
	uintptr_t base;
	size_t size;
	void *map_base; /* what mmap returned (before alignment) */
	size_t map_size;
};

struct vmm_alloc {
	size_t size;
	off_t offset; /* in the memfd */
	CUmemAllocationProp prop;
	unsigned refs;     /* cuMemCreate + each cuMemRetainAllocationHandle */
	unsigned mappings; /* live cuMemMap of it */
};

struct vmm_mapping {
	struct vmm_mapping *next;
	uintptr_t addr;
	size_t size;
	unsigned long long handle;
	unsigned long long access; /* CUmemAccess_flags for the device */
};

static struct vmm_reservation *reservations;
static struct vmm_mapping *mappings;
static struct vmm_alloc **allocs; /* handle h is allocs[h - 1] */
static size_t nallocs;
static int vmm_fd = -2;
static off_t vmm_next_offset;

static int fd_locked(void)
{
	if (vmm_fd == -2) {
		vmm_fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
		if (vmm_fd >= 0 && ftruncate(vmm_fd, (off_t)1 << 46) != 0) {
			close(vmm_fd);
			vmm_fd = -1;
		}
		if (vmm_fd < 0)
			vmm_fd = -1;
	}
	return vmm_fd;
}

static struct vmm_alloc *handle_get(unsigned long long h)
{
	return h >= 1 && h <= nallocs ? allocs[h - 1] : NULL;
}

static void alloc_maybe_free(unsigned long long h)
{
	struct vmm_alloc *a = handle_get(h);
	if (!a || a->refs || a->mappings)
		return;
	fallocate(vmm_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, a->offset, (off_t)a->size);
	g_fake.used[a->prop.location.id] -= a->size;
	free(a);
	allocs[h - 1] = NULL;
}

static struct vmm_reservation *reservation_of(uintptr_t p, size_t size)
{
	for (struct vmm_reservation *r = reservations; r; r = r->next)
		if (p >= r->base && size <= r->size && p - r->base <= r->size - size)
			return r;
	return NULL;
}

/* Bytes of [p, p + size) covered by mappings. */
static size_t mapped_bytes(uintptr_t p, size_t size)
{
	size_t n = 0;
	for (struct vmm_mapping *m = mappings; m; m = m->next) {
		uintptr_t lo = m->addr > p ? m->addr : p;
		uintptr_t hi = m->addr + m->size < p + size ? m->addr + m->size : p + size;
		if (hi > lo)
			n += hi - lo;
	}
	return n;
}

static bool prop_ok(const CUmemAllocationProp *prop, CUresult *why)
{
	if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
		*why = CUDA_ERROR_INVALID_VALUE;
		return false;
	}
	if (!fake_device_valid(prop->location.id)) {
		*why = CUDA_ERROR_INVALID_DEVICE;
		return false;
	}
	return true;
}

FAKE_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
						CUmemAllocationGranularity_flags option)
{
	FAKE_ENTER(cuMemGetAllocationGranularity);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!granularity || !prop ||
				  (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
				   option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && prop_ok(prop, &r))
		*granularity = VMM_GRAN;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
				      unsigned long long flags)
{
	FAKE_ENTER(cuMemAddressReserve);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!ptr || size == 0 || size % (size_t)getpagesize() || flags ||
				  (alignment & (alignment - 1))))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		size_t align = alignment ? alignment : VMM_GRAN;
		struct vmm_reservation *res = calloc(1, sizeof(*res));
		void *p = MAP_FAILED;
		if (res && size <= SIZE_MAX - align)
			p = mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED) {
			free(res);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			res->map_base = p;
			res->map_size = size + align;
			res->base = ((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1);
			res->size = size;
			res->next = reservations;
			reservations = res;
			*ptr = (CUdeviceptr)res->base;
		}
	}
	(void)addr; /* a hint only */
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	FAKE_ENTER(cuMemAddressFree);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	struct vmm_reservation **pp = &reservations;
	while (r == CUDA_SUCCESS && *pp && (*pp)->base != (uintptr_t)ptr)
		pp = &(*pp)->next;
	if (r == CUDA_SUCCESS && (!*pp || (*pp)->size != size || mapped_bytes((uintptr_t)ptr, size)))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		struct vmm_reservation *res = *pp;
		*pp = res->next;
		munmap(res->map_base, res->map_size);
		free(res);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
			      unsigned long long flags)
{
	FAKE_ENTER(cuMemCreate);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	if (r == CUDA_SUCCESS && (!handle || !prop || flags || size == 0 || size % VMM_GRAN))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS && prop_ok(prop, &r)) {
		int dev = prop->location.id;
		struct vmm_alloc *a = NULL, **grown = NULL;
		if (g_fake.fail_allocs > 0) {
			g_fake.fail_allocs--;
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else if (size > g_fake.capacity - g_fake.used[dev] || fd_locked() < 0) {
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else if (!(a = calloc(1, sizeof(*a))) ||
			   !(grown = realloc(allocs, (nallocs + 1) * sizeof(*allocs)))) {
			free(a);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			allocs = grown;
			a->size = size;
			a->offset = vmm_next_offset;
			vmm_next_offset += (off_t)size;
			a->prop = *prop;
			a->refs = 1;
			allocs[nallocs++] = a;
			g_fake.used[dev] += size;
			*handle = nallocs;
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
	FAKE_ENTER(cuMemRelease);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	struct vmm_alloc *a = handle_get(handle);
	if (r == CUDA_SUCCESS && (!a || a->refs == 0))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		a->refs--;
		alloc_maybe_free(handle);
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
			   unsigned long long flags)
{
	FAKE_ENTER(cuMemMap);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	struct vmm_alloc *a = handle_get(handle);
	uintptr_t p = (uintptr_t)ptr;
	if (r == CUDA_SUCCESS && (flags || size == 0 || p % VMM_GRAN || size % VMM_GRAN || !a || a->refs == 0 ||
				  !reservation_of(p, size) || mapped_bytes(p, size)))
		r = CUDA_ERROR_INVALID_VALUE;
	/* A nonzero offset, or more than the handle holds: the real driver
	 * (580, H100) answers CUDA_ERROR_NOT_SUPPORTED. */
	if (r == CUDA_SUCCESS && (offset || size > a->size))
		r = CUDA_ERROR_NOT_SUPPORTED;
	if (r == CUDA_SUCCESS) {
		struct vmm_mapping *m = calloc(1, sizeof(*m));
		if (!m || mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, vmm_fd, a->offset) == MAP_FAILED) {
			free(m);
			r = CUDA_ERROR_OUT_OF_MEMORY;
		} else {
			*m = (struct vmm_mapping){mappings, p, size, handle, CU_MEM_ACCESS_FLAGS_PROT_NONE};
			mappings = m;
			a->mappings++;
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	FAKE_ENTER(cuMemUnmap);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	uintptr_t p = (uintptr_t)ptr;
	/* The range must be whole mappings: each mapping overlapping it lies
	 * inside it, and together they cover it. */
	size_t inside = 0;
	for (struct vmm_mapping *m = mappings; r == CUDA_SUCCESS && m; m = m->next) {
		bool overlaps = m->addr < p + size && p < m->addr + m->size;
		if (overlaps && (m->addr < p || m->addr + m->size > p + size))
			r = CUDA_ERROR_INVALID_VALUE;
		else if (overlaps)
			inside += m->size;
	}
	/* Unmapped parts of the range are no error: the real driver (580, H100)
	 * answers CUDA_SUCCESS for a range unmapped twice. */
	if (r == CUDA_SUCCESS && (size == 0 || (inside == 0 && !reservation_of(p, size))))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		for (struct vmm_mapping **pp = &mappings; *pp;) {
			struct vmm_mapping *m = *pp;
			if (m->addr >= p && m->addr < p + size) {
				*pp = m->next;
				mmap((void *)m->addr, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
				     -1, 0);
				struct vmm_alloc *a = handle_get(m->handle);
				a->mappings--;
				alloc_maybe_free(m->handle);
				free(m);
			} else {
				pp = &m->next;
			}
		}
	}
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	FAKE_ENTER(cuMemSetAccess);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	uintptr_t p = (uintptr_t)ptr;
	if (r == CUDA_SUCCESS && (!desc || count == 0 || size == 0 || mapped_bytes(p, size) != size))
		r = CUDA_ERROR_INVALID_VALUE;
	unsigned long long flags = CU_MEM_ACCESS_FLAGS_PROT_NONE;
	for (size_t i = 0; r == CUDA_SUCCESS && i < count; i++) {
		if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
			r = CUDA_ERROR_INVALID_VALUE;
		else if (!fake_device_valid(desc[i].location.id))
			r = CUDA_ERROR_INVALID_DEVICE;
		else
			flags = desc[i].flags; /* one device in the fake: the last word wins */
	}
	if (r == CUDA_SUCCESS) {
		int prot = flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? PROT_READ | PROT_WRITE
			   : flags == CU_MEM_ACCESS_FLAGS_PROT_READ    ? PROT_READ
									: PROT_NONE;
		mprotect((void *)p, size, prot);
		for (struct vmm_mapping *m = mappings; m; m = m->next)
			if (m->addr < p + size && p < m->addr + m->size)
				m->access = flags;
	}
	fake_unlock();
	return r;
}

static struct vmm_mapping *mapping_at(uintptr_t p)
{
	for (struct vmm_mapping *m = mappings; m; m = m->next)
		if (p >= m->addr && p - m->addr < m->size)
			return m;
	return NULL;
}

bool fake_vmm_mapped_range_locked(uintptr_t p, size_t n)
{
	struct vmm_mapping *m = mapping_at(p);

	return m && n <= m->size - (p - m->addr);
}

CUresult fake_vmm_pointer_attribute_locked(uintptr_t p, CUpointer_attribute attr, void *data)
{
	struct vmm_mapping *m = mapping_at(p);
	struct vmm_alloc *va = m ? handle_get(m->handle) : NULL;

	if (!m)
		return CUDA_ERROR_NOT_FOUND;
	/* What the driver (580) answers for mapped VMM memory: no context
	 * owns it, the device of its physical allocation does. */
	switch (attr) {
	case CU_POINTER_ATTRIBUTE_CONTEXT:
		*(CUcontext *)data = NULL;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
		*(unsigned int *)data = CU_MEMORYTYPE_DEVICE;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
		*(CUdeviceptr *)data = (CUdeviceptr)p;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
		*(int *)data = va ? va->prop.location.id : 0;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
		*(CUdeviceptr *)data = (CUdeviceptr)m->addr;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
		*(size_t *)data = m->size;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_MAPPED:
		*(int *)data = 1;
		return CUDA_SUCCESS;
	case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
		*(int *)data = 0;
		return CUDA_SUCCESS;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
}

FAKE_API CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
	FAKE_ENTER(cuMemGetAccess);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	struct vmm_mapping *m = mapping_at((uintptr_t)ptr);
	if (r == CUDA_SUCCESS && (!flags || !location || location->type != CU_MEM_LOCATION_TYPE_DEVICE || !m))
		r = CUDA_ERROR_INVALID_VALUE;
	else if (r == CUDA_SUCCESS && !fake_device_valid(location->id))
		r = CUDA_ERROR_INVALID_DEVICE;
	if (r == CUDA_SUCCESS)
		*flags = m->access;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
	FAKE_ENTER(cuMemGetAllocationPropertiesFromHandle);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	struct vmm_alloc *a = handle_get(handle);
	if (r == CUDA_SUCCESS && (!prop || !a || a->refs == 0))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS)
		*prop = a->prop;
	fake_unlock();
	return r;
}

FAKE_API CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
	FAKE_ENTER(cuMemRetainAllocationHandle);
	CUresult r;
	fake_lock();
	r = fake_check_init_locked();
	struct vmm_mapping *m = mapping_at((uintptr_t)addr);
	if (r == CUDA_SUCCESS && (!handle || !m))
		r = CUDA_ERROR_INVALID_VALUE;
	if (r == CUDA_SUCCESS) {
		handle_get(m->handle)->refs++;
		*handle = m->handle;
	}
	fake_unlock();
	return r;
}

void fake_vmm_reset_locked(void)
{
	while (mappings) {
		struct vmm_mapping *m = mappings;
		mappings = m->next;
		free(m);
	}
	while (reservations) {
		struct vmm_reservation *res = reservations;
		reservations = res->next;
		munmap(res->map_base, res->map_size);
		free(res);
	}
	for (size_t i = 0; i < nallocs; i++)
		free(allocs[i]);
	free(allocs);
	allocs = NULL;
	nallocs = 0;
	if (vmm_fd >= 0)
		close(vmm_fd);
	vmm_fd = -2;
	vmm_next_offset = 0;
}
