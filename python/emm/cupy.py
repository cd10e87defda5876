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

The door into CuPy is the cheapest the installed CuPy offers (emm.cupy.hook
says which one use() took; use(hook=...) picks one):

  "c"       cupy.cuda.memory.CFunctionAllocator over emm_param_alloc /
            emm_param_free (include/emm/emm.h), the stream EMM_STREAM_NONE as
            its param: CuPy calls libemm from Cython, and the free is a C call
            with no Python at all. CuPy does not check the NULL a failed
            allocation returns, so the allocator installed is a Python
            function that calls CuPy's malloc and, on a NULL, takes the "object"
            path once: that raises CuPy's OutOfMemoryError (libemm's precise
            error for anything else), or serves a block freed meanwhile.
  "python"  cupy.cuda.memory.PythonFunctionAllocator: a Python malloc over
            the ctypes function bound once, the free a functools.partial of
            the ctypes emm_param_free (no Python frame).
  "object"  the first door (any CuPy): a cupy.cuda.UnownedMemory owning a
            Python object whose __del__ frees the block.

All three allocate on the device CuPy names (its current one) and free
without a stream; a free libemm refuses (never expected: CuPy frees each
block once) is counted in emm.stats()["bad_frees"].

Pinned host memory (cupy.cuda.alloc_pinned_memory, used by asynchronous
copies) comes from libemm's pinned caches, freed the same way.
"""
import ctypes
import functools

import emm
from emm import _lib

import cupy

#: The door use() installed: "c", "python" or "object" (None before use()).
hook = None
HOOKS = ("c", "python", "object")


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


def _oom(size):
    return cupy.cuda.memory.OutOfMemoryError(size, 0, 0)


def malloc(size, device=None):
    """CuPy allocator ("object" door): a cupy.cuda.MemoryPointer to `size` bytes of libemm device memory."""
    if device is None:
        device = cupy.cuda.runtime.getDevice()
    if size == 0:
        return cupy.cuda.MemoryPointer(cupy.cuda.memory.Memory(0), 0)
    try:
        ptr = emm.device_alloc(size, device, emm.STREAM_NONE)
    except emm.OutOfMemoryError:
        raise _oom(size) from None
    block = _DeviceBlock(ptr, device)
    return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, size, block, device), 0)


def _c_door(lib):
    """The "c" door: CFunctionAllocator over emm_param_alloc/emm_param_free, a NULL turned into an error."""
    def address(fn):
        return ctypes.cast(fn, ctypes.c_void_p).value
    # CuPy takes the param as intptr_t: EMM_STREAM_NONE (all bits set) is -1 there.
    stream_none = ctypes.c_ssize_t(_lib.STREAM_NONE.value).value
    allocator = cupy.cuda.memory.CFunctionAllocator(
        stream_none, address(lib.emm_param_alloc), address(lib.emm_param_free), lib)
    c_malloc = allocator.malloc

    def malloc_c(size):
        mp = c_malloc(size)
        if mp.ptr or not size:
            return mp
        # NULL (CuPy's Memory holds ptr 0 and frees nothing): the precise error, or a block freed meanwhile.
        return malloc(size, mp.device_id)
    return malloc_c


def _python_door(lib):
    """The "python" door: PythonFunctionAllocator, malloc in Python over ctypes, free a partial of ctypes."""
    c_alloc, none = lib.emm_alloc, _lib.STREAM_NONE

    def malloc_func(size, device):
        ptr = c_alloc(size, device, none)
        if ptr:
            return ptr
        try:
            return emm.device_alloc(size, device, emm.STREAM_NONE)  # the precise error, or a block freed meanwhile
        except emm.OutOfMemoryError:
            raise _oom(size) from None
    free_func = functools.partial(lib.emm_param_free, none)
    return cupy.cuda.memory.PythonFunctionAllocator(malloc_func, free_func).malloc


def _door(which):
    """(hook, CuPy allocator function) for `which` (None: the cheapest the installed CuPy has)."""
    lib = _lib.load()[0]
    memory = cupy.cuda.memory
    if which not in (None,) + HOOKS:
        raise ValueError(f"hook {which!r}: one of {HOOKS}")
    if which in (None, "c") and hasattr(memory, "CFunctionAllocator"):
        return "c", _c_door(lib)
    if which in (None, "python") and hasattr(memory, "PythonFunctionAllocator"):
        return "python", _python_door(lib)
    if which in (None, "object"):
        return "object", malloc
    raise ValueError(f"hook {which!r}: this CuPy ({getattr(cupy, '__version__', '?')}) lacks it")


def malloc_pinned(size):
    """CuPy pinned allocator: a cupy.cuda.PinnedMemoryPointer to `size` bytes of libemm pinned memory."""
    ptr = emm.host_alloc(size, 0) if size else 0
    return cupy.cuda.PinnedMemoryPointer(_PinnedBlock(ptr, size), 0)


def use(pinned=True, hook=None):
    """Make libemm CuPy's device allocator (and, with pinned, its pinned allocator) in this process.
    hook: "c", "python" or "object" (module docstring); None takes the cheapest this CuPy has.
    Returns the hook taken (also in emm.cupy.hook)."""
    chosen, allocator = _door(hook)  # fails here, not at the first array, when libemm is missing
    cupy.cuda.set_allocator(allocator)
    if pinned:
        cupy.cuda.set_pinned_memory_allocator(malloc_pinned)
    globals()["hook"] = chosen  # the module's hook (the parameter shadows the name)
    return chosen


def unuse():
    """Back to CuPy's default pools."""
    global hook
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    cupy.cuda.set_pinned_memory_allocator(cupy.get_default_pinned_memory_pool().malloc)
    hook = None
