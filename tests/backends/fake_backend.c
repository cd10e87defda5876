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
 */
#include <errno.h>
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

__attribute__((unused)) static const struct emm_backend fake_backend = {
    .interface_version = EMM_BACKEND_INTERFACE_VERSION,
#ifdef FAKE_MODE_SMALL
    .struct_size = 16,
#else
    .struct_size = sizeof(struct emm_backend),
#endif
    .name = "fake",
    .caps = EMM_BACKEND_CAP_DEVICE | EMM_BACKEND_CAP_SIMULATED,
    .init = fake_init,
    .fini = fake_fini,
    .segment_alloc = fake_segment_alloc,
#ifndef FAKE_MODE_NOMETHOD
    .segment_free = fake_segment_free,
#endif
    .mem_info = fake_mem_info,
};

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
#else
	*inout_version = 1;
#endif
	*ret_table = &fake_backend;
	return 0;
#endif
}
