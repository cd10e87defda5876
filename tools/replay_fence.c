/* SPDX-License-Identifier: MIT */
/*
 * tools/replay_fence.c - emm-replay's simulated GPU fences (replay_fence.h).
 * An event is the clock at its record plus one (never 0), so a query needs
 * no table: it is complete once the clock has moved `lag` past it.
 */
#include "tools/replay_fence.h"

#include <errno.h>
#include <stdbool.h>

static int fence_record(void *ctx, emm_stream_t stream, uint64_t *ret_event)
{
	struct replay_fence *f = ctx;

	(void)stream;
	*ret_event = f->clock + 1;
	return 0;
}

static int fence_query(void *ctx, uint64_t event)
{
	const struct replay_fence *f = ctx;

	return f->clock + 1 >= event + f->lag ? 0 : -EBUSY;
}

static int fence_stream_wait(void *ctx, emm_stream_t stream, uint64_t event)
{
	(void)ctx, (void)stream, (void)event;
	return 0;
}

/* A host wait: the device catches up with the event. */
static int fence_synchronize(void *ctx, uint64_t event)
{
	struct replay_fence *f = ctx;

	if (f->clock + 1 < event + f->lag)
		f->clock = event + f->lag - 1;
	return 0;
}

static void fence_release(void *ctx, uint64_t event)
{
	(void)ctx, (void)event;
}

static int fence_device_synchronize(void *ctx)
{
	(void)ctx;
	return 0;
}

static bool fence_capturing(void *ctx, emm_stream_t stream)
{
	(void)ctx, (void)stream;
	return false;
}

static int fence_stream_idle(void *ctx, emm_stream_t stream)
{
	(void)ctx, (void)stream;
	return 0;
}

struct emm_fence_ops replay_fence_ops(struct replay_fence *f, uint64_t lag)
{
	f->clock = 0;
	f->lag = lag;
	return (struct emm_fence_ops){
	    .ctx = f,
	    .record = fence_record,
	    .query = fence_query,
	    .stream_wait = fence_stream_wait,
	    .synchronize = fence_synchronize,
	    .release = fence_release,
	    .device_synchronize = fence_device_synchronize,
	    .capturing = fence_capturing,
	    .stream_idle = fence_stream_idle,
	};
}
