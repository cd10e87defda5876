# SPDX-License-Identifier: MIT
"""tests/gpu/py_ctypes.py - Python ctypes straight into the driver:
ctypes.CDLL("libcuda.so.1").cuMemAlloc_v2 is a dlsym on libcuda's handle,
which libemm answers with its own shim. cuInit, primary context, then
cuMemAlloc_v2 / cuMemFree_v2 over several sizes, data written with a memset
and a host copy and read back, every allocation served by the pool."""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import DEVICE, Case, in_libemm, skip, where  # noqa: E402

case = Case("py-ctypes")

try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    skip("cannot load libcuda.so.1: %s" % e)

c_ptr = ctypes.c_uint64  # CUdeviceptr
cuda.cuInit.argtypes = [ctypes.c_uint]
cuda.cuDeviceGetCount.argtypes = [ctypes.POINTER(ctypes.c_int)]
cuda.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
cuda.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
cuda.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
cuda.cuCtxSynchronize.argtypes = []
mem_alloc = cuda.cuMemAlloc_v2
mem_alloc.argtypes = [ctypes.POINTER(c_ptr), ctypes.c_size_t]
mem_free = cuda.cuMemFree_v2
mem_free.argtypes = [c_ptr]
memset_d8 = cuda.cuMemsetD8_v2
memset_d8.argtypes = [c_ptr, ctypes.c_ubyte, ctypes.c_size_t]
htod = cuda.cuMemcpyHtoD_v2
htod.argtypes = [c_ptr, ctypes.c_void_p, ctypes.c_size_t]
dtoh = cuda.cuMemcpyDtoH_v2
dtoh.argtypes = [ctypes.c_void_p, c_ptr, ctypes.c_size_t]
for f in (cuda.cuInit, cuda.cuDeviceGetCount, cuda.cuDeviceGet, cuda.cuDevicePrimaryCtxRetain,
          cuda.cuCtxSetCurrent, cuda.cuCtxSynchronize, mem_alloc, mem_free, memset_d8, htod, dtoh):
    f.restype = ctypes.c_int

count = ctypes.c_int(0)
r = cuda.cuInit(0)
if r == 0:
    r = cuda.cuDeviceGetCount(ctypes.byref(count))
if r != 0 or count.value == 0:
    skip("no usable CUDA device (cuInit/cuDeviceGetCount: %d, %d devices)" % (r, count.value))

dev = ctypes.c_int(0)
ctx = ctypes.c_void_p()
if cuda.cuDeviceGet(ctypes.byref(dev), 0) or cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) \
        or cuda.cuCtxSetCurrent(ctx):
    case.fail("cannot make device 0's primary context current")
    case.finish()
case.require_emm()


def ck(r, what):
    if r != 0:
        raise RuntimeError("%s -> CUresult %d" % (what, r))


def test_symbols_are_libemms():
    for name in ("cuMemAlloc_v2", "cuMemFree_v2"):
        fn = getattr(cuda, name)
        fname, sname = where(fn)
        print("  ctypes.CDLL('libcuda.so.1').%s -> %s in %s" % (name, sname, fname))
        case.check(in_libemm(fn), "ESCAPE: ctypes.CDLL('libcuda.so.1').%s is the driver's own function (%s)"
                   % (name, fname))


def test_alloc_free():
    sizes = [256, 4096, 1 << 20, (5 << 20) + 3]
    made = 0
    a = case.snap()
    for rnd in range(3):
        for i, size in enumerate(sizes):
            p = c_ptr(0)
            ck(mem_alloc(ctypes.byref(p), size), "cuMemAlloc_v2(%d)" % size)
            made += 1
            buf = ctypes.create_string_buffer(size)
            v = (rnd * 16 + i + 1) & 0xff
            ck(memset_d8(p, v, size), "cuMemsetD8_v2")
            ck(dtoh(buf, p, size), "cuMemcpyDtoH_v2")
            case.check(buf.raw == bytes([v]) * size, "cuMemsetD8 of %d bytes did not read back" % size)
            data = os.urandom(size)
            src = ctypes.create_string_buffer(data, size)
            ck(htod(p, src, size), "cuMemcpyHtoD_v2")
            ck(dtoh(buf, p, size), "cuMemcpyDtoH_v2")
            case.check(buf.raw == data, "host data of %d bytes did not round-trip" % size)
            ck(mem_free(p), "cuMemFree_v2")
    ck(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
    b = case.snap()
    case.served("ctypes cuMemAlloc_v2", a, b, made)
    case.freed("ctypes cuMemFree_v2", a, b, made)


case.run(test_symbols_are_libemms)
case.run(test_alloc_free)
case.finish()
