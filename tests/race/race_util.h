/* SPDX-License-Identifier: MIT */
/*
 * tests/race/race_util.h - shared helpers of the GPU free-semantics suite
 * (meson suite 'race'): skipping without a GPU, CUDA error checks, libemm's
 * counters through dlsym(RTLD_DEFAULT, "emm_stats_get"), a device clock and
 * host-mapped control words that the tests' own bookkeeping uses without
 * going through the pools under test.
 *
 * Every program exits 0 on success, 1 on failure, 77 when no GPU or driver
 * is present (or it could test nothing here); a program that passes with
 * some of its cases skipped prints the "EMM-PARTIAL: ran R, skipped S (...)"
 * line of tests/common/emm_partial.h. Header-only: each test is one .cu file.
 */
#ifndef EMM_RACE_UTIL_H
#define EMM_RACE_UTIL_H

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "emm/emm.h"
#include "../common/emm_partial.h"

#define RACE_SKIP EMM_SKIP_EXIT

/* ---- failures ---------------------------------------------------------- */

#define race_fail(...)                                                   \
	do {                                                             \
		fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);    \
		fprintf(stderr, __VA_ARGS__);                            \
		fputc('\n', stderr);                                     \
		fflush(stdout);                                          \
		exit(1);                                                 \
	} while (0)

/* A CUDA runtime call that must succeed. */
#define CK(call)                                                                         \
	do {                                                                             \
		cudaError_t ck_e_ = (call);                                              \
		if (ck_e_ != cudaSuccess)                                                \
			race_fail("%s -> %d %s (%s)", #call, (int)ck_e_, cudaGetErrorName(ck_e_), \
				  cudaGetErrorString(ck_e_));                            \
	} while (0)

/* After a kernel launch. */
#define CK_LAUNCH() CK(cudaGetLastError())

/* A check that records the failure and goes on; main returns 1 if any. */
static int race_fails;
#define race_check(c, ...)                                   \
	do {                                                 \
		if (!(c)) {                                  \
			printf("FAIL: " __VA_ARGS__);        \
			printf("\n");                        \
			fflush(stdout);                      \
			race_fails++;                        \
		}                                            \
	} while (0)

/* ---- environment --------------------------------------------------------- */

static inline bool race_env_true(const char *name)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return false;
	return !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") || !strcasecmp(v, "on");
}

static inline bool race_env_false(const char *name)
{
	const char *v = getenv(name);
	if (!v || !*v)
		return false;
	return !strcasecmp(v, "0") || !strcasecmp(v, "false") || !strcasecmp(v, "no") || !strcasecmp(v, "off");
}

static inline const char *race_free_mode(void)
{
	const char *m = getenv("EMM_FREE_MODE");
	return (m && *m) ? m : "fence(default)";
}

/* ---- skipping -------------------------------------------------------------- */

/*
 * Exit 77 unless a CUDA device can be used through the runtime. With static
 * cudart and no libcuda.so.1, cudaGetDeviceCount returns
 * cudaErrorInsufficientDriver; with a driver but no device, cudaErrorNoDevice.
 * Both are skips; so is any other failure to see a device at all.
 */
static inline void race_require_gpu(void)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		printf("SKIP: no usable CUDA device (cudaGetDeviceCount -> %d %s, count %d)\n", (int)e,
		       cudaGetErrorName(e), n);
		fflush(stdout);
		exit(RACE_SKIP);
	}
	CK(cudaSetDevice(0));
	CK(cudaFree(0)); /* create the primary context now, outside any timing */
}

/* ---- libemm's counters ------------------------------------------------------ */

typedef int (*race_stats_fn)(int, struct emm_stats *);

/* emm_stats_get, or NULL when libemm is not loaded. */
static inline race_stats_fn race_emm_stats_fn(void)
{
	return (race_stats_fn)dlsym(RTLD_DEFAULT, "emm_stats_get");
}

/* True when libemm is loaded; fails the test when it is not and the caller
 * did not allow that. */
static inline bool race_require_emm(bool allow_missing)
{
	if (race_emm_stats_fn())
		return true;
	if (allow_missing) {
		printf("note: libemm is not loaded (emm_stats_get not found): running on the plain driver\n");
		return false;
	}
	race_fail("libemm is not loaded: dlsym(RTLD_DEFAULT, \"emm_stats_get\") is NULL "
		  "(run with LD_PRELOAD=<build>/libemm.so)");
	return false;
}

/* True when libemm is loaded and serving allocations (not EMM_DISABLE=1):
 * only then do the pool counters have to move. */
static inline bool race_emm_active(void)
{
	return race_emm_stats_fn() != NULL && !race_env_true("EMM_DISABLE");
}

/* The value libemm runs with for option `name` (e.g. "EMM_BACKEND"), from
 * emm_settings, and in *source where it came from ("default", "env" or
 * "invalid"); "" without libemm or when the option is not listed. */
static inline std::string race_setting(const char *name, std::string *source = NULL)
{
	typedef size_t (*settings_fn)(char *, size_t);
	settings_fn f = (settings_fn)dlsym(RTLD_DEFAULT, "emm_settings");
	if (!f)
		return "";
	std::string all(f(NULL, 0) + 1, '\0');
	f(&all[0], all.size());
	std::string key = std::string(name) + "=";
	for (size_t at = 0; at < all.size();) {
		size_t end = all.find('\n', at);
		if (end == std::string::npos)
			end = all.size();
		size_t tab = all.find('\t', at);
		if (all.compare(at, key.size(), key) == 0 && tab != std::string::npos && tab < end) {
			if (source)
				*source = all.substr(tab + 1, end - tab - 1);
			return all.substr(at + key.size(), tab - at - key.size());
		}
		at = end + 1;
	}
	return "";
}

/* The counters of `device` (-1 process, -2 pinned host); zeroes without
 * libemm. */
static inline struct emm_stats race_stats(int device)
{
	struct emm_stats s;
	memset(&s, 0, sizeof(s));
	s.struct_size = sizeof(s);
	race_stats_fn f = race_emm_stats_fn();
	if (f) {
		int rc = f(device, &s);
		if (rc != 0)
			race_fail("emm_stats_get(%d) -> %d", device, rc);
	}
	return s;
}

/* b - a, field by field, for the event counters (bytes fields are copied
 * from b as they are levels, not totals). */
static inline struct emm_stats race_stats_delta(const struct emm_stats &a, const struct emm_stats &b)
{
	struct emm_stats d = b;
#define RACE_D(f) d.f = b.f - a.f
	RACE_D(allocs);
	RACE_D(frees);
	RACE_D(hits);
	RACE_D(misses);
	RACE_D(passthrough_allocs);
	RACE_D(passthrough_frees);
	RACE_D(bad_frees);
	RACE_D(backend_allocs);
	RACE_D(backend_frees);
	RACE_D(oom_retries);
	RACE_D(ooms);
	RACE_D(splits);
	RACE_D(merges);
	RACE_D(events_recorded);
	RACE_D(event_queries);
	RACE_D(stream_waits);
	RACE_D(host_waits);
	RACE_D(epochs_closed);
	RACE_D(page_unmaps);
	RACE_D(page_maps);
	RACE_D(segment_grows);
#undef RACE_D
	return d;
}

static inline void race_print_stats(const char *label, const struct emm_stats &s)
{
	if (!race_emm_stats_fn()) {
		printf("emm counters [%s]: libemm not loaded\n", label);
		return;
	}
	printf("emm counters [%s]: allocs=%llu frees=%llu hits=%llu misses=%llu "
	       "passthrough_allocs=%llu passthrough_frees=%llu bad_frees=%llu "
	       "backend_allocs=%llu backend_frees=%llu "
	       "events_recorded=%llu event_queries=%llu stream_waits=%llu host_waits=%llu "
	       "epochs_closed=%llu pending_bytes=%llu live_blocks=%llu segments=%llu\n",
	       label, (unsigned long long)s.allocs, (unsigned long long)s.frees,
	       (unsigned long long)s.hits, (unsigned long long)s.misses,
	       (unsigned long long)s.passthrough_allocs, (unsigned long long)s.passthrough_frees,
	       (unsigned long long)s.bad_frees, (unsigned long long)s.backend_allocs,
	       (unsigned long long)s.backend_frees, (unsigned long long)s.events_recorded,
	       (unsigned long long)s.event_queries, (unsigned long long)s.stream_waits,
	       (unsigned long long)s.host_waits, (unsigned long long)s.epochs_closed,
	       (unsigned long long)s.pending_bytes, (unsigned long long)s.live_blocks,
	       (unsigned long long)s.segments);
	fflush(stdout);
}

/* ---- time ------------------------------------------------------------------ */

static inline uint64_t race_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline double race_median(std::vector<double> v)
{
	if (v.empty())
		return 0.0;
	std::sort(v.begin(), v.end());
	size_t n = v.size();
	return (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Nanoseconds of the GPU's global timer (wall time, same on every SM). */
__device__ __forceinline__ uint64_t race_gtimer(void)
{
	uint64_t t;
	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* p[0..n) = v, grid-stride. */
__global__ void race_fill_u32(uint32_t *p, size_t n, uint32_t v)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		p[i] = v;
}

/* p[i] = i * mul + add, grid-stride. */
__global__ void race_fill_affine(uint32_t *p, size_t n, uint32_t mul, uint32_t add)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		p[i] = (uint32_t)i * mul + add;
}

/* out[i] += in[i], grid-stride. */
__global__ void race_accumulate(uint32_t *out, const uint32_t *in, size_t n)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		out[i] += in[i];
}

/* ---- host-mapped control words --------------------------------------------- */

/*
 * Page-aligned host memory registered with cudaHostRegister(Mapped), used for
 * the tests' own flags (host -> kernel and kernel -> host). Registration is
 * passed through by libemm, so the test's bookkeeping never depends on the
 * pinned pool it may be testing.
 */
struct race_mapped {
	void *host;
	void *dev;
	size_t bytes;
};

static inline struct race_mapped race_mapped_alloc(size_t bytes)
{
	struct race_mapped m;
	long page = sysconf(_SC_PAGESIZE);
	m.bytes = (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
	if (posix_memalign(&m.host, (size_t)page, m.bytes) != 0)
		race_fail("posix_memalign(%zu)", m.bytes);
	memset(m.host, 0, m.bytes);
	CK(cudaHostRegister(m.host, m.bytes, cudaHostRegisterMapped));
	CK(cudaHostGetDevicePointer(&m.dev, m.host, 0));
	return m;
}

static inline void race_mapped_free(struct race_mapped *m)
{
	CK(cudaHostUnregister(m->host));
	free(m->host);
	m->host = m->dev = NULL;
}

/* ---- argument helpers -------------------------------------------------------- */

static inline unsigned long long race_parse_size(const char *s)
{
	char *end = NULL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s)
		race_fail("bad number '%s'", s);
	switch (*end) {
	case 'k': case 'K': v <<= 10; end++; break;
	case 'm': case 'M': v <<= 20; end++; break;
	case 'g': case 'G': v <<= 30; end++; break;
	default: break;
	}
	if (*end == 'i' && end[1] == 'B')
		end += 2;
	else if (*end == 'B')
		end++;
	if (*end)
		race_fail("bad size '%s'", s);
	return v;
}

/* Shared by race.cu and multidevice.cu. */
/*
 * Writes `a` over p[0..n) again and again until the host flag reaches `want`
 * (then `tail_ns` more) or `max_ns` passed, never less than `min_ns`; then one
 * last full pass. win[0] = 1 if block 0 saw the flag (the race window was
 * open), 0 if it stopped on the time limit.
 */
static __global__ void race_long_writer(uint32_t *p, size_t n, uint32_t a, const volatile uint32_t *flag, uint32_t want,
					uint64_t min_ns, uint64_t max_ns, uint64_t tail_ns, volatile uint32_t *win)
{
	__shared__ int stop;
	__shared__ int seen;
	uint64_t t0 = race_gtimer();
	uint64_t t_end = t0 + max_ns;
	if (threadIdx.x == 0) {
		stop = 0;
		seen = 0;
	}
	__syncthreads();
	volatile uint32_t *vp = p;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (;;) {
		for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
			vp[i] = a;
		__syncthreads();
		if (threadIdx.x == 0) {
			uint64_t now = race_gtimer();
			if (!seen && *flag >= want) {
				seen = 1;
				uint64_t e = now + tail_ns;
				uint64_t m = t0 + min_ns;
				t_end = e > m ? e : m;
			}
			if (now >= t_end)
				stop = 1;
		}
		__syncthreads();
		if (stop)
			break;
	}
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
		vp[i] = a;
	__threadfence_system();
	if (blockIdx.x == 0 && threadIdx.x == 0)
		*win = seen;
}

/* Runs closures on one thread, synchronously (the caller waits); with a
 * device >= 0 the thread makes it current first. Shared by race.cu (the Y
 * side on its own per-thread default stream) and multidevice.cu (frees from
 * another device's thread). */
class race_worker {
public:
	explicit race_worker(int dev = -1) : dev_(dev), th_([this] { loop(); }) {}
	~race_worker()
	{
		{
			std::lock_guard<std::mutex> g(m_);
			quit_ = true;
		}
		cv_.notify_all();
		th_.join();
	}
	void run(const std::function<void()> &f)
	{
		std::unique_lock<std::mutex> g(m_);
		job_ = &f;
		done_ = false;
		cv_.notify_all();
		cv_.wait(g, [this] { return done_; });
	}

private:
	void loop()
	{
		if (dev_ >= 0)
			CK(cudaSetDevice(dev_));
		std::unique_lock<std::mutex> g(m_);
		for (;;) {
			cv_.wait(g, [this] { return quit_ || job_ != nullptr; });
			if (quit_)
				return;
			const std::function<void()> *f = job_;
			job_ = nullptr;
			g.unlock();
			(*f)();
			g.lock();
			done_ = true;
			cv_.notify_all();
		}
	}
	int dev_;
	std::mutex m_;
	std::condition_variable cv_;
	const std::function<void()> *job_ = nullptr;
	bool done_ = false;
	bool quit_ = false;
	std::thread th_; /* last: starts after the members above exist */
};

#endif
