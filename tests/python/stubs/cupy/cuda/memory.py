# Stand-in for cupy.cuda.memory (tests/python/stubs/README.md): the memory
# classes the allocators return, and CuPy's two function allocators with
# the semantics of CuPy's memory.pyx: the device id from the current device,
# malloc called only for size > 0, free called when the memory object goes
# if its ptr is not 0 - and CFunctionAllocator's NULL NOT checked.
import ctypes

from . import runtime


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):
        super().__init__(f"out of memory allocating {size} bytes")
        self.size = size


class Memory:
    def __init__(self, size):
        assert size == 0
        self.ptr = 0
        self.size = 0
        self.device_id = runtime.getDevice()


class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):
        self.ptr, self.size, self._owner, self.device_id = ptr, size, owner, device_id


class MemoryPointer:
    def __init__(self, mem, offset):
        self.mem = mem
        self.ptr = mem.ptr + offset
        self.device_id = mem.device_id


_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
_INTPTR_MIN, _INTPTR_MAX = -(1 << 63), (1 << 63) - 1


def _intptr(value):
    """CuPy's `intptr_t` arguments: an OverflowError outside the type's range."""
    value = int(value)
    if not _INTPTR_MIN <= value <= _INTPTR_MAX:
        raise OverflowError("value too large to convert to intptr_t")
    return value


class CFunctionAllocatorMemory:
    # malloc_func, free_func: the C functions (CuPy keeps their addresses and calls them from Cython).
    def __init__(self, size, param, malloc_func, free_func, device_id):
        self._param, self._free_func, self.device_id, self.size = param, free_func, device_id, size
        self.ptr = 0
        if size > 0:
            self.ptr = malloc_func(param, size, device_id) or 0  # NULL is kept, as CuPy does

    def __del__(self):
        if self.ptr:
            self._free_func(self._param, self.ptr, self.device_id)


class CFunctionAllocator:
    def __init__(self, param, malloc_func, free_func, owner):
        self._param = _intptr(param)
        self._malloc_func, self._free_func = _MALLOC(_intptr(malloc_func)), _FREE(_intptr(free_func))
        self._owner = owner

    def malloc(self, size):
        return MemoryPointer(CFunctionAllocatorMemory(size, self._param, self._malloc_func, self._free_func,
                                                      runtime.getDevice()), 0)


class PythonFunctionAllocatorMemory:
    def __init__(self, size, malloc_func, free_func, device_id):
        self._free_func, self.device_id, self.size = free_func, device_id, size
        self.ptr = 0
        if size > 0:
            self.ptr = malloc_func(size, device_id)

    def __del__(self):
        if self.ptr:
            self._free_func(self.ptr, self.device_id)


class PythonFunctionAllocator:
    def __init__(self, malloc_func, free_func):
        self._malloc_func, self._free_func = malloc_func, free_func

    def malloc(self, size):
        return MemoryPointer(PythonFunctionAllocatorMemory(size, self._malloc_func, self._free_func,
                                                           runtime.getDevice()), 0)
