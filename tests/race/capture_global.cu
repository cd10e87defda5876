/* SPDX-License-Identifier: MIT */
/*
 * tests/race/capture_global.cu - libemm serving allocations during a
 * global-mode stream capture (issue 13). Without libemm the real driver
 * refuses a cudaMalloc made during a global capture (on the capturing
 * thread, or on any other thread in global mode) with
 * cudaErrorStreamCaptureUnsupported and invalidates the capture; libemm
 * serves it from its pool, and a pool miss reaches the driver with the
 * calling thread in relaxed mode, so the capture stays valid.
 *
 * --part global-miss: a global-mode capture whose first cudaMalloc misses
 *   the cache (a size no cached block serves, more than once): the
 *   allocation succeeds, the stream still captures, kernels using the
 *   block are captured, the block is cudaFree'd inside the capture; the
 *   capture ends cleanly, the graph replays 100 times with the right
 *   result, and blocks of the same size allocated after the capture and
 *   filled with a sentinel survive 20 more replays (the freed block stays
 *   out of reach while the graph lives).
 *
 * --part threads-beside: the main thread holds a global-mode capture open
 *   while another thread (global thread mode, the default) allocates and
 *   frees in a loop - cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync
 *   on its own non-blocking stream, sizes that hit and sizes that miss -
 *   and writes every block with a kernel on its stream. Every call
 *   succeeds, no block handed out overlaps another live one or the
 *   capture's own blocks, the capture ends cleanly (not invalidated), the
 *   graph replays correctly, and the other thread's last blocks hold their
 *   tags after the replays (0 corruptions).
 *
 * --stream blocking captures on a cudaStreamCreate stream instead of a
 * non-blocking one (then anything libemm enqueued on the legacy stream
 * during the capture would join it and invalidate it).
 *
 * Both parts test libemm's behaviour: without libemm (--allow-no-emm) they
 * print the driver's refusal and skip (77).
 *
 * Usage: capture_global --part global-miss|threads-beside [--stream nonblocking|blocking] [--allow-no-emm]
 */
#include <atomic>
#include <string>
#include <thread>

#include "race_util.h"

__global__ void cg_count_ne(const uint32_t *p, size_t n, uint32_t want, unsigned long long *res)
{
	unsigned long long c = 0;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		c += p[i] != want;
	if (c)
		atomicAdd(res, c);
}

static const unsigned GRID = 128;
static bool g_blocking;

static void make_stream(cudaStream_t *s)
{
	if (g_blocking)
		CK(cudaStreamCreate(s));
	else
		CK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
}

/* Words of out[0..n) not equal to reps * (3i + 1). */
static size_t count_wrong(const uint32_t *out, size_t n, uint32_t reps)
{
	std::vector<uint32_t> h(n);
	CK(cudaMemcpy(h.data(), out, n * 4, cudaMemcpyDeviceToHost));
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += h[i] != reps * ((uint32_t)i * 3u + 1u);
	return bad;
}

/* Words of p[0..n) not equal to want (device count, result through mapped memory). */
static unsigned long long count_ne(const uint32_t *p, size_t n, uint32_t want, struct race_mapped *res,
                                   cudaStream_t s)
{
	volatile unsigned long long *h = (volatile unsigned long long *)res->host;
	*h = 0;
	cg_count_ne<<<GRID, 256, 0, s>>>(p, n, want, (unsigned long long *)res->dev);
	CK_LAUNCH();
	CK(cudaStreamSynchronize(s));
	return *h;
}

static bool overlaps(const void *a, size_t na, const void *b, size_t nb)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return x < y + nb && y < x + na;
}

/* The end of a capture the driver refused to keep: report and skip or fail. */
static int refused(const char *what, cudaError_t e)
{
	printf("%s -> %s during a global-mode capture\n", what, cudaGetErrorName(e));
	if (!race_emm_active()) {
		printf("SKIP: the plain driver refuses it (this part tests libemm's behaviour)\n");
		return RACE_SKIP;
	}
	race_check(false, "%s failed during a global-mode capture under libemm: %s", what, cudaGetErrorName(e));
	return 1;
}

static cudaStreamCaptureStatus capture_status(cudaStream_t s)
{
	cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
	cudaError_t e = cudaStreamIsCapturing(s, &st);
	return e == cudaSuccess ? st : cudaStreamCaptureStatusInvalidated;
}

/* In the capture on s: out += tmp (3i + 1), tmp2 += tmp. */
static void capture_kernels(cudaStream_t s, uint32_t *tmp, uint32_t *tmp2, uint32_t *out, size_t n)
{
	race_fill_affine<<<GRID, 256, 0, s>>>(tmp, n, 3, 1);
	race_accumulate<<<GRID, 256, 0, s>>>(tmp2, tmp, n);
	race_accumulate<<<GRID, 256, 0, s>>>(out, tmp, n);
}

/* The capture's blocks freed inside it (*freed: both frees succeeded), the
 * counters since s0 read into *d (before the end, which may close epochs),
 * then the capture ended into *g. */
static cudaError_t free_and_end(cudaStream_t s, uint32_t *tmp, uint32_t *tmp2, const struct emm_stats &s0,
                                struct emm_stats *d, cudaGraph_t *g, bool *freed)
{
	cudaError_t ef = tmp ? cudaFree(tmp) : cudaSuccess;
	cudaError_t ef2 = tmp2 ? cudaFree(tmp2) : cudaSuccess;
	*freed = ef == cudaSuccess && ef2 == cudaSuccess;
	*d = race_stats_delta(s0, race_stats(0));
	*g = NULL;
	cudaError_t ee = cudaStreamEndCapture(s, g);
	race_print_stats("device 0, during the global capture", *d);
	return ee;
}

/* The capture's counters (no event recorded or queried while it ran), then
 * the graph instantiated and replayed 100 times on s: out must hold
 * 100 * (3i + 1). The executable graph, for more replays. */
static cudaGraphExec_t check_and_replay(const struct emm_stats &d, cudaGraph_t g, cudaStream_t s,
                                        const uint32_t *out, size_t n)
{
	race_check(d.events_recorded == 0 && d.event_queries == 0, "libemm recorded %llu / queried %llu events "
	           "during the global capture", (unsigned long long)d.events_recorded,
	           (unsigned long long)d.event_queries);
	cudaGraphExec_t ex;
	CK(cudaGraphInstantiate(&ex, g, 0));
	for (int i = 0; i < 100; i++)
		CK(cudaGraphLaunch(ex, s));
	CK(cudaStreamSynchronize(s));
	size_t bad = count_wrong(out, n, 100);
	printf("100 replays: %zu wrong words\n", bad);
	race_check(bad == 0, "after 100 replays %zu of %zu words wrong", bad, n);
	return ex;
}

/* ---- global-miss ------------------------------------------------------------------ */

static int part_global_miss(void)
{
	printf("== global-miss: global-mode capture whose first cudaMalloc misses the cache\n");
	const size_t n = (96u << 20) / 4 + 1024; /* 96 MiB + 4 KiB: no cached block this size */
	cudaStream_t s;
	make_stream(&s);
	uint32_t *out;
	CK(cudaMalloc((void **)&out, n * 4));
	CK(cudaMemset(out, 0, n * 4));
	CK(cudaDeviceSynchronize());

	struct emm_stats s0 = race_stats(0);
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	uint32_t *tmp = NULL, *tmp2 = NULL;
	cudaError_t ea = cudaMalloc((void **)&tmp, n * 4);
	cudaError_t eb = ea == cudaSuccess ? cudaMalloc((void **)&tmp2, n * 4 + 8192) : ea;
	cudaStreamCaptureStatus mid = capture_status(s);
	if (ea == cudaSuccess && eb == cudaSuccess)
		capture_kernels(s, tmp, tmp2, out, n);
	struct emm_stats d;
	cudaGraph_t g;
	bool freed;
	cudaError_t ee = free_and_end(s, tmp, tmp2, s0, &d, &g, &freed);
	printf("cudaMalloc -> %s, %s; stream %s after them; cudaFree %s; cudaStreamEndCapture -> %s\n",
	       cudaGetErrorName(ea), cudaGetErrorName(eb), mid == cudaStreamCaptureStatusActive ? "capturing" : "not capturing",
	       freed ? "ok" : "failed", cudaGetErrorName(ee));
	if (ea != cudaSuccess || eb != cudaSuccess || ee != cudaSuccess || !g) {
		cudaGetLastError();
		return refused(ea != cudaSuccess ? "cudaMalloc" : eb != cudaSuccess ? "the second cudaMalloc"
		                                                                   : "cudaStreamEndCapture",
		               ea != cudaSuccess ? ea : eb != cudaSuccess ? eb : ee);
	}
	race_check(mid == cudaStreamCaptureStatusActive, "the capture was not active after the cudaMalloc calls");
	race_check(freed, "cudaFree during the capture failed");
	race_check(d.allocs >= 2 && d.passthrough_allocs == 0, "libemm did not serve the capture's cudaMalloc calls "
	           "(allocs %llu, passed through %llu)", (unsigned long long)d.allocs,
	           (unsigned long long)d.passthrough_allocs);
	/* A miss reaches the backend: a new segment, or (EMM_BACKEND=vmm) a
	 * segment grown in place or pages mapped again - driver calls all. */
	race_check(d.misses >= 1 && d.backend_allocs + d.segment_grows + d.page_maps >= 1,
	           "the first cudaMalloc did not miss (misses %llu, backend allocations %llu, grows %llu, "
	           "page maps %llu): the test did not test a miss",
	           (unsigned long long)d.misses, (unsigned long long)d.backend_allocs,
	           (unsigned long long)d.segment_grows, (unsigned long long)d.page_maps);
	cudaGraphExec_t ex = check_and_replay(d, g, s, out, n);

	/* New owners of blocks that size: the graph's own must not be among them. */
	struct race_mapped res = race_mapped_alloc(sizeof(unsigned long long));
	cudaStream_t o;
	CK(cudaStreamCreateWithFlags(&o, cudaStreamNonBlocking));
	std::vector<uint32_t *> junk;
	for (int i = 0; i < 6; i++) {
		uint32_t *p;
		CK(cudaMalloc((void **)&p, n * 4));
		race_check(!overlaps(p, n * 4, tmp, n * 4) && !overlaps(p, n * 4, tmp2, n * 4 + 8192),
		           "a block allocated after the capture lies on a block the graph uses");
		race_fill_u32<<<GRID, 256, 0, o>>>(p, n, 0x7777u);
		CK_LAUNCH();
		junk.push_back(p);
	}
	CK(cudaStreamSynchronize(o));
	for (int i = 0; i < 20; i++)
		CK(cudaGraphLaunch(ex, s));
	CK(cudaStreamSynchronize(s));
	unsigned long long hit = 0;
	for (uint32_t *p : junk)
		hit += count_ne(p, n, 0x7777u, &res, o);
	printf("20 more replays: %llu sentinel words overwritten\n", hit);
	race_check(hit == 0, "graph replays overwrote %llu words of blocks allocated after the capture", hit);
	size_t bad = count_wrong(out, n, 120);
	race_check(bad == 0, "after 120 replays %zu of %zu words wrong", bad, n);
	for (uint32_t *p : junk)
		CK(cudaFree(p));
	CK(cudaGraphExecDestroy(ex));
	CK(cudaGraphDestroy(g));
	CK(cudaFree(out));
	CK(cudaStreamDestroy(o));
	CK(cudaStreamDestroy(s));
	race_mapped_free(&res);
	return 0;
}

/* ---- threads-beside ---------------------------------------------------------------- */

struct beside {
	std::atomic<int> ready{0}, go{0};
	const void *avoid[2];
	size_t avoid_size[2];
	unsigned iterations = 600;
	unsigned errors = 0, overlaps = 0;
	cudaError_t first_error = cudaSuccess;
	enum { LIVE = 8 };
	uint32_t *live[LIVE] = {};
	size_t words[LIVE] = {};
	uint32_t tag[LIVE] = {};
	cudaStream_t b;
};

static void beside_thread(struct beside *w)
{
	/* cudart's per-thread set-up before the capture begins. */
	CK(cudaSetDevice(0));
	CK(cudaFree(NULL));
	w->ready.store(1);
	while (w->go.load() == 0)
		std::this_thread::yield();
	for (unsigned i = 0; i < w->iterations; i++) {
		unsigned k = i % beside::LIVE;
		cudaError_t e;
		if (w->live[k]) {
			e = (i & 1) ? cudaFreeAsync(w->live[k], w->b) : cudaFree(w->live[k]);
			if (e != cudaSuccess && w->errors++ == 0)
				w->first_error = e;
			w->live[k] = NULL;
		}
		/* Mostly sizes seen before (hits); every 32nd one no block serves. */
		size_t bytes = (i % 32 == 31) ? ((size_t)40 << 20) + 4096u * i : (size_t)65536 << (i % 5);
		uint32_t *p = NULL;
		e = (i & 2) ? cudaMallocAsync((void **)&p, bytes, w->b) : cudaMalloc((void **)&p, bytes);
		if (e != cudaSuccess) {
			if (w->errors++ == 0)
				w->first_error = e;
			continue;
		}
		for (int a = 0; a < 2; a++)
			if (overlaps(p, bytes, w->avoid[a], w->avoid_size[a]))
				w->overlaps++;
		for (unsigned j = 0; j < beside::LIVE; j++)
			if (w->live[j] && overlaps(p, bytes, w->live[j], w->words[j] * 4))
				w->overlaps++;
		w->live[k] = p;
		w->words[k] = bytes / 4;
		w->tag[k] = 0xb0000000u + i;
		race_fill_u32<<<GRID, 256, 0, w->b>>>(p, w->words[k], w->tag[k]);
		e = cudaGetLastError();
		if (e != cudaSuccess && w->errors++ == 0)
			w->first_error = e;
	}
}

static int part_threads_beside(void)
{
	printf("== threads-beside: another thread allocates and frees during a global-mode capture\n");
	const size_t n = 1 << 20;
	cudaStream_t s;
	make_stream(&s);
	struct beside w;
	CK(cudaStreamCreateWithFlags(&w.b, cudaStreamNonBlocking));
	uint32_t *out, *tmp = NULL, *tmp2 = NULL;
	CK(cudaMalloc((void **)&out, n * 4));
	CK(cudaMemset(out, 0, n * 4));
	/* Warm the sizes the other thread uses, and leave frees pending. */
	for (int r = 0; r < 2; r++)
		for (unsigned i = 0; i < 64; i++) {
			void *p;
			CK(cudaMalloc(&p, (size_t)65536 << (i % 5)));
			CK(cudaFree(p));
		}
	CK(cudaDeviceSynchronize());
	std::thread t(beside_thread, &w);
	while (w.ready.load() == 0)
		std::this_thread::yield();

	struct emm_stats s0 = race_stats(0);
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	cudaError_t ea = cudaMalloc((void **)&tmp, n * 4);
	cudaError_t eb = ea == cudaSuccess ? cudaMalloc((void **)&tmp2, n * 4) : ea;
	if (ea == cudaSuccess && eb == cudaSuccess) {
		w.avoid[0] = tmp;
		w.avoid[1] = tmp2;
		w.avoid_size[0] = w.avoid_size[1] = n * 4;
		capture_kernels(s, tmp, tmp2, out, n);
	}
	w.go.store(1);
	t.join();
	cudaStreamCaptureStatus mid = capture_status(s);
	struct emm_stats d;
	cudaGraph_t g;
	bool freed;
	cudaError_t ee = free_and_end(s, tmp, tmp2, s0, &d, &g, &freed);
	printf("capture thread: cudaMalloc -> %s, %s; cudaStreamEndCapture -> %s; stream %s after the other "
	       "thread's loop\n", cudaGetErrorName(ea), cudaGetErrorName(eb), cudaGetErrorName(ee),
	       mid == cudaStreamCaptureStatusActive ? "still capturing" : "no longer capturing");
	printf("other thread: %u iterations, %u failed calls (first %s), %u overlapping blocks\n", w.iterations,
	       w.errors, cudaGetErrorName(w.first_error), w.overlaps);
	CK(cudaStreamSynchronize(w.b));
	if (ea != cudaSuccess || eb != cudaSuccess || ee != cudaSuccess || !g || w.errors) {
		cudaGetLastError();
		return refused(w.errors ? "the other thread's allocations" : ea != cudaSuccess ? "cudaMalloc"
		                                                            : eb != cudaSuccess ? "the second cudaMalloc"
		                                                                                : "cudaStreamEndCapture",
		               w.errors ? w.first_error : ea != cudaSuccess ? ea : eb != cudaSuccess ? eb : ee);
	}
	race_check(mid == cudaStreamCaptureStatusActive, "the capture was invalidated by the other thread");
	race_check(freed, "cudaFree during the capture failed");
	race_check(w.overlaps == 0, "%u blocks handed to the other thread overlapped live blocks", w.overlaps);
	race_check(d.misses >= 1, "no allocation missed during the capture: the test did not test a miss");
	cudaGraphExec_t ex = check_and_replay(d, g, s, out, n);

	struct race_mapped res = race_mapped_alloc(sizeof(unsigned long long));
	unsigned long long corrupt = 0;
	for (unsigned k = 0; k < beside::LIVE; k++)
		if (w.live[k])
			corrupt += count_ne(w.live[k], w.words[k], w.tag[k], &res, w.b);
	printf("the other thread's %u live blocks after the replays: %llu corrupted words\n",
	       (unsigned)beside::LIVE, corrupt);
	race_check(corrupt == 0, "%llu words of the other thread's blocks corrupted", corrupt);
	for (unsigned k = 0; k < beside::LIVE; k++)
		if (w.live[k])
			CK(cudaFree(w.live[k]));
	CK(cudaGraphExecDestroy(ex));
	CK(cudaGraphDestroy(g));
	CK(cudaFree(out));
	CK(cudaStreamDestroy(w.b));
	CK(cudaStreamDestroy(s));
	race_mapped_free(&res);
	return 0;
}

int main(int argc, char **argv)
{
	std::string part;
	bool allow_no_emm = false;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		if (a == "--part" && i + 1 < argc) part = argv[++i];
		else if (a == "--allow-no-emm") allow_no_emm = true;
		else if (a == "--stream" && i + 1 < argc && std::string(argv[i + 1]) == "blocking") { g_blocking = true; i++; }
		else if (a == "--stream" && i + 1 < argc && std::string(argv[i + 1]) == "nonblocking") { g_blocking = false; i++; }
		else part = "";
	}
	if (part != "global-miss" && part != "threads-beside") {
		fprintf(stderr, "usage: capture_global --part global-miss|threads-beside [--stream nonblocking|blocking] "
		                "[--allow-no-emm]\n");
		return 2;
	}
	race_require_gpu();
	race_require_emm(allow_no_emm);
	printf("capture_global: EMM_FREE_MODE=%s, capturing on a %s stream\n", race_free_mode(),
	       g_blocking ? "blocking" : "non-blocking");
	int rc = part == "global-miss" ? part_global_miss() : part_threads_beside();
	race_print_stats("device 0, totals", race_stats(0));
	if (rc == RACE_SKIP)
		return RACE_SKIP;
	if (rc || race_fails) {
		printf("%d check(s) failed\n", race_fails ? race_fails : 1);
		return 1;
	}
	printf("ok\n");
	return 0;
}
