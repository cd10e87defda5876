/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_trace.h - reading an allocation trace for emm-replay: the CSV
 * in RMM's logging_resource_adaptor columns
 *
 *     Thread,Time,Action,Pointer,Size,Stream[,Memory]
 *
 * as libemm's EMM_LOG writes it (Time in seconds since the epoch, pointers
 * and streams in 0x hex) or as RMM writes it (Time as HH:MM:SS.ffffff,
 * "(nil)" for null pointers). Actions: "allocate", "free" (RMM's docs also
 * say "deallocate"), "allocate failure". A header line, blank lines and
 * '#' comments are skipped. libemm adds a seventh column, Memory ("device",
 * "pinned" or "managed"); only device events are replayed, the others are
 * counted and skipped. Numbers with 0x are hex, "(nil)" is 0, other
 * numbers are decimal (RMM's own replay reads the hex Stream column as
 * decimal; this reader does not).
 *
 * The events are sorted by time (file order among equal times) and each
 * free is matched to the allocation it releases. Frees of pointers the
 * trace never allocated (tracing started late) are marked, to be counted
 * and skipped. Streams become allocator stream keys (replay_stream_key).
 */
#ifndef EMM_TOOLS_REPLAY_TRACE_H
#define EMM_TOOLS_REPLAY_TRACE_H

#include <stddef.h>
#include <stdint.h>

enum replay_action {
	REPLAY_ALLOC,
	REPLAY_FREE,
	REPLAY_ALLOC_FAILURE, /* the program's request failed: replayed, expected to fail */
};

#define REPLAY_NO_MATCH UINT32_MAX

struct replay_event {
	uint64_t time_ns;     /* since the trace's first event's day or epoch */
	uint64_t ptr;	      /* the traced pointer */
	uint64_t size;	      /* bytes asked for (frees: as traced) */
	uint64_t stream_key;  /* the allocator stream key (emm_stream_t) */
	uint32_t line;	      /* line number in the file, from 1 */
	uint32_t thread;      /* index into trace.thread_ids */
	uint32_t match;	      /* free: index of its allocation; REPLAY_NO_MATCH if unknown */
	uint8_t action;	      /* enum replay_action */
};

struct replay_trace {
	struct replay_event *events; /* in replay (time) order */
	size_t count;
	uint64_t *thread_ids;	     /* the traced thread ids, by first appearance */
	size_t nthreads;
	size_t nstreams;	     /* distinct stream values */
	size_t unmatched_frees;	     /* frees of pointers never allocated in the trace */
	size_t other_memory;	     /* pinned-host and managed events, skipped */
	size_t allocs, frees, failures;
	uint64_t peak_requested;     /* most bytes live at once, as traced */
};

/*
 * Read `path` ("-": stdin). 0, or -errno (-EINVAL for a malformed line)
 * with a one-line reason in `err` ("trace.csv:12: bad Size 'x'").
 */
int replay_trace_load(const char *path, struct replay_trace *ret, char *err, size_t err_size);

void replay_trace_free(struct replay_trace *trace);

/*
 * The stream key for a traced stream value: 0 -> EMM_STREAM_SYNC (libemm
 * traces synchronous calls with 0x0), 1 -> the legacy stream, 2 -> the
 * event thread's per-thread default stream, any other value -> a key of its
 * own, numbered by first appearance (never mistaken for a per-thread key).
 */
uint64_t replay_stream_key(uint64_t value, uint32_t thread, uint32_t stream_index);

#endif
