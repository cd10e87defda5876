"""The names emm.numba uses from numba.cuda.cudadrv.driver (NBEP 7), minimally:
finalizers run when the pointer object is collected, as Numba's weakref.finalize does."""
import collections
import ctypes
import weakref

USE_NV_BINDING = False
MemoryInfo = collections.namedtuple("MemoryInfo", "free,total")


class CudaAPIError(Exception):
    def __init__(self, code, msg):
        super().__init__(code, msg)
        self.code = code


class _Pointer:
    def __init__(self, context, pointer, size, owner=None, finalizer=None):
        self.context, self.handle, self.size = context, pointer, size
        if finalizer is not None:
            weakref.finalize(self, finalizer)

    def own(self):
        return self


class MemoryPointer(_Pointer):
    @property
    def device_ctypes_pointer(self):
        return self.handle


class MappedMemory(_Pointer):
    pass


class PinnedMemory(_Pointer):
    pass


class BaseCUDAMemoryManager:
    def __init__(self, *args, **kwargs):
        self.context = kwargs.pop("context")


class HostOnlyCUDAMemoryManager(BaseCUDAMemoryManager):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.allocations = {}
        self.resets = 0

    def reset(self):
        self.allocations.clear()
        self.resets += 1


class GetIpcHandleMixin:
    def get_ipc_handle(self, memory):
        raise NotImplementedError


c_uint64 = ctypes.c_uint64
