/* SPDX-License-Identifier: MIT */
/*
 * interpose/public_api.c - the exported query API of include/emm/emm.h
 * (emm_version_string, emm_stats_get, emm_release_idle): argument checks
 * and the calls into the process layer.
 *
 * None of these initialise libemm: before the first CUDA call there is
 * nothing to report, and a statistics query must not load a backend.
 */
#include <errno.h>
#include <string.h>

#include "common/compiler.h"
#include "emm/emm.h"
#include "emm/emm_version.h"
#include "process/process.h"

#define STATS_MIN_SIZE (2 * sizeof(uint32_t)) /* struct_size and version */

EMM_EXPORT const char *emm_version_string(void)
{
	return EMM_VERSION_STRING;
}

EMM_EXPORT int emm_stats_get(int device, struct emm_stats *out)
{
	if (!out || out->struct_size < STATS_MIN_SIZE || device < -2)
		return -EINVAL;
	emm_state_stats_snapshot(device, out);
	return 0;
}

EMM_EXPORT long long emm_release_idle(int device, size_t keep_bytes)
{
	long long released = 0;
	int r = emm_state_release_idle(device, keep_bytes, &released);

	return r < 0 ? r : released;
}
