/* SPDX-License-Identifier: MIT */
/*
 * process/annotate_regions.c - the regions libemm has registered with a
 * memory checker and not yet unregistered (annotate.c), so that it never
 * unregisters one the tool does not hold: the tool reports such a call as
 * an error of the program's ("Call to nvtxMemRegionsUnregister failed: One
 * or more of the parameters is invalid", race-multidevice under memcheck
 * on two GPUs). A region's heap going away (its segment given back, its
 * context gone) takes the heap's regions with it in the tool, and here.
 * So does another device's gaining access to the region's device's memory:
 * the tool then refuses the unregister of every region registered there
 * before (tests/gpu/probe_nvtx_unreg.cu, case peer10, on two H200), and as
 * cudart enables peer access through calls libemm does not see, a device's
 * regions are forgotten when its annotations go off (annotate_peer.c).
 *
 * Used only while annotations are on (a tool is attached), so it is plain:
 * a fixed array of buckets of malloc'd nodes under one mutex.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "process/annotate.h"

#define BUCKETS 4096u

struct region {
	uint64_t addr;
	int device;
	struct region *next;
};

static pthread_mutex_t regions_lock = PTHREAD_MUTEX_INITIALIZER;
static struct region *buckets[BUCKETS];

static unsigned bucket_of(uint64_t addr)
{
	return (unsigned)((addr >> 9) * UINT64_C(0x9e3779b97f4a7c15) >> 52) & (BUCKETS - 1);
}

bool st_region_note(uint64_t addr, int device)
{
	struct region *r = malloc(sizeof(*r));
	unsigned b = bucket_of(addr);

	if (!r)
		return false;
	r->addr = addr;
	r->device = device;
	pthread_mutex_lock(&regions_lock);
	for (struct region *o = buckets[b]; o; o = o->next) {
		if (o->addr == addr) { /* registered again: one is enough */
			pthread_mutex_unlock(&regions_lock);
			free(r);
			return true;
		}
	}
	r->next = buckets[b];
	buckets[b] = r;
	pthread_mutex_unlock(&regions_lock);
	return true;
}

bool st_region_forget(uint64_t addr)
{
	struct region **link, *r = NULL;

	pthread_mutex_lock(&regions_lock);
	for (link = &buckets[bucket_of(addr)]; *link; link = &(*link)->next) {
		if ((*link)->addr == addr) {
			r = *link;
			*link = r->next;
			break;
		}
	}
	pthread_mutex_unlock(&regions_lock);
	free(r);
	return r != NULL;
}

/* Forget every region in [base, base + size) if device < 0, else every
 * region of `device`; the count. */
static size_t forget_where(uint64_t base, size_t size, int device)
{
	struct region *dead = NULL;
	size_t n = 0;

	pthread_mutex_lock(&regions_lock);
	for (unsigned b = 0; b < BUCKETS; b++) {
		struct region **link = &buckets[b];
		while (*link) {
			struct region *r = *link;
			if (device < 0 ? r->addr - base < size : r->device == device) {
				*link = r->next;
				r->next = dead;
				dead = r;
				n++;
			} else {
				link = &r->next;
			}
		}
	}
	pthread_mutex_unlock(&regions_lock);
	while (dead) {
		struct region *r = dead;
		dead = r->next;
		free(r);
	}
	return n;
}

void st_region_forget_range(uint64_t base, size_t size)
{
	(void)forget_where(base, size, -1);
}

size_t st_regions_forget_device(int device)
{
	return device < 0 ? 0 : forget_where(0, 0, device);
}

void st_regions_fork_child(void)
{
	/* Another thread may have held the lock; the nodes are leaked. */
	pthread_mutex_init(&regions_lock, NULL);
	for (unsigned b = 0; b < BUCKETS; b++)
		buckets[b] = NULL;
}
