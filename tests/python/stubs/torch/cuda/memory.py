"""CUDAPluggableAllocator as torch/csrc/cuda/CUDAPluggableAllocator.cpp uses it:
dlopen the path, dlsym the two names, call them as
void *alloc(size_t, int, cudaStream_t) and void free(void *, size_t, int, cudaStream_t)."""
import ctypes

current = None


class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        lib = ctypes.CDLL(path)
        self.alloc = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(
            ctypes.cast(getattr(lib, alloc_fn_name), ctypes.c_void_p).value)
        self.free = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(
            ctypes.cast(getattr(lib, free_fn_name), ctypes.c_void_p).value)
        self.path = path


def change_current_allocator(allocator):
    global current
    if current is not None:
        raise RuntimeError("Can't swap an already initialized allocator")
    current = allocator
