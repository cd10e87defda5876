/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_run.h - replaying a loaded trace (replay_trace.h) on a fresh
 * heap over a backend (hostsim by default) through the allocator API: no
 * CUDA, no GPU, no fence ops (every fence is complete at once, as on the
 * host-simulation backend).
 *
 * A replayer keeps one thread per traced thread for its whole life, so a
 * traced thread always reaches the allocator from the same replay thread
 * (and arena) in every run; the threads hand the events over in trace order,
 * one running at a time. With one_thread, the calling thread replays every
 * event itself.
 *
 * A run stops at the first allocation that fails although the trace's
 * succeeded, and describes it. An "allocate failure" of the trace is
 * requested and expected to fail; if it succeeds here the block is freed at
 * once and counted. Frees of untraced pointers are counted and skipped.
 */
#ifndef EMM_TOOLS_REPLAY_RUN_H
#define EMM_TOOLS_REPLAY_RUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "allocator/heap.h"
#include "emm/emm.h"
#include "tools/replay_trace.h"

struct replayer;

struct replay_setup {
	struct emm_heap_params params;
	const char *backend;	     /* built-in name or .so path ("hostsim") */
	const char *backend_options; /* EMM_BACKEND_OPTIONS ("" or NULL) */
	uint64_t capacity;	     /* hostsim's capacity= (appended); 0: the backend's default */
	bool timeline;		     /* keep per-event bytes in the result */
	const char *snapshot;	     /* write a memory snapshot here at the end (NULL: none) */
	bool fences;		     /* simulated fences (replay_fence.h); false: frees reusable at once */
	uint64_t fence_lag;	     /* with fences: an event completes this many events later */
};

struct replay_result {
	bool ok;		 /* every event replayed as traced */
	/* The failing event, when !ok. */
	size_t fail_index;	 /* into trace->events */
	int fail_error;		 /* the allocator's negative errno */
	uint64_t fail_requested; /* live bytes the program held then (as asked) */
	uint64_t fail_allocated; /* ... as the heap rounded them */
	uint64_t fail_reserved;	 /* bytes the heap held from the backend */
	uint64_t fail_largest_free;

	uint64_t peak_requested, peak_allocated, peak_reserved;
	uint64_t reserved_at_peak;  /* reserved bytes when allocated first hit its peak */
	struct emm_stats stats;	    /* the heap's counters at the end of the run */
	bool fences;		    /* the setup's */
	uint64_t fence_lag;
	uint64_t calls;		    /* allocator calls made (alloc and free) */
	double call_seconds;	    /* time spent inside them */
	double wall_seconds;	    /* the whole run, thread hand-overs included */
	size_t skipped_frees;	    /* frees of pointers the trace never allocated */
	size_t expected_failures;   /* traced failures that failed here too */
	size_t unexpected_successes; /* traced failures that succeeded here (freed at once) */

	/* With setup.timeline: after each event (up to the failure). */
	uint64_t *tl_requested, *tl_allocated, *tl_reserved;
	size_t tl_count;
};

/* One replay thread per traced thread, or none (one_thread). 0 or -errno. */
int replayer_create(const struct replay_trace *trace, bool one_thread, struct replayer **ret);
void replayer_destroy(struct replayer *rp);

/*
 * Replay the whole trace once on a new heap and backend instance. 0 with
 * *result filled (result->ok says whether it replayed), or -errno when the
 * backend or heap could not be set up (reason in err).
 */
int replayer_run(struct replayer *rp, const struct replay_setup *setup, struct replay_result *result,
		 char *err, size_t err_size);

void replay_result_free(struct replay_result *result);

/* 1 - allocated/reserved when allocated bytes peaked, in percent (0 if none). */
double replay_fragmentation(const struct replay_result *result);

#endif
