# SPDX-License-Identifier: MIT
"""tests/bench/cupy_bench.py - one CuPy workload, one allocator variant:
steps/s and NVML peak device memory, for tests/bench/run-cupy.sh (project
issue 11: CuPy without its pool under libemm against CuPy's pool).

The workload allocates the way array code does: each step makes a few
dozen temporaries of a size that changes from step to step (elementwise
expressions, a reduction, a matmul, slicing copies), on one non-blocking
stream, synchronizing every 10 steps. The allocator decides how fast that
runs; the kernels are small.

    python3 cupy_bench.py VARIANT [--steps N] [--alloc-pairs N]

VARIANT names how CuPy allocates:
    pool     CuPy's default MemoryPool (and pinned pool)
    nopool   cupy.cuda.set_allocator(None): every array a cudaMalloc
             (run it under LD_PRELOAD=libemm.so for libemm's variant)
    async    cupy.cuda.MemoryAsyncPool (cudaMallocAsync on CUDA's pool)

--alloc-pairs N then measures what the allocator costs the step: the
allocations one step makes (counted through a wrapper for 50 more steps)
and the microseconds of one cupy.cuda.alloc and its release, over N pairs
of the workload's sizes with 8 kept live (the Python call included, as
every array pays it).

Prints one line:
    CUPY variant=NAME steps=N steps_per_s=X peak_nvml_gib=Y checksum=Z [emm_allocs=K]
         [allocs_per_step=A alloc_us=U]
Exit 77 without CuPy or a GPU.
"""
import argparse
import ctypes
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "gpu"))
from emmstats import EmmStats  # noqa: E402  (struct emm_stats mirrored)
from torch_train import nvml_used_sampler  # noqa: E402  (NVML only: torch is not imported there)


def emm_allocs():
    """libemm's pool allocations in the process so far, or None without it."""
    try:
        fn = ctypes.CDLL(None).emm_stats_get
    except AttributeError:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(EmmStats)]
    st = EmmStats()
    st.struct_size = ctypes.sizeof(EmmStats)
    if fn(-1, ctypes.byref(st)) != 0:
        return None
    return st.allocs


def alloc_cost(cupy, step, pairs):
    """(allocations per step, microseconds per allocation and release)."""
    current = cupy.cuda.get_allocator()
    count = [0]

    def counting(nbytes):
        count[0] += 1
        return current(nbytes)

    cupy.cuda.set_allocator(counting)
    for i in range(50):
        step(i)
    cupy.cuda.get_current_stream().synchronize()
    cupy.cuda.set_allocator(current)
    # The workload's sizes: vectors of 4096-53248 floats, 64-448 square matrices.
    sizes = [4 * 4096 * k for k in range(1, 14)] + [4 * (64 * k) ** 2 for k in range(1, 8)]
    live = [None] * 8
    for i in range(1000):  # warm: the pool or libemm holds these sizes
        live[i % 8] = cupy.cuda.alloc(sizes[i % len(sizes)])
    t0 = time.perf_counter()
    for i in range(pairs):
        live[i % 8] = cupy.cuda.alloc(sizes[(i * 7) % len(sizes)])
    dt = time.perf_counter() - t0
    live.clear()
    return count[0] / 50.0, dt / pairs * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variant", choices=["pool", "nopool", "async"])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--alloc-pairs", type=int, default=0)
    args = ap.parse_args()
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no GPU")
    except Exception as e:  # noqa: BLE001 - any failure here means: cannot run
        print("SKIP: no CuPy with a GPU here (%s)" % e, file=sys.stderr)
        return 77
    if args.variant == "nopool":
        cupy.cuda.set_allocator(None)
        cupy.cuda.set_pinned_memory_allocator(None)
    elif args.variant == "async":
        cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)

    rs = cupy.random.RandomState(1234)
    stream = cupy.cuda.Stream(non_blocking=True)

    def step(i):
        n = 4096 * (1 + (i * 7) % 13)  # 4096-53248 elements, changing every step
        m = 64 * (1 + (i * 5) % 7)  # 64-448 square matrices
        x = rs.standard_normal(n, dtype=cupy.float32)
        y = x * 2.0 + 1.0
        z = cupy.sin(y) * cupy.cos(x) + y * y
        w = cupy.where(z > 0, z, -z)
        s = w.sum() + cupy.abs(x).max()
        a = rs.standard_normal((m, m), dtype=cupy.float32)
        b = a @ a.T + cupy.eye(m, dtype=cupy.float32)
        parts = [b[k::4].copy() for k in range(4)]
        c = cupy.concatenate(parts) * 0.5
        t = c.mean() + s
        for _ in range(8):  # a chain of temporaries, as expression code makes
            x = cupy.tanh(x) + 0.1 * y
        return t + x.sum()

    with stream:
        for i in range(20):  # warm-up: kernels compiled, caches filled
            step(i)
        stream.synchronize()
        before = emm_allocs()
        finish = nvml_used_sampler()
        total = 0.0
        t0 = time.perf_counter()
        acc = []
        for i in range(args.steps):
            acc.append(step(i))
            if i % 10 == 9:
                total += float(cupy.stack(acc).sum())
                acc = []
        if acc:
            total += float(cupy.stack(acc).sum())
        stream.synchronize()
        dt = time.perf_counter() - t0
        peak = finish()
    after = emm_allocs()
    extra = " emm_allocs=%d" % (after - before) if before is not None and after is not None else ""
    if args.alloc_pairs > 0:
        with stream:
            extra += " allocs_per_step=%.1f alloc_us=%.3f" % alloc_cost(cupy, step, args.alloc_pairs)
    print("CUPY variant=%s steps=%d steps_per_s=%.3f peak_nvml_gib=%.3f checksum=%.6e%s"
          % (os.environ.get("CUPY_BENCH_NAME", args.variant), args.steps, args.steps / dt, peak / 2**30, total,
             extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())
