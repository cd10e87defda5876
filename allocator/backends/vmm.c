/* SPDX-License-Identifier: MIT */
/*
 * allocator/backends/vmm.c - device memory through the driver's virtual
 * memory management: each segment is an address range from
 * cuMemAddressReserve, backed page by page with cuMemCreate + cuMemMap +
 * cuMemSetAccess, so libemm can give back the pages under free blocks
 * (segment_unmap: cuMemUnmap + cuMemRelease, the range stays reserved),
 * back them again (segment_map) and grow a segment in place (segment_grow).
 * Interface version 2, caps DEVICE | REMAP | GROW.
 *
 * Pages: one physical allocation (handle) per page, recorded per segment,
 * because cuMemUnmap cannot unmap part of a mapping: a page given back is
 * exactly one handle. The page size is the driver's
 * CU_MEM_ALLOC_GRANULARITY_RECOMMENDED granularity for pinned device memory
 * of the context's device (2 MiB on Hopper), or the MINIMUM one when the
 * recommended one is missing or not a multiple of it: the recommended one is
 * the driver's choice for performance and is what PyTorch's expandable
 * segments use, and a smaller page would multiply the handles (and the
 * create/map calls) for little gain in give-back. EMM_BACKEND_OPTIONS
 * "page=SIZE" overrides it (a power of two, a multiple of the minimum).
 *
 * Reservations: a segment of at least grow_min bytes (default 4 MiB, so
 * the large pool's but not the small pool's 2 MiB segments) reserves
 * `reserve` bytes of address space (default: the device's total memory),
 * so it can grow in place to the whole device; smaller ones reserve their
 * size. "reserve=SIZE,grow_min=SIZE" override. If the big reservation is
 * refused, the segment reserves its size only (it then cannot grow).
 *
 * Not served: pinned host memory (no CAP_HOST_PINNED: libemm passes pinned
 * allocations to the driver with this backend), IPC (cuIpcGetMemHandle does
 * not accept VMM memory). All driver functions come from host->driver_proc
 * (libemm intercepts exported names). One mutex per state, held across the
 * driver calls of one method (libemm calls methods with its own locks
 * dropped; the backend's lock only orders its own bookkeeping).
 *
 * One file, two builds, like driver.c: libemm-backend-vmm.so exporting
 * emm_backend_get, or compiled into libemm with -DEMM_BACKEND_BUILTIN.
 */
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/backends/backend_util.h"
#include "emm/emm_backend.h"

#ifdef EMM_BACKEND_BUILTIN
#include "allocator/backend_loader.h"
#define VMM_ENTRY emm_backend_builtin_vmm
#else
#define VMM_ENTRY emm_backend_get
__attribute__((visibility("default"))) int emm_backend_get(uint32_t *inout_version,
                                                           const struct emm_backend **ret_table);
#endif

#define MIB ((size_t)1 << 20)

typedef CUresult (*reserve_fn)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*addr_free_fn)(CUdeviceptr, size_t);
typedef CUresult (*create_fn)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*release_fn)(CUmemGenericAllocationHandle);
typedef CUresult (*map_fn)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*unmap_fn)(CUdeviceptr, size_t);
typedef CUresult (*set_access_fn)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*granularity_fn)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*mem_get_info_fn)(size_t *, size_t *);
typedef CUresult (*total_mem_fn)(size_t *, CUdevice);

struct vmm_seg {
	uint64_t base;
	size_t reserved;			/* address range reserved */
	size_t size;				/* current size (segment_grow moves it) */
	CUmemGenericAllocationHandle *pages;	/* per page; 0: not mapped */
	unsigned char *mapped;			/* per page: 1 mapped (a handle may be 0) */
	size_t cap;				/* entries allocated in both */
};

struct vmm_state {
	const struct emm_backend_host *host;
	int device;
	pthread_mutex_t lock;
	size_t page, reserve, grow_min;
	CUmemAllocationProp prop;
	CUmemAccessDesc access;
	struct vmm_seg **segs; /* sorted by base */
	size_t nsegs, capsegs;

	reserve_fn addr_reserve;
	addr_free_fn addr_free;
	create_fn create;
	release_fn release;
	map_fn map;
	unmap_fn unmap;
	set_access_fn set_access;
	granularity_fn granularity;
	mem_get_info_fn mem_get_info;
	total_mem_fn total_mem;
};

#define vmm_log emm_bk_log

static int vmm_error(const struct vmm_state *st, const char *what, size_t size, CUresult res)
{
	return emm_bk_error(st->host, EMM_BACKEND_LOG_WARNING, "vmm", st->device, what, size, res);
}

/* --- options ---------------------------------------------------------------- */

/* "12", "4K", "2M", "80G", "1T" (binary); 0 or -EINVAL. */
static int parse_size(const char *s, size_t len, size_t *ret)
{
	size_t value = 0, i = 0;
	unsigned shift = 0;

	if (len == 0 || s[0] < '0' || s[0] > '9')
		return -EINVAL;
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
		if (value > (SIZE_MAX - 9) / 10)
			return -EINVAL;
		value = value * 10 + (size_t)(s[i] - '0');
	}
	if (i < len) {
		const char *units = "KMGT", *u = memchr(units, s[i] & ~0x20, 4);
		if (!u || s[i] == '\0')
			return -EINVAL;
		shift = 10u * (unsigned)(u - units + 1);
		i++;
	}
	if (i != len || (shift && value > (SIZE_MAX >> shift)))
		return -EINVAL;
	*ret = value << shift;
	return 0;
}

static void parse_options(struct vmm_state *st, const char *options, size_t *page)
{
	const char *p = options ? options : "";

	while (*p) {
		size_t len = strcspn(p, ", \t");
		const char *eq = memchr(p, '=', len);
		size_t value = 0, klen = eq ? (size_t)(eq - p) : len;
		bool ok = eq && parse_size(eq + 1, len - klen - 1, &value) == 0 && value > 0;

		if (len == 0) {
			p++;
			continue;
		}
		if (ok && klen == 4 && strncmp(p, "page", 4) == 0)
			*page = value;
		else if (ok && klen == 7 && strncmp(p, "reserve", 7) == 0)
			st->reserve = value;
		else if (ok && klen == 8 && strncmp(p, "grow_min", 8) == 0)
			st->grow_min = value;
		else
			vmm_log(st->host, EMM_BACKEND_LOG_WARNING,
			        "vmm backend: ignoring option '%.*s' (page=, reserve=, grow_min= with a size)",
			        (int)len, p);
		p += len;
	}
}

/* --- segments --------------------------------------------------------------- */

/* Index of the segment at exactly `base`, or -1. Lock held. */
static long seg_find(const struct vmm_state *st, uint64_t base)
{
	size_t lo = 0, hi = st->nsegs;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (st->segs[mid]->base < base)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < st->nsegs && st->segs[lo]->base == base ? (long)lo : -1;
}

static int seg_insert(struct vmm_state *st, struct vmm_seg *s)
{
	size_t i = 0;

	if (st->nsegs == st->capsegs) {
		size_t cap = st->capsegs ? st->capsegs * 2 : 16;
		struct vmm_seg **n = realloc(st->segs, cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		st->segs = n;
		st->capsegs = cap;
	}
	while (i < st->nsegs && st->segs[i]->base < s->base)
		i++;
	memmove(&st->segs[i + 1], &st->segs[i], (st->nsegs - i) * sizeof(st->segs[0]));
	st->segs[i] = s;
	st->nsegs++;
	return 0;
}

static int seg_pages_reserve(struct vmm_seg *s, size_t n)
{
	if (n <= s->cap)
		return 0;
	size_t cap = s->cap ? s->cap : 8;
	while (cap < n)
		cap *= 2;
	CUmemGenericAllocationHandle *p = realloc(s->pages, cap * sizeof(*p));
	if (!p)
		return -ENOMEM;
	s->pages = p;
	unsigned char *m = realloc(s->mapped, cap);
	if (!m)
		return -ENOMEM;
	s->mapped = m;
	memset(s->pages + s->cap, 0, (cap - s->cap) * sizeof(*p));
	memset(s->mapped + s->cap, 0, cap - s->cap);
	s->cap = cap;
	return 0;
}

/* Unmap and release pages [from, to) that are mapped; the first error. */
static int pages_unmap(struct vmm_state *st, struct vmm_seg *s, size_t from, size_t to)
{
	int err = 0;

	for (size_t i = from; i < to; i++) {
		if (!s->mapped[i])
			continue;
		CUresult res = st->unmap((CUdeviceptr)(s->base + i * st->page), st->page);
		if (res != CUDA_SUCCESS) {
			if (!err)
				err = vmm_error(st, "cuMemUnmap", st->page, res);
			continue;
		}
		res = st->release(s->pages[i]);
		if (res != CUDA_SUCCESS && !err)
			err = vmm_error(st, "cuMemRelease", st->page, res);
		s->pages[i] = 0;
		s->mapped[i] = 0;
	}
	return err;
}

/* Create, map and make accessible pages [from, to), none of them mapped.
 * On failure every page made here is undone. */
static int pages_map(struct vmm_state *st, struct vmm_seg *s, size_t from, size_t to)
{
	size_t i;
	CUresult res = CUDA_SUCCESS;
	const char *what = "cuMemCreate";

	for (i = from; i < to; i++) {
		CUmemGenericAllocationHandle h = 0;
		res = st->create(&h, st->page, &st->prop, 0);
		if (res != CUDA_SUCCESS)
			break;
		res = st->map((CUdeviceptr)(s->base + i * st->page), st->page, 0, h, 0);
		if (res != CUDA_SUCCESS) {
			what = "cuMemMap";
			st->release(h);
			break;
		}
		s->pages[i] = h;
		s->mapped[i] = 1;
	}
	if (res == CUDA_SUCCESS) {
		/* One call for the whole run (it may span several mappings). */
		res = st->set_access((CUdeviceptr)(s->base + from * st->page), (to - from) * st->page, &st->access, 1);
		what = "cuMemSetAccess";
		if (res == CUDA_SUCCESS)
			return 0;
	}
	int err = vmm_error(st, what, (to - from) * st->page, res);
	pages_unmap(st, s, from, i);
	return err;
}

/* --- methods ---------------------------------------------------------------- */

static void *proc(const struct emm_backend_host *host, const char *name)
{
	return host->driver_proc ? host->driver_proc(name) : NULL;
}

static int vmm_init(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state)
{
	struct vmm_state *st;
	size_t min = 0, rec = 0, page = 0, total = 0;

	if (!host || !ret_state)
		return -EINVAL;
	st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->host = host;
	st->device = device;
	*(void **)&st->addr_reserve = proc(host, "cuMemAddressReserve");
	*(void **)&st->addr_free = proc(host, "cuMemAddressFree");
	*(void **)&st->create = proc(host, "cuMemCreate");
	*(void **)&st->release = proc(host, "cuMemRelease");
	*(void **)&st->map = proc(host, "cuMemMap");
	*(void **)&st->unmap = proc(host, "cuMemUnmap");
	*(void **)&st->set_access = proc(host, "cuMemSetAccess");
	*(void **)&st->granularity = proc(host, "cuMemGetAllocationGranularity");
	*(void **)&st->mem_get_info = proc(host, "cuMemGetInfo_v2");
	*(void **)&st->total_mem = proc(host, "cuDeviceTotalMem_v2");
	if (!st->addr_reserve || !st->addr_free || !st->create || !st->release || !st->map || !st->unmap ||
	    !st->set_access || !st->granularity || !st->mem_get_info) {
		vmm_log(host, EMM_BACKEND_LOG_ERROR, "vmm backend: the driver lacks the virtual memory management API");
		free(st);
		return -ENOENT;
	}
	st->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	st->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	st->prop.location.id = device;
	st->access.location = st->prop.location;
	st->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if (st->granularity(&min, &st->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || min == 0) {
		vmm_log(host, EMM_BACKEND_LOG_ERROR, "vmm backend: no allocation granularity for device %d", device);
		free(st);
		return -ENOTSUP;
	}
	if (st->granularity(&rec, &st->prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || rec == 0 ||
	    rec % min)
		rec = min;
	page = rec;
	st->grow_min = 4 * MIB;
	if (!st->total_mem || st->total_mem(&total, device) != CUDA_SUCCESS)
		st->mem_get_info(NULL, &total);
	st->reserve = total;
	parse_options(st, host->options, &page);
	if (page < 512 || (page & (page - 1)) || page % min) {
		vmm_log(host, EMM_BACKEND_LOG_WARNING,
		        "vmm backend: page %zu is not a power of two multiple of the granularity %zu; using %zu", page,
		        min, rec);
		page = rec;
	}
	if (page & (page - 1)) {
		vmm_log(host, EMM_BACKEND_LOG_ERROR, "vmm backend: granularity %zu is not a power of two", page);
		free(st);
		return -ENOTSUP;
	}
	st->page = page;
	st->reserve = (st->reserve + page - 1) & ~(page - 1);
	if (pthread_mutex_init(&st->lock, NULL)) {
		free(st);
		return -ENOMEM;
	}
	vmm_log(host, EMM_BACKEND_LOG_DEBUG,
	        "vmm backend: device %d, context 0x%llx, page %zu (minimum %zu), reserve %zu for segments >= %zu",
	        device, (unsigned long long)context, page, min, st->reserve, st->grow_min);
	*ret_state = st;
	return 0;
}

static void seg_destroy(struct vmm_seg *s)
{
	free(s->pages);
	free(s->mapped);
	free(s);
}

static void vmm_fini(void *state, bool driver_alive)
{
	struct vmm_state *st = state;

	/* libemm returned its segments; any left die with the context (or
	 * are given back here while the driver lives). */
	for (size_t i = 0; i < st->nsegs; i++) {
		struct vmm_seg *s = st->segs[i];
		if (driver_alive) {
			pages_unmap(st, s, 0, s->size / st->page);
			st->addr_free((CUdeviceptr)s->base, s->reserved);
		}
		seg_destroy(s);
	}
	free(st->segs);
	pthread_mutex_destroy(&st->lock);
	free(st);
}

static int vmm_segment_alloc(void *state, size_t size, uint64_t stream, uint64_t *ret_addr)
{
	struct vmm_state *st = state;
	struct vmm_seg *s;
	CUdeviceptr base = 0;
	CUresult res;
	int err;

	if (size == 0 || !ret_addr || size > SIZE_MAX - st->page)
		return -EINVAL;
	size = (size + st->page - 1) & ~(st->page - 1);
	s = calloc(1, sizeof(*s));
	if (!s || seg_pages_reserve(s, size / st->page)) {
		if (s)
			seg_destroy(s);
		return -ENOMEM;
	}
	s->reserved = size >= st->grow_min && st->reserve > size ? st->reserve : size;
	pthread_mutex_lock(&st->lock);
	res = st->addr_reserve(&base, s->reserved, st->page, 0, 0);
	if (res != CUDA_SUCCESS && s->reserved > size) {
		s->reserved = size;
		res = st->addr_reserve(&base, s->reserved, st->page, 0, 0);
	}
	if (res != CUDA_SUCCESS) {
		err = vmm_error(st, "cuMemAddressReserve", s->reserved, res);
		goto fail;
	}
	s->base = base;
	s->size = size;
	err = pages_map(st, s, 0, size / st->page);
	if (!err)
		err = seg_insert(st, s);
	if (err) {
		pages_unmap(st, s, 0, size / st->page);
		st->addr_free(base, s->reserved);
		goto fail;
	}
	pthread_mutex_unlock(&st->lock);
	*ret_addr = base;
	return 0;
fail:
	pthread_mutex_unlock(&st->lock);
	seg_destroy(s);
	return err;
}

static int vmm_segment_free(void *state, uint64_t addr, size_t size, uint64_t stream)
{
	struct vmm_state *st = state;
	int err;

	pthread_mutex_lock(&st->lock);
	long i = seg_find(st, addr);
	if (i < 0) {
		pthread_mutex_unlock(&st->lock);
		return -EINVAL;
	}
	struct vmm_seg *s = st->segs[i];
	err = pages_unmap(st, s, 0, s->size / st->page);
	if (!err) {
		CUresult res = st->addr_free((CUdeviceptr)s->base, s->reserved);
		if (res != CUDA_SUCCESS)
			err = vmm_error(st, "cuMemAddressFree", s->reserved, res);
	}
	if (!err) {
		memmove(&st->segs[i], &st->segs[i + 1], (st->nsegs - (size_t)i - 1) * sizeof(st->segs[0]));
		st->nsegs--;
	}
	pthread_mutex_unlock(&st->lock);
	if (!err)
		seg_destroy(s);
	return err;
}

static int vmm_mem_info(void *state, size_t *ret_free, size_t *ret_total)
{
	struct vmm_state *st = state;

	return emm_bk_mem_info(st->host, EMM_BACKEND_LOG_WARNING, "vmm", st->device, st->mem_get_info, ret_free, ret_total);
}

static int vmm_granularity(void *state, size_t *ret)
{
	struct vmm_state *st = state;

	if (!ret)
		return -EINVAL;
	*ret = st->page;
	return 0;
}

/* The segment at seg_addr with [offset, + length) inside it, whole pages;
 * lock held. */
static struct vmm_seg *seg_range(struct vmm_state *st, uint64_t seg_addr, size_t offset, size_t length)
{
	long i = seg_find(st, seg_addr);

	if (i < 0 || length == 0 || offset % st->page || length % st->page)
		return NULL;
	struct vmm_seg *s = st->segs[i];
	if (offset > s->size || length > s->size - offset)
		return NULL;
	return s;
}

static int vmm_segment_unmap(void *state, uint64_t seg_addr, size_t seg_size, size_t offset, size_t length)
{
	struct vmm_state *st = state;
	int err;

	pthread_mutex_lock(&st->lock);
	struct vmm_seg *s = seg_range(st, seg_addr, offset, length);
	size_t from = offset / st->page, to = (offset + length) / st->page;
	err = s ? 0 : -EINVAL;
	for (size_t i = from; s && i < to && !err; i++)
		if (!s->mapped[i])
			err = -EINVAL; /* libemm never unmaps a page twice */
	if (!err) {
		err = pages_unmap(st, s, from, to);
		if (err) {
			/* All or nothing: back what went before the failure. */
			for (size_t i = from; i < to; i++) {
				if (s->mapped[i])
					continue;
				size_t j = i;
				while (j < to && !s->mapped[j])
					j++;
				if (pages_map(st, s, i, j))
					vmm_log(st->host, EMM_BACKEND_LOG_ERROR,
					        "vmm backend: pages at 0x%llx lost their memory after a failed unmap",
					        (unsigned long long)(s->base + i * st->page));
				i = j;
			}
		}
	}
	pthread_mutex_unlock(&st->lock);
	return err;
}

static int vmm_segment_map(void *state, uint64_t seg_addr, size_t seg_size, size_t offset, size_t length)
{
	struct vmm_state *st = state;
	int err;

	pthread_mutex_lock(&st->lock);
	struct vmm_seg *s = seg_range(st, seg_addr, offset, length);
	size_t from = offset / st->page, to = (offset + length) / st->page;
	err = s ? 0 : -EINVAL;
	for (size_t i = from; s && i < to && !err; i++)
		if (s->mapped[i])
			err = -EINVAL;
	if (!err)
		err = pages_map(st, s, from, to);
	pthread_mutex_unlock(&st->lock);
	return err;
}

static int vmm_segment_grow(void *state, uint64_t seg_addr, size_t old_size, size_t new_size)
{
	struct vmm_state *st = state;
	int err = 0;

	pthread_mutex_lock(&st->lock);
	long i = seg_find(st, seg_addr);
	struct vmm_seg *s = i < 0 ? NULL : st->segs[i];
	if (!s || old_size != s->size || new_size <= old_size || new_size % st->page)
		err = -EINVAL;
	else if (new_size > s->reserved)
		err = -ENOSPC;
	else if (seg_pages_reserve(s, new_size / st->page))
		err = -ENOMEM;
	if (!err)
		err = pages_map(st, s, old_size / st->page, new_size / st->page);
	if (!err)
		s->size = new_size;
	pthread_mutex_unlock(&st->lock);
	return err;
}

static const struct emm_backend vmm_backend = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
    .struct_size = sizeof(struct emm_backend),
    .name = "vmm",
    .caps = EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_REMAP | EMM_BACKEND_CAP_GROW,
    .init = vmm_init,
    .fini = vmm_fini,
    .segment_alloc = vmm_segment_alloc,
    .segment_free = vmm_segment_free,
    .mem_info = vmm_mem_info,
    .trim = NULL,
    .host_segment_alloc = NULL,
    .host_segment_free = NULL,
    .granularity = vmm_granularity,
    .segment_unmap = vmm_segment_unmap,
    .segment_map = vmm_segment_map,
    .segment_grow = vmm_segment_grow,
};

int VMM_ENTRY(uint32_t *inout_version, const struct emm_backend **ret_table)
{
	/* Page-granular segments need version 2: a libemm that speaks only
	 * version 1 could not give pages back, so this backend declines. */
	return emm_bk_negotiate(inout_version, ret_table, &vmm_backend, 2);
}
