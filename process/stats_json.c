/* SPDX-License-Identifier: MIT */
/*
 * process/stats_json.c - the statistics as JSON (EMM_STATS=json or a
 * path): one object with a row per device, the pinned row and the whole
 * process, each carrying every field of struct emm_stats under its own
 * name, plus the process-wide counters. The schema is in
 * docs/stats-json.md; tests/obs checks it with python3's json module.
 *
 * Reads counters through the same getters as the table (stats_print.c)
 * and never calls the driver (it runs at exit too). Written through a
 * fixed buffer (common/outbuf.h): nothing here allocates beyond what the
 * getters do.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/outbuf.h"
#include "emm/emm.h"
#include "emm/emm_version.h"
#include "process/process.h"
#include "process/process_internal.h"

/* Every field of struct emm_stats after struct_size and version. */
#define STATS_FIELDS(X)                                                                              \
	X(allocs) X(frees) X(hits) X(misses) X(passthrough_allocs) X(passthrough_frees) X(bad_frees)  \
	X(backend_allocs) X(backend_frees) X(oom_retries) X(ooms) X(splits) X(merges)                   \
	X(events_recorded) X(event_queries) X(stream_waits) X(host_waits) X(epochs_closed)             \
	X(allocated_bytes) X(allocated_bytes_peak) X(allocated_bytes_total) X(requested_bytes)         \
	X(requested_bytes_peak) X(requested_bytes_total) X(reserved_bytes) X(reserved_bytes_peak)      \
	X(reserved_bytes_total) X(pending_bytes) X(segments) X(live_blocks) X(page_unmaps)             \
	X(page_maps) X(unmapped_bytes_total) X(remapped_bytes_total) X(unmapped_bytes)                 \
	X(segment_grows) X(grown_bytes_total) X(vmm_allocs) X(vmm_hits) X(vmm_misses) X(vmm_frees)     \
	X(vmm_hit_bytes_total) X(vmm_idle_bytes) X(vmm_materializations) X(vmm_idle_released)          \
	X(pool_allocs) X(pool_creates) X(pool_destroys) X(passby_array_calls) X(passby_array_bytes)      \
	X(passby_graph_mem_calls) X(passby_graph_mem_bytes) X(passby_managed_calls)                    \
	X(passby_managed_bytes) X(passby_host_register_calls) X(passby_host_register_bytes)            \
	X(passby_vmm_calls) X(passby_vmm_bytes) X(passby_pool_calls) X(passby_pool_bytes)              \
	X(passby_capture_calls) X(passby_capture_bytes) X(passby_unknown_free_calls)                   \
	X(passby_unknown_free_bytes) X(allocated_bytes_peak_error) X(requested_bytes_peak_error)       \
	X(passby_driver_calls) X(passby_driver_bytes)

#define COUNT_FIELD(f) +1
/* A field added to struct emm_stats must be added here (and to the
 * schema): the JSON carries every one. */
_Static_assert(sizeof(struct emm_stats) == 8 + 8 * (0 STATS_FIELDS(COUNT_FIELD)),
               "struct emm_stats has a field the JSON statistics do not write");

static void write_row(struct emm_outbuf *ob, const char *key, int device)
{
	struct emm_stats s;
	const char *sep = "";

	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	s.version = EMM_STATS_VERSION;
	emm_state_collect_stats(device, &s);
	if (key)
		emm_outbuf_printf(ob, "\"%s\":", key);
	emm_outbuf_printf(ob, "{");
	if (device >= 0)
		emm_outbuf_printf(ob, "\"device\":%d,", device);
#define WRITE_FIELD(f)                                                      \
	emm_outbuf_printf(ob, "%s\"" #f "\":%" PRIu64, sep, (uint64_t)s.f); \
	sep = ",";
	STATS_FIELDS(WRITE_FIELD)
#undef WRITE_FIELD
	if (s.allocs)
		emm_outbuf_printf(ob, ",\"hit_rate\":%.6f", (double)s.hits / (double)s.allocs);
	else
		emm_outbuf_printf(ob, ",\"hit_rate\":null");
	if (s.reserved_bytes_peak)
		emm_outbuf_printf(ob, ",\"fragmentation\":%.6f",
		                  1.0 - (double)s.allocated_bytes_peak / (double)s.reserved_bytes_peak);
	else
		emm_outbuf_printf(ob, ",\"fragmentation\":null");
	emm_outbuf_printf(ob, "}");
}

static bool row_used(int device)
{
	struct emm_stats s;

	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	emm_state_collect_stats(device, &s);
	return s.allocs || s.frees || s.passthrough_allocs || s.passthrough_frees || s.bad_frees ||
	       s.backend_allocs || s.reserved_bytes_peak || s.vmm_allocs;
}

static void note_device(emm_heap_t *heap, int device, void *arg)
{
	(void)heap;
	if (device >= 0 && device < 64)
		*(uint64_t *)arg |= UINT64_C(1) << device;
}

static void write_process(struct emm_outbuf *ob)
{
	uint64_t c[EMM_COUNT__COUNT], quarantined = 0, released = 0, beside = 0;
	size_t held = 0;

	emm_state_counters(c);
	emm_capture_stats(&quarantined, &released, &held, &beside);
	emm_outbuf_printf(ob,
	                  ",\"process\":{\"host_registrations\":%" PRIu64 ",\"host_unregistrations\":%" PRIu64
	                  ",\"managed_allocs\":%" PRIu64 ",\"capture_allocs\":%" PRIu64 ",\"ipc_refused\":%" PRIu64
	                  ",\"graph_quarantined_blocks\":%" PRIu64 ",\"graph_released_blocks\":%" PRIu64
	                  ",\"graph_held_blocks\":%zu,\"graph_beside_frees\":%" PRIu64 "}",
	                  c[EMM_COUNT_HOST_REGISTER], c[EMM_COUNT_HOST_UNREGISTER], c[EMM_COUNT_MANAGED_ALLOC],
	                  c[EMM_COUNT_CAPTURE_ALLOC], c[EMM_COUNT_IPC_REFUSED], quarantined, released, held, beside);
}

void emm_stats_write_json(struct emm_outbuf *ob, const char *reason)
{
	struct timespec ts;
	const char *state = !atomic_load(&st_init_done) ? "not reached" : !st_enabled ? "off" : "on";
	uint64_t mask = 0;
	const char *sep = "";

	clock_gettime(CLOCK_REALTIME, &ts);
	emm_outbuf_printf(ob,
	                  "{\"schema\":\"emm-stats\",\"schema_version\":1,\"libemm\":\"%s\",\"pid\":%ld,"
	                  "\"reason\":\"%s\",\"time\":%lld.%06ld,\"state\":\"%s\",\"backend\":\"%s\","
	                  "\"stats_version\":%d,\"devices\":[",
	                  EMM_VERSION_STRING, (long)getpid(), reason, (long long)ts.tv_sec, ts.tv_nsec / 1000, state,
	                  emm_state_backend_name(), EMM_STATS_VERSION);
	if (st_enabled) {
		emm_state_for_each_heap(note_device, &mask, false);
		for (int dev = 0; dev < 64; dev++) {
			if (!(mask & (UINT64_C(1) << dev)) && !row_used(dev))
				continue;
			emm_outbuf_printf(ob, "%s", sep);
			write_row(ob, NULL, dev);
			sep = ",";
		}
	}
	emm_outbuf_printf(ob, "],");
	if (st_enabled && row_used(-2))
		write_row(ob, "pinned", -2);
	else
		emm_outbuf_printf(ob, "\"pinned\":null");
	emm_outbuf_printf(ob, ",");
	write_row(ob, "all", -1);
	write_process(ob);
	emm_outbuf_printf(ob, "}\n");
}
