/* SPDX-License-Identifier: MIT */
/*
 * allocator/snapshot.h - the pieces of a memory snapshot in the format
 * PyTorch's memory viewer reads (torch.cuda.memory._snapshot(), drawn by
 * pytorch.org/memory_viz and torch.cuda._memory_viz), written as pickle
 * opcodes (common/pickle.h):
 *
 *   {'segments': [{'device', 'address', 'total_size', 'allocated_size',
 *                  'active_size', 'requested_size', 'stream',
 *                  'segment_type' ('small'/'large'), 'segment_pool_id'
 *                  (0, 0), 'is_expandable' False, 'frames' [],
 *                  'blocks': [{'address', 'size', 'requested_size',
 *                              'state' ('active_allocated',
 *                              'active_pending_free', 'inactive'),
 *                              'frames' []}]}],
 *    'device_traces': [[{'action', 'addr', 'size', 'stream', 'time_us',
 *                        'frames' [], ('device_free' for 'oom')}] per device]}
 *
 * The blocks of a segment tile it, so PyTorch's segsum() adds up. There are
 * no stack frames (libemm does not unwind): 'frames' is always empty.
 */
#ifndef EMM_ALLOCATOR_SNAPSHOT_H
#define EMM_ALLOCATOR_SNAPSHOT_H

#include <stdint.h>

#include "allocator/heap.h"
#include "common/outbuf.h"

enum emm_snap_action {
	EMM_SNAP_ALLOC,
	EMM_SNAP_FREE_REQUESTED,
	EMM_SNAP_FREE_COMPLETED,
	EMM_SNAP_SEGMENT_ALLOC,
	EMM_SNAP_SEGMENT_FREE,
	EMM_SNAP_OOM,
};

/* One trace entry ('device_free' is written for EMM_SNAP_OOM only). */
struct emm_snap_event {
	uint64_t addr, size, stream, time_us, device_free;
	uint8_t action; /* enum emm_snap_action */
};

/*
 * Append the segment dicts of `heap` (device `device`) to the list the
 * caller opened: the heap is walked into scratch memory (mmap, not
 * malloc) under each arena's lock, then written with no lock held.
 * 0 or a negative errno (-ENOMEM: no scratch memory).
 */
int emm_snap_write_segments(struct emm_outbuf *ob, emm_heap_t *heap, int device);

/* One trace entry dict. */
void emm_snap_write_event(struct emm_outbuf *ob, const struct emm_snap_event *e);

/* The stream value PyTorch shows for a heap stream key (0: synchronous). */
uint64_t emm_snap_stream(emm_stream_t key);

#endif
