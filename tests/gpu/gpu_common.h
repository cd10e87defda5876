/* SPDX-License-Identifier: MIT */
/*
 * tests/gpu/gpu_common.h - what every GPU interception test shares (C and
 * CUDA C++): libemm's counters read through emm_stats_get found at run time
 * (so the programs never link libemm), before/after snapshots, the
 * "served by the pool" checks, and the one summary line each program prints:
 *
 *   emm-served: case=NAME made=N allocs=N pinned_allocs=N hits=N ...
 *
 * scripts/gpu-check collects those lines into its summary table. A check
 * that finds an allocation the pool did not see prints a line starting with
 * "ESCAPE:" naming the path, and the test fails.
 *
 * Scopes: device 0 (its CUDA ordinal), pinned host memory (-2), the whole
 * process (-1). Pass-through counters are read process-wide as well as per
 * scope, so a pass-through counted in either is noticed.
 */
#ifndef EMM_TESTS_GPU_COMMON_H
#define EMM_TESTS_GPU_COMMON_H

#include <cuda.h>
#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emm/emm.h"
#include "emm_test.h"

#define GPU_SCOPE_DEVICE  0
#define GPU_SCOPE_PINNED  (-2)
#define GPU_SCOPE_PROCESS (-1)

/* Exit status of a program that found no GPU or no driver. */
#define GPU_SKIP 77

/* The driver programs' start: cuInit, device 0's primary context retained
 * (*ret_dev, *ret_ctx) and made current. 0; GPU_SKIP (said) without a
 * usable device; 1 (said) when the context cannot be made current. */
static inline int gpu_primary_current(CUdevice *ret_dev, CUcontext *ret_ctx)
{
	int count = 0;
	CUresult r = cuInit(0);

	if (r == CUDA_SUCCESS)
		r = cuDeviceGetCount(&count);
	if (r != CUDA_SUCCESS || count == 0) {
		printf("skip: no usable CUDA device (cuInit/cuDeviceGetCount: %d, %d devices)\n", (int)r, count);
		return GPU_SKIP;
	}
	if (cuDeviceGet(ret_dev, 0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(ret_ctx, *ret_dev) != CUDA_SUCCESS ||
	    cuCtxSetCurrent(*ret_ctx) != CUDA_SUCCESS) {
		printf("FAIL: cannot make device 0's primary context current\n");
		return 1;
	}
	return 0;
}

typedef int (*gpu_stats_get_fn)(int device, struct emm_stats *out);

static inline gpu_stats_get_fn gpu_stats_fn(void)
{
	static gpu_stats_get_fn fn;
	static int looked;

	if (!looked) {
		void *sym = dlsym(RTLD_DEFAULT, "emm_stats_get");
		memcpy(&fn, &sym, sizeof(fn));
		looked = 1;
	}
	return fn;
}

/* True when libemm is loaded in this process. */
static inline int gpu_emm_present(void)
{
	return gpu_stats_fn() != NULL;
}

/* A memory checker injected itself (compute-sanitizer sets
 * NVTX_INJECTION64_PATH): libemm then keeps no freed VMM buffer for reuse
 * (process/vmm_idle.c), so cache hits are not expected. */
static inline int gpu_checker_attached(void)
{
	const char *p = getenv("NVTX_INJECTION64_PATH");

	return p && *p;
}

/* emm_release_idle found at run time: the bytes it gave back, or -1
 * without libemm. */
static inline long long gpu_release_idle(int device, size_t keep_bytes)
{
	long long (*fn)(int, size_t);
	void *sym = dlsym(RTLD_DEFAULT, "emm_release_idle");

	memcpy(&fn, &sym, sizeof(fn));
	return fn ? fn(device, keep_bytes) : -1;
}

/* EMM_HOLD_PEAK as the vmm tests expect it: on unless "off" or "0". */
static inline int gpu_hold_peak_on(void)
{
	const char *v = getenv("EMM_HOLD_PEAK");

	return !v || !(strcmp(v, "off") == 0 || strcmp(v, "0") == 0);
}

/* Where the code at `addr` lives ("?" if unknown): the file of its object. */
static inline const char *gpu_where(const void *addr)
{
	Dl_info info;

	if (addr && dladdr(addr, &info) && info.dli_fname)
		return info.dli_fname;
	return "?";
}

/* The exported name dladdr gives for `addr`, or "?". */
static inline const char *gpu_symbol_at(const void *addr)
{
	Dl_info info;

	if (addr && dladdr(addr, &info) && info.dli_sname)
		return info.dli_sname;
	return "?";
}

/* True when `addr` is in libemm.so itself (by the file's name). */
static inline int gpu_in_libemm(const void *addr)
{
	const char *path = gpu_where(addr), *base = strrchr(path, '/');

	base = base ? base + 1 : path;
	return strncmp(base, "libemm.so", 9) == 0;
}

/* Counters of one scope; all zero (and the return value negative) when the
 * scope has none yet (its heap is created on first use). */
static inline int gpu_stats(int scope, struct emm_stats *out)
{
	gpu_stats_get_fn fn = gpu_stats_fn();
	int rc;

	memset(out, 0, sizeof(*out));
	if (!fn)
		return -1;
	out->struct_size = (uint32_t)sizeof(*out);
	rc = fn(scope, out);
	if (rc != 0) {
		memset(out, 0, sizeof(*out));
		out->struct_size = (uint32_t)sizeof(*out);
	}
	return rc;
}

struct gpu_snap {
	struct emm_stats dev;
	struct emm_stats pinned;
	struct emm_stats proc;
};

static inline void gpu_snap_take(struct gpu_snap *s)
{
	(void)gpu_stats(GPU_SCOPE_DEVICE, &s->dev);
	(void)gpu_stats(GPU_SCOPE_PINNED, &s->pinned);
	(void)gpu_stats(GPU_SCOPE_PROCESS, &s->proc);
}

static inline const struct emm_stats *gpu_snap_scope(const struct gpu_snap *s, int scope)
{
	if (scope == GPU_SCOPE_PINNED)
		return &s->pinned;
	if (scope == GPU_SCOPE_PROCESS)
		return &s->proc;
	return &s->dev;
}

/* Allocations the program made that the pool should have served: the
 * expected lower bound printed in the summary line. */
static uint64_t gpu_made;

/* Field deltas between snapshots a and b: in `scope`, and process-wide. */
#define GPU_D(f)  ((unsigned long long)(gpu_snap_scope(b, scope)->f - gpu_snap_scope(a, scope)->f))
#define GPU_DP(f) ((unsigned long long)(b->proc.f - a->proc.f))

/*
 * The pool served the `n` allocations made between snapshots a and b on the
 * path `path` (counted in `scope`), and none of them went to the driver
 * unchanged.
 */
static inline void gpu_expect_served_(const char *file, int line, const char *path, int scope,
                                      const struct gpu_snap *a, const struct gpu_snap *b, uint64_t n)
{
	unsigned long long got = GPU_D(allocs), pt = GPU_D(passthrough_allocs),
	                   ptp = GPU_DP(passthrough_allocs);

	gpu_made += n;
	if (got < n) {
		fprintf(stderr,
		        "%s:%d: %s: ESCAPE: %s: %llu allocation(s) made, the pool counted %llu "
		        "(scope %d allocs +%llu, process allocs +%llu, passthrough +%llu)\n",
		        file, line, emm_test_current.name, path, (unsigned long long)n, got, scope, got,
		        GPU_DP(allocs), ptp);
		emm_test_current.failures++;
	}
	if (pt != 0 || ptp != 0) {
		fprintf(stderr,
		        "%s:%d: %s: ESCAPE: %s: passed through to the driver "
		        "(passthrough_allocs +%llu in scope %d, +%llu process-wide)\n",
		        file, line, emm_test_current.name, path, pt, scope, ptp);
		emm_test_current.failures++;
	}
	printf("  %-52s scope %2d: allocs +%llu (made %llu) hits +%llu misses +%llu backend +%llu\n", path,
	       scope, got, (unsigned long long)n, GPU_D(hits), GPU_D(misses), GPU_D(backend_allocs));
}

/* The pool took back the `n` blocks freed between a and b. */
static inline void gpu_expect_freed_(const char *file, int line, const char *path, int scope,
                                     const struct gpu_snap *a, const struct gpu_snap *b, uint64_t n)
{
	unsigned long long got = GPU_D(frees), pt = GPU_DP(passthrough_frees), bad = GPU_DP(bad_frees);

	if (got < n) {
		fprintf(stderr,
		        "%s:%d: %s: ESCAPE: %s: %llu free(s) made, the pool counted %llu "
		        "(passthrough_frees +%llu, bad_frees +%llu)\n",
		        file, line, emm_test_current.name, path, (unsigned long long)n, got, pt, bad);
		emm_test_current.failures++;
	}
	if (pt != 0 || bad != 0) {
		fprintf(stderr,
		        "%s:%d: %s: %s: frees of pool blocks went elsewhere "
		        "(passthrough_frees +%llu, bad_frees +%llu)\n",
		        file, line, emm_test_current.name, path, pt, bad);
		emm_test_current.failures++;
	}
}

#define expect_served(path, scope, a, b, n) gpu_expect_served_(__FILE__, __LINE__, path, scope, a, b, n)
#define expect_freed(path, scope, a, b, n)  gpu_expect_freed_(__FILE__, __LINE__, path, scope, a, b, n)

/* live_blocks of `scope` moved by exactly `delta` between a and b. */
#define expect_live_delta(scope, a, b, delta)                                                                \
	do {                                                                                                 \
		long long d_ = (long long)(gpu_snap_scope(b, scope)->live_blocks -                           \
		                           gpu_snap_scope(a, scope)->live_blocks);                           \
		if (d_ != (long long)(delta))                                                                \
			emm_test_fail_("live_blocks in scope %d moved by %lld, expected %lld", scope, d_,    \
			               (long long)(delta));                                                  \
	} while (0)

/* Fail the test unless libemm is loaded (every GPU test runs under it). */
#define assert_emm_present()                                                                                 \
	do {                                                                                                 \
		if (!gpu_emm_present()) {                                                                    \
			emm_test_fail_("emm_stats_get not found: libemm is not loaded (LD_PRELOAD=%s)",      \
			               getenv("LD_PRELOAD") ? getenv("LD_PRELOAD") : "(unset)");             \
			return;                                                                              \
		}                                                                                            \
	} while (0)

/* The line scripts/gpu-check collects: what this process's pool served. */
static inline void gpu_print_served(const char *case_name)
{
	struct emm_stats p, pin;

	if (!gpu_emm_present()) {
		printf("emm-served: case=%s libemm=absent made=%" PRIu64 "\n", case_name, gpu_made);
		return;
	}
	(void)gpu_stats(GPU_SCOPE_PROCESS, &p);
	(void)gpu_stats(GPU_SCOPE_PINNED, &pin);
	printf("emm-served: case=%s made=%" PRIu64 " allocs=%" PRIu64 " pinned_allocs=%" PRIu64
	       " hits=%" PRIu64 " misses=%" PRIu64 " passthrough_allocs=%" PRIu64 " backend_allocs=%" PRIu64
	       " frees=%" PRIu64 " live_blocks=%" PRIu64 "\n",
	       case_name, gpu_made, p.allocs, pin.allocs, p.hits, p.misses, p.passthrough_allocs,
	       p.backend_allocs, p.frees, p.live_blocks);
	fflush(stdout);
}

/* A byte pattern that differs per position and per seed. */
#if defined(__CUDACC__)
__host__ __device__
#endif
    static inline unsigned char
    gpu_pattern(size_t i, unsigned seed)
{
	return (unsigned char)(((i * 2654435761u) >> 7) ^ (seed * 0x9Du) ^ (i >> 11));
}

/* Compare n bytes against the pattern; print the first mismatch. */
static inline int gpu_check_pattern(const char *what, const unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i] != gpu_pattern(i, seed)) {
			fprintf(stderr, "%s: %s: data mismatch at byte %zu of %zu: 0x%02x, expected 0x%02x\n",
			        emm_test_current.name, what, i, n, p[i], gpu_pattern(i, seed));
			emm_test_current.failures++;
			return 0;
		}
	}
	return 1;
}

static inline void gpu_fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = gpu_pattern(i, seed);
}

#endif
