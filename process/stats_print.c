/* SPDX-License-Identifier: MIT */
/*
 * process/stats_print.c - what the public API asks of the statistics: a
 * snapshot for emm_stats_get (a trace flush point too), the EMM_STATS table
 * printed at exit, and giving idle memory back on request
 * (emm_release_idle).
 *
 * The exit table reads counters only and never calls the driver (it may
 * already be gone).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/compiler.h"
#include "common/format.h"
#include "common/log.h"
#include "emm/emm.h"
#include "emm/emm_version.h"
#include "allocator/trace.h"
#include "process/process.h"
#include "process/process_internal.h"

void emm_state_stats_snapshot(int device, struct emm_stats *out)
{
	struct emm_stats s;
	uint32_t caller_size = out->struct_size;

	/* A statistics snapshot is also a trace flush point, so a program (or
	 * test) that reads its counters can read a complete EMM_LOG too. */
	emm_trace_flush();
	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	s.version = EMM_STATS_VERSION;
	emm_state_collect_stats(device, &s);
	memcpy(out, &s, caller_size < sizeof(s) ? caller_size : sizeof(s));
	out->struct_size = caller_size;
}

struct release_arg {
	int device;
	size_t keep;
	long long released;
	int error;
};

static void release_one(emm_heap_t *heap, int device, void *arg)
{
	struct release_arg *a = arg;
	long long r;

	if (a->device != -1 && a->device != device)
		return;
	r = emm_heap_release_idle(heap, a->keep);
	if (r >= 0)
		a->released += r;
	else if (!a->error)
		a->error = (int)r;
}

int emm_state_release_idle(int device, size_t keep_bytes, long long *ret_released)
{
	struct release_arg a = {device, keep_bytes, 0, 0};

	if (device < -2)
		return -EINVAL;
	if (emm_state_exiting()) {
		*ret_released = 0;
		return 0;
	}
	st_drop_inactive_primaries();
	/* Each heap's context is made current around the release: segments
	 * go back through the driver and fences may be recorded. */
	emm_state_for_each_heap(release_one, &a, true);
	a.released += (long long)st_vmm_release_idle(device);
	a.released += (long long)st_ipc_release_retired(device);
	if (a.released == 0 && a.error)
		return a.error;
	*ret_released = a.released;
	return 0;
}

/* --- EMM_STATS --------------------------------------------------------- */

static void print_row(const char *label, const struct emm_stats *s)
{
	char alloc_peak[32], reserved_peak[32], hit[16], frag[16], backend[48], pass[48];

	if (s->allocs)
		snprintf(hit, sizeof(hit), "%.1f%%", 100.0 * (double)s->hits / (double)s->allocs);
	else
		snprintf(hit, sizeof(hit), "-");
	/* Fragmentation at peak: the share of reserved memory not handed out. */
	if (s->reserved_bytes_peak)
		snprintf(frag, sizeof(frag), "%.1f%%",
		         100.0 * (1.0 - (double)s->allocated_bytes_peak / (double)s->reserved_bytes_peak));
	else
		snprintf(frag, sizeof(frag), "-");
	snprintf(backend, sizeof(backend), "%" PRIu64 "/%" PRIu64, s->backend_allocs, s->backend_frees);
	snprintf(pass, sizeof(pass), "%" PRIu64 "/%" PRIu64, s->passthrough_allocs, s->passthrough_frees);
	emm_info("%-7s %10" PRIu64 " %10" PRIu64 " %6s %13s %8" PRIu64 " %6" PRIu64 " %11s %11s %6s %15s",
	         label, s->allocs, s->hits, hit, backend, s->events_recorded, s->host_waits,
	         emm_format_bytes(s->allocated_bytes_peak, alloc_peak, sizeof(alloc_peak)),
	         emm_format_bytes(s->reserved_bytes_peak, reserved_peak, sizeof(reserved_peak)), frag, pass);
}

static bool row_used(const struct emm_stats *s)
{
	return s->allocs || s->frees || s->passthrough_allocs || s->passthrough_frees || s->bad_frees ||
	       s->backend_allocs || s->reserved_bytes_peak;
}

/* The "passed by" rows: every family of calls that reached the driver
 * without libemm serving it, with its calls and bytes (the struct's
 * passby_* fields; process-wide). One summary line even when all are 0. */
static void print_passby(const struct emm_stats *s, const uint64_t c[EMM_COUNT__COUNT])
{
	static const char *const note_unknown = "(sizes are the driver's)";
	static const char *const note_uncounted = "(bytes not counted; EMM_LOG has them)";
	const struct {
		const char *name;
		uint64_t calls, bytes;
		const char *note;
	} rows[] = {
	    {"arrays", s->passby_array_calls, s->passby_array_bytes, "(from the descriptors)"},
	    {"graph memory nodes", s->passby_graph_mem_calls, s->passby_graph_mem_bytes, ""},
	    {"managed", s->passby_managed_calls, s->passby_managed_bytes, ""},
	    {"host registration", s->passby_host_register_calls, s->passby_host_register_bytes, ""},
	    {"VMM (driver-made)", s->passby_vmm_calls, s->passby_vmm_bytes, ""},
	    {"explicit pools", s->passby_pool_calls, s->passby_pool_bytes, ""},
	    {"during capture", s->passby_capture_calls, s->passby_capture_bytes, ""},
	    {"device allocations", c[EMM_COUNT_PASS_ALLOC], 0, note_uncounted},
	    {"pinned allocations", c[EMM_COUNT_PASS_HOST_ALLOC], 0, note_uncounted},
	    {"driver components", s->passby_driver_calls, s->passby_driver_bytes,
	     "(libnvcuvid: NVDEC, nvJPEG's hardware path; freed memory the driver allocated)"},
	    {"unknown frees", s->passby_unknown_free_calls, 0, note_unknown},
	};
	uint64_t calls = 0, bytes = 0;
	char b[32];

	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		calls += rows[i].calls;
		bytes += rows[i].bytes;
	}
	emm_info("passed by (reached the driver, not served by libemm): %" PRIu64 " calls, %s known", calls,
	         emm_format_bytes(bytes, b, sizeof(b)));
	for (size_t i = 0; i < EMM_ARRAY_SIZE(rows); i++) {
		if (!rows[i].calls)
			continue;
		if (rows[i].note == note_unknown || rows[i].note == note_uncounted)
			emm_info("  passed by  %-20s %10" PRIu64 " calls %s", rows[i].name, rows[i].calls, rows[i].note);
		else
			emm_info("  passed by  %-20s %10" PRIu64 " calls %11s%s%s", rows[i].name, rows[i].calls,
			         emm_format_bytes(rows[i].bytes, b, sizeof(b)), *rows[i].note ? " " : "", rows[i].note);
	}
}

struct devices_arg {
	uint64_t mask; /* devices 0..63 with a live heap */
};

static void note_device(emm_heap_t *heap, int device, void *arg)
{
	struct devices_arg *d = arg;

	(void)heap;
	if (device >= 0 && device < 64)
		d->mask |= UINT64_C(1) << device;
}

void emm_stats_print_exit(void)
{
	struct emm_stats s;
	struct devices_arg d = {0};
	uint64_t c[EMM_COUNT__COUNT];
	char label[16];

	/* Say so when there is nothing to tabulate, so that "nothing to serve"
	 * is never mistaken for "libemm was not loaded". */
	if (!atomic_load(&st_init_done)) {
		emm_info("statistics (libemm %s): loaded; no CUDA call reached it: 0 allocations served, 0 calls "
		         "passed by",
		         EMM_VERSION_STRING);
		return;
	}
	if (!st_enabled) {
		emm_info("statistics (libemm %s): off (EMM_DISABLE or no usable backend): every call went to the "
		         "driver uncounted",
		         EMM_VERSION_STRING);
		return;
	}

	emm_state_for_each_heap(note_device, &d, false);
	emm_info("statistics (libemm %s, backend %s)", EMM_VERSION_STRING, emm_state_backend_name());
	emm_info("%-7s %10s %10s %6s %13s %8s %6s %11s %11s %6s %15s", "device", "allocs", "hits", "hit%",
	         "backend a/f", "events", "waits", "peak alloc", "peak resv", "frag", "passthru a/f");
	for (int dev = 0; dev < 64; dev++) {
		memset(&s, 0, sizeof(s));
		s.struct_size = sizeof(s);
		emm_state_collect_stats(dev, &s);
		if (!(d.mask & (UINT64_C(1) << dev)) && !row_used(&s))
			continue;
		snprintf(label, sizeof(label), "%d", dev);
		print_row(label, &s);
	}
	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	emm_state_collect_stats(-2, &s);
	if (row_used(&s))
		print_row("pinned", &s);
	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	emm_state_collect_stats(-1, &s);
	print_row("all", &s);

	emm_state_counters(c);
	emm_info("frees %" PRIu64 ", bad frees %" PRIu64 ", out of memory %" PRIu64 " (after %" PRIu64
	         " retries), event queries %" PRIu64 ", stream waits %" PRIu64 ", epochs %" PRIu64,
	         s.frees, s.bad_frees, s.ooms, s.oom_retries, s.event_queries, s.stream_waits,
	         s.epochs_closed);
	if (c[EMM_COUNT_HOST_REGISTER] || c[EMM_COUNT_MANAGED_ALLOC] || c[EMM_COUNT_CAPTURE_ALLOC] ||
	    c[EMM_COUNT_IPC_REFUSED])
		emm_info("host registrations %" PRIu64 "/%" PRIu64 ", managed allocations %" PRIu64
		         ", allocations in stream capture %" PRIu64 ", IPC exports refused %" PRIu64,
		         c[EMM_COUNT_HOST_REGISTER], c[EMM_COUNT_HOST_UNREGISTER], c[EMM_COUNT_MANAGED_ALLOC],
		         c[EMM_COUNT_CAPTURE_ALLOC], c[EMM_COUNT_IPC_REFUSED]);
	if (s.vmm_allocs || s.vmm_frees || s.pool_allocs || s.pool_creates) {
		char hit_bytes[32], idle[32];

		emm_info("VMM: %" PRIu64 " allocations (%" PRIu64 " from the cache, %.1f%%, %s; %" PRIu64
		         " by the driver), %" PRIu64 " frees, %s idle, %" PRIu64 " deferrals made real, %" PRIu64
		         " idle buffers given back",
		         s.vmm_allocs, s.vmm_hits, s.vmm_allocs ? 100.0 * (double)s.vmm_hits / (double)s.vmm_allocs : 0.0,
		         emm_format_bytes(s.vmm_hit_bytes_total, hit_bytes, sizeof(hit_bytes)), s.vmm_misses, s.vmm_frees,
		         emm_format_bytes(s.vmm_idle_bytes, idle, sizeof(idle)), s.vmm_materializations, s.vmm_idle_released);
		if (s.pool_allocs || s.pool_creates || s.pool_destroys)
			emm_info("explicit pools (passed through): %" PRIu64 " allocations, %" PRIu64
			         " pools created, %" PRIu64 " destroyed",
			         s.pool_allocs, s.pool_creates, s.pool_destroys);
	}
	if (s.allocated_bytes_peak_error || s.requested_bytes_peak_error) {
		char ae[32], re[32];

		emm_info("peaks are upper bounds (several arenas): the true allocated peak is at most %s below, "
		         "the requested at most %s below",
		         emm_format_bytes(s.allocated_bytes_peak_error, ae, sizeof(ae)),
		         emm_format_bytes(s.requested_bytes_peak_error, re, sizeof(re)));
	}
	print_passby(&s, c);
	{
		uint64_t quarantined = 0, released = 0, beside = 0;
		size_t held = 0;

		emm_capture_stats(&quarantined, &released, &held, &beside);
		if (quarantined)
			emm_info("graph quarantine: %" PRIu64 " blocks freed while a captured graph could use "
			         "them, %" PRIu64 " released since, %zu still held",
			         quarantined, released, held);
		if (beside)
			emm_info("graph quarantine: %" PRIu64 " blocks allocated and freed beside a capture by a "
			         "thread capturing none, not held",
			         beside);
	}
}
