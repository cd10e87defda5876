/* SPDX-License-Identifier: MIT */
/*
 * allocator/heap_check.c - the invariant checker behind emm_heap_check:
 * walks every arena's segments, blocks, trees, fences and idle list, and
 * compares what it finds with the counters (the tests and bench-core call
 * it; the allocator itself never does).
 */
#include "allocator/heap_internal.h"

#include <errno.h>
#include <pthread.h>

#include "allocator/ptrmap.h"
#include "common/compiler.h"
#include "common/log.h"

#define CHECK(cond, ...)                                                                                     \
	do {                                                                                                 \
		if (EMM_UNLIKELY(!(cond))) {                                                                 \
			emm_error("heap check: " __VA_ARGS__);                                               \
			return -EFAULT;                                                                      \
		}                                                                                            \
	} while (0)

/* Page-granular segments: the unmapped count matches the bitmap, and no
 * granule any part of which belongs to a block other than a ready-any one
 * lacks memory (a live block being mapped may have busy granules), nor one
 * that a ready-any block only partly covers. */
static int check_pages(struct arena *h, struct emm_segment *s)
{
	size_t g = h->pg.granularity, n, unmapped = 0;

	if (!s->gmap)
		return 0;
	n = s->size / g;
	CHECK(s->gwords * 64 >= n, "segment 0x%llx: bitmap of %zu words for %zu granules",
	      (unsigned long long)s->base, s->gwords, n);
	for (size_t i = 0; i < n; i++)
		unmapped += !((s->gmap[i / 64] >> (i % 64)) & 1u);
	CHECK(unmapped == s->unmapped, "segment 0x%llx: %zu granules unmapped, counter %zu",
	      (unsigned long long)s->base, unmapped, s->unmapped);
	if (!unmapped)
		return 0;
	for (struct emm_block *b = s->first; b; b = b->next) {
		bool any = b->state == BLOCK_READY && b->stream == 0;
		emm_addr_t lo = any ? EMM_ALIGN_UP(b->addr, g) : b->addr;
		emm_addr_t hi = any ? (b->addr + b->size) & ~(emm_addr_t)(g - 1) : b->addr + b->size;
		size_t first = (b->addr - s->base) / g, end = (b->addr + b->size - s->base + g - 1) / g;

		for (size_t i = first; i < end; i++) {
			emm_addr_t ga = s->base + i * g;
			bool inner = ga >= lo && ga + g <= hi && hi > lo;
			bool mapped = (s->gmap[i / 64] >> (i % 64)) & 1u;
			bool busy = (s->gbusy[i / 64] >> (i % 64)) & 1u;

			CHECK(mapped || (any && inner) || busy,
			      "granule 0x%llx has no memory under block 0x%llx (+%zu) in state %u key 0x%llx",
			      (unsigned long long)ga, (unsigned long long)b->addr, b->size, b->state,
			      (unsigned long long)b->stream);
		}
	}
	return 0;
}

/* `c`: the arena's counters with every thread cache's own added (blocks
 * a cache handed out are live, the ones it holds free). */
static int check_locked(struct arena *h, const struct heap_counters *c)
{
	uint64_t allocated = 0, requested = 0, pending = 0, reserved = 0, live = 0, segments = 0;
	size_t ready[NPOOLS][2] = {{0, 0}, {0, 0}}, npending = 0, nidle = 0; /* [pool][keyed] */

	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		const char *why = "";
		CHECK(emm_tree_check(&h->trees[pool], &why) >= 0, "pool %u tree: %s", pool, why);
		CHECK(emm_sfit_check(&h->ready[pool], &why) == 0, "pool %u ready-any index: %s", pool, why);
		/* Every node listed is a ready-any block of this pool; with the
		 * counts below, every such block is listed. */
		for (struct emm_sfit_node *n = emm_sfit_last(&h->ready[pool]); n; n = emm_sfit_prev(&h->ready[pool], n)) {
			struct emm_block *b = fnode_block(n);
			CHECK(b->state == BLOCK_READY && b->stream == 0 && b->pool == pool && b->seg &&
			          b->seg->arena == h && n->size == b->size && n->addr == b->addr,
			      "pool %u ready-any index lists block 0x%llx (state %u, key 0x%llx)", pool,
			      (unsigned long long)b->addr, b->state, (unsigned long long)b->stream);
		}
	}

	for (struct emm_segment *s = h->segs; s; s = s->next) {
		uint64_t base = 0;
		size_t size = 0;
		void *value = NULL;
		struct emm_block *prev = NULL;
		emm_addr_t expect = s->base;
		size_t nblocks = 0;

		CHECK(s->live && s->arena == h, "segment 0x%llx not live or of another arena",
		      (unsigned long long)s->base);
		CHECK(s->next == NULL || s->next->prev == s, "segment list links disagree at 0x%llx",
		      (unsigned long long)s->base);
		CHECK(emm_segmap_find(s->base, &base, &size, &value) == 0 && base == s->base &&
		          size == s->size && value == s,
		      "segment 0x%llx (+%zu) missing from the segment map", (unsigned long long)s->base,
		      s->size);
		CHECK(s->first && s->first->prev == NULL, "segment 0x%llx: bad first block",
		      (unsigned long long)s->base);
		for (struct emm_block *b = s->first; b; b = b->next) {
			nblocks++;
			CHECK(b->seg == s, "block 0x%llx: wrong segment", (unsigned long long)b->addr);
			CHECK(b->prev == prev, "block 0x%llx: prev link disagrees",
			      (unsigned long long)b->addr);
			CHECK(b->addr == expect,
			      "block at 0x%llx, expected 0x%llx: blocks do not tile the segment",
			      (unsigned long long)b->addr, (unsigned long long)expect);
			CHECK(b->size > 0 && b->size % EMM_MIN_BLOCK == 0,
			      "block 0x%llx: size %zu not a multiple of %u", (unsigned long long)b->addr,
			      b->size, EMM_MIN_BLOCK);
			CHECK(b->size <= s->base + s->size - b->addr,
			      "block 0x%llx (+%zu) runs past its segment", (unsigned long long)b->addr,
			      b->size);
			CHECK(b->pool == s->pool, "block 0x%llx: pool disagrees with segment",
			      (unsigned long long)b->addr);
			switch (b->state) {
			case BLOCK_LIVE:
				CHECK(block_unindexed(b), "live block 0x%llx in an index",
				      (unsigned long long)b->addr);
				CHECK(b->requested <= b->size, "live block 0x%llx: requested %zu > size %zu",
				      (unsigned long long)b->addr, b->requested, b->size);
				if (atomic_load_explicit(&b->tcached, memory_order_relaxed))
					break; /* free, in a thread's cache */
				CHECK(emm_blocktab_get(&h->tab, b->addr) == b, "live block 0x%llx not in its arena's table",
				      (unsigned long long)b->addr);
				allocated += b->size;
				requested += b->requested;
				live++;
				break;
			case BLOCK_READY:
				if (b->stream == 0)
					CHECK(emm_sfit_node_linked(&b->fnode) &&
					          b->fnode.bin == emm_sfit_bin(b->size) &&
					          b->fnode.size == b->size && b->fnode.addr == b->addr,
					      "ready-any block 0x%llx (+%zu) not in its pool's index as it is",
					      (unsigned long long)b->addr, b->size);
				else
					CHECK(emm_tree_node_linked(&b->node) &&
					          emm_tree_find(&h->trees[b->pool], b->stream, b->size, b->addr) ==
					              &b->node,
					      "ready block 0x%llx (+%zu, key 0x%llx) not in its pool's tree",
					      (unsigned long long)b->addr, b->size, (unsigned long long)b->stream);
				CHECK(!(prev && prev->state == BLOCK_READY && prev->stream == b->stream),
				      "adjacent mergeable free blocks at 0x%llx and 0x%llx",
				      (unsigned long long)prev->addr, (unsigned long long)b->addr);
				ready[b->pool][b->stream != 0]++;
				break;
			case BLOCK_RESERVED:
				CHECK(block_unindexed(b), "reserved block 0x%llx in an index",
				      (unsigned long long)b->addr);
				break;
			case BLOCK_PENDING:
				CHECK(block_unindexed(b), "pending block 0x%llx in an index",
				      (unsigned long long)b->addr);
				CHECK(b->fence != NULL, "pending block 0x%llx without a fence",
				      (unsigned long long)b->addr);
				pending += b->size;
				npending++;
				break;
			default:
				CHECK(0, "block 0x%llx in state %u", (unsigned long long)b->addr, b->state);
			}
			expect = b->addr + b->size;
			prev = b;
		}
		CHECK(expect == s->base + s->size, "segment 0x%llx: blocks end at 0x%llx, segment at 0x%llx",
		      (unsigned long long)s->base, (unsigned long long)expect,
		      (unsigned long long)(s->base + s->size));
		CHECK(s->last == prev, "segment 0x%llx: last block pointer disagrees", (unsigned long long)s->base);
		if (check_pages(h, s))
			return -EFAULT;
		bool whole_any = nblocks == 1 && s->first->state == BLOCK_READY && s->first->stream == 0;
		CHECK(s->idle == whole_any, "segment 0x%llx: idle flag %d, whole ready-any %d",
		      (unsigned long long)s->base, s->idle, whole_any);
		reserved += seg_mapped_bytes(h, s);
		segments++;
	}

	for (unsigned pool = 0; pool < NPOOLS; pool++) {
		CHECK(h->ready[pool].count == ready[pool][0],
		      "pool %u ready-any index holds %zu blocks, %zu found", pool, h->ready[pool].count,
		      ready[pool][0]);
		CHECK(h->trees[pool].count == ready[pool][1],
		      "pool %u tree holds %zu blocks, %zu ready-stream blocks found", pool, h->trees[pool].count,
		      ready[pool][1]);
	}

	/* Fences: the open epoch, the orphans, the busy list, the closed FIFO. */
	size_t listed = 0;
	struct emm_fence *lists[] = {h->open, h->orphans[0], h->orphans[1], h->busy, h->fq_head};
	for (unsigned li = 0; li < EMM_ARRAY_SIZE(lists); li++) {
		for (struct emm_fence *f = lists[li]; f; f = li < 3 ? NULL : f->next) {
			size_t n = 0, bytes = 0;
			for (struct emm_block *b = f->blocks; b; b = b->link) {
				CHECK(b->state == BLOCK_PENDING && b->fence == f,
				      "fence list holds block 0x%llx in state %u", (unsigned long long)b->addr,
				      b->state);
				CHECK(b->seg && b->seg->live, "fence holds block 0x%llx of a dead segment",
				      (unsigned long long)b->addr);
				n++;
				bytes += b->size;
			}
			CHECK(n == f->nblocks && bytes == f->bytes, "fence counts %u blocks/%zu bytes, lists %zu/%zu",
			      f->nblocks, f->bytes, n, bytes);
			CHECK(!f->retired || n == 0, "retired fence still holds blocks");
			CHECK(li < 3 || f->done <= f->nevents, "fence event index past its events");
			CHECK(li >= 3 || f->nevents == 0, "open or orphan fence with events");
			if (li == 4 && f->next == NULL)
				CHECK(h->fq_tail == f, "fence FIFO tail disagrees");
			listed += n;
		}
	}
	CHECK(listed == npending, "%zu pending blocks, %zu on fence lists", npending, listed);

	for (struct emm_segment *s = h->idle_head; s; s = s->idle_next) {
		CHECK(s->idle && s->live, "idle list holds a segment not idle");
		CHECK(s->idle_next == NULL || s->idle_next->idle_prev == s, "idle list links disagree");
		nidle++;
	}
	for (struct emm_segment *s = h->segs; s; s = s->next)
		if (s->idle)
			nidle--;
	CHECK(nidle == 0, "idle list and idle flags disagree");

	CHECK(allocated == c->allocated, "allocated bytes %llu, counter %llu", (unsigned long long)allocated,
	      (unsigned long long)c->allocated);
	CHECK(requested == c->requested, "requested bytes %llu, counter %llu", (unsigned long long)requested,
	      (unsigned long long)c->requested);
	CHECK(pending == h->st.pending, "pending bytes %llu, counter %llu", (unsigned long long)pending,
	      (unsigned long long)h->st.pending);
	CHECK(reserved == h->st.reserved, "reserved bytes %llu, counter %llu", (unsigned long long)reserved,
	      (unsigned long long)h->st.reserved);
	CHECK(live == c->live_blocks, "live blocks %llu, counter %llu", (unsigned long long)live,
	      (unsigned long long)c->live_blocks);
	/* Every entry is one of those live blocks (each found above). */
	CHECK(h->tab.count == live, "the arena's table holds %u blocks, %llu live", h->tab.count,
	      (unsigned long long)live);
	CHECK(segments == h->st.segments, "segments %llu, counter %llu", (unsigned long long)segments,
	      (unsigned long long)h->st.segments);
	return 0;
}

int emm_heap_check(emm_heap_t *heap)
{
	int r = 0;

	if (!heap)
		return -EINVAL;
	emm_tcache_stats_begin();
	for (unsigned i = 0; i < heap->narenas && r == 0; i++) {
		struct arena *h = heap->arenas[i];
		arena_lock(h);
		struct heap_counters merged = h->st;
		(void)emm_tcache_add_counters(h, &merged);
		r = check_locked(h, &merged);
		arena_unlock(h);
	}
	emm_tcache_stats_end();
	return r;
}
