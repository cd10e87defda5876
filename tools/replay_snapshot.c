/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_snapshot.c - emm-replay --snapshot: the replay's heap as
 * PyTorch's memory snapshot (allocator/snapshot.h) when the replay ends (or
 * fails), with the replayed events as the device's trace entries: what
 * pytorch.org/memory_viz draws as the Active Memory Timeline.
 */
#include "tools/replay_snapshot.h"

#include "allocator/snapshot.h"
#include "common/outbuf.h"
#include "common/pickle.h"

static void event(struct emm_outbuf *ob, enum emm_snap_action action, const struct replay_event *ev,
                  uint64_t addr, uint64_t size)
{
	struct emm_snap_event e = {
	    .addr = addr,
	    .size = size,
	    .stream = emm_snap_stream(ev->stream_key),
	    .time_us = ev->time_ns / 1000,
	    .action = (uint8_t)action,
	};

	emm_snap_write_event(ob, &e);
}

int replay_write_snapshot(const char *path, const struct replay_trace *t, emm_heap_t *heap, const emm_addr_t *addr,
                          const struct replay_result *res)
{
	size_t end = res->ok ? t->count : res->fail_index + 1;
	struct emm_outbuf ob;
	int r = emm_outbuf_open(&ob, path);

	if (r < 0)
		return r;
	emm_pk_begin(&ob);
	emm_pk_dict(&ob);
	emm_pk_str(&ob, "segments");
	emm_pk_list(&ob);
	r = emm_snap_write_segments(&ob, heap, 0);
	emm_pk_appends(&ob);
	emm_pk_str(&ob, "device_traces");
	emm_pk_list(&ob);
	emm_pk_list(&ob);
	for (size_t i = 0; i < end; i++) {
		const struct replay_event *ev = &t->events[i];
		bool failed = !res->ok && i == res->fail_index;

		if (ev->action == REPLAY_ALLOC_FAILURE || (failed && ev->action == REPLAY_ALLOC)) {
			event(&ob, EMM_SNAP_OOM, ev, 0, ev->size);
		} else if (ev->action == REPLAY_ALLOC) {
			event(&ob, EMM_SNAP_ALLOC, ev, addr[i], ev->size);
		} else if (ev->match != REPLAY_NO_MATCH && !failed) {
			event(&ob, EMM_SNAP_FREE_REQUESTED, ev, addr[ev->match], t->events[ev->match].size);
			event(&ob, EMM_SNAP_FREE_COMPLETED, ev, addr[ev->match], t->events[ev->match].size);
		}
	}
	emm_pk_appends(&ob);
	emm_pk_appends(&ob);
	emm_pk_setitems(&ob);
	emm_pk_end(&ob);
	if (r < 0 && !ob.error)
		ob.error = r;
	return emm_outbuf_commit(&ob);
}
