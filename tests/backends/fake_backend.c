/* SPDX-License-Identifier: MIT */
/*
 * tests/backends/fake_backend.c - backends that are wrong in one way each,
 * for test-loader. Built once per FAKE_MODE_* (tests/backends/meson.build):
 *   GOOD      a working (trivial) backend, built as libemm-backend-besideme.so
 *   NOTSUP    answers -ENOTSUP to every offer
 *   TOOOLD    answers interface version 0
 *   TOONEW    answers a version above the one offered
 *   NOMETHOD  table without segment_free
 *   SMALL     table whose struct_size is too small
 *   FAILING   entry fails with -EIO
 *   NOENTRY   exports no emm_backend_get
 *   V1        speaks only version 1: a version-1-sized table whose caps
 *             (wrongly) claim CAP_REMAP; accepted as version 1, the cap ignored
 *   V3        built for a future version 3 (a larger table): answers 2
 *   GARBAGE   answers interface version 0xdeadbeef
 *   V2GOOD    version 2 with CAP_REMAP | CAP_GROW and their methods
 *   V2NOGRAN  CAP_GROW without granularity
 *   V2NOUNMAP CAP_REMAP without segment_unmap
 *   V2NOMAP   CAP_REMAP without segment_map
 *   V2NOGROW  CAP_REMAP | CAP_GROW without segment_grow
 *   V2SMALL   answers version 2 with a version-1-sized table
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "emm/emm_backend.h"

#define EXPORT __attribute__((visibility("default")))

static uint64_t next_addr = UINT64_C(0x100000000);

static int fake_init(const struct emm_backend_host *host, int device, uint64_t context, void **ret_state)
{
	*ret_state = &next_addr;
	return 0;
}

static void fake_fini(void *state, bool driver_alive)
{
}

static int fake_segment_alloc(void *state, size_t size, uint64_t stream, uint64_t *ret_addr)
{
	*ret_addr = __atomic_fetch_add(&next_addr, (size + 0xfffff) & ~(uint64_t)0xfffff, __ATOMIC_RELAXED);
	return 0;
}

__attribute__((unused)) static int fake_segment_free(void *state, uint64_t addr, size_t size, uint64_t stream)
{
	return 0;
}

static int fake_mem_info(void *state, size_t *ret_free, size_t *ret_total)
{
	*ret_free = (size_t)1 << 30;
	*ret_total = (size_t)1 << 30;
	return 0;
}

__attribute__((unused)) static int fake_granularity(void *state, size_t *ret)
{
	*ret = (size_t)2 << 20;
	return 0;
}

__attribute__((unused)) static int fake_range(void *state, uint64_t seg, size_t seg_size, size_t offset, size_t length)
{
	return 0;
}

__attribute__((unused)) static int fake_grow(void *state, uint64_t seg, size_t old_size, size_t new_size)
{
	return -ENOSPC;
}

#define V1_SIZE (offsetof(struct emm_backend, host_segment_free) + sizeof(void *))

#if defined(FAKE_MODE_V1)
#define FAKE_CAPS (EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_SIMULATED | EMM_BACKEND_CAP_REMAP)
#elif defined(FAKE_MODE_V2GOOD) || defined(FAKE_MODE_V2NOGROW) || defined(FAKE_MODE_V3)
#define FAKE_CAPS (EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_REMAP | EMM_BACKEND_CAP_GROW)
#elif defined(FAKE_MODE_V2NOUNMAP) || defined(FAKE_MODE_V2NOMAP) || defined(FAKE_MODE_V2SMALL)
#define FAKE_CAPS (EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_REMAP)
#elif defined(FAKE_MODE_V2NOGRAN)
#define FAKE_CAPS (EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_GROW)
#else
#define FAKE_CAPS (EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_SIMULATED)
#endif

/* A table built against a future header: version 2's table plus a method. */
__attribute__((unused)) static const struct {
	struct emm_backend v2;
	int (*from_v3)(void *state);
} fake_backend_full = {{
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
#if defined(FAKE_MODE_SMALL)
    .struct_size = 16,
#elif defined(FAKE_MODE_V1) || defined(FAKE_MODE_V2SMALL)
    .struct_size = V1_SIZE,
#elif defined(FAKE_MODE_V3)
    .struct_size = sizeof(fake_backend_full),
#else
    .struct_size = sizeof(struct emm_backend),
#endif
    .name = "fake",
    .caps = FAKE_CAPS,
    .init = fake_init,
    .fini = fake_fini,
    .segment_alloc = fake_segment_alloc,
#ifndef FAKE_MODE_NOMETHOD
    .segment_free = fake_segment_free,
#endif
    .mem_info = fake_mem_info,
#if !defined(FAKE_MODE_V1) && !defined(FAKE_MODE_V2NOGRAN)
    .granularity = fake_granularity,
#endif
#if !defined(FAKE_MODE_V1) && !defined(FAKE_MODE_V2NOUNMAP)
    .segment_unmap = fake_range,
#endif
#if !defined(FAKE_MODE_V1) && !defined(FAKE_MODE_V2NOMAP)
    .segment_map = fake_range,
#endif
#if !defined(FAKE_MODE_V1) && !defined(FAKE_MODE_V2NOGROW)
    .segment_grow = fake_grow,
#endif
}, NULL};
#define fake_backend (fake_backend_full.v2)

#ifdef FAKE_MODE_NOENTRY
EXPORT int emm_backend_get_misspelt(uint32_t *inout_version, const struct emm_backend **ret_table);
EXPORT int emm_backend_get_misspelt(uint32_t *inout_version, const struct emm_backend **ret_table)
#else
EXPORT int emm_backend_get(uint32_t *inout_version, const struct emm_backend **ret_table);
EXPORT int emm_backend_get(uint32_t *inout_version, const struct emm_backend **ret_table)
#endif
{
#if defined(FAKE_MODE_NOTSUP)
	return -ENOTSUP;
#elif defined(FAKE_MODE_FAILING)
	return -EIO;
#else
#if defined(FAKE_MODE_TOOOLD)
	*inout_version = 0;
#elif defined(FAKE_MODE_TOONEW)
	*inout_version = *inout_version + 1;
#elif defined(FAKE_MODE_GARBAGE)
	*inout_version = 0xdeadbeefu;
#elif defined(FAKE_MODE_V1) || defined(FAKE_MODE_NOTSUP) || defined(FAKE_MODE_GOOD) || \
    defined(FAKE_MODE_NOMETHOD) || defined(FAKE_MODE_SMALL) || defined(FAKE_MODE_NOENTRY)
	*inout_version = 1;
#else
	/* Speaks 1..3: the newest not above the offer. */
	if (*inout_version > 3)
		*inout_version = 3;
	if (*inout_version < 2)
		*inout_version = 1;
#endif
	*ret_table = &fake_backend;
	return 0;
#endif
}
