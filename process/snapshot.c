/* SPDX-License-Identifier: MIT */
/*
 * process/snapshot.c - EMM_SNAPSHOT: the memory snapshot PyTorch's viewer
 * reads (format in allocator/snapshot.h), written at exit and on
 * EMM_STATS_SIGNAL (from its helper thread, never in signal context).
 *
 * Segments and blocks are every device heap's, as they are at that moment.
 * The trace entries are the last SNAP_RING events of libemm's pool (and of
 * its backend segments), kept in a fixed ring (static storage, filled only
 * when EMM_SNAPSHOT is set): 'alloc'; a free as 'free_requested' and
 * 'free_completed' at once (libemm does not watch each block's fence
 * complete); 'segment_alloc' and 'segment_free'; 'oom' (device_free 0:
 * the failure path does not ask the driver). Events are assigned to the
 * device of the calling thread's context. Pinned host memory is left out
 * (the viewer draws device memory).
 */
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "allocator/snapshot.h"
#include "common/format.h"
#include "common/log.h"
#include "common/outbuf.h"
#include "common/pickle.h"
#include "process/process.h"
#include "process/process_internal.h"

#define SNAP_RING 8192u
#define MAX_TRACE_DEVICES 64

struct ring_entry {
	struct emm_snap_event e;
	int device;
};

bool st_snapshot_on;
static pthread_mutex_t ring_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ring_entry ring[SNAP_RING];
static uint64_t ring_next; /* events ever noted */
static pthread_mutex_t write_lock = PTHREAD_MUTEX_INITIALIZER;

void st_snapshot_setup(void)
{
	st_snapshot_on = emm_state_options()->snapshot_file[0] != '\0';
}

void st_snapshot_note(enum emm_snap_action action, uint64_t addr, uint64_t size, uint64_t stream)
{
	struct ring_entry r = {.e = {.addr = addr, .size = size, .stream = stream, .action = (uint8_t)action},
	                       .device = st_tls_device()};
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	r.e.time_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
	pthread_mutex_lock(&ring_lock);
	ring[ring_next++ % SNAP_RING] = r;
	pthread_mutex_unlock(&ring_lock);
}

void st_snapshot_fork_child(void)
{
	pthread_mutex_init(&ring_lock, NULL);
	pthread_mutex_init(&write_lock, NULL);
	ring_next = 0;
}

struct seg_arg {
	struct emm_outbuf *ob;
	int max_device;
	int error;
};

static void heap_segments(emm_heap_t *heap, int device, void *arg)
{
	struct seg_arg *a = arg;
	int r;

	if (device < 0)
		return; /* pinned host memory */
	if (device > a->max_device)
		a->max_device = device;
	r = emm_snap_write_segments(a->ob, heap, device);
	if (r < 0 && !a->error)
		a->error = r;
}

/* The ring's events, oldest first, into scratch memory; the count. */
static size_t copy_ring(struct ring_entry *out)
{
	size_t n;

	pthread_mutex_lock(&ring_lock);
	n = ring_next < SNAP_RING ? (size_t)ring_next : SNAP_RING;
	for (size_t i = 0; i < n; i++)
		out[i] = ring[(ring_next - n + i) % SNAP_RING];
	pthread_mutex_unlock(&ring_lock);
	return n;
}

static int write_snapshot(struct emm_outbuf *ob, struct ring_entry *events)
{
	struct seg_arg a = {.ob = ob, .max_device = -1};
	size_t n = copy_ring(events);

	emm_pk_begin(ob);
	emm_pk_dict(ob);
	emm_pk_str(ob, "segments");
	emm_pk_list(ob);
	emm_state_for_each_heap(heap_segments, &a, false);
	emm_pk_appends(ob);
	for (size_t i = 0; i < n; i++)
		if (events[i].device > a.max_device && events[i].device < MAX_TRACE_DEVICES)
			a.max_device = events[i].device;
	emm_pk_str(ob, "device_traces");
	emm_pk_list(ob);
	for (int d = 0; d <= a.max_device; d++) {
		emm_pk_list(ob);
		for (size_t i = 0; i < n; i++)
			if (events[i].device == d)
				emm_snap_write_event(ob, &events[i].e);
		emm_pk_appends(ob);
	}
	emm_pk_appends(ob);
	emm_pk_setitems(ob);
	emm_pk_end(ob);
	return a.error;
}

int emm_snapshot_write(const char *pattern, const char *reason)
{
	size_t scratch = SNAP_RING * sizeof(struct ring_entry);
	struct ring_entry *events;
	struct emm_outbuf ob;
	char path[256];
	int r;

	(void)reason;
	events = mmap(NULL, scratch, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (events == MAP_FAILED)
		return -ENOMEM;
	pthread_mutex_lock(&write_lock); /* the exit and a signal may meet */
	r = emm_format_path(pattern, path, sizeof(path));
	if (r == 0)
		r = emm_outbuf_open(&ob, path);
	if (r == 0) {
		r = write_snapshot(&ob, events);
		if (r < 0) {
			ob.error = ob.error ? ob.error : r;
		}
		r = emm_outbuf_commit(&ob);
	}
	pthread_mutex_unlock(&write_lock);
	munmap(events, scratch);
	if (r < 0)
		emm_warn("EMM_SNAPSHOT: cannot write %s: %s", pattern, strerror(-r));
	return r;
}
