/* SPDX-License-Identifier: MIT */
/*
 * process/vmm_table.c - what the VMM cache knows, and how it finds it: the
 * tracked vbufs by address (a sorted array: calls name ranges, and a range
 * may fall inside a buffer) and by handle (a hash), the plain reservations
 * and handles that a cuMemMap may still turn into a vbuf (hashes), the
 * lock over all of it, thread ids and the clock. Every function here but
 * the clock and thread id runs with vmm_lock held and calls nobody.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "process/process_internal.h"
#include "process/vmm_internal.h"

#define BUCKETS	  1024

pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t vmm_busy_cond = PTHREAD_COND_INITIALIZER;

/* Tracked vbufs, sorted by address; vbufs by handle. */
static struct vbuf **by_va;
static size_t nva, cap_va;
atomic_size_t vmm_tracked_count; /* nva, read without the lock */
static struct vbuf *by_handle[BUCKETS];

static struct plain_resv *resv_tab[BUCKETS];
static struct plain_handle *hnd_tab[BUCKETS];

uint64_t vmm_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- the tables (vmm_lock held) ------------------------------------------ */

static unsigned bucket(uint64_t key)
{
	return (unsigned)(((key >> 9) * UINT64_C(0x9E3779B97F4A7C15)) >> 54) % BUCKETS;
}

/* The first index whose vbuf starts at or after va. */
static size_t va_lower(CUdeviceptr va)
{
	size_t lo = 0, hi = nva;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (by_va[mid]->va < va)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* The first vbuf overlapping [va, va + max(size, 1)) at index >= *pos, or
 * NULL; advances *pos past it. Start with *pos = SIZE_MAX. */
struct vbuf *vmm_va_next_overlap(CUdeviceptr va, size_t size, size_t *pos)
{
	CUdeviceptr end = va + (size ? size : 1);

	if (*pos == SIZE_MAX) {
		*pos = va_lower(va);
		if (*pos > 0 && by_va[*pos - 1]->va + by_va[*pos - 1]->size > va)
			(*pos)--;
	}
	if (*pos < nva && by_va[*pos]->va < end)
		return by_va[(*pos)++];
	return NULL;
}

struct vbuf *vmm_va_find(CUdeviceptr va)
{
	size_t i = va_lower(va);

	return i < nva && by_va[i]->va == va ? by_va[i] : NULL;
}

bool vmm_va_insert(struct vbuf *v)
{
	size_t i = va_lower(v->va);

	if (nva == cap_va) {
		size_t cap = cap_va ? cap_va * 2 : 64;
		struct vbuf **a = realloc(by_va, cap * sizeof(*a));
		if (!a)
			return false;
		by_va = a;
		cap_va = cap;
	}
	memmove(&by_va[i + 1], &by_va[i], (nva - i) * sizeof(*by_va));
	by_va[i] = v;
	atomic_store_explicit(&vmm_tracked_count, ++nva, memory_order_relaxed);
	return true;
}

void vmm_va_remove(struct vbuf *v)
{
	size_t i = va_lower(v->va);

	if (i < nva && by_va[i] == v) {
		memmove(&by_va[i], &by_va[i + 1], (nva - i - 1) * sizeof(*by_va));
		atomic_store_explicit(&vmm_tracked_count, --nva, memory_order_relaxed);
	}
}

struct vbuf *vmm_handle_find(CUmemGenericAllocationHandle h)
{
	struct vbuf *v = by_handle[bucket(h)];

	while (v && v->handle != h)
		v = v->hnext;
	return v;
}

void vmm_handle_remove(struct vbuf *v)
{
	for (struct vbuf **link = &by_handle[bucket(v->handle)]; *link; link = &(*link)->hnext)
		if (*link == v) {
			*link = v->hnext;
			return;
		}
}

static struct plain_resv **resv_link(CUdeviceptr va)
{
	struct plain_resv **link = &resv_tab[bucket(va)];

	while (*link && (*link)->va != va)
		link = &(*link)->next;
	return link;
}

static struct plain_handle **hnd_link(CUmemGenericAllocationHandle h)
{
	struct plain_handle **link = &hnd_tab[bucket(h)];

	while (*link && (*link)->handle != h)
		link = &(*link)->next;
	return link;
}

/* Without memory a reservation or handle is simply not tracked: it can
 * never become a vbuf, and everything about it goes to the driver. */
void vmm_resv_add(CUdeviceptr va, size_t size)
{
	struct plain_resv *r = *resv_link(va);

	if (!r && (r = malloc(sizeof(*r))) != NULL) {
		r->next = resv_tab[bucket(va)];
		resv_tab[bucket(va)] = r;
	}
	if (r) {
		r->va = va;
		r->size = size;
	}
}

void vmm_resv_del(CUdeviceptr va)
{
	struct plain_resv **link = resv_link(va), *r = *link;

	if (r) {
		*link = r->next;
		free(r);
	}
}

void vmm_hnd_add(CUmemGenericAllocationHandle h, size_t size, const CUmemAllocationProp *prop, bool cacheable)
{
	struct plain_handle *p = *hnd_link(h);

	if (!p && (p = malloc(sizeof(*p))) != NULL) {
		p->next = hnd_tab[bucket(h)];
		hnd_tab[bucket(h)] = p;
	}
	if (p) {
		p->handle = h;
		p->size = size;
		p->prop = *prop;
		p->cacheable = cacheable;
	}
}

void vmm_hnd_del(CUmemGenericAllocationHandle h)
{
	struct plain_handle **link = hnd_link(h), *p = *link;

	if (p) {
		*link = p->next;
		free(p);
	}
}

void vmm_tables_fork_child(void)
{
	/* Leaked: the parent's objects are not the child's. */
	by_va = NULL;
	nva = cap_va = 0;
	atomic_store(&vmm_tracked_count, 0);
	memset(by_handle, 0, sizeof(by_handle));
	memset(resv_tab, 0, sizeof(resv_tab));
	memset(hnd_tab, 0, sizeof(hnd_tab));
}

struct plain_resv *vmm_resv_find(CUdeviceptr va)
{
	return *resv_link(va);
}

struct plain_handle *vmm_hnd_find(CUmemGenericAllocationHandle h)
{
	return *hnd_link(h);
}

void vmm_handle_insert(struct vbuf *v)
{
	v->hnext = by_handle[bucket(v->handle)];
	by_handle[bucket(v->handle)] = v;
}
