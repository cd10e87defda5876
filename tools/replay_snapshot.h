/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_snapshot.h - emm-replay --snapshot (replay_snapshot.c).
 */
#ifndef EMM_TOOLS_REPLAY_SNAPSHOT_H
#define EMM_TOOLS_REPLAY_SNAPSHOT_H

#include "allocator/heap.h"
#include "tools/replay_run.h"
#include "tools/replay_trace.h"

/* Write `heap` (the replay's, device 0) and the events replayed so far
 * (addr[i]: the block event i got) to `path` as a memory snapshot pickle.
 * 0 or a negative errno. */
int replay_write_snapshot(const char *path, const struct replay_trace *t, emm_heap_t *heap, const emm_addr_t *addr,
                          const struct replay_result *res);

#endif
