# SPDX-License-Identifier: MIT
"""emm.numba - libemm as Numba's external memory manager (NBEP 7).

Select it before Numba creates a context:

    NUMBA_CUDA_MEMORY_MANAGER=emm.numba python app.py
    # or: from numba import cuda; import emm.numba; cuda.set_memory_manager(emm.numba.EMMNumbaManager)

Device memory (memalloc) and pinned host memory (memhostalloc) come from
libemm's heaps; mempin stays the driver's (cuMemHostRegister, as in Numba's
HostOnlyCUDAMemoryManager). get_memory_info reports libemm's books (idle
cache counted as free); get_ipc_handle follows NBEP 7's offset protocol over
the address range the driver reports: the segment without the preload, the
block itself with it (libemm's IPC of any block).

Deallocation: Numba's own manager defers cuMemFree into a queue because the
real free waits for the whole device. libemm's free does not wait and is
fenced (a block freed without a stream is reused only after work enqueued
before the free is done), so device and pinned frees happen at once, in the
finalizer; defer_cleanup therefore only holds back the queue that mempin's
unregistrations use (inherited from HostOnlyCUDAMemoryManager).

Numba's streams are blocking (cuda.stream()), which the fence covers, as it
covers every non-blocking stream libemm knows (all of them under the preload;
without it, those that allocated through libemm's door, such as PyTorch's).
Synchronise any other non-blocking stream (an external stream) before
freeing memory it used.
"""
import ctypes

import emm

from numba.cuda.cudadrv import driver as _driver
from numba.cuda.cudadrv.driver import GetIpcHandleMixin, HostOnlyCUDAMemoryManager, MemoryPointer

_CU_MEMHOSTALLOC_PORTABLE = 0x01
_CU_MEMHOSTALLOC_DEVICEMAP = 0x02
_CU_MEMHOSTALLOC_WRITECOMBINED = 0x04
_CUDA_ERROR_OUT_OF_MEMORY = 2
_CUDA_ERROR_NOT_SUPPORTED = 801
_NO_IPC_BACKENDS = ("vmm", "async", "managed")

# NVIDIA's cuda-python binding: always in numba-cuda (no USE_NV_BINDING any
# more), optional in older Numba (ctypes pointers otherwise).
_use_nv_binding = bool(getattr(_driver, "USE_NV_BINDING", True)) and hasattr(_driver, "binding")


def _device_pointer(ptr):
    if _use_nv_binding:
        return _driver.binding.CUdeviceptr(ptr)
    return ctypes.c_uint64(ptr)


def _host_pointer(ptr):
    return ptr if _use_nv_binding else ctypes.c_void_p(ptr)


def _device_finalizer(ptr, device):
    def core():
        emm.device_free(ptr, device, emm.STREAM_NONE)
    return core


def _host_finalizer(manager, ptr, mapped):
    allocations = manager.allocations

    def core():
        if mapped and allocations:
            allocations.pop(ptr, None)
        emm.host_free(ptr)
    return core


class EMMNumbaManager(GetIpcHandleMixin, HostOnlyCUDAMemoryManager):
    """NBEP 7 external memory manager over libemm."""

    def initialize(self):
        emm.library_path()  # load libemm now: a missing library fails at context creation

    def get_ipc_handle(self, memory):
        """NBEP 7's offset protocol (GetIpcHandleMixin) over libemm's block; a clear
        CUDA_ERROR_NOT_SUPPORTED under a built-in backend whose memory cuIpcGetMemHandle
        cannot export (vmm, async, managed), as libemm answers under the preload."""
        backend = emm.settings().get("EMM_BACKEND", "driver")
        if backend in _NO_IPC_BACKENDS:
            raise _driver.CudaAPIError(
                _CUDA_ERROR_NOT_SUPPORTED,
                "libemm's %s backend: its memory cannot be exported with cuIpcGetMemHandle "
                "(run with EMM_BACKEND=driver to share it)" % backend)
        return super().get_ipc_handle(memory)

    def _device(self):
        return self.context.device.id

    def memalloc(self, size):
        device = self._device()
        try:
            ptr = emm.device_alloc(size, device, emm.STREAM_NONE)
        except emm.OutOfMemoryError as e:
            raise _driver.CudaAPIError(_CUDA_ERROR_OUT_OF_MEMORY, f"libemm: out of memory for {size} bytes") from e
        return MemoryPointer(self.context, _device_pointer(ptr), size, finalizer=_device_finalizer(ptr, device))

    def memhostalloc(self, size, mapped=False, portable=False, wc=False):
        flags = ((_CU_MEMHOSTALLOC_DEVICEMAP if mapped else 0) | (_CU_MEMHOSTALLOC_PORTABLE if portable else 0) |
                 (_CU_MEMHOSTALLOC_WRITECOMBINED if wc else 0))
        try:
            ptr = emm.host_alloc(size, flags)
        except emm.OutOfMemoryError as e:
            raise _driver.CudaAPIError(_CUDA_ERROR_OUT_OF_MEMORY, f"libemm: out of pinned memory for {size} bytes") from e
        finalizer = _host_finalizer(self, ptr, mapped)
        if mapped:
            mem = _driver.MappedMemory(self.context, _host_pointer(ptr), size, finalizer=finalizer)
            self.allocations[ptr] = mem
            return mem.own()
        return _driver.PinnedMemory(self.context, _host_pointer(ptr), size, finalizer=finalizer)

    def get_memory_info(self):
        free, total = emm.mem_info(self._device())
        return _driver.MemoryInfo(free=free, total=total)

    def reset(self):
        # Blocks still referenced stay valid; what libemm holds idle goes back.
        super().reset()
        emm.release_idle(self._device(), 0)

    @property
    def interface_version(self):
        return 1


#: What NUMBA_CUDA_MEMORY_MANAGER=emm.numba makes Numba use.
_numba_memory_manager = EMMNumbaManager
