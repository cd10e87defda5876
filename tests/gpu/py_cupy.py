# SPDX-License-Identifier: MIT
"""tests/gpu/py_cupy.py - CuPy with its own pools switched off
(cupy.cuda.set_allocator(None), set_pinned_memory_allocator(None)), so every
array is a cudaMalloc and every pinned buffer a cudaHostAlloc made by CuPy's
runtime. Elementwise expressions and a reduction compared with NumPy, a loop
that allocates a temporary per operation (which the pool must serve from
cache), and pinned host memory. Every allocation must be served by libemm."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import PINNED, Case, skip  # noqa: E402

case = Case("py-cupy")

try:
    import numpy as np
    import cupy
except ImportError as e:
    skip("cupy is not installed: %s" % e)

try:
    ndev = cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # noqa: BLE001 - CUDARuntimeError without a driver
    skip("no usable CUDA device: %s" % e)
if ndev == 0:
    skip("no CUDA device")

cupy.cuda.set_allocator(None)
cupy.cuda.set_pinned_memory_allocator(None)
cupy.cuda.Device(0).use()
cupy.cuda.runtime.free(0)  # initialise the context
case.require_emm()


def test_expressions():
    n = 1 << 20
    host = np.arange(n, dtype=np.float32)
    # Warm up: compile the kernels outside the counted window.
    x = cupy.asarray(host)
    _ = cupy.sqrt(x * 2 + 1).sum()
    del x, _
    cupy.cuda.Device().synchronize()

    a = case.snap()
    x = cupy.asarray(host)            # 1 allocation
    y = x * 2 + 1                     # 2 (temporary, result)
    z = cupy.sqrt(y)                  # 1
    s = z.sum()                       # 1 (+ possibly reduction scratch)
    cupy.cuda.Device().synchronize()
    b = case.snap()
    case.served("cupy arrays with set_allocator(None) (cudaMalloc)", a, b, 5)
    expect = np.sqrt(host * 2 + 1)
    case.check(np.allclose(cupy.asnumpy(z), expect, rtol=1e-6), "cupy.sqrt(x * 2 + 1) differs from numpy")
    case.check(abs(float(s) - float(expect.sum(dtype=np.float64))) <= 1e-4 * float(expect.sum(dtype=np.float64)),
               "cupy sum %r differs from numpy %r" % (float(s), float(expect.sum(dtype=np.float64))))
    del x, y, z, s
    cupy.cuda.Device().synchronize()


def test_per_op_loop():
    n = 100000
    x = cupy.ones(n, dtype=cupy.float32)
    _ = x + 1  # compile
    del _
    ops = 300
    a = case.snap()
    acc = cupy.zeros(n, dtype=cupy.float32)
    for i in range(ops):
        acc = acc + x  # one new array per op; the old one is freed
    cupy.cuda.Device().synchronize()
    b = case.snap()
    case.served("cupy per-operation temporaries (cudaMalloc/cudaFree)", a, b, ops + 1)
    case.freed("cupy per-operation frees (cudaFree)", a, b, ops - 1)
    hits = b[0]["hits"] - a[0]["hits"]
    case.check(hits > 0, "%d same-size alloc/free pairs gave no cache hit" % ops)
    case.check(bool((acc == ops).all()), "loop result is wrong")
    del x, acc


def test_pinned():
    n = 1 << 20
    a = case.snap()
    mem = cupy.cuda.alloc_pinned_memory(n)  # cudaHostAlloc
    b = case.snap()
    case.served("cupy.cuda.alloc_pinned_memory with set_pinned_memory_allocator(None)", a, b, 1, scope=PINNED)
    host = np.ndarray((n,), dtype=np.uint8, buffer=mem)  # as cupyx.empty_pinned does
    host[:] = np.arange(n, dtype=np.uint64).astype(np.uint8)
    d = cupy.empty(n, dtype=cupy.uint8)
    d.set(host)
    back = np.ndarray((n,), dtype=np.uint8, buffer=cupy.cuda.alloc_pinned_memory(n))
    d.get(out=back)
    case.check(np.array_equal(back, host), "pinned round trip differs")
    del d, back, host, mem


case.run(test_expressions)
case.run(test_per_op_loop)
case.run(test_pinned)
case.finish()
