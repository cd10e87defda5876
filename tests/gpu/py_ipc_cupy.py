# SPDX-License-Identifier: MIT
"""tests/gpu/py_ipc_cupy.py - CuPy without its pool (set_allocator(None):
every array a cudaMalloc) shares five small arrays, which lie in one libemm
segment, with another process through cudaIpcGetMemHandle /
cudaIpcOpenMemHandle: the importer (this script again, under libemm) sees
every array's bytes at the pointer it opens, writes one, and the exporter
sees the write. An importer without libemm (LD_PRELOAD unset) gets an error
for a sub-allocated array and the right bytes for a whole-segment one."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import Case, ipc_refused_by_backend, skip  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "export"
case = Case("py-ipc-cupy" if MODE == "export" else "py-ipc-cupy-" + MODE)

try:
    import numpy as np
    import cupy
except ImportError as e:
    skip("cupy is not installed: %s" % e)
try:
    ndev = cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # noqa: BLE001
    skip("no usable CUDA device: %s" % e)
if ndev == 0:
    skip("no CUDA device")

cupy.cuda.set_allocator(None)
cupy.cuda.Device(0).use()
cupy.cuda.runtime.free(0)

SIZES = [1000, 250, 4096, 17, 3000]  # float32 elements each
WHOLE = 3 << 20                      # 12 MiB: a segment of its own
rt = cupy.cuda.runtime


def expected(i, n):
    return (np.arange(n, dtype=np.float32) * (i + 1) + 0.25).astype(np.float32)


def wrap(ptr, n):
    mem = cupy.cuda.UnownedMemory(ptr, n * 4, owner=None)
    return cupy.ndarray((n,), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))


def child(mode, payload, env):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), mode, json.dumps(payload)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)


def read_until(p, tag):
    for line in p.stdout:
        line = line.rstrip("\n")
        if line.startswith(tag):
            return line
        print("  child: " + line, flush=True)
    return None


def importer():
    """Under libemm: open, check, write array 1, close."""
    args = json.loads(sys.argv[2])
    ptrs = []
    for i, (h, n) in enumerate(zip(args["handles"], SIZES)):
        ptr = rt.ipcOpenMemHandle(bytes.fromhex(h))
        ptrs.append(ptr)
        got = cupy.asnumpy(wrap(ptr, n))
        case.check(np.array_equal(got, expected(i, n)), "array %d arrives with wrong bytes" % i)
    for i in range(1, len(ptrs)):
        case.check(ptrs[i] - ptrs[0] == args["offsets"][i] - args["offsets"][0],
                   "array %d lies at %d from array 0, the exporter has %d"
                   % (i, ptrs[i] - ptrs[0], args["offsets"][i] - args["offsets"][0]))
    again = rt.ipcOpenMemHandle(bytes.fromhex(args["handles"][0]))
    case.check(again == ptrs[0], "the same handle opened twice at two pointers")
    rt.ipcCloseMemHandle(again)
    a1 = wrap(ptrs[1], SIZES[1])
    a1 += 1
    cupy.cuda.Device().synchronize()
    del a1
    for ptr in ptrs:
        rt.ipcCloseMemHandle(ptr)
    print("written", flush=True)


def plain():
    """Without libemm: the sub-allocated array's handle fails, the whole
    segment's opens at the right bytes."""
    args = json.loads(sys.argv[2])
    case.check(not case.present(), "libemm is loaded in the importer that should run without it")
    try:
        ptr = rt.ipcOpenMemHandle(bytes.fromhex(args["sub"]))
        case.fail("a libemm handle opened without libemm (at %#x): it must fail" % ptr)
    except cupy.cuda.runtime.CUDARuntimeError as e:
        print("EMM-CONFIRM: cudaIpcOpenMemHandle without libemm answers %s for a libemm handle "
              "(expected cudaErrorInvalidValue)" % e, flush=True)
    ptr = rt.ipcOpenMemHandle(bytes.fromhex(args["whole"]))
    got = cupy.asnumpy(wrap(ptr, WHOLE))
    case.check(np.array_equal(got, expected(7, WHOLE)), "the whole-segment array arrives with wrong bytes")
    rt.ipcCloseMemHandle(ptr)
    print("done", flush=True)


def test_share_with_libemm_importer():
    arrays = [cupy.asarray(expected(i, n)) for i, n in enumerate(SIZES)]
    cupy.cuda.Device().synchronize()
    try:
        handles = [rt.ipcGetMemHandle(a.data.ptr).hex() for a in arrays]
    except Exception as e:
        ipc_refused_by_backend(e)
        raise
    offsets = [a.data.ptr - arrays[0].data.ptr for a in arrays]
    case.check(len(set(handles)) == len(handles), "two arrays got the same handle")
    p = child("import", {"handles": handles, "offsets": offsets}, os.environ.copy())
    line = read_until(p, "written")
    p.stdin.close()
    rc = p.wait()
    case.check(line is not None and rc == 0, "the importer failed (exit %d)" % rc)
    want = expected(1, SIZES[1]) + 1
    case.check(np.array_equal(cupy.asnumpy(arrays[1]), want), "the importer's write is not seen by the exporter")
    del arrays


def test_importer_without_libemm():
    small = [cupy.asarray(expected(i, n)) for i, n in enumerate(SIZES[:2])]
    whole = cupy.asarray(expected(7, WHOLE))
    cupy.cuda.Device().synchronize()
    env = os.environ.copy()
    env.pop("LD_PRELOAD", None)
    try:
        handles = {"sub": rt.ipcGetMemHandle(small[1].data.ptr).hex(),
                   "whole": rt.ipcGetMemHandle(whole.data.ptr).hex()}
    except Exception as e:
        ipc_refused_by_backend(e)
        raise
    p = child("plain", handles, env)
    line = read_until(p, "done")
    p.stdin.close()
    rc = p.wait()
    case.check(line is not None and rc == 0, "the importer without libemm failed (exit %d)" % rc)
    del small, whole


if MODE == "import":
    case.require_emm()
    case.run(importer)
    sys.exit(1 if case.failures else 0)
if MODE == "plain":
    case.run(plain)
    sys.exit(1 if case.failures else 0)
case.require_emm()
case.run(test_share_with_libemm_importer)
case.run(test_importer_without_libemm)
case.finish()
