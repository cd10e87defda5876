# SPDX-License-Identifier: MIT
"""tests/gpu/py_emm_numba.py - Numba with libemm as its external memory
manager (NBEP 7) through the package, without LD_PRELOAD
(NUMBA_CUDA_MEMORY_MANAGER=emm.numba): device arrays and kernels, pinned and
mapped host arrays, memory info from libemm's books, an IPC handle opened in
a second process (NBEP 7's offset protocol), deallocation at once (no
deferral) with the blocks reused. libemm's counters must show it served
them."""
import os
import sys

os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "emm.numba"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmpkg import DEVICE, PINNED, package_case, skip  # noqa: E402
from emmstats import ipc_refused_by_backend  # noqa: E402

try:
    import numpy
    from numba import cuda
except ImportError as e:
    numba_missing = str(e)
else:
    numba_missing = None

    @cuda.jit
    def axpy(out, a, x, y):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + y[i]

import emm  # noqa: E402

case = None


def test_manager_selected():
    import emm.numba
    mm = cuda.current_context().memory_manager
    case.check(isinstance(mm, emm.numba.EMMNumbaManager), "memory manager is %r" % type(mm))
    case.check(mm.interface_version == 1, "interface_version")


def test_device_arrays():
    n = 1 << 20
    # Integer values small enough that k * x + y is exact in float32 (with
    # x up to 2**20 the GPU's fused multiply-add and NumPy's two roundings
    # differ from k = 17 on: a comparison the allocator has no part in).
    x, y = (numpy.arange(n) % 1024).astype(numpy.float32), numpy.ones(n, dtype=numpy.float32)
    a = case.snap()
    for k in range(20):
        dx, dy = cuda.to_device(x), cuda.to_device(y)
        dout = cuda.device_array_like(dx)
        axpy[(n + 255) // 256, 256](dout, numpy.float32(k), dx, dy)
        case.check(numpy.array_equal(dout.copy_to_host(), k * x + y), "axpy %d" % k)
        del dx, dy, dout
    b = case.snap()
    case.served("numba device_array / to_device", a, b, 60)
    case.freed("numba finalizers (no deferral)", a, b, 60)
    hits = b[DEVICE]["hits"] - a[DEVICE]["hits"]
    print("hits +%d of 60 (frees without a stream are reusable once their epoch closes)" % hits, flush=True)
    case.check(hits >= 20, "freed blocks were not reused: hits +%d of 60" % hits)


def test_streams():
    s1, s2 = cuda.stream(), cuda.stream()
    n = 1 << 18
    x = numpy.random.default_rng(1).standard_normal(n).astype(numpy.float32)
    for k in range(10):
        d1 = cuda.to_device(x, stream=s1)
        o1 = cuda.device_array(n, numpy.float32, stream=s1)
        axpy[(n + 255) // 256, 256, s1](o1, numpy.float32(2), d1, d1)
        r1 = o1.copy_to_host(stream=s1)
        del d1, o1  # freed while s1 may still run: fenced
        d2 = cuda.to_device(x, stream=s2)
        o2 = cuda.device_array(n, numpy.float32, stream=s2)
        axpy[(n + 255) // 256, 256, s2](o2, numpy.float32(1), d2, d2)
        r2 = o2.copy_to_host(stream=s2)
        s1.synchronize()
        s2.synchronize()
        case.check(numpy.array_equal(r1, 3 * x) and numpy.array_equal(r2, 2 * x), "streams round %d" % k)


def test_host_memory():
    a = case.snap()
    p = cuda.pinned_array(1 << 20, numpy.float32)
    m = cuda.mapped_array(1 << 16, numpy.float32)
    p[:] = 1.5
    m[:] = 2.5
    d = cuda.to_device(p)
    case.check(float(d.copy_to_host().sum()) == 1.5 * (1 << 20), "pinned copy")
    axpy[(1 << 16) // 256, 256](m, numpy.float32(1), m, m)
    cuda.synchronize()
    case.check(float(m[100]) == 5.0, "mapped array written by a kernel: %r" % float(m[100]))
    b = case.snap()
    case.served("numba pinned_array / mapped_array", a, b, 2, scope=PINNED)
    del p, m, d


def test_memory_info():
    # Numba's answer read before and after libemm's: another process on the
    # same GPU (the suite runs tests side by side) may allocate or free in
    # between, so libemm's free bytes must lie within the bracket (256 MiB
    # of slack), in one of five tries.
    tol = 256 << 20
    for _ in range(5):
        free1, total = cuda.current_context().get_memory_info()
        efree, etotal = emm.mem_info(0)
        free2, _ = cuda.current_context().get_memory_info()
        if total == etotal and min(free1, free2) - tol < efree < max(free1, free2) + tol:
            break
    case.check(total == etotal and min(free1, free2) - tol < efree < max(free1, free2) + tol,
               "memory info %d..%d/%d vs libemm %d/%d" % (free1, free2, total, efree, etotal))


def ipc_child(handle, n, q):
    from numba import cuda as c
    with handle as arr:
        q.put(float(arr.copy_to_host()[:n].sum()))


def test_ipc():
    import multiprocessing as mp
    n = 1 << 16
    d = cuda.to_device(numpy.full(n, 3, numpy.float32))
    try:
        h = d.get_ipc_handle()
    except Exception as e:
        ipc_refused_by_backend(e)
        raise
    print("IPC handle: %s" % ", ".join("%s=%r" % (k, getattr(h, k)) for k in ("offset", "size", "base_size")
                                      if hasattr(h, k)), flush=True)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=ipc_child, args=(h, n, q))
    p.start()
    got = q.get(timeout=120)
    p.join(120)
    case.check(got == 3.0 * n, "IPC child read %r" % got)


def main():
    global case
    case = package_case("py-emm-numba")
    if numba_missing:
        skip("numba is not installed: %s" % numba_missing)
    if not cuda.is_available():
        skip("numba finds no usable GPU")
    import emm.numba  # noqa: F401
    for t in (test_manager_selected, test_device_arrays, test_streams, test_host_memory, test_memory_info,
              test_ipc):
        case.run(t)
    case.finish()


if __name__ == "__main__":  # the IPC child (spawn) imports this file without running the tests
    main()
