# SPDX-License-Identifier: MIT
"""tests/gpu/py_cuda_python.py - cuda-python (cuda.bindings.driver), which
dlsym()s cuGetProcAddress_v2 from libcuda and fetches every entry point
through it with an explicit version (per-thread variants when
CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM=1; meson runs both). cuMemAlloc /
cuMemFree and cuMemAllocAsync / cuMemFreeAsync on created streams, stream 0
and CU_STREAM_PER_THREAD; data written with a memset and a host copy and
read back; every allocation served by the pool."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import Case, skip  # noqa: E402

PTDS = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
case = Case("py-cuda-python" + ("-ptds" if PTDS else ""))

try:
    from cuda.bindings import driver
except ImportError:
    try:
        from cuda import cuda as driver  # cuda-python < 12.6
    except ImportError as e:
        skip("cuda-python is not installed: %s" % e)

OK = driver.CUresult.CUDA_SUCCESS


def ck(res, what):
    """cuda-python returns (err, values...): raise on an error, give the values."""
    err = res[0] if isinstance(res, tuple) else res
    if err != OK:
        raise RuntimeError("%s -> %s" % (what, err))
    if isinstance(res, tuple):
        return res[1] if len(res) == 2 else res[1:]
    return None


try:
    ck(driver.cuInit(0), "cuInit")
    n = ck(driver.cuDeviceGetCount(), "cuDeviceGetCount")
except RuntimeError as e:
    skip("no usable CUDA device: %s" % e)
if n == 0:
    skip("no CUDA device")
dev = ck(driver.cuDeviceGet(0), "cuDeviceGet")
ctx = ck(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
ck(driver.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
case.require_emm()


def roundtrip(p, size, v, stream=None):
    """Memset p to v, read it back; copy random bytes in, read them back."""
    buf = ctypes.create_string_buffer(size)
    data = os.urandom(size)
    src = ctypes.create_string_buffer(data, size)
    if stream is None:
        ck(driver.cuMemsetD8(p, v, size), "cuMemsetD8")
        ck(driver.cuMemcpyDtoH(ctypes.addressof(buf), p, size), "cuMemcpyDtoH")
        ok1 = buf.raw == bytes([v]) * size
        ck(driver.cuMemcpyHtoD(p, ctypes.addressof(src), size), "cuMemcpyHtoD")
        ck(driver.cuMemcpyDtoH(ctypes.addressof(buf), p, size), "cuMemcpyDtoH")
    else:
        ck(driver.cuMemsetD8Async(p, v, size, stream), "cuMemsetD8Async")
        ck(driver.cuMemcpyDtoHAsync(ctypes.addressof(buf), p, size, stream), "cuMemcpyDtoHAsync")
        ck(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
        ok1 = buf.raw == bytes([v]) * size
        ck(driver.cuMemcpyHtoDAsync(p, ctypes.addressof(src), size, stream), "cuMemcpyHtoDAsync")
        ck(driver.cuMemcpyDtoHAsync(ctypes.addressof(buf), p, size, stream), "cuMemcpyDtoHAsync")
        ck(driver.cuStreamSynchronize(stream), "cuStreamSynchronize")
    case.check(ok1, "memset of %d bytes did not read back" % size)
    case.check(buf.raw == data, "host data of %d bytes did not round-trip" % size)


def test_mem_alloc():
    sizes = [256, 65536, 1 << 20, (3 << 20) + 7]
    made = 0
    a = case.snap()
    for rnd in range(3):
        for i, size in enumerate(sizes):
            p = ck(driver.cuMemAlloc(size), "cuMemAlloc(%d)" % size)
            made += 1
            roundtrip(p, size, (rnd * 8 + i + 1) & 0xff)
            ck(driver.cuMemFree(p), "cuMemFree")
    b = case.snap()
    case.served("cuda.bindings.driver.cuMemAlloc", a, b, made)
    case.freed("cuda.bindings.driver.cuMemFree", a, b, made)


def test_mem_alloc_async():
    s_blocking = ck(driver.cuStreamCreate(0), "cuStreamCreate(CU_STREAM_DEFAULT)")
    s_nonblocking = ck(driver.cuStreamCreate(1), "cuStreamCreate(CU_STREAM_NON_BLOCKING)")
    streams = [("created blocking stream", s_blocking), ("created non-blocking stream", s_nonblocking),
               ("stream 0", driver.CUstream(0)),
               ("CU_STREAM_PER_THREAD", driver.CUstream(2))]  # the handle value of CU_STREAM_PER_THREAD
    sizes = [512, 200000, 5 << 20]
    made = 0
    a = case.snap()
    for rnd in range(3):
        for k, (name, s) in enumerate(streams):
            for i, size in enumerate(sizes):
                p = ck(driver.cuMemAllocAsync(size, s), "cuMemAllocAsync(%d) on %s" % (size, name))
                made += 1
                roundtrip(p, size, (rnd * 32 + k * 4 + i + 1) & 0xff, s)
                ck(driver.cuMemFreeAsync(p, s), "cuMemFreeAsync on %s" % name)
    ck(driver.cuCtxSynchronize(), "cuCtxSynchronize")
    b = case.snap()
    case.served("cuda.bindings.driver.cuMemAllocAsync" + (" (ptds)" if PTDS else ""), a, b, made)
    case.freed("cuda.bindings.driver.cuMemFreeAsync" + (" (ptds)" if PTDS else ""), a, b, made)
    ck(driver.cuStreamDestroy(s_blocking), "cuStreamDestroy")
    ck(driver.cuStreamDestroy(s_nonblocking), "cuStreamDestroy")


case.run(test_mem_alloc)
case.run(test_mem_alloc_async)
case.finish()
