/* SPDX-License-Identifier: MIT */
/*
 * test-model: randomized allocations and frees checked against a reference
 * model, a million operations and more.
 *
 * The model keeps the live set in address order (the allocator's own tree,
 * keyed by address here) and a shadow map of tags written at sampled
 * 512-byte granules of each live block. Every allocation must not overlap
 * a live block, must lie inside a segment the source handed out and is
 * still live, must be found by emm_heap_find_block with the right sizes, and
 * its granules must be untagged; every free must find its tags intact and
 * return the requested size. emm_heap_check runs every CHECK_EVERY
 * operations and at the end; the counters must match the model.
 *
 * Run A mixes everything: sizes across the small, large and oversize
 * ranges, random streams (legacy, per-thread keys, blocking, non-blocking
 * created and destroyed), synchronous and stream-ordered frees, fences
 * completed at random, flushes, releases, captures, a small capacity so the
 * OOM path runs. Run B checks the fence rule itself: with a non-blocking
 * stream always live and only synchronous frees, no address freed at time t
 * may be handed out again before some event recorded after t has completed
 * (addresses from the source are never reused, so any reuse is the cache's).
 */
#include <errno.h>

#include "allocator/heap.h"
#include "allocator/tree.h"
#include "heap_doubles.h"
#include "emm_test.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)

#define CHECK_EVERY 2000
#define MAX_LIVE    1500

static uint64_t rng = 0x243f6a8885a308d3ull;

static uint64_t rnd(void)
{
	return emm_test_rand(&rng);
}

static size_t rnd_range(size_t lo, size_t hi) /* [lo, hi) */
{
	return lo + (size_t)(rnd() % (hi - lo));
}

/* --- the model ------------------------------------------------------------ */

struct live {
	struct emm_tree_node node; /* key (0, addr, 0) */
	emm_addr_t addr;
	size_t size; /* the block's size as the heap reports it */
	size_t requested;
	emm_stream_t stream;
	uint64_t tag;
	size_t idx; /* position in live_arr */
};

static struct emm_tree live_tree;
static struct live **live_arr;
static size_t nlive;
static uint64_t live_requested;
static uint64_t next_tag = 1;

/* Shadow map: granule address -> tag, chained hash with a node pool. */
struct shadow {
	uint64_t granule;
	uint64_t tag;
	struct shadow *next;
};
#define SHADOW_BUCKETS (1u << 16)
static struct shadow *shadow_tab[SHADOW_BUCKETS];
static struct shadow *shadow_free;

static unsigned shadow_hash(uint64_t g)
{
	return (unsigned)((g >> 9) * 0x9e3779b97f4a7c15ull >> 48) & (SHADOW_BUCKETS - 1);
}

static uint64_t shadow_get(uint64_t g)
{
	for (struct shadow *s = shadow_tab[shadow_hash(g)]; s; s = s->next)
		if (s->granule == g)
			return s->tag;
	return 0;
}

static void shadow_set(uint64_t g, uint64_t tag)
{
	struct shadow *s = shadow_free;
	if (s)
		shadow_free = s->next;
	else
		s = malloc(sizeof(*s));
	s->granule = g;
	s->tag = tag;
	s->next = shadow_tab[shadow_hash(g)];
	shadow_tab[shadow_hash(g)] = s;
}

static void shadow_del(uint64_t g)
{
	struct shadow **pp = &shadow_tab[shadow_hash(g)];
	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->granule == g) {
			struct shadow *s = *pp;
			*pp = s->next;
			s->next = shadow_free;
			shadow_free = s;
			return;
		}
	}
}

/* Sampled granules of a block: first, last, and a few in between. */
static unsigned granules(const struct live *l, uint64_t out[5])
{
	size_t n = l->size / 512;
	unsigned k = 0;
	out[k++] = l->addr;
	if (n > 1)
		out[k++] = l->addr + (n - 1) * 512;
	if (n > 2)
		out[k++] = l->addr + (n / 2) * 512;
	if (n > 4) {
		out[k++] = l->addr + (n / 4) * 512;
		out[k++] = l->addr + (3 * n / 4) * 512;
	}
	return k;
}

static struct fake_src src;
static struct fake_fence fence;
static long violations;

#define VIOLATION(...)                                                                                       \
	do {                                                                                                 \
		if (violations++ < 10)                                                                       \
			emm_test_fail_(__VA_ARGS__);                                                         \
	} while (0)

/* Is [addr, addr+size) inside a segment the source gave and still holds? */
static bool in_source_segment(emm_addr_t addr, size_t size)
{
	size_t lo = 0, hi = src.nsegs;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (src.segs[mid].addr <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return false;
	const struct fake_seg *s = &src.segs[lo - 1];
	return s->live && addr >= s->addr && addr + size <= s->addr + s->size;
}

static void model_add(emm_heap_t *h, emm_addr_t addr, size_t req, emm_stream_t stream)
{
	struct emm_block_range r;
	if (emm_heap_find_block(addr, &r) != 0 || r.base != addr || r.requested != req || r.size < req ||
	    r.heap != h || r.size % 512) {
		VIOLATION("find_block disagrees for 0x%llx (+%zu)", (unsigned long long)addr, req);
		return;
	}
	if (addr < r.segment_base || addr + r.size > r.segment_base + r.segment_size ||
	    !in_source_segment(r.segment_base, r.segment_size))
		VIOLATION("block 0x%llx (+%zu) outside a live source segment", (unsigned long long)addr,
		          r.size);

	struct live *l = malloc(sizeof(*l));
	l->addr = addr;
	l->size = r.size;
	l->requested = req;
	l->stream = stream;
	l->tag = next_tag++;
	/* Overlap with the address-order neighbours. */
	struct emm_tree_node *succ = emm_tree_lower_bound(&live_tree, 0, addr, 0);
	struct emm_tree_node *pred = succ ? emm_tree_prev(succ) : emm_tree_last(&live_tree);
	if (succ) {
		struct live *s = (struct live *)succ;
		if (s->addr < addr + l->size)
			VIOLATION("0x%llx (+%zu) overlaps live 0x%llx", (unsigned long long)addr, l->size,
			          (unsigned long long)s->addr);
	}
	if (pred) {
		struct live *p = (struct live *)pred;
		if (p->addr + p->size > addr)
			VIOLATION("0x%llx overlaps live 0x%llx (+%zu)", (unsigned long long)addr,
			          (unsigned long long)p->addr, p->size);
	}
	uint64_t g[5];
	unsigned k = granules(l, g);
	for (unsigned i = 0; i < k; i++) {
		if (shadow_get(g[i]))
			VIOLATION("granule 0x%llx already tagged", (unsigned long long)g[i]);
		shadow_set(g[i], l->tag);
	}
	l->node.key[0] = 0;
	l->node.key[1] = addr;
	l->node.key[2] = 0;
	if (emm_tree_insert(&live_tree, &l->node))
		VIOLATION("address 0x%llx handed out twice", (unsigned long long)addr);
	l->idx = nlive;
	live_arr[nlive++] = l;
	live_requested += req;
}

static struct live *model_pick(void)
{
	return nlive ? live_arr[rnd() % nlive] : NULL;
}

static void model_remove(struct live *l)
{
	uint64_t g[5];
	unsigned k = granules(l, g);
	for (unsigned i = 0; i < k; i++) {
		if (shadow_get(g[i]) != l->tag)
			VIOLATION("granule 0x%llx of 0x%llx lost its tag", (unsigned long long)g[i],
			          (unsigned long long)l->addr);
		shadow_del(g[i]);
	}
	emm_tree_remove(&live_tree, &l->node);
	live_arr[l->idx] = live_arr[--nlive];
	live_arr[l->idx]->idx = l->idx;
	live_requested -= l->requested;
	free(l);
}

static void model_reset(void)
{
	while (nlive)
		model_remove(live_arr[nlive - 1]);
	emm_tree_init(&live_tree);
}

/* --- run A: everything ---------------------------------------------------- */

static size_t pick_size(void)
{
	unsigned r = (unsigned)(rnd() % 1000);
	if (r < 600)
		return rnd() % 4 ? rnd_range(1, 16 * KIB) : rnd_range(1, 1 * MIB + 1);
	if (r < 950)
		return rnd_range(1 * MIB + 1, 10 * MIB);
	if (r < 995)
		return rnd_range(10 * MIB, 64 * MIB);
	return rnd_range(64 * MIB, 300 * MIB);
}

#define MAX_NB 4
static emm_stream_t nb_streams[MAX_NB];
static unsigned n_nb;
static emm_stream_t next_nb = 0x70000;

static const emm_stream_t fixed_streams[] = {
    EMM_STREAM_LEGACY, EMM_STREAM_PER_THREAD_KEY(0), EMM_STREAM_PER_THREAD_KEY(1), 0x5000, 0x6000,
};

static emm_stream_t pick_stream(void)
{
	unsigned n = (unsigned)(sizeof(fixed_streams) / sizeof(fixed_streams[0]));
	unsigned r = (unsigned)(rnd() % (n + n_nb));
	return r < n ? fixed_streams[r] : nb_streams[r - n];
}

static bool stream_alive(emm_stream_t s)
{
	for (size_t i = 0; i < sizeof(fixed_streams) / sizeof(fixed_streams[0]); i++)
		if (fixed_streams[i] == s)
			return true;
	for (unsigned i = 0; i < n_nb; i++)
		if (nb_streams[i] == s)
			return true;
	return false;
}

static void check_counters(emm_heap_t *h)
{
	struct emm_stats st = heap_stats(h);
	if (st.live_blocks != nlive || st.requested_bytes != live_requested)
		VIOLATION("counters: %llu live blocks / %llu requested bytes, model %zu / %llu",
		          (unsigned long long)st.live_blocks, (unsigned long long)st.requested_bytes, nlive,
		          (unsigned long long)live_requested);
	if (st.reserved_bytes != src.used)
		VIOLATION("reserved %llu, source says %zu", (unsigned long long)st.reserved_bytes, src.used);
	if (emm_heap_check(h) != 0)
		VIOLATION("emm_heap_check failed");
}

static void model_mixed(bool tcache)
{
	violations = 0;
	const long OPS = 1200000;
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.roundup_divisions = 0;
	p.max_split = 128 * MIB; /* exercise the oversize rules */
	p.thread_cache = tcache;
	emm_heap_t *h = NULL;
	assert_int_eq(fake_heap_create(&p, &src, 3 * GIB, &fence, &h), 0);
	live_arr = calloc(MAX_LIVE + 1, sizeof(*live_arr));
	emm_tree_init(&live_tree);
	long allocs = 0, frees = 0, enomem = 0, capture_left = 0;

	for (long op = 0; op < OPS && violations < 10; op++) {
		unsigned r = (unsigned)(rnd() % 1000);
		if (capture_left && --capture_left == 0)
			fence.capture_sync = false;
		if (r < 490 && nlive < MAX_LIVE) {
			size_t size = pick_size();
			emm_stream_t st = rnd() % 5 < 2 ? EMM_STREAM_SYNC : pick_stream();
			emm_addr_t a = 0;
			int rc = emm_heap_alloc(h, size, st, &a);
			if (rc == 0) {
				model_add(h, a, size, st);
				allocs++;
			} else if (rc == -ENOMEM) {
				enomem++;
			} else {
				VIOLATION("alloc %zu: %d", size, rc);
			}
		} else if (r < 960) {
			struct live *l = model_pick();
			if (!l)
				continue;
			unsigned k = (unsigned)(rnd() % 10);
			emm_stream_t st = k < 5 ? EMM_STREAM_SYNC
			                  : k < 8 && l->stream != EMM_STREAM_SYNC && stream_alive(l->stream)
			                      ? l->stream
			                      : pick_stream();
			size_t req = 0;
			emm_addr_t a = l->addr;
			size_t want = l->requested;
			model_remove(l);
			int rc = emm_heap_free(a, st, &req);
			if (rc != 0 || req != want)
				VIOLATION("free 0x%llx: %d, requested %zu (want %zu)", (unsigned long long)a,
				          rc, req, want);
			/* And once more: now a double free. */
			if (rnd() % 64 == 0 && emm_heap_free(a, st, NULL) != -EINVAL)
				VIOLATION("double free of 0x%llx not refused", (unsigned long long)a);
			frees++;
		} else if (r < 975) {
			fake_complete(&fence, 0);
		} else if (r < 980) {
			fake_complete(&fence, pick_stream());
		} else if (r < 983) {
			emm_heap_flush(h);
		} else if (r < 984) {
			emm_heap_release_idle(h, rnd() % 2 ? 0 : (size_t)rnd_range(0, 512 * MIB));
		} else if (r < 990) {
			if (n_nb < MAX_NB && rnd() % 2) {
				nb_streams[n_nb++] = next_nb;
				emm_heap_stream_created(h, next_nb, true);
				next_nb += 0x100;
			} else if (n_nb) {
				unsigned i = (unsigned)(rnd() % n_nb);
				emm_heap_stream_destroyed(h, nb_streams[i]);
				nb_streams[i] = nb_streams[--n_nb];
			}
		} else if (r < 992) {
			if (!capture_left) {
				fence.capture_sync = true;
				capture_left = (long)rnd_range(10, 300);
			}
		} else if (r < 994) {
			/* Interior pointers and foreign addresses. */
			struct live *l = model_pick();
			if (l && l->size > 512 && emm_heap_free(l->addr + 512, 0, NULL) != -EINVAL)
				VIOLATION("interior free of 0x%llx not refused", (unsigned long long)l->addr);
			if (emm_heap_free(0x1000 + (rnd() % 4096) * 512, 0, NULL) != -ENOENT)
				VIOLATION("foreign free not -ENOENT");
		} else if (r < 995) {
			fake_device_synchronize(&fence);
		} else {
			fence.fail_record = rnd() % 8 == 0;
		}
		if (op % CHECK_EVERY == 0)
			check_counters(h);
	}
	fence.capture_sync = false;
	fence.fail_record = 0;
	check_counters(h);
	struct emm_stats st = heap_stats(h);
	fprintf(
	    stderr,
	    "  run A: %ld allocs, %ld frees, %ld ENOMEM; hits %llu misses %llu splits %llu merges %llu, "
	    "epochs %llu, events %llu, queries %llu, stream waits %llu, host waits %llu, oom retries %llu, "
	    "backend %llu/%llu, peak reserved %llu MiB\n",
	    allocs, frees, enomem, (unsigned long long)st.hits, (unsigned long long)st.misses,
	    (unsigned long long)st.splits, (unsigned long long)st.merges,
	    (unsigned long long)st.epochs_closed, (unsigned long long)st.events_recorded,
	    (unsigned long long)st.event_queries, (unsigned long long)st.stream_waits,
	    (unsigned long long)st.host_waits, (unsigned long long)st.oom_retries,
	    (unsigned long long)st.backend_allocs, (unsigned long long)st.backend_frees,
	    (unsigned long long)(st.reserved_bytes_peak >> 20));
	expect_true(allocs > 300000);
	expect_true(st.hits > st.misses * 10);
	expect_true(st.stream_waits > 0 && st.oom_retries > 0 && st.epochs_closed > 0);

	/* Drain. */
	while (nlive) {
		struct live *l = live_arr[nlive - 1];
		emm_addr_t a = l->addr;
		emm_stream_t fs = rnd() % 2 || !stream_alive(l->stream) ? EMM_STREAM_SYNC : l->stream;
		model_remove(l);
		if (emm_heap_free(a, fs, NULL) != 0)
			VIOLATION("drain free 0x%llx", (unsigned long long)a);
	}
	while (n_nb)
		emm_heap_stream_destroyed(h, nb_streams[--n_nb]);
	fake_complete(&fence, 0);
	emm_heap_flush(h);
	check_counters(h);
	st = heap_stats(h);
	expect_u64_eq(st.live_blocks, 0);
	expect_u64_eq(st.allocated_bytes, 0);
	expect_u64_eq(st.pending_bytes, 0);
	emm_heap_destroy(h, true);
	expect_u64_eq(src.used, 0);
	expect_int_eq(src.bad_frees, 0);
	expect_int_eq(fence.misuse, 0);
	expect_int_eq(fake_live_events(&fence), 0);
	expect_int_eq(violations, 0);
	model_reset();
	free(live_arr);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

TEST_BEGIN(test_model_mixed)
{
	model_mixed(false);
}
TEST_END

/* The same with the per-thread cache (EMM_THREAD_CACHE=1). */
TEST_BEGIN(test_model_mixed_tcache)
{
	model_mixed(true);
}
TEST_END

/* --- run B: the fence rule -------------------------------------------------- */

/* Freed ranges, address-ordered, with the number of events recorded at the
 * time of the free. */
struct freed {
	struct emm_tree_node node; /* key (0, addr, 0) */
	emm_addr_t addr;
	size_t size;
	size_t events_at_free;
};
static struct emm_tree freed_tree;

static void freed_add(emm_addr_t addr, size_t size, size_t events)
{
	struct freed *f = malloc(sizeof(*f));
	f->addr = addr;
	f->size = size;
	f->events_at_free = events;
	f->node.key[0] = 0;
	f->node.key[1] = addr;
	f->node.key[2] = 0;
	emm_tree_insert(&freed_tree, &f->node);
}

/* A new block [addr, addr+size): every freed range it overlaps must have
 * seen an event recorded after its free complete. Overlapped ranges are
 * dropped (the memory is live again). */
static long freed_check_reuse(emm_addr_t addr, size_t size, size_t max_done)
{
	long n_reused = 0;
	struct emm_tree_node *n = emm_tree_lower_bound(&freed_tree, 0, addr, 0);
	struct emm_tree_node *p = n ? emm_tree_prev(n) : emm_tree_last(&freed_tree);
	if (p && ((struct freed *)p)->addr + ((struct freed *)p)->size > addr)
		n = p;
	while (n && ((struct freed *)n)->addr < addr + size) {
		struct freed *f = (struct freed *)n;
		n = emm_tree_next(n);
		if (max_done <= f->events_at_free)
			VIOLATION("0x%llx reused before any fence after its free completed (freed with %zu "
			          "events recorded, highest complete %zu)",
			          (unsigned long long)f->addr, f->events_at_free, max_done);
		emm_tree_remove(&freed_tree, &f->node);
		free(f);
		n_reused++;
	}
	return n_reused;
}

static void model_fence_rule(bool tcache)
{
	violations = 0;
	const long OPS = 300000;
	struct emm_heap_params p;
	emm_heap_params_default(&p);
	p.thread_cache = tcache;
	emm_heap_t *h = NULL;
	assert_int_eq(fake_heap_create(&p, &src, 1 * GIB, &fence, &h), 0);
	live_arr = calloc(MAX_LIVE + 1, sizeof(*live_arr));
	emm_tree_init(&live_tree);
	emm_tree_init(&freed_tree);
	emm_heap_stream_created(h, 0x9900, true);
	long reuses = 0;

	for (long op = 0; op < OPS && violations < 10; op++) {
		unsigned r = (unsigned)(rnd() % 1000);
		if (r < 500 && nlive < 600) {
			size_t size = rnd() % 8 ? rnd_range(1, 256 * KIB) : rnd_range(1 * MIB, 12 * MIB);
			emm_stream_t st = rnd() % 2 ? EMM_STREAM_SYNC : pick_stream();
			emm_addr_t a = 0;
			int rc = emm_heap_alloc(h, size, st, &a);
			if (rc == 0) {
				model_add(h, a, size, st);
				struct live *l = live_arr[nlive - 1];
				reuses += freed_check_reuse(a, l->size, fence.max_done);
			} else if (rc != -ENOMEM) {
				VIOLATION("alloc: %d", rc);
			}
		} else if (r < 980) {
			struct live *l = model_pick();
			if (!l)
				continue;
			emm_addr_t a = l->addr;
			size_t size = l->size;
			model_remove(l);
			size_t events = fence.nev;
			if (emm_heap_free(a, EMM_STREAM_SYNC, NULL) != 0)
				VIOLATION("free 0x%llx", (unsigned long long)a);
			freed_add(a, size, events);
		} else if (r < 995) {
			fake_complete(&fence, rnd() % 2 ? 0 : EMM_STREAM_LEGACY);
		} else {
			emm_heap_flush(h);
		}
		if (op % CHECK_EVERY == 0)
			check_counters(h);
	}
	check_counters(h);
	struct emm_stats st = heap_stats(h);
	fprintf(stderr,
	        "  run B: %ld reuses checked; hits %llu, epochs %llu, events %llu, queries %llu, "
	        "host waits %llu\n",
	        reuses, (unsigned long long)st.hits, (unsigned long long)st.epochs_closed,
	        (unsigned long long)st.events_recorded, (unsigned long long)st.event_queries,
	        (unsigned long long)st.host_waits);
	expect_true(st.hits > 100000);
	expect_true(reuses > 10000);
	while (nlive) {
		emm_addr_t a = live_arr[nlive - 1]->addr;
		model_remove(live_arr[nlive - 1]);
		emm_heap_free(a, EMM_STREAM_SYNC, NULL);
	}
	for (struct emm_tree_node *n; (n = emm_tree_first(&freed_tree));) {
		emm_tree_remove(&freed_tree, n);
		free(n);
	}
	emm_heap_stream_destroyed(h, 0x9900);
	emm_heap_destroy(h, true);
	expect_u64_eq(src.used, 0);
	expect_int_eq(fence.misuse, 0);
	expect_int_eq(fake_live_events(&fence), 0);
	expect_int_eq(violations, 0);
	free(live_arr);
	fake_src_fini(&src);
	fake_fence_fini(&fence);
}

TEST_BEGIN(test_model_fence_rule)
{
	model_fence_rule(false);
}
TEST_END

/* The same with the per-thread cache (EMM_THREAD_CACHE=1). */
TEST_BEGIN(test_model_fence_rule_tcache)
{
	model_fence_rule(true);
}
TEST_END

int main(void)
{
	int r = emm_test_run(test_model_mixed, test_model_fence_rule, test_model_mixed_tcache,
	                     test_model_fence_rule_tcache, NULL);
	while (shadow_free) {
		struct shadow *s = shadow_free;
		shadow_free = s->next;
		free(s);
	}
	return r;
}
