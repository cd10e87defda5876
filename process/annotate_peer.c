/* SPDX-License-Identifier: MIT */
/*
 * process/annotate_peer.c - several devices under a memory checker.
 * compute-sanitizer (CUDA 13.0) checks a kernel's access against the NVTX
 * regions of its own device only: from a plain program, every word a
 * kernel on device 0 read of a region registered on device 1 was reported
 * as out of bounds, whether the heap was registered on one device or both,
 * and with nvtxMemCudaSetPeerAccess (tests/gpu/probe_nvtx_peer.cu). A heap
 * cannot be taken back from the tool while its memory lives: unregistered,
 * the segment is unknown to it and every access is reported (measured:
 * race-multidevice, run L). So once peer access is possible libemm stops
 * offering new segments of the device as heaps (the tool sees them as the
 * plain allocations they are, as cudaMalloc's) and gives back its idle
 * ones, so that later blocks come from unannotated segments; blocks in
 * segments still holding live blocks keep their regions, and a peer's
 * access to those is still reported. Their regions are never unregistered
 * (the tool refuses that once peer access is on): a block freed after the
 * device went off is not seen as freed, until its segment goes.
 *
 * When is peer access possible: after cuCtxEnablePeerAccess names the
 * device (emm_state_peer_access_enabled), and as soon as a second device
 * has a segment (st_annotate_device_used): cudart enables peer access
 * through no call libemm sees (race-multidevice's cudaDeviceEnablePeerAccess
 * answered "already enabled" after cudaMemcpyPeer, without libemm too).
 */
#include <stdatomic.h>
#include <stdint.h>

#include "common/log.h"
#include "process/annotate.h"
#include "process/process_internal.h"
#include "process/process.h"

/* The device of `ctx`: the driver's answer, else the registry's; -1. */
static int device_of(CUcontext ctx)
{
	const struct emm_real_driver_table *real = st_real_table();
	CUdevice dev;
	bool primary;

	if (real && real->cuCtxGetDevice_v2 && real->cuCtxGetDevice_v2(&dev, ctx) == CUDA_SUCCESS)
		return dev;
	return st_ctx_lookup(ctx, &dev, &primary) ? dev : -1;
}

/* Device `device`'s new segments are not offered from now on, and its
 * idle ones go back with `release` (no lock held; not the device whose
 * segment is being made: its heap is in the middle of an allocation).
 * True for the call that did it. */
static bool device_off(int device, bool release)
{
	long long released = 0;
	size_t forgotten;

	if (!st_annotate_set_device_off(device))
		return false;
	/* Once another device may reach this one's memory the tool refuses
	 * the unregister of its regions (annotate_regions.c): the blocks
	 * live now keep them in the tool until their heap goes. */
	forgotten = st_regions_forget_device(device);
	if (release && atomic_load_explicit(&st_annotate_on, memory_order_relaxed)) {
		/* Its contexts' new blocks from fresh heaps: none carved from a
		 * segment the tool knows (contexts_retire.c). */
		st_contexts_retire_heaps(device);
		(void)emm_state_release_idle(device, 0, &released);
	}
	emm_debug("annotations: device %d: %lld idle bytes given back, its new segments are not annotated, its %zu "
	          "live regions not unregistered",
	          device, released, forgotten);
	return true;
}

void emm_state_peer_access_enabled(CUcontext peer)
{
	int device;

	/* Before the first segment the tool is not probed yet: a tool
	 * injected is enough to remember the device. */
	if (!st_tool_injected || !st_opts->annotate || !peer || !st_enabled || st_is_exiting())
		return;
	device = device_of(peer);
	if (device >= 0 && device_off(device, true))
		emm_warn("annotations: peer access to device %d is enabled: the memory checker does not check a "
		         "peer's access to a region of another device, so device %d's new blocks are not "
		         "annotated (errors inside its segments go unseen; accesses from other devices are not "
		         "reported falsely)",
		         device, device);
}

void st_annotate_device_used(int device)
{
	static atomic_uint_fast64_t seen;
	static atomic_bool warned;
	uint_fast64_t bit, prev;

	if (device < 0 || device >= 64)
		return;
	bit = (uint_fast64_t)1 << device;
	if (atomic_load_explicit(&seen, memory_order_relaxed) & bit)
		return;
	prev = atomic_fetch_or(&seen, bit);
	if ((prev & bit) || !(prev & ~bit))
		return;
	if (!atomic_exchange(&warned, true))
		emm_warn("annotations: blocks on several devices (%d is the second): the CUDA runtime enables peer "
		         "access without a call libemm sees (cudaMemcpyPeer did), and the memory checker does not "
		         "check a peer's access to a region of another device, so new blocks are not annotated "
		         "from here on (errors inside segments go unseen; no access is reported falsely)",
		         device);
	for (int d = 0; d < 64; d++)
		if ((prev | bit) >> d & 1)
			(void)device_off(d, d != device);
}
