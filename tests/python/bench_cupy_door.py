#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""CPU micro-benchmark of emm.cupy's doors: the Python-side cost of one
CuPy malloc + free pair through each door, over the stand-in CuPy
(tests/python/stubs) and the test-double driver. A measurement, not a test.

usage: LD_LIBRARY_PATH=build/tests/fakecuda LIBEMM_PATH=build/libemm.so \\
       python3 tests/python/bench_cupy_door.py [PAIRS]

Rows: each door (emm.cupy.use(hook=...)); "stub floor", the stand-in's
PythonFunctionAllocator with malloc/free that do nothing (what the stand-in
itself costs: real CuPy builds these objects in Cython); "ctypes floor",
emm_param_alloc + emm_param_free called through ctypes with nothing around
them (libemm's own cost over the test double plus two ctypes calls). The
stand-in's CFunctionAllocator calls the C functions through ctypes where
CuPy calls them from Cython, so the "c" row overstates real CuPy's cost by
about the ctypes floor's call overhead.
"""
import ctypes
import gc
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "python", "stubs"))
os.environ.setdefault("FAKECUDA_MEM_CAPACITY", "256M")

import cupy  # noqa: E402  (the stand-in)
import emm  # noqa: E402
import emm.cupy  # noqa: E402
from emm import _lib  # noqa: E402

PAIRS = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
SIZES = (512, 4096, 1 << 20, 256, 65536)  # temporaries of a few shapes


def timeit(step, pairs=PAIRS, repeat=5):
    """Best ns per pair of `repeat` runs of `pairs` calls of step(size)."""
    best = None
    gc.disable()
    try:
        for _ in range(repeat):
            t = time.perf_counter_ns()
            for i in range(pairs):
                step(SIZES[i % 5])
            dt = (time.perf_counter_ns() - t) / pairs
            best = dt if best is None else min(best, dt)
    finally:
        gc.enable()
    return best


def pair_through_allocator(size):
    mp = cupy.cuda.allocator(size)  # dropped at once: CuPy frees it (refcount)
    assert mp.ptr


def main():
    assert getattr(cupy, "STUB", False), "the stand-in CuPy is not first on sys.path"
    lib = _lib.load()[0]
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "no test-double driver (LD_LIBRARY_PATH)"
    rows = []
    for hook in emm.cupy.HOOKS:
        emm.cupy.use(hook=hook)
        s0 = emm.stats()
        ns = timeit(pair_through_allocator)
        s1 = emm.stats()
        assert s1["allocs"] - s0["allocs"] >= PAIRS and s1["live_blocks"] == s0["live_blocks"], hook
        rows.append((f"door {hook}", ns))
    emm.cupy.unuse()
    cupy.cuda.set_allocator(cupy.cuda.memory.PythonFunctionAllocator(lambda s, d: 1, lambda p, d: None).malloc)
    rows.append(("stub floor", timeit(pair_through_allocator)))
    a, f, none = lib.emm_param_alloc, lib.emm_param_free, _lib.STREAM_NONE

    def raw(size):
        f(none, a(none, size, 0), 0)
    rows.append(("ctypes floor", timeit(raw)))
    base = rows[HOOKS_OBJECT][1]
    print(f"emm.cupy door cost per malloc+free pair, best of 5 x {PAIRS} pairs "
          f"(python {sys.version.split()[0]}, stand-in CuPy, test-double driver):")
    for name, ns in rows:
        print(f"  {name:14s} {ns / 1000:7.2f} us   {base / ns:5.2f}x the object door")


HOOKS_OBJECT = emm.cupy.HOOKS.index("object")
if __name__ == "__main__":
    main()
