# SPDX-License-Identifier: MIT
"""tests/gpu/py_emm_mixed.py - one process using Numba, CuPy and PyTorch,
each with libemm installed through the package (no LD_PRELOAD):
NUMBA_CUDA_MEMORY_MANAGER=emm.numba, emm.cupy.use(), emm.torch.use(). Arrays
pass between them without copies - PyTorch -> CuPy by DLPack, CuPy -> Numba
by the CUDA Array Interface, Numba -> PyTorch by the CUDA Array Interface -
each framework working on a stream of its own (ordered by events). The
results must match NumPy's; each framework's allocations must be counted by
the same libemm heap of device 0, and exactly one libemm be mapped."""
import os
import sys

os.environ["NUMBA_CUDA_MEMORY_MANAGER"] = "emm.numba"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmpkg import DEVICE, libemm_mappings, package_case, skip  # noqa: E402

case = package_case("py-emm-mixed")
try:
    import numpy
    import torch
    import cupy
    from numba import cuda
except ImportError as e:
    skip("needs numba, cupy and torch: %s" % e)
if not (torch.cuda.is_available() and cuda.is_available()):
    skip("no usable GPU")

import emm  # noqa: E402
import emm.cupy  # noqa: E402
import emm.numba  # noqa: E402
import emm.torch  # noqa: E402

emm.torch.use()
emm.cupy.use()


@cuda.jit
def scale_add(out, x, a):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + 1.0


def test_one_library():
    maps = libemm_mappings()
    case.check(len(maps) == 1, "libemm mapped %d times: %s" % (len(maps), sorted(maps)))
    case.check(isinstance(cuda.current_context().memory_manager, emm.numba.EMMNumbaManager), "numba manager")


def test_pipeline():
    n = 1 << 20
    ref = numpy.arange(n, dtype=numpy.float32)
    ts, cs = torch.cuda.Stream(), cupy.cuda.Stream(non_blocking=True)
    ns = cuda.stream()
    for r in range(10):
        a = case.snap()
        with torch.cuda.stream(ts):
            t = torch.arange(n, dtype=torch.float32, device="cuda") * (r + 1)   # torch allocates
        ev = torch.cuda.Event()
        ev.record(ts)
        ev.synchronize()   # the consumers below run on other streams: hand over after ts's work
        a_t = case.snap()
        with cs:
            c = cupy.from_dlpack(t)                    # no copy
            c2 = cupy.sqrt(c * c) + 0.5                # cupy allocates
            cs.synchronize()
        a_c = case.snap()
        d = cuda.as_cuda_array(c2)                     # CAI, no copy
        out = cuda.device_array(n, numpy.float32, stream=ns)   # numba allocates
        scale_add[(n + 255) // 256, 256, ns](out, d, numpy.float32(2))
        ns.synchronize()
        a_n = case.snap()
        back = torch.as_tensor(out, device="cuda")     # CAI into torch, no copy
        got = back.cpu().numpy()
        want = 2.0 * (ref * (r + 1) + 0.5) + 1.0
        case.check(numpy.array_equal(got, want), "round %d: result differs (max %g)"
                   % (r, float(numpy.abs(got - want).max())))
        case.check(c.data.ptr == t.data_ptr(), "DLPack copied the torch tensor")
        case.check(back.data_ptr() == out.__cuda_array_interface__["data"][0], "CAI copied the numba array")
        case.served("torch (emm.torch)", a, a_t, 1, strict_passthrough=False)
        case.served("cupy (emm.cupy)", a_t, a_c, 1, strict_passthrough=False)
        case.served("numba (emm.numba)", a_c, a_n, 1, strict_passthrough=False)
        del t, c, c2, d, out, back
    torch.cuda.synchronize()
    s = emm.stats(DEVICE)
    case.check(s["passthrough_allocs"] == 0, "%d allocations passed to the driver" % s["passthrough_allocs"])
    print("one heap on device 0: allocs %d frees %d hits %d segments %d live %d"
          % (s["allocs"], s["frees"], s["hits"], s["segments"], s["live_blocks"]), flush=True)


case.run(test_one_library)
case.run(test_pipeline)
case.finish()
