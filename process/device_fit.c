/* SPDX-License-Identifier: MIT */
/*
 * process/device_fit.c - segment sizes a device cannot hold, refused when a
 * context's first heap is made: a segment option larger than the device
 * (its total as the backend reports it: the GPU's memory, or hostsim's
 * simulated capacity) would fail every allocation that needs such a
 * segment, so the heap gets half the device instead
 * (allocator/heap_options.h) and the user is told once per device: an
 * error for a size set in the environment, an info line at EMM_VERBOSE >= 1
 * for a default (a 16 MiB simulated device is a normal thing to ask for).
 */
#include <stdatomic.h>
#include <stdint.h>

#include "allocator/heap_options.h"
#include "common/format.h"
#include "common/log.h"
#include "config/options.h"
#include "process/process.h"
#include "process/process_internal.h"

static atomic_uint_fast64_t told; /* devices 0..63 already told */

static void tell(int device, size_t total, enum emm_option_id id, size_t before, size_t after)
{
	const enum emm_option_source *src = emm_options_sources();
	char b[32], a[32], t[32];

	emm_options_format_size(before, b, sizeof(b));
	emm_options_format_size(after, a, sizeof(a));
	emm_format_bytes(total, t, sizeof(t));
	if (src[id] == EMM_OPTION_ENV)
		emm_error("EMM_%s=%s is larger than device %d (%s): refused, using %s (every allocation that "
		          "needs such a segment would fail)",
		          emm_option_name(id), b, device, t, a);
	else if (emm_state_options()->verbose >= 1)
		emm_info("EMM_%s's default %s is larger than device %d (%s): using %s", emm_option_name(id), b,
		         device, t, a);
}

void st_fit_params(struct ctx_entry *e, int device, struct emm_heap_params *p)
{
	struct emm_heap_params before = *p;
	size_t free_bytes = 0, total = 0;
	unsigned changed;
	int r;

	if (!st_backend.table || !st_backend.table->mem_info)
		return;
	st_tls_in_backend = true;
	r = st_backend.table->mem_info(e->backend_state, &free_bytes, &total);
	st_tls_in_backend = false;
	if (r < 0 || total == 0)
		return;
	changed = emm_heap_params_fit(p, total);
	if (!changed || device < 0 || device >= 64 ||
	    (atomic_fetch_or(&told, UINT64_C(1) << device) & (UINT64_C(1) << device)))
		return;
	if (changed & EMM_FIT_SMALL_SEGMENT)
		tell(device, total, EMM_OPT_SMALL_SEGMENT, before.small_segment, p->small_segment);
	if (changed & EMM_FIT_LARGE_SEGMENT)
		tell(device, total, EMM_OPT_LARGE_SEGMENT, before.large_segment, p->large_segment);
	if (changed & EMM_FIT_LARGE_ROUND)
		tell(device, total, EMM_OPT_LARGE_ROUND, before.large_round, p->large_round);
	if (changed & EMM_FIT_SMALL_SIZE)
		tell(device, total, EMM_OPT_SMALL_SIZE, before.small_max, p->small_max);
}
