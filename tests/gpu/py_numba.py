# SPDX-License-Identifier: MIT
"""tests/gpu/py_numba.py - Numba (numba-cuda over cuda-python's bindings,
which reach the driver through cuGetProcAddress_v2): cuda.to_device,
cuda.device_array, a small kernel, results compared on the host; pinned and
mapped host arrays; frees forced through Numba's deallocation queue. Every
allocation must be served by libemm's pool."""
import gc
import os
import weakref
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import PINNED, Case, skip  # noqa: E402

case = Case("py-numba")

try:
    import numpy as np
except ImportError as e:
    skip("numpy is not installed: %s" % e)
# numpy 2.5 dropped row_stack; the installed Numba still imports it.
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack

try:
    from numba import cuda
except ImportError as e:
    skip("numba is not installed: %s" % e)

try:
    available = cuda.is_available()
except Exception as e:  # noqa: BLE001 - any driver trouble means no GPU here
    skip("numba.cuda is unusable: %s" % e)
if not available:
    skip("numba.cuda finds no usable GPU")

cuda.select_device(0)
cuda.current_context()
case.require_emm()


@cuda.jit
def affine(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] * 2.0 + 1.0


def flush_frees():
    """Numba defers frees, and a device array can sit in a reference cycle
    (the dispatcher's argument handling): collect, then empty the queue."""
    gc.collect()
    cuda.current_context().deallocations.clear()
    cuda.synchronize()


def watch(arr, refs):
    """Keep a weak reference to the array's device memory object: once it is
    dead, Numba has released the memory (and queued its free)."""
    mem = arr.gpu_data
    # A device array's gpu_data may be a view; the owner frees the memory.
    mem = getattr(mem, "owner", None) or mem
    try:
        refs.append(weakref.ref(mem))
    except TypeError:
        refs.append(None)


def test_device_arrays():
    flush_frees()
    sizes = [1000, 100000, 1 << 20]
    made = 0
    refs = []
    a = case.snap()
    for rnd in range(2):
        for n in sizes:
            host = np.arange(n, dtype=np.float32) + rnd
            d_in = cuda.to_device(host)
            d_out = cuda.device_array(n, dtype=np.float32)
            watch(d_in, refs)
            watch(d_out, refs)
            made += 2
            affine[(n + 255) // 256, 256](d_in, d_out)
            got = d_out.copy_to_host()
            case.check(np.array_equal(got, host * 2.0 + 1.0), "kernel result of %d elements is wrong" % n)
            del d_in, d_out
    cuda.synchronize()
    b = case.snap()
    case.served("numba cuda.to_device + cuda.device_array", a, b, made)
    flush_frees()
    c = case.snap()
    # Memory Numba still holds (a live memory object, e.g. a cached kernel
    # argument) has not been freed by anyone: not an escape. Every released
    # one must have reached the pool.
    kept = sum(1 for r in refs if r is not None and r() is not None)
    if kept:
        print("  numba still holds %d of the %d arrays after gc and flush" % (kept, made), flush=True)
    case.freed("numba deallocations", a, c, made - kept)


def test_pinned_arrays():
    flush_frees()
    n = 1 << 18
    a = case.snap()
    pinned = cuda.pinned_array(n, dtype=np.float32)
    mapped = cuda.mapped_array(n, dtype=np.float32)
    b = case.snap()
    case.served("numba cuda.pinned_array + cuda.mapped_array", a, b, 2, scope=PINNED)
    pinned[:] = np.arange(n, dtype=np.float32)
    d = cuda.to_device(pinned)
    affine[(n + 255) // 256, 256](d, mapped)  # the kernel writes host memory
    cuda.synchronize()
    case.check(np.array_equal(mapped, pinned * 2.0 + 1.0), "kernel output in mapped host memory is wrong")
    del d, pinned, mapped
    flush_frees()


def report_unfreed_from_trace():
    """With EMM_LOG set (meson does), name every pointer libemm saw allocated
    but never freed: the evidence for or against an escaped free."""
    path = os.environ.get("EMM_LOG")
    if not path or not os.path.exists(path):
        return
    live = {}
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) < 6 or parts[0] == "Thread":
                continue
            action, ptr, size = parts[2], parts[3], parts[4]
            if action == "allocate":
                live[ptr] = size
            elif action == "free":
                live.pop(ptr, None)
    for ptr, size in sorted(live.items()):
        print("  trace: %s (%s bytes) allocated, never freed through libemm" % (ptr, size), flush=True)


case.run(test_device_arrays)
case.run(test_pinned_arrays)
flush_frees()
report_unfreed_from_trace()
case.finish()
