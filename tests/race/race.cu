/* SPDX-License-Identifier: MIT */
/*
 * tests/race/race.cu - does libemm ever hand a freed block to a new owner
 * while GPU work enqueued before the free may still write it?
 *
 * One iteration, device pairings (X = stream of the old owner, Y = stream of
 * the new one):
 *
 *   long kernel on X keeps writing pattern A into block p; it runs until the
 *     host raises a flag (host-mapped memory), then `tail` more, then one last
 *     pass of A;
 *   free p right after the launch, no sync (cudaFree, or cudaFreeAsync on X);
 *   allocate the same size again -> q (cudaMalloc, or cudaMallocAsync on Y);
 *     q == p: "reused", else "safe-by-new-block" (counted, not a failure);
 *   short kernel on Y writes pattern B into q;
 *   the host raises the flag (so free + alloc + short kernel were all issued
 *     while the long kernel ran: the race window is real on every
 *     iteration where the kernel saw the flag before its time limit);
 *   device sync; q must be all B. Any A left means the long kernel's writes
 *     landed after B: corruption.
 *
 * Pinned pairing (pinned[:KIND]): a spin kernel on X waits for the flag, then
 * cudaMemcpyAsync(d, h, H2D, X) copies the pinned buffer h (pattern A);
 * cudaFreeHost(h); cudaHostAlloc again -> h2 (h2 == h: reused); the host
 * overwrites h2 with B and raises the flag; after the sync d must be all A.
 *
 * Usage: race --pairing NAME [--iterations N] [--sizes S1,S2,...]
 *             [--expect-corruption] [--simulate-reuse] [--allow-no-emm]
 *             [--min-window F] [--long-blocks N] [--min-us N] [--max-us N] [--tail-us N]
 *
 *   NAME: [async:]X-Y with X, Y in legacy|blocking|nonblocking|ptds (Y may be
 *         "same": the stream of X), or pinned[:X]; aliases async-cross
 *         (= async:nonblocking-nonblocking), async-same
 *         (= async:nonblocking-same). ptds-ptds runs the Y side on a second
 *         thread (its own per-thread default stream).
 *   --iterations N: per size (default 1000). --sizes: default 64K,4M.
 *   --expect-corruption: exit 0 only if at least one corruption was seen
 *         (the unsafe controls: EMM_FREE_MODE=stream across streams).
 *   --simulate-reuse: no free/alloc at all, q = p: what a broken allocator
 *         would do; with --expect-corruption it proves the check can fail
 *         independently of libemm.
 *   --destroy-x before|after: X is a new stream each iteration (X must be
 *         blocking or nonblocking, the free synchronous, Y not "same"),
 *         destroyed right after the long kernel's launch, before or after
 *         the free: its work runs on, and the block must still wait for it.
 *   --reuse-optional: a size at which the freed block never came back
 *         counts as run, not skipped: where handing it out at once is the
 *         bug looked for (the libemm before 69aec73 did, at 64 MiB, with
 *         --destroy-x: every iteration corrupted), not handing it out
 *         while the kernel runs is the pass.
 *   --min-window F: fail unless the race window was open (the long kernel
 *         saw the flag before its --max-us limit) in at least fraction F of
 *         the iterations; under EMM_FREE_MODE=fence this proves the free and
 *         the allocation did not block the host, so "no corruption" means
 *         something.
 *
 * Built twice: `race` (legacy default stream) and `race-ptds`
 * (--default-stream per-thread, RACE_PTDS: stream 0 is the per-thread
 * stream, so the runtime reaches the driver's _ptsz entry points).
 */
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "race_util.h"

#ifdef RACE_PTDS
#define LEGACY_HANDLE cudaStreamLegacy
#define PTDS_HANDLE ((cudaStream_t)0)
#define BINARY_KIND "per-thread default stream build"
#else
#define LEGACY_HANDLE ((cudaStream_t)0)
#define PTDS_HANDLE cudaStreamPerThread
#define BINARY_KIND "legacy default stream build"
#endif

/* ---- kernels ------------------------------------------------------------------ */

/* The pinned pairing's gate: spins (no data) until the flag or max_ns. */
__global__ void spin_gate(const volatile uint32_t *flag, uint32_t want, uint64_t max_ns, uint64_t tail_ns,
			  volatile uint32_t *win)
{
	uint64_t t0 = race_gtimer();
	uint64_t t_end = t0 + max_ns;
	int seen = 0;
	for (;;) {
		uint64_t now = race_gtimer();
		if (!seen && *flag >= want) {
			seen = 1;
			t_end = now + tail_ns;
		}
		if (now >= t_end)
			break;
	}
	*win = seen;
}

/* res[0] += mismatches; the first one seen goes to res[1] (index), res[2]
 * (value). */
__global__ void count_ne(const uint32_t *p, size_t n, uint32_t want, unsigned long long *res)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
		uint32_t v = p[i];
		if (v != want) {
			unsigned long long c = atomicAdd(&res[0], 1ull);
			if (c == 0) {
				res[1] = i;
				res[2] = v;
			}
		}
	}
}

/* ---- pairings ------------------------------------------------------------------ */

enum skind { SK_LEGACY, SK_BLOCKING, SK_NONBLOCKING, SK_PTDS, SK_SAME };

static const char *skind_name(skind k)
{
	switch (k) {
	case SK_LEGACY: return "legacy";
	case SK_BLOCKING: return "blocking";
	case SK_NONBLOCKING: return "nonblocking";
	case SK_PTDS: return "per-thread";
	case SK_SAME: return "same";
	}
	return "?";
}

static bool parse_skind(const std::string &s, skind *k, bool allow_same)
{
	if (s == "legacy") *k = SK_LEGACY;
	else if (s == "blocking") *k = SK_BLOCKING;
	else if (s == "nonblocking" || s == "non-blocking") *k = SK_NONBLOCKING;
	else if (s == "ptds" || s == "per-thread" || s == "perthread") *k = SK_PTDS;
	else if (allow_same && s == "same") *k = SK_SAME;
	else return false;
	return true;
}

struct pairing {
	std::string name;
	bool async = false;
	bool pinned = false;
	skind x = SK_NONBLOCKING, y = SK_NONBLOCKING;
};

static pairing parse_pairing(const char *arg)
{
	pairing p;
	std::string s = arg;
	p.name = s;
	if (s == "async-cross") s = "async:nonblocking-nonblocking";
	else if (s == "async-same") s = "async:nonblocking-same";
	if (s.rfind("pinned", 0) == 0) {
		p.pinned = true;
		p.x = SK_NONBLOCKING;
		if (s.size() > 6) {
			if (s[6] != ':' || !parse_skind(s.substr(7), &p.x, false))
				race_fail("bad pinned pairing '%s' (pinned[:legacy|blocking|nonblocking|ptds])", arg);
		}
		p.y = SK_SAME;
		return p;
	}
	if (s.rfind("async:", 0) == 0) {
		p.async = true;
		s = s.substr(6);
	}
	size_t dash = s.find('-');
	if (dash == std::string::npos ||
	    !parse_skind(s.substr(0, dash), &p.x, false) || !parse_skind(s.substr(dash + 1), &p.y, true))
		race_fail("bad pairing '%s': want [async:]X-Y with X,Y in legacy|blocking|nonblocking|ptds "
			  "(Y may be 'same'), pinned[:X], async-cross or async-same", arg);
	return p;
}

/* ---- the Y side may run on another thread ------------------------------------------ */

/* ---- the run ----------------------------------------------------------------------- */

struct options {
	pairing pr;
	unsigned iterations = 1000;
	std::vector<size_t> sizes;
	bool expect_corruption = false;
	bool simulate = false;
	bool allow_no_emm = false;
	double min_window = 0; /* fraction of iterations with the race window open */
	unsigned long_blocks = 8;
	uint64_t min_ns = 20000;
	uint64_t max_ns = 1000000;
	uint64_t tail_ns = 200000;
	int destroy_x = 0; /* 1: X destroyed before the free, 2: after it (a new X each iteration) */
	bool reuse_optional = false; /* a size whose freed block never came back ran (not skipped) */
};

struct result {
	unsigned iterations = 0;
	unsigned reused = 0;
	unsigned new_block = 0;
	unsigned window_open = 0;
	unsigned corruptions = 0;
	unsigned long long bad_words = 0;
	std::vector<double> issue_us; /* host: long launch -> flag raised */
};

/* Control words, host-mapped: [0] flag (host -> GPU), [1] window (GPU -> host). */
static struct race_mapped g_ctl;
static unsigned long long *g_res; /* device: count_ne results */

static volatile uint32_t *ctl_flag_host(void) { return (volatile uint32_t *)g_ctl.host; }
static const volatile uint32_t *ctl_flag_dev(void) { return (const volatile uint32_t *)g_ctl.dev; }
static volatile uint32_t *ctl_win_host(void) { return (volatile uint32_t *)g_ctl.host + 1; }
static volatile uint32_t *ctl_win_dev(void) { return (volatile uint32_t *)g_ctl.dev + 1; }

static void raise_flag(uint32_t want)
{
	__sync_synchronize();
	*ctl_flag_host() = want;
	__sync_synchronize();
}

static cudaStream_t make_stream(skind k, cudaStream_t same, std::vector<cudaStream_t> *owned)
{
	cudaStream_t s = 0;
	switch (k) {
	case SK_LEGACY: return LEGACY_HANDLE;
	case SK_PTDS: return PTDS_HANDLE;
	case SK_SAME: return same;
	case SK_BLOCKING: CK(cudaStreamCreate(&s)); break;
	case SK_NONBLOCKING: CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); break;
	}
	owned->push_back(s);
	return s;
}

/* Mismatches of q[0..n) against want, on the device (after a full sync). */
static unsigned long long check_block(const uint32_t *q, size_t n, uint32_t want, unsigned long long *first_idx,
				      unsigned long long *first_val)
{
	unsigned long long h[3];
	CK(cudaMemset(g_res, 0, 3 * sizeof(unsigned long long)));
	count_ne<<<256, 256>>>(q, n, want, g_res); /* default stream, like the memset and copy */
	CK_LAUNCH();
	CK(cudaMemcpy(h, g_res, sizeof(h), cudaMemcpyDeviceToHost));
	*first_idx = h[1];
	*first_val = h[2];
	return h[0];
}

static uint32_t g_want; /* flag value of the current iteration, monotonic */

/* One iteration's bookkeeping: issue time, whether the freed block came back,
 * and whether the `kernel` kernel saw the race window open (it reports 1 or
 * 0 in the window word; anything else means it never ran to the end). */
static void record_iteration(result *r, unsigned it, uint64_t t0, uint64_t t1, bool reused, const char *kernel)
{
	r->iterations++;
	r->issue_us.push_back((double)(t1 - t0) / 1000.0);
	if (reused)
		r->reused++;
	else
		r->new_block++;
	uint32_t win = *ctl_win_host();
	if (win == 1)
		r->window_open++;
	else if (win != 0)
		race_fail("iteration %u: the %s kernel did not report (window word 0x%x)", it, kernel, win);
}

static void run_device(const options &o, size_t size, cudaStream_t X, cudaStream_t Y, race_worker *yw, result *r)
{
	size_t n = size / sizeof(uint32_t);
	uint32_t *p = NULL;
	/* Async pairings stay within the stream-ordered API (cudaFreeAsync of
	 * a cudaMalloc block is not something to rely on). */
	if (o.pr.async)
		CK(cudaMallocAsync((void **)&p, size, X));
	else
		CK(cudaMalloc((void **)&p, size));
	CK(cudaMemsetAsync(p, 0, size, X));
	CK(cudaDeviceSynchronize());
	unsigned fill_blocks = (unsigned)std::min<size_t>((n + 255) / 256, 1024);
	if (fill_blocks == 0)
		fill_blocks = 1;

	for (unsigned it = 0; it < o.iterations; it++) {
		uint32_t A = 0xA0000000u | (it & 0xFFFFFFu);
		uint32_t B = 0xB0000000u | (it & 0xFFFFFFu);
		uint32_t want = ++g_want;
		*ctl_win_host() = 0xFFFFFFFFu;
		__sync_synchronize();

		if (o.destroy_x)
			CK(cudaStreamCreateWithFlags(&X, o.pr.x == SK_NONBLOCKING ? cudaStreamNonBlocking
			                                                         : cudaStreamDefault));
		uint64_t t0 = race_now_ns();
		race_long_writer<<<o.long_blocks, 256, 0, X>>>(p, n, A, ctl_flag_dev(), want, o.min_ns, o.max_ns, o.tail_ns,
							  ctl_win_dev());
		CK_LAUNCH();
		if (o.destroy_x == 1)
			CK(cudaStreamDestroy(X)); /* the long kernel runs on */

		uint32_t *q = NULL;
		if (o.simulate) {
			q = p;
		} else if (o.pr.async) {
			CK(cudaFreeAsync(p, X));
		} else {
			CK(cudaFree(p));
		}
		if (o.destroy_x == 2)
			CK(cudaStreamDestroy(X));
		auto yside = [&] {
			if (!o.simulate) {
				if (o.pr.async)
					CK(cudaMallocAsync((void **)&q, size, Y));
				else
					CK(cudaMalloc((void **)&q, size));
			}
			race_fill_u32<<<fill_blocks, 256, 0, Y>>>(q, n, B);
			CK_LAUNCH();
			raise_flag(want);
		};
		if (yw)
			yw->run(yside);
		else
			yside();
		uint64_t t1 = race_now_ns();
		CK(cudaDeviceSynchronize());

		record_iteration(r, it, t0, t1, q == p, "long");

		unsigned long long fi = 0, fv = 0;
		unsigned long long bad = check_block(q, n, B, &fi, &fv);
		if (bad) {
			r->corruptions++;
			r->bad_words += bad;
			if (r->corruptions <= 5)
				printf("  corruption: size %zu iteration %u block %p (%s): %llu of %zu words not B "
				       "(first: word %llu = 0x%08llx, B = 0x%08x, A = 0x%08x)\n",
				       size, it, (void *)q, q == p ? "reused" : "new block", bad, n, fi, fv, B, A);
		}
		p = q;
	}
	if (o.pr.async)
		CK(cudaFreeAsync(p, X));
	else
		CK(cudaFree(p));
	CK(cudaDeviceSynchronize());
}

static void fill_host(uint32_t *h, size_t n, uint32_t v)
{
	for (size_t i = 0; i < n; i++)
		h[i] = v;
}

static void run_pinned(const options &o, size_t size, cudaStream_t X, result *r)
{
	size_t n = size / sizeof(uint32_t);
	uint32_t *d = NULL, *h = NULL;
	CK(cudaMalloc((void **)&d, size));
	CK(cudaHostAlloc((void **)&h, size, cudaHostAllocDefault));

	for (unsigned it = 0; it < o.iterations; it++) {
		uint32_t A = 0xA0000000u | (it & 0xFFFFFFu);
		uint32_t B = 0xB0000000u | (it & 0xFFFFFFu);
		uint32_t want = ++g_want;
		fill_host(h, n, A);
		CK(cudaMemset(d, 0, size));
		CK(cudaDeviceSynchronize());
		*ctl_win_host() = 0xFFFFFFFFu;
		__sync_synchronize();

		uint64_t t0 = race_now_ns();
		spin_gate<<<1, 32, 0, X>>>(ctl_flag_dev(), want, o.max_ns, o.tail_ns, ctl_win_dev());
		CK_LAUNCH();
		CK(cudaMemcpyAsync(d, h, size, cudaMemcpyHostToDevice, X));
		uint32_t *h2 = NULL;
		if (o.simulate) {
			h2 = h;
		} else {
			CK(cudaFreeHost(h));
			CK(cudaHostAlloc((void **)&h2, size, cudaHostAllocDefault));
		}
		fill_host(h2, n, B); /* the new owner overwrites "its" buffer */
		raise_flag(want);
		uint64_t t1 = race_now_ns();
		CK(cudaDeviceSynchronize());

		record_iteration(r, it, t0, t1, h2 == h, "gate");

		unsigned long long fi = 0, fv = 0;
		unsigned long long bad = check_block(d, n, A, &fi, &fv);
		if (bad) {
			r->corruptions++;
			r->bad_words += bad;
			if (r->corruptions <= 5)
				printf("  corruption: size %zu iteration %u pinned %p (%s): the device received %llu "
				       "of %zu words not A (first: word %llu = 0x%08llx, A = 0x%08x, B = 0x%08x)\n",
				       size, it, (void *)h2, h2 == h ? "reused" : "new block", bad, n, fi, fv, A, B);
		}
		h = h2;
	}
	CK(cudaFreeHost(h));
	CK(cudaFree(d));
	CK(cudaDeviceSynchronize());
}

static void usage(void)
{
	fprintf(stderr, "usage: race --pairing [async:]X-Y|pinned[:X]|async-cross|async-same [--iterations N]\n"
			"            [--sizes S1,S2] [--expect-corruption] [--simulate-reuse] [--allow-no-emm]\n"
			"            [--min-window F] [--long-blocks N] [--min-us N] [--max-us N] [--tail-us N]\n"
			"            [--destroy-x before|after] [--reuse-optional]\n"
			"  X, Y: legacy | blocking | nonblocking | ptds   (Y may also be 'same')\n");
	exit(2);
}

int main(int argc, char **argv)
{
	options o;
	bool have_pairing = false;
	const char *sizes_arg = "64K,4M";
	bool tail_set = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		auto next = [&]() -> const char * {
			if (i + 1 >= argc)
				usage();
			return argv[++i];
		};
		if (a == "--pairing") {
			o.pr = parse_pairing(next());
			have_pairing = true;
		} else if (a == "--iterations") o.iterations = (unsigned)race_parse_size(next());
		else if (a == "--sizes") sizes_arg = next();
		else if (a == "--expect-corruption") o.expect_corruption = true;
		else if (a == "--simulate-reuse") o.simulate = true;
		else if (a == "--allow-no-emm") o.allow_no_emm = true;
		else if (a == "--min-window") o.min_window = atof(next());
		else if (a == "--long-blocks") o.long_blocks = (unsigned)race_parse_size(next());
		else if (a == "--min-us") o.min_ns = race_parse_size(next()) * 1000;
		else if (a == "--max-us") o.max_ns = race_parse_size(next()) * 1000;
		else if (a == "--tail-us") { o.tail_ns = race_parse_size(next()) * 1000; tail_set = true; }
		else if (a == "--reuse-optional") o.reuse_optional = true;
		else if (a == "--destroy-x") {
			std::string w = next();
			o.destroy_x = w == "before" ? 1 : w == "after" ? 2 : 0;
			if (!o.destroy_x)
				usage();
		} else usage();
	}
	if (!have_pairing)
		usage();
	if (o.pr.pinned && !tail_set)
		o.tail_ns = 5000; /* the copy runs after the gate; the host already overwrote */
	for (const char *s = sizes_arg; *s;) {
		const char *c = strchr(s, ',');
		std::string one = c ? std::string(s, c - s) : std::string(s);
		size_t v = (size_t)race_parse_size(one.c_str());
		if (v < 4 || v % 4)
			race_fail("size %zu: want a positive multiple of 4", v);
		o.sizes.push_back(v);
		s = c ? c + 1 : s + strlen(s);
	}
	if (o.long_blocks == 0 || o.iterations == 0)
		usage();
	if (o.destroy_x && (o.pr.async || o.pr.pinned || o.simulate || o.pr.y == SK_SAME ||
	                    (o.pr.x != SK_NONBLOCKING && o.pr.x != SK_BLOCKING)))
		race_fail("--destroy-x: X blocking or nonblocking, a synchronous free, Y not 'same'");

	race_require_gpu();
	bool emm = race_require_emm(o.allow_no_emm);

	const char *ykind = o.pr.pinned ? "host" : skind_name(o.pr.y);
	printf("race: pairing %s (%s%s -> %s%s), EMM_FREE_MODE=%s, %u iterations per size, %s%s%s\n",
	       o.pr.name.c_str(), o.pr.pinned ? "pinned via " : (o.pr.async ? "cudaFreeAsync on " : "cudaFree after "),
	       skind_name(o.pr.x), o.pr.async ? "cudaMallocAsync on " : "", ykind, race_free_mode(), o.iterations,
	       BINARY_KIND, o.simulate ? ", SIMULATED REUSE (no free/alloc)" : "",
	       o.expect_corruption ? ", expecting corruption" : "");
	fflush(stdout);

	g_ctl = race_mapped_alloc(4096);
	CK(cudaMalloc((void **)&g_res, 3 * sizeof(unsigned long long)));

	std::vector<cudaStream_t> owned;
	cudaStream_t X = make_stream(o.pr.x, 0, &owned);
	cudaStream_t Y = o.pr.pinned ? X : make_stream(o.pr.y, X, &owned);
	race_worker *yw = NULL;
	if (!o.pr.pinned && o.pr.x == SK_PTDS && o.pr.y == SK_PTDS)
		yw = new race_worker(); /* two per-thread default streams need two threads */

	/* Warm up: load the kernels (lazy module loading) and the async pool. */
	{
		uint32_t *w = NULL;
		CK(cudaMalloc((void **)&w, 4096));
		raise_flag(++g_want);
		race_long_writer<<<1, 32, 0, X>>>(w, 1024, 0, ctl_flag_dev(), g_want, 0, 1000, 0, ctl_win_dev());
		CK_LAUNCH();
		spin_gate<<<1, 32, 0, X>>>(ctl_flag_dev(), g_want, 1000, 0, ctl_win_dev());
		CK_LAUNCH();
		race_fill_u32<<<1, 32, 0, X>>>(w, 1024, 1);
		CK_LAUNCH();
		unsigned long long fi, fv;
		CK(cudaDeviceSynchronize());
		(void)check_block(w, 1024, 1, &fi, &fv);
		CK(cudaFree(w));
		if (o.pr.async) {
			CK(cudaMallocAsync((void **)&w, 4096, X));
			CK(cudaFreeAsync(w, X));
		}
		CK(cudaDeviceSynchronize());
	}

	int stats_dev = o.pr.pinned ? -2 : 0;
	struct emm_stats s0 = race_stats(stats_dev);
	struct emm_stats p0 = race_stats(-1);

	result total;
	bool any_fail = false;
	struct emm_partial part = {};
	for (size_t sz : o.sizes) {
		result r;
		if (o.pr.pinned)
			run_pinned(o, sz, X, &r);
		else
			run_device(o, sz, X, Y, yw, &r);
		std::vector<double> is = r.issue_us;
		std::sort(is.begin(), is.end());
		printf("pairing %s size %zu: iterations %u, reused-same-address %u, safe-by-new-block %u, "
		       "window-open %u, corruptions %u (%llu words); issue time median %.1f us, max %.1f us\n",
		       o.pr.name.c_str(), sz, r.iterations, r.reused, r.new_block, r.window_open, r.corruptions,
		       r.bad_words, race_median(is), is.empty() ? 0.0 : is.back());
		fflush(stdout);
		/* A size at which the allocator never handed the freed block back
		 * tested no reuse under a live kernel: a skipped case. */
		if (r.reused > 0 || o.reuse_optional)
			emm_partial_ran(&part);
		else
			emm_partial_skip(&part, "size %zu: no iteration reused the freed block (%u new blocks)", sz,
					 r.new_block);
		total.iterations += r.iterations;
		total.reused += r.reused;
		total.new_block += r.new_block;
		total.window_open += r.window_open;
		total.corruptions += r.corruptions;
		total.bad_words += r.bad_words;
	}

	struct emm_stats s1 = race_stats(stats_dev);
	struct emm_stats d = race_stats_delta(s0, s1);
	race_print_stats(o.pr.pinned ? "pinned host (-2), during the iterations" : "device 0, during the iterations", d);
	race_print_stats("process (-1), totals", race_stats(-1));
	(void)p0;

	printf("TOTAL pairing %s mode %s: iterations %u, reused-same-address %u, safe-by-new-block %u, "
	       "window-open %u, corruptions %u\n",
	       o.pr.name.c_str(), race_free_mode(), total.iterations, total.reused, total.new_block,
	       total.window_open, total.corruptions);

	/* The allocations must have gone through libemm's pool. */
	if (emm && race_emm_active() && !o.simulate) {
		bool pinned_off = o.pr.pinned && race_env_false("EMM_PINNED");
		if (!pinned_off && d.allocs < total.iterations) {
			printf("FAIL: libemm served %llu allocations for %u iterations: the allocations did not go "
			       "through the pool\n",
			       (unsigned long long)d.allocs, total.iterations);
			any_fail = true;
		}
	}
	if (o.min_window > 0 && total.window_open < o.min_window * total.iterations) {
		printf("FAIL: the race window was open in only %u of %u iterations (want >= %.0f%%): free + alloc + "
		       "launch blocked the host until the old owner's kernel ended (or hit its %.0f us limit), so "
		       "this run did not test reuse under a live kernel\n",
		       total.window_open, total.iterations, o.min_window * 100, o.max_ns / 1000.0);
		any_fail = true;
	}
	if (total.window_open == 0 && !o.expect_corruption)
		printf("note: the race window was never open (each iteration's free/alloc/launch finished only "
		       "after the long kernel's time limit): expected under EMM_FREE_MODE=strict, where the free "
		       "waits for the device\n");
	if (total.reused == 0)
		printf("note: no iteration reused the freed block: this run proves nothing about reuse for "
		       "pairing %s\n", o.pr.name.c_str());

	for (cudaStream_t s : owned)
		CK(cudaStreamDestroy(s));
	delete yw;
	race_mapped_free(&g_ctl);
	CK(cudaFree(g_res));

	if (o.expect_corruption) {
		if (total.corruptions == 0) {
			printf("FAIL: --expect-corruption, but no corruption in %u iterations (%u reused the freed "
			       "block%s)\n",
			       total.iterations, total.reused,
			       total.reused == 0 ? ": the allocator never handed p back, so no race could happen" : "");
			return 1;
		}
		printf("ok: corruption observed as expected (%u of %u iterations): the check can fail\n",
		       total.corruptions, total.iterations);
		return any_fail ? 1 : 0;
	}
	if (total.corruptions) {
		printf("FAIL: %u corrupted iterations: a freed block was handed out while earlier GPU work could "
		       "still write it\n",
		       total.corruptions);
		return 1;
	}
	if (any_fail)
		return 1;
	printf("ok: no corruption\n");
	/* 77 when no size saw reuse, the marker line when some did not. */
	return emm_partial_finish(&part);
}
