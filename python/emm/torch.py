# SPDX-License-Identifier: MIT
"""emm.torch - libemm as PyTorch's CUDA allocator.

    import emm.torch
    emm.torch.use()     # before PyTorch's first CUDA allocation

It installs torch.cuda.memory.CUDAPluggableAllocator over libemm's
emm_alloc / emm_free (include/emm/emm.h), whose signatures are the pluggable
allocator's own: PyTorch passes the stream to both the allocation and the
free, so libemm serves PyTorch stream-ordered (a freed block is reused at
once on its stream, on another one behind an event), with no epochs.

What the pluggable interface does not carry from Python (README, "Without
LD_PRELOAD"): Tensor.record_stream is a no-op (synchronise, or keep the
tensor alive, when a tensor is used on a stream other than the one it was
allocated on); torch.cuda.memory_stats / memory_allocated / memory_reserved
/ memory_snapshot raise (use emm.stats() or emm.torch.memory_stats());
torch.cuda.empty_cache does nothing (use emm.release_idle()); CUDA graphs get
no private pool: allocations made during a capture become the driver's graph
memory nodes (cuMemAllocAsync), as with PyTorch's cudaMallocAsync backend; an
allocation that fails returns NULL, which PyTorch does not check.
"""
import emm

import torch
from torch.cuda.memory import CUDAPluggableAllocator, change_current_allocator

_allocator = None


def use():
    """Install libemm as PyTorch's CUDA allocator (once; later calls return the same allocator)."""
    global _allocator
    if _allocator is None:
        allocator = CUDAPluggableAllocator(emm.library_path(), "emm_alloc", "emm_free")
        change_current_allocator(allocator)
        _allocator = allocator
    return _allocator


def memory_stats(device=None):
    """libemm's counters for a torch device (default: the current one), as emm.stats()."""
    if device is None:
        device = torch.cuda.current_device()
    elif not isinstance(device, int):
        device = torch.device(device).index or 0
    return emm.stats(device)
