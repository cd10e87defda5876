# SPDX-License-Identifier: MIT
"""emm.cupy - libemm as CuPy's device and pinned-host allocators.

    import emm.cupy
    emm.cupy.use()          # cupy.cuda.set_allocator + set_pinned_memory_allocator

Device memory comes from libemm's heap of the current device, allocated and
freed without a stream (cuMemAlloc / cuMemFree semantics): libemm reuses a
freed block only behind the work enqueued before the free on the legacy
stream, on CuPy's blocking streams (CuPy's default) and on every non-blocking
stream it knows, and never waits for the device to know it. (CuPy's own pool
instead trusts that a block is used only on the stream it was allocated on.)
CuPy's streams are not handed to libemm because they come and go: without
the preload libemm then does not know the ones created with
non_blocking=True, so synchronise such a stream before dropping arrays it
used, or preload libemm as well.

Pinned host memory (cupy.cuda.alloc_pinned_memory, used by asynchronous
copies) comes from libemm's pinned caches, freed the same way.
"""
import emm

import cupy

_previous = None


class _DeviceBlock:
    """Owns one libemm device block; frees it when CuPy drops its last reference."""
    __slots__ = ("ptr", "device")

    def __init__(self, ptr, device):
        self.ptr = ptr
        self.device = device

    def __del__(self):
        if self.ptr:
            emm.device_free(self.ptr, self.device, emm.STREAM_NONE)
            self.ptr = 0


class _PinnedBlock:
    """What cupy.cuda.PinnedMemoryPointer expects of its memory: ptr and size."""
    __slots__ = ("ptr", "size")

    def __init__(self, ptr, size):
        self.ptr = ptr
        self.size = size

    def __int__(self):
        return self.ptr

    def __del__(self):
        if self.ptr:
            emm.host_free(self.ptr)
            self.ptr = 0


def malloc(size):
    """CuPy allocator: a cupy.cuda.MemoryPointer to `size` bytes of libemm device memory."""
    device = cupy.cuda.runtime.getDevice()
    if size == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.memory.Memory(0), 0)
    try:
        ptr = emm.device_alloc(size, device, emm.STREAM_NONE)
    except emm.OutOfMemoryError:
        raise cupy.cuda.memory.OutOfMemoryError(size, 0, 0) from None
    block = _DeviceBlock(ptr, device)
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, size, block, device), 0)


def malloc_pinned(size):
    """CuPy pinned allocator: a cupy.cuda.PinnedMemoryPointer to `size` bytes of libemm pinned memory."""
    ptr = emm.host_alloc(size, 0) if size else 0
    return cupy.cuda.PinnedMemoryPointer(_PinnedBlock(ptr, size), 0)


def use(pinned=True):
    """Make libemm CuPy's device allocator (and, with pinned, its pinned allocator) in this process."""
    global _previous
    emm.library_path()  # fail here, not at the first array, when libemm is missing
    cupy.cuda.set_allocator(malloc)
    if pinned:
        cupy.cuda.set_pinned_memory_allocator(malloc_pinned)


def unuse():
    """Back to CuPy's default pools."""
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    cupy.cuda.set_pinned_memory_allocator(cupy.get_default_pinned_memory_pool().malloc)
