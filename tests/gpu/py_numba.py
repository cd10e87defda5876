# SPDX-License-Identifier: MIT
"""tests/gpu/py_numba.py - Numba (numba-cuda over cuda-python's bindings,
which reach the driver through cuGetProcAddress_v2): cuda.to_device,
cuda.device_array, a small kernel, results compared on the host; pinned and
mapped host arrays; frees forced through Numba's deallocation queue. Every
allocation must be served by libemm's pool."""
import gc
import os
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


def numba_live():
    """How many allocations Numba itself still tracks as live (its memory
    manager's table), or None if this Numba does not expose it."""
    mm = getattr(cuda.current_context(), "memory_manager", None)
    table = getattr(mm, "allocations", None)
    return len(table) if table is not None else None


def test_device_arrays():
    flush_frees()
    sizes = [1000, 100000, 1 << 20]
    made = 0
    live0 = numba_live()
    a = case.snap()
    for rnd in range(2):
        for n in sizes:
            host = np.arange(n, dtype=np.float32) + rnd
            d_in = cuda.to_device(host)
            d_out = cuda.device_array(n, dtype=np.float32)
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
    # Frees Numba has not issued (arrays it still holds, such as a cached
    # kernel argument) are not escapes: only count what Numba released.
    live1 = numba_live()
    kept = live1 - live0 if live0 is not None and live1 is not None else 0
    if kept:
        print("  numba still holds %d of the %d arrays after gc and flush" % (kept, made), flush=True)
    case.freed("numba deallocations", a, c, made - max(kept, 0))


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


case.run(test_device_arrays)
case.run(test_pinned_arrays)
case.finish()
