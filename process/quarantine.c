/* SPDX-License-Identifier: MIT */
/*
 * process/quarantine.c - the graph quarantine, which keeps the blocks a
 * captured graph may touch away from new owners while that graph can still
 * run (the registry of active captures is capture.c's; the two share
 * st_capture_lock and the interface in process_internal.h).
 *
 * Why: a kernel captured into a graph keeps the pointers it was given. If
 * the program frees such a block during the capture (PyTorch without its
 * cache frees every intermediate during a relaxed-mode capture), the graph
 * still writes it on every replay; the real driver would have freed the
 * memory (the program's bug), but libemm must not hand the block to a new
 * owner whose data the replays would overwrite.
 *
 * How: every active capture owns a quarantine set (struct qset). A free of
 * one of libemm's blocks (cuMemFree_v2, cuMemFreeHost, cuMemFreeAsync) made
 * while ANY capture is active in the process does not reach the heap: the
 * block goes into the set of every active capture (conservative: a capture
 * on another stream, thread or context may reference the block too, e.g.
 * through peer access). Blocks allocated from the pool while a capture is
 * active are noted in the same sets ("watched"); freeing one later, while a
 * graph that may use it lives, quarantines it too (driver-shim paths only).
 *
 * Except a thread's own blocks beside a capture: one allocated during a
 * capture by a thread that captured none (its owner, st_thread_uid) and
 * freed by that thread while it still captures none goes back to its heap;
 * its record turns idle, so a later block at that address is held only if
 * it too was allocated during a capture. The graph can reach such a block
 * only through a use after free the real driver would not catch either, and
 * holding it let a thread's loop beside a capture pile up 13-19 GiB for a
 * 100 MiB working set (tests/bench/RESULTS.md section 32). The capturing
 * thread's frees (PyTorch's intermediates) and frees of blocks older than
 * the capture are held as before.
 *
 * At cuStreamEndCapture the set is attached to the returned CUgraph; if the
 * capture failed (no graph) the set is released at once. Graph objects
 * (struct gobj: a CUgraph or CUgraphExec holding references to sets) pass
 * their sets on to everything derived from them: cuGraphInstantiate* (every
 * exported ABI), cuGraphClone, cuGraphAddChildGraphNode and cuGraphAddNode
 * with a child graph (MOVE ownership moves the child's references to the
 * parent), cuGraphExecUpdate*, cuGraphExecChildGraphNodeSetParams and
 * cuGraphExecNodeSetParams with a child graph (the exec gains the new
 * child's sets). cuGraphNodeSetParams with a child graph names no parent we
 * can see: the child's sets are pinned until the context goes.
 *
 * The bound: a quarantined block is freed (a normal synchronous free into
 * its heap, so the epoch fence still covers a launch in flight) when every
 * graph and executable graph that holds its set has been destroyed with
 * cuGraphDestroy / cuGraphExecDestroy, or when its context is destroyed or
 * reset (then the memory is gone with the context and nothing is freed).
 * A graph the program never destroys keeps its blocks until its context
 * goes: the same memory the real driver would keep for the graph's own
 * allocation nodes. Not tracked (documented limitations): handles returned
 * by cuGraphChildGraphNodeGetGraph and conditional-node body graphs are not
 * graph objects of ours; a body graph captured into keeps its set until the
 * context goes (safe), but an object derived from an embedded child graph
 * handle is not tracked. Frees and allocations served by the shared-cudart
 * fast path (shims_runtime.c) bypass this module unless that path calls it.
 *
 * Locking: one mutex (st_capture_lock, capture.c) over captures, sets, blocks and graph
 * objects; a leaf. Heap calls are made without it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "common/compiler.h"
#include "common/log.h"
#include "process/annotate.h"
#include "process/process.h"
#include "process/process_internal.h"

#define QHASH_BUCKETS   4096u
#define QFILTER_BUCKETS 4096u

/* A block a graph may touch. */
struct qblock {
	struct qblock *next; /* hash chain */
	emm_addr_t addr;
	emm_heap_t *heap;
	uint64_t owner; /* watched: the thread that allocated it, capturing none (st_thread_uid); 0: else */
	bool freed; /* the program freed it: quarantined (else watched) */
	bool idle;  /* let go by own_beside: a block at addr allocated since is not watched */
	bool dead;  /* its context is gone: forget it, never free it */
	unsigned nsets, capsets;
	struct st_qset **sets;
};

/* The blocks one capture's graph (and everything derived) may touch. */
struct st_qset {
	unsigned refs; /* graph objects holding it, plus 1 while its capture runs */
	uint64_t id;
	size_t n, cap;
	struct qblock **blocks;
};

/* A CUgraph or CUgraphExec that holds sets; handle NULL: pinned sets of ctx. */
struct gobj {
	struct gobj *next;
	const void *handle;
	bool exec;
	CUcontext ctx;
	size_t n, cap;
	struct st_qset **sets;
};

static struct gobj *gobjs;
static atomic_uint gobj_count;
static struct qblock *qhash[QHASH_BUCKETS];
/* Per address bucket: how many blocks of that bucket are in the hash. Read
 * without the lock by every free; a zero means "not quarantined/watched". */
static atomic_uint qfilter[QFILTER_BUCKETS];
static uint64_t qset_next_id;
static atomic_uint_fast64_t quarantined_total, released_total;
static atomic_uint_fast64_t beside_total; /* frees let through by own_beside */

/* --- small helpers ----------------------------------------------------- */

/* Is freeing qb's block now one its own thread's, beside the captures?
 * Allocated during a capture by a thread that captured none, and freed by
 * that thread while it still captures none: see the file comment. */
static bool own_beside(const struct qblock *qb)
{
	return !qb->idle && qb->owner && qb->owner == st_thread_uid() && !st_capture_by_this_thread_locked();
}

static unsigned addr_hash(emm_addr_t addr)
{
	return (unsigned)(((addr >> 9) * UINT64_C(0x9E3779B97F4A7C15)) >> 40);
}

static unsigned qhash_bucket(emm_addr_t addr)
{
	return addr_hash(addr) % QHASH_BUCKETS;
}

static unsigned qfilter_bucket(emm_addr_t addr)
{
	return (addr_hash(addr) >> 12) % QFILTER_BUCKETS;
}

static bool grow(void **array, size_t *cap, size_t need, size_t elem)
{
	size_t ncap;
	void *p;

	if (need <= *cap)
		return true;
	ncap = *cap ? *cap * 2 : 8;
	while (ncap < need)
		ncap *= 2;
	p = realloc(*array, ncap * elem);
	if (!p)
		return false;
	*array = p;
	*cap = ncap;
	return true;
}

static void release_add(struct st_release *rel, emm_addr_t addr, emm_heap_t *heap)
{
	if (!grow((void **)&rel->items, &rel->cap, rel->n + 1, sizeof(*rel->items))) {
		rel->lost++;
		return;
	}
	rel->items[rel->n++] = (struct st_release_item){addr, heap};
}

/* Free the released blocks into their heaps (no lock held): a normal
 * synchronous free, so the epoch fence covers a launch still in flight. A
 * block whose heap went meanwhile (its context was torn down while this
 * was being released) is not touched. */
void st_release_run(struct st_release *rel)
{
	size_t freed = 0;

	if (rel->n)
		st_enter();
	for (size_t i = 0; i < rel->n; i++) {
		struct emm_block_range range;
		size_t requested = 0;

		if (emm_heap_find_block(rel->items[i].addr, &range) != 0 || range.base != rel->items[i].addr ||
		    range.heap != rel->items[i].heap)
			continue;
		/* Its region stayed while a graph could use it (block_free.c). */
		st_annotate_block(rel->items[i].addr, false, emm_state_heap_is_pinned(range.heap));
		if (emm_heap_free(rel->items[i].addr, EMM_STREAM_SYNC, &requested) == 0)
			freed++;
	}
	if (rel->n)
		st_leave();
	if (rel->n || rel->lost) {
		atomic_fetch_add_explicit(&released_total, freed, memory_order_relaxed);
		emm_debug("graph quarantine: %zu blocks released into their heaps (%zu leaked for lack of memory)",
		          freed, rel->lost);
	}
	free(rel->items);
	rel->items = NULL;
	rel->n = rel->cap = 0;
}

/* --- blocks and sets (st_capture_lock held) -------------------------------- */

static struct qblock *qblock_find(emm_addr_t addr)
{
	for (struct qblock *qb = qhash[qhash_bucket(addr)]; qb; qb = qb->next)
		if (qb->addr == addr)
			return qb;
	return NULL;
}

static struct qblock *qblock_new(emm_addr_t addr, emm_heap_t *heap)
{
	struct qblock *qb = calloc(1, sizeof(*qb));
	unsigned b;

	if (!qb)
		return NULL;
	qb->addr = addr;
	qb->heap = heap;
	b = qhash_bucket(addr);
	qb->next = qhash[b];
	qhash[b] = qb;
	atomic_fetch_add_explicit(&qfilter[qfilter_bucket(addr)], 1, memory_order_release);
	return qb;
}

static void qblock_remove(struct qblock *qb)
{
	struct qblock **link;

	for (link = &qhash[qhash_bucket(qb->addr)]; *link; link = &(*link)->next) {
		if (*link == qb) {
			*link = qb->next;
			break;
		}
	}
	atomic_fetch_sub_explicit(&qfilter[qfilter_bucket(qb->addr)], 1, memory_order_release);
	free(qb->sets);
	free(qb);
}

/* Put qb into qs (once). False without memory. */
static bool qset_add(struct st_qset *qs, struct qblock *qb)
{
	for (unsigned i = 0; i < qb->nsets; i++)
		if (qb->sets[i] == qs)
			return true;
	if (!grow((void **)&qs->blocks, &qs->cap, qs->n + 1, sizeof(*qs->blocks)))
		return false;
	{
		size_t cap = qb->capsets;
		if (!grow((void **)&qb->sets, &cap, qb->nsets + 1u, sizeof(*qb->sets)))
			return false;
		qb->capsets = (unsigned)cap;
	}
	qs->blocks[qs->n++] = qb;
	qb->sets[qb->nsets++] = qs;
	return true;
}

struct st_qset *st_qset_new_locked(void)
{
	struct st_qset *qs = calloc(1, sizeof(*qs));

	if (!qs)
		return NULL;
	qs->refs = 1;
	qs->id = ++qset_next_id;
	return qs;
}

/* Drop one reference; the last one releases the set's freed blocks. */
void st_qset_put_locked(struct st_qset *qs, struct st_release *rel)
{
	if (--qs->refs > 0)
		return;
	for (size_t i = 0; i < qs->n; i++) {
		struct qblock *qb = qs->blocks[i];
		for (unsigned j = 0; j < qb->nsets; j++) {
			if (qb->sets[j] == qs) {
				qb->sets[j] = qb->sets[--qb->nsets];
				break;
			}
		}
		if (qb->nsets == 0) {
			if (qb->freed && !qb->dead)
				release_add(rel, qb->addr, qb->heap);
			qblock_remove(qb);
		}
	}
	if (qs->n)
		emm_debug("graph quarantine: set %llu (%zu blocks) no longer referenced",
		          (unsigned long long)qs->id, qs->n);
	free(qs->blocks);
	free(qs);
}

/* --- graph objects (st_capture_lock held) ---------------------------------- */

static struct gobj *gobj_find(const void *handle, bool exec, CUcontext ctx_if_pinned)
{
	for (struct gobj *g = gobjs; g; g = g->next)
		if (g->handle == handle && g->exec == exec && (handle || g->ctx == ctx_if_pinned))
			return g;
	return NULL;
}

static struct gobj *gobj_get(const void *handle, bool exec, CUcontext ctx)
{
	struct gobj *g = gobj_find(handle, exec, ctx);

	if (g)
		return g;
	g = calloc(1, sizeof(*g));
	if (!g)
		return NULL;
	g->handle = handle;
	g->exec = exec;
	g->ctx = ctx;
	g->next = gobjs;
	gobjs = g;
	atomic_fetch_add_explicit(&gobj_count, 1, memory_order_relaxed);
	return g;
}

static void gobj_unlink(struct gobj *g)
{
	for (struct gobj **link = &gobjs; *link; link = &(*link)->next) {
		if (*link == g) {
			*link = g->next;
			atomic_fetch_sub_explicit(&gobj_count, 1, memory_order_relaxed);
			return;
		}
	}
}

/* g takes a reference to qs (once). False without memory. */
static bool gobj_add_set(struct gobj *g, struct st_qset *qs)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->sets[i] == qs)
			return true;
	if (!grow((void **)&g->sets, &g->cap, g->n + 1, sizeof(*g->sets)))
		return false;
	g->sets[g->n++] = qs;
	qs->refs++;
	return true;
}

static void gobj_free(struct gobj *g, struct st_release *rel)
{
	for (size_t i = 0; i < g->n; i++)
		st_qset_put_locked(g->sets[i], rel);
	free(g->sets);
	free(g);
}

/* Give every set of src to dst; without memory the sets are leaked (kept
 * quarantined for good), never released early. */
static void gobj_copy_sets(struct gobj *dst, const struct gobj *src)
{
	for (size_t i = 0; i < src->n; i++) {
		if (!dst || !gobj_add_set(dst, src->sets[i])) {
			src->sets[i]->refs++;
			emm_warn("graph quarantine: out of memory: %zu blocks of a captured graph stay "
			         "quarantined until their context goes", src->sets[i]->n);
		}
	}
}

/* --- what capture.c hands over (st_capture_lock held) ----------------------- */

void st_qset_capture_ended_locked(struct st_qset *qs, CUgraph graph, CUcontext ctx, struct st_release *rel)
{
	/* The graph inherits the set (an empty one is not worth tracking). */
	if (graph && qs->n) {
		struct gobj *g = gobj_get(graph, false, ctx);
		if (!g || !gobj_add_set(g, qs)) {
			qs->refs++; /* keep it quarantined for good rather than too short */
			emm_warn("graph quarantine: out of memory: %zu blocks freed during a capture stay "
			         "quarantined until their context goes", qs->n);
		} else {
			emm_debug("graph quarantine: capture ended, graph %p holds %zu blocks (set %llu)",
			          (void *)graph, qs->n, (unsigned long long)qs->id);
		}
	}
	/* No graph (the capture failed): released at once. */
	st_qset_put_locked(qs, rel);
}

void st_quarantine_context_dropped_locked(CUcontext ctx, emm_heap_t *const *heaps, size_t nheaps,
                                          struct st_release *rel)
{
	/* The context's memory went with it: its blocks are forgotten. */
	for (unsigned b = 0; b < QHASH_BUCKETS; b++)
		for (struct qblock *qb = qhash[b]; qb; qb = qb->next)
			for (size_t i = 0; i < nheaps; i++)
				if (qb->heap == heaps[i])
					qb->dead = true;
	/* Its graphs went too. */
	for (struct gobj **link = &gobjs; *link;) {
		struct gobj *g = *link;
		if (g->ctx == ctx) {
			*link = g->next;
			atomic_fetch_sub_explicit(&gobj_count, 1, memory_order_relaxed);
			gobj_free(g, rel);
		} else {
			link = &g->next;
		}
	}
}

void st_quarantine_fork_child(void)
{
	gobjs = NULL;
	atomic_store(&gobj_count, 0);
	for (unsigned b = 0; b < QHASH_BUCKETS; b++)
		qhash[b] = NULL;
	for (unsigned b = 0; b < QFILTER_BUCKETS; b++)
		atomic_store(&qfilter[b], 0);
	atomic_store(&quarantined_total, 0);
	atomic_store(&released_total, 0);
	atomic_store(&beside_total, 0);
}

/* --- the quarantine ------------------------------------------------------ */

static void watch_in_set(struct st_qset *qs, void *arg)
{
	if (qs)
		(void)qset_add(qs, arg);
}

static void quarantine_in_set(struct st_qset *qs, void *arg)
{
	struct qblock *qb = arg;

	if (!qs || !qset_add(qs, qb))
		emm_warn("graph quarantine: out of memory: block %#llx stays quarantined until its context goes",
		         (unsigned long long)qb->addr);
}

void emm_capture_note_alloc(emm_addr_t addr, emm_heap_t *heap)
{
	struct qblock *qb;

	if (EMM_LIKELY(atomic_load_explicit(&st_capture_count, memory_order_acquire) == 0))
		return;
	st_lock(&st_capture_lock);
	if (!st_captures_listed_locked()) {
		st_unlock(&st_capture_lock);
		return;
	}
	qb = qblock_find(addr);
	if (!qb)
		qb = qblock_new(addr, heap);
	if (qb) {
		qb->heap = heap;
		qb->freed = false;
		qb->idle = false;
		qb->owner = st_capture_by_this_thread_locked() ? 0 : st_thread_uid();
		st_capture_each_set_locked(watch_in_set, qb); /* no memory: not watched (as without libemm) */
		if (qb->nsets == 0)
			qblock_remove(qb);
	}
	st_unlock(&st_capture_lock);
}

__attribute__((noinline)) static int quarantine_free(emm_addr_t addr, bool pinned, size_t *ret_requested)
{
	struct emm_block_range range;
	struct qblock *qb;
	int ret = 0;

	/* Only the start of a live block of the right kind; anything else is
	 * the heap's (and the driver's) to answer. */
	if (emm_heap_find_block(addr, &range) != 0 || range.base != addr ||
	    (emm_heap_device(range.heap) == -2) != pinned)
		return 0;
	st_lock(&st_capture_lock);
	qb = qblock_find(addr);
	if (qb && qb->freed) {
		ret = -EINVAL; /* freed twice: the block is quarantined, not live */
	} else if (qb && own_beside(qb)) {
		/* Back to its heap. The record stays (its sets hold it) for the
		 * next block at addr allocated during a capture. */
		qb->idle = true;
		atomic_fetch_add_explicit(&beside_total, 1, memory_order_relaxed);
	} else if (st_captures_active_locked()) {
		if (!qb)
			qb = qblock_new(addr, range.heap);
		if (qb) {
			qb->freed = true;
			qb->idle = false;
			st_capture_each_set_locked(quarantine_in_set, qb);
		} else {
			emm_warn("graph quarantine: out of memory: block %#llx freed during stream capture is "
			         "leaked (never reused)",
			         (unsigned long long)addr);
		}
		ret = 1;
	} else if (qb && !qb->idle) {
		qb->freed = true; /* allocated during a capture; its graph still lives */
		ret = 1;
	}
	st_unlock(&st_capture_lock);
	if (ret == 1) {
		*ret_requested = range.requested;
		atomic_fetch_add_explicit(&quarantined_total, 1, memory_order_relaxed);
		emm_debug("graph quarantine: block %#llx (%zu bytes) kept while a captured graph may use it",
		          (unsigned long long)addr, range.size);
	}
	return ret;
}

/* Every free asks: with no capture and nothing watched, without quarantine_free's frame. */
int emm_capture_quarantine_free(emm_addr_t addr, bool pinned, size_t *ret_requested)
{
	if (EMM_LIKELY(atomic_load_explicit(&st_capture_count, memory_order_acquire) == 0 &&
	               atomic_load_explicit(&qfilter[qfilter_bucket(addr)], memory_order_acquire) == 0))
		return 0;
	return quarantine_free(addr, pinned, ret_requested);
}

/* --- graph objects --------------------------------------------------------- */

void emm_graph_derived(const void *dst, bool dst_exec, const void *src, bool src_exec, bool move)
{
	struct st_release rel = {0};
	struct gobj *s, *d;

	if (!dst || !src || atomic_load_explicit(&gobj_count, memory_order_relaxed) == 0)
		return;
	st_lock(&st_capture_lock);
	s = gobj_find(src, src_exec, NULL);
	if (s && s != gobj_find(dst, dst_exec, NULL)) {
		d = gobj_get(dst, dst_exec, s->ctx);
		gobj_copy_sets(d, s);
		if (move) {
			/* The parent owns the child now: the child handle is gone. */
			gobj_unlink(s);
			gobj_free(s, &rel);
		}
	}
	st_unlock(&st_capture_lock);
	st_release_run(&rel);
}

void emm_graph_pin(const void *src, bool src_exec)
{
	struct gobj *s, *p;

	if (!src || atomic_load_explicit(&gobj_count, memory_order_relaxed) == 0)
		return;
	st_lock(&st_capture_lock);
	s = gobj_find(src, src_exec, NULL);
	if (s) {
		p = gobj_get(NULL, false, s->ctx);
		gobj_copy_sets(p, s);
	}
	st_unlock(&st_capture_lock);
}

void emm_graph_destroyed(const void *handle, bool exec)
{
	struct st_release rel = {0};
	struct gobj *g;

	if (!handle || atomic_load_explicit(&gobj_count, memory_order_relaxed) == 0)
		return;
	st_lock(&st_capture_lock);
	g = gobj_find(handle, exec, NULL);
	if (g) {
		gobj_unlink(g);
		gobj_free(g, &rel);
	}
	st_unlock(&st_capture_lock);
	st_release_run(&rel);
}

/* --- statistics ---------------------------------------------------------- */

void emm_capture_stats(uint64_t *ret_quarantined, uint64_t *ret_released, size_t *ret_held, uint64_t *ret_beside)
{
	size_t held = 0;

	st_lock(&st_capture_lock);
	for (unsigned b = 0; b < QHASH_BUCKETS; b++)
		for (struct qblock *qb = qhash[b]; qb; qb = qb->next)
			held += qb->freed && !qb->dead;
	st_unlock(&st_capture_lock);
	*ret_quarantined = atomic_load_explicit(&quarantined_total, memory_order_relaxed);
	*ret_released = atomic_load_explicit(&released_total, memory_order_relaxed);
	*ret_held = held;
	*ret_beside = atomic_load_explicit(&beside_total, memory_order_relaxed);
}
