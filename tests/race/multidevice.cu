/* SPDX-License-Identifier: MIT */
/*
 * tests/race/multidevice.cu - libemm with several devices (DESIGN.md §4:
 * one heap per context, so one pool per device): allocations are served and
 * counted on the device they were made on, frees from another device's
 * context go back to the owning device's heap, pool blocks work with peer
 * copies and peer access, one thread per device can churn its own pool
 * concurrently, and a block freed from another device while a kernel on its
 * own device still writes it is never handed out again too early.
 *
 * Needs at least two devices (exit 77 otherwise); uses all of them. Parts:
 *
 *  1. per device d: N blocks of mixed sizes (cudaMalloc and cudaMallocAsync
 *     on a created stream), filled with a d-specific pattern and checked;
 *     pointer attributes (cudaPointerGetAttributes, cuPointerGetAttribute)
 *     name device d and the block; emm_stats_get(d) grew by exactly N
 *     allocations / live blocks and no other device's counters moved.
 *     Then every block is freed with cudaFree from the next device
 *     (cudaSetDevice(other)): the frees count on d (and nowhere else, not
 *     as pass-through on `other`), and allocating the same sizes on d again
 *     reuses d's pool (a freed address comes back, or hits grew).
 *  2. peer copies: pool blocks on d and d+1, cudaMemcpyPeer and
 *     cudaMemcpyPeerAsync both ways, and (when the hardware allows) a kernel
 *     on d+1 reading d's block through peer access; data checked.
 *  3. threads: one thread per device, --thread-iterations (2000)
 *     alloc/fill/check/free with up to 4 blocks live, two non-blocking
 *     streams alternating; no CUDA error, no mismatch; each device's
 *     counters grew by exactly the thread's allocations and frees.
 *  4. race: for each owner device o and freer f = o+1: a long kernel on a
 *     non-blocking stream of o writes A into p; a thread whose current
 *     device is f calls cudaFree(p); the main thread (on o) allocates the
 *     same size again and a short kernel on another non-blocking stream
 *     writes B; the host raises the flag the long kernel waits for; after
 *     the sync the block must be all B (early reuse would leave A).
 *     --race-iterations (200) per size (64 KiB, 4 MiB).
 *  5. race on another device's stream: the same, but the long kernel runs
 *     on a non-blocking stream of f and writes o's block through peer
 *     access, and the thread on f frees it with cudaFreeAsync on that
 *     stream (process/carrier.c: a stream of another context than the
 *     block's heap). Skipped without peer access.
 *
 * Usage: multidevice [--allow-no-emm] [--min-window F] [--max-us N]
 *                    [--thread-iterations N] [--race-iterations N] [--blocks N]
 *
 *   --min-window F: fail unless the race window was open in at least
 *         fraction F of the race iterations (fence mode: the cross-device
 *         free and the allocation did not block the host).
 *   --max-us N: the long kernel's time limit (default 1000; keep it short
 *         under EMM_FREE_MODE=strict, where the free waits for it).
 */
#include <cuda.h> /* types of cuPointerGetAttribute only: it is reached through cudart */

#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "race_util.h"

/* ---- kernels ------------------------------------------------------------------ */

/* res[0] += mismatches against want; the first one goes to res[1] (index),
 * res[2] (value). */
__global__ void md_count_ne(const uint32_t *p, size_t n, uint32_t want, unsigned long long *res)
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

/* dst[i] = src[i]: src may be another device's memory (peer access). */
__global__ void md_copy(uint32_t *dst, const uint32_t *src, size_t n)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		dst[i] = src[i];
}

static unsigned grid_for(size_t n)
{
	size_t g = (n + 255) / 256;
	if (g == 0)
		g = 1;
	return (unsigned)std::min<size_t>(g, 1024);
}

/* ---- per-device state ------------------------------------------------------------ */

struct dev_state {
	cudaStream_t s[2];	     /* non-blocking streams */
	unsigned long long *res; /* count_ne results: 3 words */
};

static int g_ndev;
static std::vector<dev_state> g_dev;
/* Parts run and skipped (the EMM-PARTIAL line): pools, peer copies,
 * peer-access kernels, threads, race reuse. */
static struct emm_partial g_part;
static bool g_emm; /* libemm active: the counters must move */

typedef CUresult (*pga_fn)(void *, CUpointer_attribute, CUdeviceptr);
static pga_fn g_pga; /* cuPointerGetAttribute, through cudart's driver entry point (so libemm's shim) */

static uint32_t pattern(int d, unsigned i, uint32_t tag)
{
	return tag | ((uint32_t)(d & 0xFF) << 16) | (i & 0xFFFFu);
}

/* Mismatches of p[0..n) against want on device `dev` (made current), on its
 * stream 0; waits for that stream. */
static unsigned long long check_on(int dev, const uint32_t *p, size_t n, uint32_t want, unsigned long long *first_idx,
				   unsigned long long *first_val)
{
	dev_state &ds = g_dev[dev];
	unsigned long long h[3];
	CK(cudaSetDevice(dev));
	CK(cudaMemsetAsync(ds.res, 0, 3 * sizeof(unsigned long long), ds.s[0]));
	md_count_ne<<<grid_for(n), 256, 0, ds.s[0]>>>(p, n, want, ds.res);
	CK_LAUNCH();
	CK(cudaMemcpyAsync(h, ds.res, sizeof(h), cudaMemcpyDeviceToHost, ds.s[0]));
	CK(cudaStreamSynchronize(ds.s[0]));
	if (first_idx)
		*first_idx = h[1];
	if (first_val)
		*first_val = h[2];
	return h[0];
}

static void expect_pattern(const char *what, int dev, const uint32_t *p, size_t n, uint32_t want)
{
	unsigned long long fi = 0, fv = 0;
	unsigned long long bad = check_on(dev, p, n, want, &fi, &fv);
	race_check(bad == 0, "%s: block %p on device %d: %llu of %zu words not 0x%08x (first: word %llu = 0x%08llx)",
		   what, (const void *)p, dev, bad, n, want, fi, fv);
}

/* Every device's counters (index = ordinal) and the process's (last). */
static std::vector<struct emm_stats> snap_all(void)
{
	std::vector<struct emm_stats> v;
	for (int d = 0; d < g_ndev; d++)
		v.push_back(race_stats(d));
	v.push_back(race_stats(-1));
	return v;
}

static long long dlevel(uint64_t a, uint64_t b)
{
	return (long long)b - (long long)a;
}

/*
 * The counters moved only where they should: on device `own` the allocations,
 * frees and live blocks changed by exactly the given amounts; every other
 * device's allocation/free counters stayed put; nobody passed anything
 * through or refused a free.
 */
static void expect_counters(const char *what, const std::vector<struct emm_stats> &a,
			    const std::vector<struct emm_stats> &b, int own, long long allocs, long long frees,
			    long long live)
{
	if (!g_emm)
		return;
	for (int d = 0; d < g_ndev; d++) {
		const struct emm_stats &x = a[d], &y = b[d];
		long long da = dlevel(x.allocs, y.allocs), df = dlevel(x.frees, y.frees);
		long long dl = dlevel(x.live_blocks, y.live_blocks);
		long long dpa = dlevel(x.passthrough_allocs, y.passthrough_allocs);
		long long dpf = dlevel(x.passthrough_frees, y.passthrough_frees);
		long long dbf = dlevel(x.bad_frees, y.bad_frees);
		if (d == own || own < 0) {
			race_check(da == allocs && df == frees && dl == live,
				   "%s: device %d counters: allocs %+lld frees %+lld live_blocks %+lld, want %+lld %+lld %+lld",
				   what, d, da, df, dl, allocs, frees, live);
		} else {
			race_check(da == 0 && df == 0 && dl == 0,
				   "%s: device %d's counters moved (allocs %+lld frees %+lld live_blocks %+lld): "
				   "another device's blocks were counted in its scope",
				   what, d, da, df, dl);
		}
		race_check(dpa == 0 && dpf == 0 && dbf == 0,
			   "%s: device %d: passthrough_allocs %+lld passthrough_frees %+lld bad_frees %+lld (want 0: "
			   "every call was a pool block's)",
			   what, d, dpa, dpf, dbf);
	}
}

/* ---- 1. per-device pools, cross-device free --------------------------------------------- */

struct blk {
	uint32_t *p;
	size_t size;
	bool async; /* cudaMallocAsync on the device's stream 0 */
};

static const size_t k_sizes[] = {512, 3004, 65536, 200004, 1u << 20, (2u << 20) + 4096, 9u << 20};
static const size_t k_nsizes = sizeof(k_sizes) / sizeof(k_sizes[0]);

static void alloc_blk(int dev, blk *b)
{
	if (b->async)
		CK(cudaMallocAsync((void **)&b->p, b->size, g_dev[dev].s[0]));
	else
		CK(cudaMalloc((void **)&b->p, b->size));
}

/* Which device the pointer belongs to, asked with `asker` current: both the
 * runtime's and the driver's view must name `dev`, and the driver's range
 * must be the block itself. */
static void check_attributes(const blk &b, int dev, int asker)
{
	CK(cudaSetDevice(asker));
	cudaPointerAttributes at;
	memset(&at, 0, sizeof(at));
	CK(cudaPointerGetAttributes(&at, b.p));
	/* From another device without peer access there is no address to
	 * dereference there, so the runtime reports devicePointer NULL (seen
	 * on the H200 pair); it must never name another address. */
	bool ptr_ok = at.devicePointer == (void *)b.p || (asker != dev && at.devicePointer == NULL);
	race_check(at.type == cudaMemoryTypeDevice && at.device == dev && ptr_ok,
		   "cudaPointerGetAttributes(%p) asked on device %d: type %d device %d devicePointer %p, want "
		   "device memory of device %d at the block",
		   (void *)b.p, asker, (int)at.type, at.device, at.devicePointer, dev);
	int ord = -1;
	CUresult r = g_pga(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)b.p);
	race_check(r == CUDA_SUCCESS && ord == dev,
		   "cuPointerGetAttribute(DEVICE_ORDINAL, %p) asked on device %d -> %d, ordinal %d, want %d",
		   (void *)b.p, asker, (int)r, ord, dev);
	CUdeviceptr start = 0;
	size_t rsize = 0;
	CUresult r1 = g_pga(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, (CUdeviceptr)b.p);
	CUresult r2 = g_pga(&rsize, CU_POINTER_ATTRIBUTE_RANGE_SIZE, (CUdeviceptr)b.p);
	race_check(r1 == CUDA_SUCCESS && r2 == CUDA_SUCCESS && start == (CUdeviceptr)b.p && rsize == b.size,
		   "cuPointerGetAttribute(RANGE_START_ADDR/RANGE_SIZE, %p) -> %d/%d: %#llx + %zu, want the block "
		   "(%zu bytes)",
		   (void *)b.p, (int)r1, (int)r2, (unsigned long long)start, rsize, b.size);
}

static void part_pools(unsigned nblocks)
{
	printf("--- 1. per-device pools (%u blocks per device), cross-device free ---\n", nblocks);
	for (int d = 0; d < g_ndev; d++) {
		int other = (d + 1) % g_ndev;
		std::vector<blk> bl(nblocks);
		size_t total = 0;
		for (unsigned i = 0; i < nblocks; i++) {
			bl[i].size = k_sizes[i % k_nsizes];
			bl[i].async = (i & 1) != 0;
			total += bl[i].size;
		}

		/* allocate on d */
		CK(cudaSetDevice(d));
		CK(cudaDeviceSynchronize());
		std::vector<struct emm_stats> s0 = snap_all();
		for (unsigned i = 0; i < nblocks; i++) {
			alloc_blk(d, &bl[i]);
			race_fill_u32<<<grid_for(bl[i].size / 4), 256, 0, g_dev[d].s[0]>>>(bl[i].p, bl[i].size / 4,
										  pattern(d, i, 0xD0000000u));
			CK_LAUNCH();
		}
		CK(cudaStreamSynchronize(g_dev[d].s[0]));
		std::vector<struct emm_stats> s1 = snap_all();
		for (unsigned i = 0; i < nblocks; i++)
			expect_pattern("fill", d, bl[i].p, bl[i].size / 4, pattern(d, i, 0xD0000000u));

		/* distinct, non-overlapping blocks */
		std::vector<std::pair<uintptr_t, size_t>> rg;
		for (const blk &b : bl)
			rg.push_back({(uintptr_t)b.p, b.size});
		std::sort(rg.begin(), rg.end());
		for (size_t i = 1; i < rg.size(); i++)
			race_check(rg[i - 1].first + rg[i - 1].second <= rg[i].first,
				   "device %d: blocks %#lx (+%zu) and %#lx overlap", d, (unsigned long)rg[i - 1].first,
				   rg[i - 1].second, (unsigned long)rg[i].first);

		/* the pointers belong to d, whichever device asks */
		for (const blk &b : bl) {
			check_attributes(b, d, d);
			check_attributes(b, d, other);
		}

		struct emm_stats dd = race_stats_delta(s0[d], s1[d]);
		printf("device %d: %u blocks, %zu bytes, first %p\n", d, nblocks, total, (void *)bl[0].p);
		race_print_stats("allocations on this device", dd);
		expect_counters("allocations", s0, s1, d, nblocks, 0, nblocks);
		if (g_emm) {
			long long req = dlevel(s0[d].requested_bytes, s1[d].requested_bytes);
			race_check(req == (long long)total, "device %d: requested_bytes %+lld, want +%zu", d, req, total);
			race_check(dlevel(s0[g_ndev].allocs, s1[g_ndev].allocs) == nblocks,
				   "process scope: allocs %+lld, want +%u", dlevel(s0[g_ndev].allocs, s1[g_ndev].allocs),
				   nblocks);
		}

		/* free every block from the other device's context */
		CK(cudaSetDevice(d));
		CK(cudaDeviceSynchronize());
		CK(cudaSetDevice(other));
		std::set<uintptr_t> freed;
		for (const blk &b : bl) {
			CK(cudaFree(b.p));
			freed.insert((uintptr_t)b.p);
		}
		int cur = -1;
		CK(cudaGetDevice(&cur));
		race_check(cur == other, "current device %d after the frees, want %d", cur, other);
		std::vector<struct emm_stats> s2 = snap_all();
		race_print_stats("frees from the other device", race_stats_delta(s1[d], s2[d]));
		expect_counters("cross-device frees", s1, s2, d, 0, nblocks, -(long long)nblocks);
		if (g_emm) {
			long long req = dlevel(s1[d].requested_bytes, s2[d].requested_bytes);
			race_check(req == -(long long)total, "device %d after the frees: requested_bytes %+lld, want -%zu",
				   d, req, total);
		}

		/* allocate the same sizes on d again: d's own pool serves them */
		CK(cudaSetDevice(d));
		CK(cudaDeviceSynchronize()); /* the free fences can complete */
		unsigned reused = 0;
		for (unsigned i = 0; i < nblocks; i++) {
			alloc_blk(d, &bl[i]);
			if (freed.count((uintptr_t)bl[i].p))
				reused++;
			race_fill_u32<<<grid_for(bl[i].size / 4), 256, 0, g_dev[d].s[0]>>>(bl[i].p, bl[i].size / 4,
										  pattern(d, i, 0xE0000000u));
			CK_LAUNCH();
		}
		CK(cudaStreamSynchronize(g_dev[d].s[0]));
		std::vector<struct emm_stats> s3 = snap_all();
		struct emm_stats dr = race_stats_delta(s2[d], s3[d]);
		printf("device %d: reallocation after the cross-device frees: %u of %u addresses reused, hits %llu, "
		       "misses %llu\n",
		       d, reused, nblocks, (unsigned long long)dr.hits, (unsigned long long)dr.misses);
		expect_counters("reallocation", s2, s3, d, nblocks, 0, nblocks);
		if (g_emm)
			race_check(reused > 0 || dr.hits > 0,
				   "device %d: no freed address came back and no hit: the blocks freed from device %d "
				   "did not return to device %d's pool",
				   d, other, d);
		for (unsigned i = 0; i < nblocks; i++) {
			expect_pattern("refill", d, bl[i].p, bl[i].size / 4, pattern(d, i, 0xE0000000u));
			check_attributes(bl[i], d, other);
		}

		/* and free them on d itself */
		CK(cudaSetDevice(d));
		for (const blk &b : bl) {
			if (b.async)
				CK(cudaFreeAsync(b.p, g_dev[d].s[0]));
			else
				CK(cudaFree(b.p));
		}
		CK(cudaDeviceSynchronize());
		std::vector<struct emm_stats> s4 = snap_all();
		expect_counters("frees on the owning device", s3, s4, d, 0, nblocks, -(long long)nblocks);
	}
}

/* ---- 2. peer copies ------------------------------------------------------------------------ */

/* Let kernels on dev read and write peer's memory (dev becomes current):
 * false when the hardware does not allow it. */
static bool enable_peer(int dev, int peer)
{
	int can = 0;

	CK(cudaDeviceCanAccessPeer(&can, dev, peer));
	if (!can)
		return false;
	CK(cudaSetDevice(dev));
	cudaError_t pe = cudaDeviceEnablePeerAccess(peer, 0);
	if (pe == cudaErrorPeerAccessAlreadyEnabled)
		(void)cudaGetLastError();
	else
		CK(pe);
	return true;
}

static void part_peer(void)
{
	static const size_t sizes[] = {12 * 1024 + 4, 4u << 20};
	printf("--- 2. peer copies between pool blocks ---\n");
	for (int d = 0; d < g_ndev; d++)
		for (int x = 0; x < 2; x++)
			CK(cudaStreamSynchronize(g_dev[d].s[x]));
	std::vector<struct emm_stats> s0 = snap_all();
	unsigned peer_kernels = 0;
	for (int d = 0; d < g_ndev; d++) {
		int e = (d + 1) % g_ndev;
		for (size_t sz : sizes) {
			size_t n = sz / 4;
			uint32_t *src = NULL, *dst = NULL;
			uint32_t P = pattern(d, (unsigned)sz, 0x90000000u), Q = pattern(e, (unsigned)sz, 0xA0000000u);

			CK(cudaSetDevice(d));
			CK(cudaMalloc((void **)&src, sz));
			race_fill_u32<<<grid_for(n), 256, 0, g_dev[d].s[0]>>>(src, n, P);
			CK_LAUNCH();
			CK(cudaStreamSynchronize(g_dev[d].s[0]));
			CK(cudaSetDevice(e));
			CK(cudaMallocAsync((void **)&dst, sz, g_dev[e].s[0]));
			CK(cudaMemsetAsync(dst, 0, sz, g_dev[e].s[0]));
			CK(cudaStreamSynchronize(g_dev[e].s[0]));

			/* d -> e, synchronous */
			CK(cudaMemcpyPeer(dst, e, src, d, sz));
			/* cudaMemcpyPeer may return before the copy completes and is
			 * ordered with the legacy streams only; the check runs on a
			 * non-blocking stream, so wait for both devices first. */
			CK(cudaSetDevice(d));
			CK(cudaDeviceSynchronize());
			CK(cudaSetDevice(e));
			CK(cudaDeviceSynchronize());
			expect_pattern("cudaMemcpyPeer", e, dst, n, P);

			/* e -> d, on a stream of d */
			race_fill_u32<<<grid_for(n), 256, 0, g_dev[e].s[0]>>>(dst, n, Q);
			CK_LAUNCH();
			CK(cudaStreamSynchronize(g_dev[e].s[0]));
			CK(cudaSetDevice(d));
			CK(cudaMemcpyPeerAsync(src, d, dst, e, sz, g_dev[d].s[1]));
			CK(cudaStreamSynchronize(g_dev[d].s[1]));
			expect_pattern("cudaMemcpyPeerAsync", d, src, n, Q);

			/* a kernel on e reads d's block directly */
			if (enable_peer(e, d)) {
				CK(cudaMemsetAsync(dst, 0, sz, g_dev[e].s[0]));
				md_copy<<<grid_for(n), 256, 0, g_dev[e].s[0]>>>(dst, src, n);
				CK_LAUNCH();
				CK(cudaStreamSynchronize(g_dev[e].s[0]));
				expect_pattern("peer-access kernel", e, dst, n, Q);
				peer_kernels++;
			}

			/* each block freed from the other device */
			CK(cudaSetDevice(e));
			CK(cudaFree(src));
			CK(cudaSetDevice(d));
			CK(cudaFree(dst));
		}
	}
	for (int d = 0; d < g_ndev; d++) {
		CK(cudaSetDevice(d));
		CK(cudaDeviceSynchronize());
	}
	std::vector<struct emm_stats> s1 = snap_all();
	printf("peer copies: %d device pairs x %zu sizes, %u peer-access kernels\n", g_ndev,
	       sizeof(sizes) / sizeof(sizes[0]), peer_kernels);
	emm_partial_ran(&g_part);
	unsigned want_kernels = (unsigned)g_ndev * (unsigned)(sizeof(sizes) / sizeof(sizes[0]));
	if (peer_kernels == want_kernels)
		emm_partial_ran(&g_part);
	else
		emm_partial_skip(&g_part, "peer-access kernels: %u of %u not run (cudaDeviceCanAccessPeer = 0)",
				 want_kernels - peer_kernels, want_kernels);
	/* Ring: every device holds one source and one destination per size. */
	long long per = 2 * (long long)(sizeof(sizes) / sizeof(sizes[0]));
	expect_counters("peer copies", s0, s1, -1, per, per, 0);
}

/* ---- 3. one thread per device ---------------------------------------------------------------- */

struct thread_result {
	int dev = -1;
	unsigned long long mismatches = 0;
	unsigned allocs = 0, frees = 0;
	std::string error;
};

static void device_thread(int d, unsigned iterations, unsigned long long *res, thread_result *out)
{
	static const size_t sizes[] = {256, 4096, 60000, 1u << 20, (3u << 20) + 512};
	const unsigned K = 4; /* blocks live at once */
	out->dev = d;
	cudaError_t e = cudaSetDevice(d);
	cudaStream_t s[2] = {g_dev[d].s[0], g_dev[d].s[1]};
	struct live {
		uint32_t *p;
		size_t n;
		uint32_t pat;
		int stream;
		bool async;
	};
	std::vector<live> ring;
	auto release = [&](const live &b) -> cudaError_t {
		md_count_ne<<<grid_for(b.n), 256, 0, s[b.stream]>>>(b.p, b.n, b.pat, res);
		cudaError_t r = cudaGetLastError();
		if (r != cudaSuccess)
			return r;
		out->frees++;
		return b.async ? cudaFreeAsync(b.p, s[b.stream]) : cudaFree(b.p);
	};
	for (unsigned it = 0; it < iterations && e == cudaSuccess; it++) {
		live b;
		size_t sz = sizes[(it * 7 + (unsigned)d) % (sizeof(sizes) / sizeof(sizes[0]))];
		b.n = sz / 4;
		b.pat = pattern(d, it, 0xC0000000u);
		b.stream = (int)(it & 1);
		b.async = (it % 3) == 1;
		e = b.async ? cudaMallocAsync((void **)&b.p, sz, s[b.stream]) : cudaMalloc((void **)&b.p, sz);
		if (e != cudaSuccess)
			break;
		out->allocs++;
		race_fill_u32<<<grid_for(b.n), 256, 0, s[b.stream]>>>(b.p, b.n, b.pat);
		if ((e = cudaGetLastError()) != cudaSuccess)
			break;
		ring.push_back(b);
		if (ring.size() > K) {
			e = release(ring.front());
			ring.erase(ring.begin());
		}
	}
	while (e == cudaSuccess && !ring.empty()) {
		e = release(ring.front());
		ring.erase(ring.begin());
	}
	if (e == cudaSuccess)
		e = cudaDeviceSynchronize();
	unsigned long long h = 0;
	if (e == cudaSuccess)
		e = cudaMemcpy(&h, res, sizeof(h), cudaMemcpyDeviceToHost);
	out->mismatches = h;
	if (e != cudaSuccess)
		out->error = std::string(cudaGetErrorName(e)) + " " + cudaGetErrorString(e);
}

static void part_threads(unsigned iterations)
{
	printf("--- 3. one thread per device, %u alloc/free each ---\n", iterations);
	std::vector<unsigned long long *> res(g_ndev);
	for (int d = 0; d < g_ndev; d++) {
		CK(cudaSetDevice(d));
		CK(cudaMalloc((void **)&res[d], 3 * sizeof(unsigned long long)));
		CK(cudaMemset(res[d], 0, 3 * sizeof(unsigned long long)));
		CK(cudaDeviceSynchronize());
	}
	std::vector<struct emm_stats> s0 = snap_all();
	std::vector<thread_result> tr(g_ndev);
	std::vector<std::thread> th;
	uint64_t t0 = race_now_ns();
	for (int d = 0; d < g_ndev; d++)
		th.emplace_back(device_thread, d, iterations, res[d], &tr[d]);
	for (std::thread &t : th)
		t.join();
	uint64_t t1 = race_now_ns();
	std::vector<struct emm_stats> s1 = snap_all();
	for (int d = 0; d < g_ndev; d++) {
		const thread_result &r = tr[d];
		printf("device %d thread: %u allocs, %u frees, %llu mismatched words%s%s\n", d, r.allocs, r.frees,
		       r.mismatches, r.error.empty() ? "" : ", error ", r.error.c_str());
		race_check(r.error.empty(), "device %d thread: CUDA error %s", d, r.error.c_str());
		race_check(r.allocs == iterations && r.frees == iterations, "device %d thread: %u allocs %u frees, want %u",
			   d, r.allocs, r.frees, iterations);
		race_check(r.mismatches == 0,
			   "device %d thread: %llu words did not hold their owner's pattern when checked before the "
			   "free (a block was reused while its previous owner's work was pending)",
			   d, r.mismatches);
		race_print_stats(("device " + std::to_string(d) + ", thread phase").c_str(), race_stats_delta(s0[d], s1[d]));
		if (g_emm) {
			const struct emm_stats &x = s0[d], &y = s1[d];
			race_check(dlevel(x.allocs, y.allocs) == (long long)r.allocs &&
				       dlevel(x.frees, y.frees) == (long long)r.frees && dlevel(x.live_blocks, y.live_blocks) == 0,
				   "device %d thread phase: allocs %+lld frees %+lld live_blocks %+lld, want +%u +%u +0 (each "
				   "device counts exactly its own thread's calls)",
				   d, dlevel(x.allocs, y.allocs), dlevel(x.frees, y.frees), dlevel(x.live_blocks, y.live_blocks),
				   r.allocs, r.frees);
			race_check(dlevel(x.passthrough_allocs, y.passthrough_allocs) == 0 &&
				       dlevel(x.passthrough_frees, y.passthrough_frees) == 0 &&
				       dlevel(x.bad_frees, y.bad_frees) == 0,
				   "device %d thread phase: pass-through or refused calls", d);
		}
	}
	printf("thread phase: %.1f ms\n", (double)(t1 - t0) / 1e6);
	for (int d = 0; d < g_ndev; d++) {
		CK(cudaSetDevice(d));
		CK(cudaFree(res[d]));
		CK(cudaDeviceSynchronize());
	}
}

/* ---- 4. race: free from another device while the owner's kernel runs -------------------------- */

/* Host-mapped control words, registered portable so every device's kernels
 * can use them: [0] flag (host -> GPU), [1] window (GPU -> host). */
static void *g_ctl_host;
static std::vector<uint32_t *> g_ctl_dev; /* per device */
static uint32_t g_want;

static volatile uint32_t *ctl_host(int i) { return (volatile uint32_t *)g_ctl_host + i; }

static void raise_flag(uint32_t want)
{
	__sync_synchronize();
	*ctl_host(0) = want;
	__sync_synchronize();
}

struct race_result {
	unsigned iterations = 0, reused = 0, window_open = 0, corruptions = 0;
	unsigned long long bad_words = 0;
};

struct race_opts {
	unsigned iterations = 200;
	uint64_t min_ns = 20000, max_ns = 1000000, tail_ns = 200000;
	unsigned long_blocks = 8;
};

/* Part 4 (foreign false): the long kernel on the owner's stream, cudaFree
 * from the other device. Part 5 (foreign true): the long kernel on the other
 * device's stream (peer access), cudaFreeAsync on that stream from the other
 * device: a stream of another context than the block's heap. */
static void race_pair(const race_opts &o, int own, int freer, size_t size, bool foreign, race_result *r)
{
	size_t n = size / 4;
	CK(cudaSetDevice(own));
	int kdev = foreign ? freer : own;
	cudaStream_t X = g_dev[kdev].s[0], Y = g_dev[own].s[1];
	const volatile uint32_t *flag = g_ctl_dev[kdev];
	volatile uint32_t *win = g_ctl_dev[kdev] + 1;
	race_worker w(freer);
	uint32_t *p = NULL;
	CK(cudaMalloc((void **)&p, size));
	CK(cudaMemset(p, 0, size));
	CK(cudaDeviceSynchronize());
	for (unsigned it = 0; it < o.iterations; it++) {
		uint32_t A = pattern(own, it, 0xA0000000u), B = pattern(own, it, 0xB0000000u);
		uint32_t want = ++g_want;
		*ctl_host(1) = 0xFFFFFFFFu;
		__sync_synchronize();
		CK(cudaSetDevice(kdev));
		race_long_writer<<<o.long_blocks, 256, 0, X>>>(p, n, A, flag, want, o.min_ns, o.max_ns, o.tail_ns, win);
		CK_LAUNCH();
		CK(cudaSetDevice(own));
		w.run([&] {
			int cur = -1;
			CK(cudaGetDevice(&cur));
			if (cur != freer)
				race_fail("the freeing thread's device is %d, want %d", cur, freer);
			if (foreign)
				CK(cudaFreeAsync(p, X));
			else
				CK(cudaFree(p));
		});
		uint32_t *q = NULL;
		CK(cudaMalloc((void **)&q, size)); /* current device: own */
		race_fill_u32<<<grid_for(n), 256, 0, Y>>>(q, n, B);
		CK_LAUNCH();
		raise_flag(want);
		CK(cudaDeviceSynchronize());
		if (kdev != own) { /* the long kernel's device too */
			CK(cudaSetDevice(kdev));
			CK(cudaDeviceSynchronize());
			CK(cudaSetDevice(own));
		}

		r->iterations++;
		if (q == p)
			r->reused++;
		uint32_t wv = *ctl_host(1);
		if (wv == 1)
			r->window_open++;
		else if (wv != 0)
			race_fail("iteration %u: the long kernel did not report (window word 0x%x)", it, wv);
		unsigned long long fi = 0, fv = 0;
		unsigned long long bad = check_on(own, q, n, B, &fi, &fv);
		if (bad) {
			r->corruptions++;
			r->bad_words += bad;
			if (r->corruptions <= 5)
				printf("  corruption: device %d size %zu iteration %u block %p (%s): %llu of %zu words not "
				       "B (first: word %llu = 0x%08llx, B = 0x%08x, A = 0x%08x)\n",
				       own, size, it, (void *)q, q == p ? "reused" : "new block", bad, n, fi, fv, B, A);
		}
		CK(cudaSetDevice(own));
		p = q;
	}
	CK(cudaFree(p));
	CK(cudaDeviceSynchronize());
}

static void part_race(const race_opts &o, double min_window, bool foreign)
{
	static const size_t sizes[] = {64 * 1024, 4u << 20};
	if (foreign)
		printf("--- 5. race: a kernel on another device's stream writes the block (peer access), which is "
		       "freed with cudaFreeAsync on that stream (%u iterations per size and pair) ---\n",
		       o.iterations);
	else
		printf("--- 4. race: cudaFree from another device while the owner's kernel writes (%u iterations per "
		       "size and pair, long kernel limit %.0f us) ---\n",
		       o.iterations, o.max_ns / 1000.0);
	race_result tot;
	for (int own = 0; own < g_ndev; own++) {
		int freer = (own + 1) % g_ndev;
		if (foreign) {
			if (!enable_peer(freer, own)) {
				emm_partial_skip(&g_part, "race on another device's stream: device %d cannot access "
				                 "device %d", freer, own);
				return;
			}
		}
		for (int d = 0; d < g_ndev; d++) {
			CK(cudaSetDevice(d));
			CK(cudaDeviceSynchronize());
		}
		std::vector<struct emm_stats> s0 = snap_all();
		race_result pr;
		for (size_t sz : sizes) {
			race_result r;
			race_pair(o, own, freer, sz, foreign, &r);
			printf("owner device %d, freed from device %d, size %zu: iterations %u, reused-same-address %u, "
			       "window-open %u, corruptions %u (%llu words)\n",
			       own, freer, sz, r.iterations, r.reused, r.window_open, r.corruptions, r.bad_words);
			pr.iterations += r.iterations;
			pr.reused += r.reused;
			pr.window_open += r.window_open;
			pr.corruptions += r.corruptions;
			pr.bad_words += r.bad_words;
		}
		std::vector<struct emm_stats> s1 = snap_all();
		race_print_stats(("race, owner device " + std::to_string(own)).c_str(), race_stats_delta(s0[own], s1[own]));
		/* One allocation before the loop and one per iteration; as many frees. */
		long long per = (long long)(pr.iterations + sizeof(sizes) / sizeof(sizes[0]));
		expect_counters("race", s0, s1, own, per, per, 0);
		tot.iterations += pr.iterations;
		tot.reused += pr.reused;
		tot.window_open += pr.window_open;
		tot.corruptions += pr.corruptions;
		tot.bad_words += pr.bad_words;
	}
	printf("TOTAL race mode %s: iterations %u, reused-same-address %u, window-open %u, corruptions %u\n",
	       race_free_mode(), tot.iterations, tot.reused, tot.window_open, tot.corruptions);
	race_check(tot.corruptions == 0,
		   "%u corrupted iterations: a block freed from another device was handed out while its own "
		   "device's kernel could still write it",
		   tot.corruptions);
	if (min_window > 0)
		race_check(tot.window_open >= min_window * tot.iterations,
			   "the race window was open in only %u of %u iterations (want >= %.0f%%): the cross-device "
			   "free + allocation blocked the host until the owner's kernel ended",
			   tot.window_open, tot.iterations, min_window * 100);
	if (tot.window_open == 0)
		printf("note: the race window was never open: expected under EMM_FREE_MODE=strict, where the free "
		       "waits for the owning device\n");
	/* Part 5 looks for a block handed out at once (the libemm before
	 * 69aec73 did): not handing it out while the kernel runs is the pass. */
	if (tot.reused == 0 && !foreign)
		emm_partial_skip(&g_part, "race: no iteration reused the freed block (%u iterations)", tot.iterations);
	else
		emm_partial_ran(&g_part);
}

/* ---- main ------------------------------------------------------------------------------------- */

static void usage(void)
{
	fprintf(stderr, "usage: multidevice [--allow-no-emm] [--min-window F] [--max-us N] [--thread-iterations N]\n"
			"                   [--race-iterations N] [--blocks N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	bool allow_no_emm = false;
	double min_window = 0;
	unsigned thread_iterations = 2000, nblocks = 48;
	race_opts ro;
	for (int i = 1; i < argc; i++) {
		std::string a = argv[i];
		auto next = [&]() -> const char * {
			if (i + 1 >= argc)
				usage();
			return argv[++i];
		};
		if (a == "--allow-no-emm") allow_no_emm = true;
		else if (a == "--min-window") min_window = atof(next());
		else if (a == "--max-us") ro.max_ns = race_parse_size(next()) * 1000;
		else if (a == "--thread-iterations") thread_iterations = (unsigned)race_parse_size(next());
		else if (a == "--race-iterations") ro.iterations = (unsigned)race_parse_size(next());
		else if (a == "--blocks") nblocks = (unsigned)race_parse_size(next());
		else usage();
	}
	if (nblocks == 0 || ro.iterations == 0)
		usage();

	race_require_gpu();
	CK(cudaGetDeviceCount(&g_ndev));
	if (g_ndev < 2) {
		printf("SKIP: %d CUDA device(s) visible; this test needs at least 2\n", g_ndev);
		return RACE_SKIP;
	}
	race_require_emm(allow_no_emm);
	g_emm = race_emm_active();
	printf("multidevice: %d devices, EMM_FREE_MODE=%s, libemm %s\n", g_ndev, race_free_mode(),
	       g_emm ? "active" : "not active (counters not checked)");

	cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
	CK(cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", (void **)&g_pga, 12000, cudaEnableDefault, &q));
	if (q != cudaDriverEntryPointSuccess || !g_pga)
		race_fail("cuPointerGetAttribute not found through cudaGetDriverEntryPointByVersion (%d)", (int)q);

	/* control words, then per-device streams, result words and a warm-up
	 * (kernels loaded, both allocation APIs used once) */
	long page = sysconf(_SC_PAGESIZE);
	if (posix_memalign(&g_ctl_host, (size_t)page, (size_t)page) != 0)
		race_fail("posix_memalign");
	memset(g_ctl_host, 0, (size_t)page);
	CK(cudaHostRegister(g_ctl_host, (size_t)page, cudaHostRegisterMapped | cudaHostRegisterPortable));
	g_dev.resize(g_ndev);
	g_ctl_dev.resize(g_ndev);
	for (int d = 0; d < g_ndev; d++) {
		cudaDeviceProp prop;
		CK(cudaSetDevice(d));
		CK(cudaFree(0));
		CK(cudaGetDeviceProperties(&prop, d));
		printf("device %d: %s\n", d, prop.name);
		CK(cudaHostGetDevicePointer((void **)&g_ctl_dev[d], g_ctl_host, 0));
		for (int x = 0; x < 2; x++)
			CK(cudaStreamCreateWithFlags(&g_dev[d].s[x], cudaStreamNonBlocking));
		CK(cudaMalloc((void **)&g_dev[d].res, 3 * sizeof(unsigned long long)));
		uint32_t *w = NULL, *w2 = NULL;
		CK(cudaMalloc((void **)&w, 4096));
		CK(cudaMallocAsync((void **)&w2, 4096, g_dev[d].s[0]));
		raise_flag(++g_want);
		race_long_writer<<<1, 32, 0, g_dev[d].s[0]>>>(w, 1024, 0, g_ctl_dev[d], g_want, 0, 1000, 0, g_ctl_dev[d] + 1);
		CK_LAUNCH();
		race_fill_u32<<<1, 32, 0, g_dev[d].s[0]>>>(w, 1024, 1);
		CK_LAUNCH();
		md_copy<<<1, 32, 0, g_dev[d].s[0]>>>(w2, w, 1024);
		CK_LAUNCH();
		CK(cudaStreamSynchronize(g_dev[d].s[0]));
		expect_pattern("warm-up", d, w2, 1024, 1);
		CK(cudaFreeAsync(w2, g_dev[d].s[0]));
		CK(cudaFree(w));
		CK(cudaDeviceSynchronize());
	}
	std::vector<struct emm_stats> start = snap_all();

	part_pools(nblocks);
	emm_partial_ran(&g_part);
	part_peer();
	part_threads(thread_iterations);
	emm_partial_ran(&g_part);
	part_race(ro, min_window, false);
	part_race(ro, min_window, true);

	printf("--- counters ---\n");
	std::vector<struct emm_stats> end = snap_all();
	for (int d = 0; d < g_ndev; d++) {
		race_print_stats(("device " + std::to_string(d) + ", whole test").c_str(), race_stats_delta(start[d], end[d]));
		if (g_emm)
			race_check(end[d].live_blocks == start[d].live_blocks && end[d].bad_frees == start[d].bad_frees,
				   "device %d at the end: live_blocks %+lld bad_frees %+lld, want +0 +0", d,
				   dlevel(start[d].live_blocks, end[d].live_blocks), dlevel(start[d].bad_frees, end[d].bad_frees));
	}
	race_print_stats("process (-1), totals", race_stats(-1));

	for (int d = 0; d < g_ndev; d++) {
		CK(cudaSetDevice(d));
		CK(cudaDeviceSynchronize());
		for (int x = 0; x < 2; x++)
			CK(cudaStreamDestroy(g_dev[d].s[x]));
		CK(cudaFree(g_dev[d].res));
	}
	CK(cudaHostUnregister(g_ctl_host));
	free(g_ctl_host);

	if (race_fails) {
		printf("FAIL: %d check(s) failed\n", race_fails);
		return 1;
	}
	printf("ok: %d devices, every check that ran passed\n", g_ndev);
	return emm_partial_finish(&g_part);
}
