/* SPDX-License-Identifier: MIT */
/*
 * allocator/backends/hostsim.c - a simulated GPU for running and testing the
 * allocator without one: replaying traces, CPU unit tests, benchmarks.
 *
 * Each instance (one per context, as for a real device) reserves one range
 * of host address space that is never made accessible
 * (mmap PROT_NONE | MAP_NORESERVE: no memory is committed, and a stray write
 * through a simulated device pointer faults at once). Segments are carved
 * from it by a first-fit range allocator that frees and coalesces, so
 * addresses are unique within the process and reused after a free, like the
 * driver's. Segments of 2 MiB and more are 2 MiB aligned, smaller ones
 * 512 B aligned.
 *
 * Device segments are charged against a simulated capacity
 * (EMM_BACKEND_OPTIONS="capacity=80G", the default; K/M/G/T suffixes, binary)
 * and fail with -ENOMEM past it; mem_info reports capacity minus what is in
 * use. The reservation is twice the capacity (64 MiB at least, so small
 * simulated devices work too), so address-space fragmentation does not fail
 * an allocation the capacity allows. Pinned host segments come
 * from the same range and are not charged (host memory is not the device's).
 *
 * Standalone: the public backend header and libc, nothing of libemm's.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "allocator/backends/backend_util.h"
#include "emm/emm_backend.h"

#ifdef EMM_BACKEND_BUILTIN
#include "allocator/backend_loader.h"
#define HOSTSIM_ENTRY emm_backend_builtin_hostsim
#else
#define HOSTSIM_ENTRY emm_backend_get
__attribute__((visibility("default"))) int emm_backend_get(uint32_t *inout_version,
                                                           const struct emm_backend **ret_table);
#endif

#define MIB                      (UINT64_C(1) << 20)
#define GIB                      (UINT64_C(1) << 30)
#define HOSTSIM_GRAIN            UINT64_C(512) /* sizes round to this */
#define HOSTSIM_LARGE            (2 * MIB)     /* segments this big and up ... */
#define HOSTSIM_LARGE_ALIGN      (2 * MIB)     /* ... start on this boundary */
#define HOSTSIM_DEFAULT_CAPACITY (80 * GIB)
#define HOSTSIM_MIN_RESERVE      (64 * MIB)
#define HOSTSIM_MAX_RESERVE      (UINT64_C(1) << 46) /* 64 TiB, half of x86-64's user space */

struct range {
	uint64_t base;
	uint64_t size;
};

struct live_segment {
	uint64_t base;
	uint64_t size;  /* rounded: what the range allocator gave */
	uint64_t asked; /* what segment_alloc was asked for */
	bool host;      /* pinned host segment (not charged) */
};

struct hostsim {
	const struct emm_backend_host *host;
	int device;
	pthread_mutex_t lock;
	uint64_t capacity;
	uint64_t used; /* device bytes charged */
	void *reservation;
	size_t reservation_size;

	struct range *free_ranges; /* sorted by base, never adjacent (coalesced) */
	size_t free_count, free_capacity;
	struct live_segment *live; /* sorted by base */
	size_t live_count, live_capacity;
};

#define hostsim_log emm_bk_log

static inline uint64_t align_up(uint64_t x, uint64_t align)
{
	return (x + align - 1) & ~(align - 1);
}

/* --- options --- */

/* "80G", "512M", "1073741824", "64KiB": 0 and *ret, or -EINVAL. */
static int parse_size(const char *s, size_t len, uint64_t *ret)
{
	uint64_t value = 0, scale = 1;
	size_t i = 0;

	if (len == 0 || s[0] < '0' || s[0] > '9')
		return -EINVAL;
	for (; i < len && s[i] >= '0' && s[i] <= '9'; i++) {
		if (value > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10)
			return -EINVAL;
		value = value * 10 + (uint64_t)(s[i] - '0');
	}
	if (i < len) {
		switch (s[i]) {
		case 'k':
		case 'K':
			scale = UINT64_C(1) << 10;
			i++;
			break;
		case 'm':
		case 'M':
			scale = UINT64_C(1) << 20;
			i++;
			break;
		case 'g':
		case 'G':
			scale = UINT64_C(1) << 30;
			i++;
			break;
		case 't':
		case 'T':
			scale = UINT64_C(1) << 40;
			i++;
			break;
		default:
			break;
		}
		if (scale > 1 && i < len && s[i] == 'i')
			i++;
		if (i < len && (s[i] == 'B' || s[i] == 'b'))
			i++;
	}
	if (i != len || value == 0 || value > UINT64_MAX / scale)
		return -EINVAL;
	*ret = value * scale;
	return 0;
}

/* Options are "key=value" items separated by commas or spaces. */
static void parse_options(struct hostsim *sim, const char *options)
{
	const char *p = options ? options : "";

	while (*p) {
		size_t len = strcspn(p, ", \t");
		const char *eq = memchr(p, '=', len);

		if (len == 0) {
			p++;
			continue;
		}
		if (eq && (size_t)(eq - p) == strlen("capacity") && strncmp(p, "capacity", 8) == 0) {
			uint64_t capacity;

			if (parse_size(eq + 1, len - (size_t)(eq + 1 - p), &capacity) == 0)
				sim->capacity = capacity;
			else
				hostsim_log(sim->host, EMM_BACKEND_LOG_WARNING,
				            "hostsim backend: bad capacity '%.*s' (want a size like 80G); "
				            "using %llu GiB",
				            (int)len, p,
				            (unsigned long long)(HOSTSIM_DEFAULT_CAPACITY / GIB));
		} else {
			hostsim_log(sim->host, EMM_BACKEND_LOG_WARNING,
			            "hostsim backend: unknown option '%.*s' ignored (known: capacity=SIZE)",
			            (int)len, p);
		}
		p += len;
	}
}

/* --- sorted arrays --- */

static int grow_array(void **array, size_t *capacity, size_t count, size_t elem)
{
	size_t new_capacity;
	void *grown;

	if (count < *capacity)
		return 0;
	new_capacity = *capacity ? *capacity * 2 : 32;
	grown = realloc(*array, new_capacity * elem);
	if (!grown)
		return -ENOMEM;
	*array = grown;
	*capacity = new_capacity;
	return 0;
}

/* Index of the first live segment with base >= addr. */
static size_t live_lower_bound(const struct hostsim *sim, uint64_t addr)
{
	size_t lo = 0, hi = sim->live_count;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (sim->live[mid].base < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Index of the first free range with base >= addr. */
static size_t free_lower_bound(const struct hostsim *sim, uint64_t addr)
{
	size_t lo = 0, hi = sim->free_count;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (sim->free_ranges[mid].base < addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* --- the range allocator (caller holds the lock) --- */

static int range_alloc(struct hostsim *sim, size_t asked, bool host, uint64_t *ret_addr)
{
	uint64_t size = align_up(asked, HOSTSIM_GRAIN);
	uint64_t align = size >= HOSTSIM_LARGE ? HOSTSIM_LARGE_ALIGN : HOSTSIM_GRAIN;
	size_t i, at;

	if (asked == 0)
		return -EINVAL;
	if (size < asked || size > sim->reservation_size)
		return -ENOMEM;
	if (!host && size > sim->capacity - sim->used)
		return -ENOMEM;
	/* Room for one more live entry and for a free range split in three,
	 * before anything changes. */
	if (grow_array((void **)&sim->live, &sim->live_capacity, sim->live_count, sizeof(*sim->live)) < 0 ||
	    grow_array((void **)&sim->free_ranges, &sim->free_capacity, sim->free_count,
	               sizeof(*sim->free_ranges)) < 0)
		return -ENOMEM;

	for (i = 0; i < sim->free_count; i++) {
		struct range r = sim->free_ranges[i];
		uint64_t start = align_up(r.base, align);
		uint64_t end = r.base + r.size;
		bool lead, tail;

		if (start >= end || end - start < size)
			continue;
		lead = start > r.base;
		tail = start + size < end;
		if (lead && tail) {
			memmove(&sim->free_ranges[i + 2], &sim->free_ranges[i + 1],
			        (sim->free_count - i - 1) * sizeof(*sim->free_ranges));
			sim->free_ranges[i] = (struct range){r.base, start - r.base};
			sim->free_ranges[i + 1] = (struct range){start + size, end - start - size};
			sim->free_count++;
		} else if (lead) {
			sim->free_ranges[i].size = start - r.base;
		} else if (tail) {
			sim->free_ranges[i] = (struct range){start + size, end - start - size};
		} else {
			memmove(&sim->free_ranges[i], &sim->free_ranges[i + 1],
			        (sim->free_count - i - 1) * sizeof(*sim->free_ranges));
			sim->free_count--;
		}

		at = live_lower_bound(sim, start);
		memmove(&sim->live[at + 1], &sim->live[at], (sim->live_count - at) * sizeof(*sim->live));
		sim->live[at] =
		    (struct live_segment){.base = start, .size = size, .asked = asked, .host = host};
		sim->live_count++;
		if (!host)
			sim->used += size;
		*ret_addr = start;
		return 0;
	}
	return -ENOMEM; /* address space fragmented or exhausted */
}

static int range_free(struct hostsim *sim, uint64_t addr, size_t asked, bool host)
{
	size_t at = live_lower_bound(sim, addr);
	struct live_segment seg;
	struct range *fr;
	bool merge_prev, merge_next;
	size_t i;

	if (at == sim->live_count || sim->live[at].base != addr || sim->live[at].host != host)
		return -EINVAL;
	seg = sim->live[at];
	if (asked != seg.asked && align_up(asked, HOSTSIM_GRAIN) != seg.size)
		return -EINVAL;
	if (grow_array((void **)&sim->free_ranges, &sim->free_capacity, sim->free_count,
	               sizeof(*sim->free_ranges)) < 0)
		return -ENOMEM;

	memmove(&sim->live[at], &sim->live[at + 1], (sim->live_count - at - 1) * sizeof(*sim->live));
	sim->live_count--;
	if (!host)
		sim->used -= seg.size;

	fr = sim->free_ranges;
	i = free_lower_bound(sim, seg.base);
	merge_prev = i > 0 && fr[i - 1].base + fr[i - 1].size == seg.base;
	merge_next = i < sim->free_count && seg.base + seg.size == fr[i].base;
	if (merge_prev && merge_next) {
		fr[i - 1].size += seg.size + fr[i].size;
		memmove(&fr[i], &fr[i + 1], (sim->free_count - i - 1) * sizeof(*fr));
		sim->free_count--;
	} else if (merge_prev) {
		fr[i - 1].size += seg.size;
	} else if (merge_next) {
		fr[i].base = seg.base;
		fr[i].size += seg.size;
	} else {
		memmove(&fr[i + 1], &fr[i], (sim->free_count - i) * sizeof(*fr));
		fr[i] = (struct range){seg.base, seg.size};
		sim->free_count++;
	}
	return 0;
}

/* --- the backend --- */

static void hostsim_destroy(struct hostsim *sim)
{
	if (sim->reservation)
		munmap(sim->reservation, sim->reservation_size);
	free(sim->free_ranges);
	free(sim->live);
	pthread_mutex_destroy(&sim->lock);
	free(sim);
}

/* Reserve twice the capacity, or less where the address space (RLIMIT_AS,
 * valgrind) will not give that much. */
static int hostsim_reserve(struct hostsim *sim)
{
	uint64_t want = sim->capacity > HOSTSIM_MAX_RESERVE / 2 ? HOSTSIM_MAX_RESERVE : sim->capacity * 2;
	uint64_t start, usable;
	void *p = MAP_FAILED;

	want = align_up(want, HOSTSIM_LARGE_ALIGN) + HOSTSIM_LARGE_ALIGN;
	/* A small device (a 16 MiB capacity) still gets the smallest
	 * reservation: the halving below never goes under it. */
	if (want < HOSTSIM_MIN_RESERVE)
		want = HOSTSIM_MIN_RESERVE;
	for (; want >= HOSTSIM_MIN_RESERVE; want /= 2) {
		if (want > SIZE_MAX)
			continue;
		p = mmap(NULL, (size_t)want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p != MAP_FAILED)
			break;
	}
	if (p == MAP_FAILED) {
		hostsim_log(sim->host, EMM_BACKEND_LOG_ERROR,
		            "hostsim backend: cannot reserve even %llu MiB of address space",
		            (unsigned long long)(HOSTSIM_MIN_RESERVE / MIB));
		return -ENOMEM;
	}
	sim->reservation = p;
	sim->reservation_size = (size_t)want;
	/* The usable range starts on a 2 MiB boundary, like device memory. */
	start = align_up((uint64_t)(uintptr_t)p, HOSTSIM_LARGE_ALIGN);
	usable = ((uint64_t)(uintptr_t)p + want - start) & ~(HOSTSIM_LARGE_ALIGN - 1);
	if (usable < sim->capacity)
		hostsim_log(sim->host, EMM_BACKEND_LOG_WARNING,
		            "hostsim backend: only %llu MiB of address space for a capacity of %llu MiB",
		            (unsigned long long)(usable / MIB), (unsigned long long)(sim->capacity / MIB));
	sim->free_ranges = malloc(32 * sizeof(*sim->free_ranges));
	if (!sim->free_ranges)
		return -ENOMEM;
	sim->free_capacity = 32;
	sim->free_ranges[0] = (struct range){start, usable};
	sim->free_count = 1;
	return 0;
}

static int hostsim_init(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state)
{
	struct hostsim *sim;
	int ret;

	if (!ret_state)
		return -EINVAL;
	sim = calloc(1, sizeof(*sim));
	if (!sim)
		return -ENOMEM;
	sim->host = host;
	sim->device = device;
	sim->capacity = HOSTSIM_DEFAULT_CAPACITY;
	pthread_mutex_init(&sim->lock, NULL);
	parse_options(sim, host ? host->options : NULL);
	ret = hostsim_reserve(sim);
	if (ret < 0) {
		hostsim_destroy(sim);
		return ret;
	}
	hostsim_log(host, EMM_BACKEND_LOG_DEBUG,
	            "hostsim backend: device %d, context 0x%llx, capacity %llu MiB at 0x%llx", device,
	            (unsigned long long)context, (unsigned long long)(sim->capacity / MIB),
	            (unsigned long long)sim->free_ranges[0].base);
	*ret_state = sim;
	return 0;
}

static void hostsim_fini(void *state, bool driver_alive)
{
	if (state)
		hostsim_destroy(state);
}

/* Device and pinned host segments: the same range allocator, under the lock. */
static int locked_alloc(struct hostsim *sim, size_t size, bool host, uint64_t *ret_addr)
{
	uint64_t addr;
	int ret;

	if (!ret_addr)
		return -EINVAL;
	pthread_mutex_lock(&sim->lock);
	ret = range_alloc(sim, size, host, &addr);
	pthread_mutex_unlock(&sim->lock);
	if (ret == 0)
		*ret_addr = addr;
	return ret;
}

static int locked_free(struct hostsim *sim, uint64_t addr, size_t size, bool host)
{
	int ret;

	pthread_mutex_lock(&sim->lock);
	ret = range_free(sim, addr, size, host);
	pthread_mutex_unlock(&sim->lock);
	return ret;
}

static int hostsim_segment_alloc(void *state, size_t size, uint64_t stream, uint64_t *ret_addr)
{
	return locked_alloc(state, size, false, ret_addr);
}

static int hostsim_segment_free(void *state, uint64_t addr, size_t size, uint64_t stream)
{
	return locked_free(state, addr, size, false);
}

static int hostsim_mem_info(void *state, size_t *ret_free, size_t *ret_total)
{
	struct hostsim *sim = state;
	uint64_t used;

	pthread_mutex_lock(&sim->lock);
	used = sim->used;
	pthread_mutex_unlock(&sim->lock);
	if (ret_free)
		*ret_free = (size_t)(sim->capacity - used);
	if (ret_total)
		*ret_total = (size_t)sim->capacity;
	return 0;
}

static int hostsim_host_segment_alloc(void *state, size_t size, unsigned flags, uint64_t *ret_addr)
{
	return locked_alloc(state, size, true, ret_addr);
}

static int hostsim_host_segment_free(void *state, uint64_t addr, size_t size)
{
	return locked_free(state, addr, size, true);
}

static const struct emm_backend hostsim_backend = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
    .struct_size = sizeof(struct emm_backend),
    .name = "hostsim",
    .caps = EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_SIMULATED | EMM_BACKEND_CAP_HOST_PINNED,
    .init = hostsim_init,
    .fini = hostsim_fini,
    .segment_alloc = hostsim_segment_alloc,
    .segment_free = hostsim_segment_free,
    .mem_info = hostsim_mem_info,
    .trim = NULL,
    .host_segment_alloc = hostsim_host_segment_alloc,
    .host_segment_free = hostsim_host_segment_free,
};

int HOSTSIM_ENTRY(uint32_t *inout_version, const struct emm_backend **ret_table)
{
	return emm_bk_negotiate(inout_version, ret_table, &hostsim_backend, 1);
}
