/* SPDX-License-Identifier: MIT */
/*
 * process/oom_report.c - the out-of-memory report: when an allocation
 * finally fails (after the heap gave its idle memory back and retried), one
 * error line in the spirit of PyTorch's: what was asked, the device's total
 * and free memory, what libemm holds allocated and reserved but
 * unallocated, its largest free block, what is used outside libemm, and
 * which setting would help.
 *
 * Printed without EMM_VERBOSE, once per burst: failures less than a second
 * apart are one burst (a program that backs off and retries smaller sizes
 * gets one report); the next report counts the failures it did not print.
 * Formatted on the stack with one write (common/log.h): nothing here
 * allocates, and it runs with no lock held (the backend's mem_info may call
 * the driver's cuMemGetInfo).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "allocator/heap_options.h"
#include "common/format.h"
#include "common/log.h"
#include "process/process.h"
#include "process/process_internal.h"

#define BURST_NS 1000000000ull

static atomic_uint_fast64_t last_failure_ns;
static atomic_uint_fast64_t unreported;

/* True when this failure starts a burst (and should be reported). */
static bool burst_begins(void)
{
	struct timespec ts;
	uint64_t now, prev;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + 1; /* never 0 */
	prev = atomic_exchange(&last_failure_ns, now);
	if (prev && now - prev < BURST_NS) {
		atomic_fetch_add(&unreported, 1);
		return false;
	}
	return true;
}

/* The device's total and free memory as the backend sees it; false when
 * unknown (pinned host heap, no context, no mem_info). */
static bool device_info(size_t *ret_free, size_t *ret_total)
{
	struct ctx_entry *e;
	int r;

	if (!st_backend.table || !st_backend.table->mem_info || st_current_entry(&e, false) < 0 ||
	    !e->backend_state)
		return false;
	st_tls_in_backend = true;
	r = st_backend.table->mem_info(e->backend_state, ret_free, ret_total);
	st_tls_in_backend = false;
	return r == 0 && *ret_total > 0;
}

struct oom_facts {
	size_t size, free, total, idle, largest;
	uint64_t allocated, reserved, pending;
	bool known;  /* free and total known */
	bool pinned; /* pinned host memory */
};

/* Which setting would help, or what to do instead. */
static void hint(const struct oom_facts *f, char *buf, size_t n)
{
	const struct emm_options *o = emm_state_options();
	uint64_t unallocated = f->reserved - (f->reserved < f->allocated ? f->reserved : f->allocated);
	struct emm_heap_params p;
	char a[32], b[32];

	st_heap_params(&p);
	if (f->known)
		emm_heap_params_fit(&p, f->total);
	size_t seg = emm_heap_segment_size(&p, (f->size + 511) / 512 * 512);
	if (f->pinned) {
		snprintf(buf, n, "pinned host memory is what the system lets the process lock (free RAM, ulimit "
		         "-l); EMM_PINNED=off leaves it to the driver, uncached");
	} else if (!o->oom_retry) {
		snprintf(buf, n, "EMM_OOM_RETRY=on gives idle cached memory back and retries before failing");
	} else if (unallocated >= f->size) {
		if (!(st_backend.table->caps & EMM_BACKEND_CAP_REMAP))
			snprintf(buf, n, "enough is reserved but unallocated, in pieces too small: EMM_BACKEND=vmm gives "
			         "the pages under free blocks back to the device (as PyTorch's expandable_segments)");
		else
			snprintf(buf, n, "enough is reserved but unallocated, in pieces too small: EMM_MAX_SPLIT=%s "
			         "keeps blocks this large whole",
			         emm_format_bytes(f->size, a, sizeof(a)));
	} else if (f->known && seg > f->size && f->free + unallocated >= f->size && seg > f->free) {
		snprintf(buf, n, "the request needs a %s segment but only %s is free: a smaller EMM_LARGE_SEGMENT "
		         "(or EMM_LARGE_ROUND) would fit it",
		         emm_format_bytes(seg, a, sizeof(a)), emm_format_bytes(f->free, b, sizeof(b)));
	} else if (f->known && f->total - f->free > f->reserved &&
	           f->total - f->free - f->reserved >= f->size) {
		snprintf(buf, n, "%s of the device is used outside libemm (other processes, allocations that "
		         "passed libemm by, the driver): free it there",
		         emm_format_bytes(f->total - f->free - f->reserved, a, sizeof(a)));
	} else {
		snprintf(buf, n, "the program needs more memory than the device holds: make it use less, or "
		         "EMM_BACKEND=managed lets allocations exceed the device (slower)");
	}
}

void emm_state_report_oom(emm_heap_t *heap, size_t size)
{
	struct oom_facts f = {.size = size};
	struct emm_stats s;
	char asked[32], total[32], freeb[32], alloc[32], unalloc[32], largest[32], pending[32], outside[96];
	char where[48], more[64] = "", help[320];
	int device = emm_heap_device(heap);
	uint64_t missed;

	if (!burst_begins())
		return;
	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	emm_heap_add_stats(heap, &s);
	emm_heap_idle_info(heap, &f.idle, &f.largest);
	f.allocated = s.allocated_bytes;
	f.reserved = s.reserved_bytes;
	f.pending = s.pending_bytes;
	f.pinned = device == -2;
	f.known = !f.pinned && device_info(&f.free, &f.total);

	if (device == -2)
		snprintf(where, sizeof(where), "pinned host memory");
	else
		snprintf(where, sizeof(where), "device %d", device);
	if (f.known) {
		char t[32], fr[32];
		snprintf(total, sizeof(total), "%s total", emm_format_bytes(f.total, t, sizeof(t)));
		snprintf(freeb, sizeof(freeb), "%s free", emm_format_bytes(f.free, fr, sizeof(fr)));
		if (f.total - f.free > f.reserved) {
			char o[32];
			snprintf(outside, sizeof(outside), "; %s used outside libemm",
			         emm_format_bytes(f.total - f.free - f.reserved, o, sizeof(o)));
		} else {
			outside[0] = '\0';
		}
	} else {
		snprintf(total, sizeof(total), "total unknown");
		snprintf(freeb, sizeof(freeb), "free unknown");
		outside[0] = '\0';
	}
	missed = atomic_exchange(&unreported, 0);
	if (missed)
		snprintf(more, sizeof(more), " (%llu more failed since the last report)", (unsigned long long)missed);
	hint(&f, help, sizeof(help));
	emm_error("out of memory: tried to allocate %s (%zu bytes) on %s: %s, %s%s; libemm holds %s allocated and "
	          "%s reserved but unallocated (largest free block %s, %s waiting for fences). Hint: %s%s",
	          emm_format_bytes(size, asked, sizeof(asked)), size, where, total, freeb, outside,
	          emm_format_bytes(f.allocated, alloc, sizeof(alloc)),
	          emm_format_bytes(f.reserved > f.allocated ? f.reserved - f.allocated : 0, unalloc, sizeof(unalloc)),
	          emm_format_bytes(f.largest, largest, sizeof(largest)),
	          emm_format_bytes(f.pending, pending, sizeof(pending)), help, more);
}
