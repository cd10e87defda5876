/* SPDX-License-Identifier: MIT */
/*
 * allocator/snapshot.c - a heap's segments and blocks, and trace entries,
 * as PyTorch's memory snapshot format (snapshot.h).
 */
#include "allocator/snapshot.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>

#include "allocator/heap_walk.h"
#include "common/pickle.h"

struct scratch {
	struct emm_walk_segment *segs;
	struct emm_walk_block *blocks;
	size_t *first_block; /* per segment: index of its first block */
	size_t nsegs, nblocks, max_segs, max_blocks;
};

static int take_segment(void *arg, const struct emm_walk_segment *s)
{
	struct scratch *sc = arg;

	if (sc->nsegs == sc->max_segs)
		return -E2BIG;
	sc->first_block[sc->nsegs] = sc->nblocks;
	sc->segs[sc->nsegs++] = *s;
	return 0;
}

static int take_block(void *arg, const struct emm_walk_block *b)
{
	struct scratch *sc = arg;

	if (sc->nblocks == sc->max_blocks)
		return -E2BIG;
	sc->blocks[sc->nblocks++] = *b;
	return 0;
}

static size_t scratch_bytes(size_t segs, size_t blocks)
{
	return segs * (sizeof(struct emm_walk_segment) + sizeof(size_t)) + blocks * sizeof(struct emm_walk_block);
}

static void *scratch_map(struct scratch *sc, size_t segs, size_t blocks)
{
	char *p = mmap(NULL, scratch_bytes(segs, blocks), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
	               -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(sc, 0, sizeof(*sc));
	sc->blocks = (struct emm_walk_block *)p;
	sc->segs = (struct emm_walk_segment *)(p + blocks * sizeof(struct emm_walk_block));
	sc->first_block = (size_t *)(p + blocks * sizeof(struct emm_walk_block) +
	                             segs * sizeof(struct emm_walk_segment));
	sc->max_segs = segs;
	sc->max_blocks = blocks;
	return p;
}

uint64_t emm_snap_stream(emm_stream_t key)
{
	return (uint64_t)key; /* EMM_STREAM_SYNC is 0 */
}

static const char *state_name(enum emm_walk_state s)
{
	return s == EMM_WALK_LIVE ? "active_allocated" : s == EMM_WALK_PENDING ? "active_pending_free" : "inactive";
}

static void write_segment(struct emm_outbuf *ob, const struct scratch *sc, size_t i, int device)
{
	const struct emm_walk_segment *s = &sc->segs[i];
	size_t end = i + 1 < sc->nsegs ? sc->first_block[i + 1] : sc->nblocks;
	uint64_t allocated = 0, active = 0, requested = 0;

	emm_pk_dict(ob);
	emm_pk_kv_int(ob, "device", device);
	emm_pk_kv_uint(ob, "address", s->base);
	emm_pk_kv_uint(ob, "total_size", s->size);
	emm_pk_kv_uint(ob, "stream", emm_snap_stream(s->stream));
	emm_pk_kv_str(ob, "segment_type", s->small ? "small" : "large");
	emm_pk_str(ob, "segment_pool_id");
	emm_pk_int(ob, 0);
	emm_pk_int(ob, 0);
	emm_pk_tuple2(ob);
	emm_pk_str(ob, "is_expandable");
	emm_pk_bool(ob, false);
	emm_pk_str(ob, "frames");
	emm_pk_list(ob);
	emm_pk_appends(ob);
	emm_pk_str(ob, "blocks");
	emm_pk_list(ob);
	for (size_t b = sc->first_block[i]; b < end; b++) {
		const struct emm_walk_block *wb = &sc->blocks[b];

		if (wb->state != EMM_WALK_FREE)
			active += wb->size;
		if (wb->state == EMM_WALK_LIVE) {
			allocated += wb->size;
			requested += wb->requested;
		}
		emm_pk_dict(ob);
		emm_pk_kv_uint(ob, "address", wb->addr);
		emm_pk_kv_uint(ob, "size", wb->size);
		emm_pk_kv_uint(ob, "requested_size", wb->requested);
		emm_pk_kv_str(ob, "state", state_name(wb->state));
		emm_pk_str(ob, "frames");
		emm_pk_list(ob);
		emm_pk_appends(ob);
		emm_pk_setitems(ob);
	}
	emm_pk_appends(ob);
	emm_pk_kv_uint(ob, "allocated_size", allocated);
	emm_pk_kv_uint(ob, "active_size", active);
	emm_pk_kv_uint(ob, "requested_size", requested);
	emm_pk_setitems(ob);
}

int emm_snap_write_segments(struct emm_outbuf *ob, emm_heap_t *heap, int device)
{
	size_t segs = 256, blocks = 4096;
	struct scratch sc;
	void *mem;
	int r;

	for (;;) {
		if (!(mem = scratch_map(&sc, segs, blocks)))
			return -ENOMEM;
		r = emm_heap_walk(heap, take_segment, take_block, &sc);
		if (r != -E2BIG)
			break;
		munmap(mem, scratch_bytes(segs, blocks));
		if (sc.nsegs == sc.max_segs)
			segs *= 4;
		if (sc.nblocks == sc.max_blocks)
			blocks *= 4;
	}
	for (size_t i = 0; r == 0 && i < sc.nsegs; i++)
		write_segment(ob, &sc, i, device);
	munmap(mem, scratch_bytes(segs, blocks));
	return r;
}

static const char *action_name(uint8_t a)
{
	static const char *const names[] = {
	    [EMM_SNAP_ALLOC] = "alloc",
	    [EMM_SNAP_FREE_REQUESTED] = "free_requested",
	    [EMM_SNAP_FREE_COMPLETED] = "free_completed",
	    [EMM_SNAP_SEGMENT_ALLOC] = "segment_alloc",
	    [EMM_SNAP_SEGMENT_FREE] = "segment_free",
	    [EMM_SNAP_OOM] = "oom",
	};

	return a < sizeof(names) / sizeof(names[0]) ? names[a] : "alloc";
}

void emm_snap_write_event(struct emm_outbuf *ob, const struct emm_snap_event *e)
{
	emm_pk_dict(ob);
	emm_pk_kv_str(ob, "action", action_name(e->action));
	emm_pk_kv_uint(ob, "addr", e->addr);
	emm_pk_kv_uint(ob, "size", e->size);
	emm_pk_kv_uint(ob, "stream", e->stream);
	emm_pk_kv_uint(ob, "time_us", e->time_us);
	if (e->action == EMM_SNAP_OOM)
		emm_pk_kv_uint(ob, "device_free", e->device_free);
	emm_pk_str(ob, "frames");
	emm_pk_list(ob);
	emm_pk_appends(ob);
	emm_pk_setitems(ob);
}
