#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""CPU micro-benchmark of emm.cupy's doors: the Python-side cost of one
CuPy malloc + free pair through each door, over the stand-in CuPy
(tests/python/stubs) and the test-double driver. A measurement, not a test.

usage: LD_LIBRARY_PATH=build/tests/fakecuda LIBEMM_PATH=build/libemm.so \\
       python3 tests/python/bench_cupy_door.py [PAIRS]

Rows: each door (emm.cupy.use(hook=...)); "stub floor", the stand-in's
PythonFunctionAllocator with malloc/free that do nothing (what the stand-in
itself costs: real CuPy builds these objects in Cython); "stub + wrapper",
the same behind the c door's Python wrapper; "ctypes floor", emm_param_alloc
+ emm_param_free called through ctypes with nothing around them (libemm's
own cost over the test double plus two ctypes calls); "ctypes call", one
ctypes call of emm_param_free(NULL) (returns at once). The stand-in's
CFunctionAllocator calls the C functions through ctypes where CuPy calls
them from Cython, so the "c" row overstates real CuPy's cost by about two
ctypes calls.
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

PAIRS = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
SIZES = (512, 4096, 1 << 20, 256, 65536)  # temporaries of a few shapes


def timeit(step, pairs):
    """ns per pair of `pairs` calls of step(size)."""
    gc.disable()
    try:
        t = time.perf_counter_ns()
        for i in range(pairs):
            step(SIZES[i % 5])
        return (time.perf_counter_ns() - t) / pairs
    finally:
        gc.enable()


def pair_through_allocator(size):
    mp = cupy.cuda.allocator(size)  # dropped at once: CuPy frees it (refcount)
    assert mp.ptr


def main():
    assert getattr(cupy, "STUB", False), "the stand-in CuPy is not first on sys.path"
    lib = _lib.load()[0]
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "no test-double driver (LD_LIBRARY_PATH)"
    a, f, none = lib.emm_param_alloc, lib.emm_param_free, _lib.STREAM_NONE
    floor = cupy.cuda.memory.PythonFunctionAllocator(lambda s, d: 1, lambda p, d: None).malloc

    def wrapped_floor(size, _m=floor):  # the c door's Python wrapper, around the stand-in floor
        mp = _m(size)
        if mp.ptr or not size:
            return mp
        raise AssertionError

    def raw(size):
        f(none, a(none, size, 0), 0)

    def null_free(size):
        f(none, None, 0)

    rows = {}

    def measure(name, step, install=None):
        if install:
            install()
        ns = timeit(step, PAIRS)
        rows[name] = min(rows.get(name, ns), ns)

    for _ in range(REPEAT):  # interleaved, best of REPEAT: the machine is shared
        for hook in emm.cupy.HOOKS:
            s0 = emm.stats()
            measure(f"door {hook}", pair_through_allocator, lambda: emm.cupy.use(hook=hook))
            s1 = emm.stats()
            assert s1["allocs"] - s0["allocs"] >= PAIRS and s1["live_blocks"] == s0["live_blocks"], hook
        emm.cupy.unuse()
        measure("stub floor", pair_through_allocator, lambda: cupy.cuda.set_allocator(floor))
        measure("stub + wrapper", pair_through_allocator, lambda: cupy.cuda.set_allocator(wrapped_floor))
        measure("ctypes floor", raw)
        measure("ctypes call", null_free)
    base = rows["door object"]
    print(f"emm.cupy door cost per malloc+free pair, best of {REPEAT} interleaved runs of {PAIRS} pairs "
          f"(python {sys.version.split()[0]}, stand-in CuPy, test-double driver):")
    for name, ns in rows.items():
        print(f"  {name:15s} {ns / 1000:7.2f} us   {base / ns:5.2f}x the object door")
    wrapper = rows["stub + wrapper"] - rows["stub floor"]
    libemm_c = rows["ctypes floor"] - 2 * rows["ctypes call"]
    print(f"  the c door's Python wrapper: {wrapper / 1000:.2f} us; libemm's C alloc+free over the test double "
          f"(ctypes floor - 2 ctypes calls): {libemm_c / 1000:.2f} us")


REPEAT = 7
if __name__ == "__main__":
    main()
