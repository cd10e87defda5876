from . import memory, runtime  # noqa: F401
from .memory import Memory, MemoryPointer, UnownedMemory  # noqa: F401

allocator = None
pinned_allocator = None
current_stream_ptr = 0


class PinnedMemoryPointer:
    def __init__(self, mem, offset):
        self.mem = mem
        self.ptr = mem.ptr + offset


class _Stream:
    @property
    def ptr(self):
        return current_stream_ptr


def get_current_stream():
    return _Stream()


def set_allocator(func=None):
    global allocator
    allocator = func


def set_pinned_memory_allocator(func=None):
    global pinned_allocator
    pinned_allocator = func
