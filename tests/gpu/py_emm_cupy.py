# SPDX-License-Identifier: MIT
"""tests/gpu/py_emm_cupy.py - CuPy with libemm as its device and pinned
allocators through the package, without LD_PRELOAD (emm.cupy.use()), against
CuPy's own pools, alternating 3 times in one process: the same expressions
(elementwise chains with temporaries, reductions, matmul, FFT, sort) on the
null stream and on a blocking stream, with pinned-memory asynchronous copies.
Results must be identical between the two allocators, libemm's counters must
show it served the device and pinned allocations of the emm rounds, and the
time of each round is printed (ratio CuPy pool / libemm; a measurement, not
a pass condition). Each round times every door emm.cupy offers on this CuPy
("c": CFunctionAllocator, "python": PythonFunctionAllocator, "object": the
first door; python/emm/cupy.py), the default one first; the CUPY-DOOR line
is the default door's."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmpkg import DEVICE, PINNED, package_case, skip  # noqa: E402

case = package_case("py-emm-cupy")
try:
    import cupy
except ImportError as e:
    skip("cupy is not installed: %s" % e)
try:
    cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # noqa: BLE001
    skip("CuPy finds no usable GPU: %s" % e)
import numpy  # noqa: E402

import emm.cupy  # noqa: E402


def workload(seed):
    """A fixed set of expressions; returns host results."""
    rs = numpy.random.default_rng(seed)
    host = rs.standard_normal((512, 512)).astype(numpy.float32)
    pinned = cupy.cuda.alloc_pinned_memory(host.nbytes)
    staged = numpy.frombuffer(pinned, numpy.float32, host.size).reshape(host.shape)
    staged[...] = host
    out = []
    for stream in (cupy.cuda.Stream.null, cupy.cuda.Stream(non_blocking=False)):
        with stream:
            a = cupy.empty(host.shape, numpy.float32)
            a.set(staged, stream=stream)
            for i in range(20):
                b = cupy.sin(a) * 2.0 + cupy.cos(a * (i + 1)) - a ** 2 / 3.0  # temporaries each time
                a = (a + b * 1e-3).astype(numpy.float32)
            c = a @ a.T
            f = cupy.fft.fft(a[:, :256].astype(numpy.complex64), axis=1)
            s = cupy.sort(a.ravel())
            r = [float(a.sum()), float(c.trace()), float(cupy.abs(f).sum()), float(s[1000])]
            back = cupy.cuda.alloc_pinned_memory(a.nbytes)
            arr = numpy.frombuffer(back, numpy.float32, a.size).reshape(a.shape)
            a.get(out=arr, stream=stream)
            stream.synchronize()
            r.append(float(arr[17, 23]))
            out.append(r)
    return out


def timed(seed):
    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    for k in range(5):
        res = workload(seed + k)
    cupy.cuda.Device().synchronize()
    return res, time.perf_counter() - t


def hooks():
    """The doors this CuPy offers, the one use() takes by default first (emm/cupy.py)."""
    default = emm.cupy.use()
    emm.cupy.unuse()
    out = [default]
    for h in emm.cupy.HOOKS:
        if h != default:
            try:
                emm.cupy.use(hook=h)
                out.append(h)
            except ValueError:
                pass
            emm.cupy.unuse()
    return out


def test_emm_vs_pool():
    doors = hooks()
    print("emm.cupy doors: %s (default %s)" % (" ".join(doors), doors[0]), flush=True)
    ratios = {h: [] for h in doors}
    ref = None
    for r in range(3):
        emm.cupy.unuse()
        res_pool, t_pool = timed(100)
        ref = ref or res_pool
        case.check(res_pool == ref, "round %d: CuPy's pool gave other results than round 0" % r)
        for h in doors:
            a = case.snap()
            case.check(emm.cupy.use(hook=h) == h, "round %d: door %s taken" % (r, h))
            res_emm, t_emm = timed(100)
            b = case.snap()
            emm.cupy.unuse()
            case.check(res_emm == ref, "round %d, door %s: libemm gave %s, CuPy's pool %s" % (r, h, res_emm, ref))
            dev = b[DEVICE]["allocs"] - a[DEVICE]["allocs"]
            pin = b[PINNED]["allocs"] - a[PINNED]["allocs"]
            case.made += dev + pin
            case.check(dev > 500, "round %d, door %s: libemm served %d device allocations" % (r, h, dev))
            # 3 pinned buffers per workload (the staging one and one per stream), 5 workloads
            case.check(pin >= 15, "round %d, door %s: libemm served %d pinned allocations, want 15" % (r, h, pin))
            ratios[h].append(t_pool / t_emm)
            print("round %d: CuPy pool %.3f s, libemm door %s %.3f s (pool/libemm %.2fx); libemm device +%d pinned +%d"
                  % (r, t_pool, h, t_emm, t_pool / t_emm, dev, pin), flush=True)
    print("CUPY-DOOR speed pool/libemm per round: %s" % " ".join("%.2f" % x for x in ratios[doors[0]]), flush=True)
    for h in doors:
        print("CUPY-DOOR %s speed pool/libemm per round: %s" % (h, " ".join("%.2f" % x for x in ratios[h])),
              flush=True)


case.run(test_emm_vs_pool)
case.finish()
