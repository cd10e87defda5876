# SPDX-License-Identifier: MIT
"""tests/gpu/py_ipc_torch.py [nocache|caching] - PyTorch shares several small
CUDA tensors with a torch.multiprocessing child (spawn; libemm preloaded in
both): the child checks every tensor's values, adds 1 to one of them in
place, and the parent sees the change.

  nocache  PYTORCH_NO_CUDA_MEMORY_CACHING=1: each tensor is a cudaMalloc of
           its own, a block inside one libemm segment. PyTorch 2.11 cannot
           share such tensors at all (its uncached allocator keeps no
           blocks: "invalid device pointer", without libemm too, which the
           test checks and then reports as a skip).
  caching  PyTorch's caching allocator: its 2 MiB segment is a libemm block
           inside a 20 MiB libemm segment; PyTorch exports that block's
           handle and sends each tensor's offset in it.

The test's own _share_cuda_() calls (to look inside PyTorch's handles) send
blocks that no consumer ever opens, so PyTorch still holds them in its IPC
limbo at the producer's exit ("Producer process has been terminated before
all shared CUDA tensors released") and destroys them in its static
destructors. The producer then sometimes dies of SIGSEGV after the test has
passed: in two GPU-suite runs on two GPUs (tests/bench/RESULTS.md section
36) and in one of the two with a normal exit since (section 37: I3 none,
I5 one), never in 13 runs alone. Loaded
into the producer, tests/gpu/crash_trace.c's module (CRASH_TRACE_LIB, set
by meson) printed the frames in I5: libc's exit handlers -> libtorch_cuda's
static destructor -> c10::cuda::ExchangeDevice ->
c10_cuda_check_implementation -> CUDAKernelLaunchRegistry::has_failed,
reading address 0: PyTorch's limbo uses a singleton already destroyed
(static destruction order), no libemm frame on the stack (PyTorch issue
51619 reports a shutdown crash in this limbo). So the producer leaves
with os._exit once its result is printed, skipping those destructors;
the tracer stays loaded for a crash anywhere before."""
import ctypes
import faulthandler
import os
import sys

if os.environ.get("CRASH_TRACE_LIB"):
    ctypes.CDLL(os.environ["CRASH_TRACE_LIB"])

MODE = sys.argv[1] if len(sys.argv) > 1 else "nocache"
if MODE == "nocache":
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
else:
    os.environ.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = [1, 1000, 250, 4096, 17, 3000]
MAGIC = b"libemm-ipc-blk1"


def expected(torch, i, n):
    return torch.arange(n, dtype=torch.float32) * (i + 1) + 0.25


def consumer(q, r):
    import torch
    libemm = hasattr(ctypes.CDLL(None), "emm_stats_get")
    ts = q.get()
    bad = []
    for i, t in enumerate(ts):
        if not torch.equal(t.cpu(), expected(torch, i, SIZES[i])):
            bad.append("tensor %d (%d elements) arrived with wrong values" % (i, SIZES[i]))
    ts[1].add_(1)
    torch.cuda.synchronize()
    r.put((libemm, bad))
    del ts, t


def without_libemm_refuses_too(err):
    """PyTorch's own uncached allocator keeps no blocks, so its
    _share_cuda_ has nothing to look the pointer up in: the same call
    without libemm must fail the same way, and then the case is PyTorch's
    limit, not libemm's (a skip)."""
    import subprocess
    from emmstats import Skip
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    prog = ("import torch; t = torch.ones(10, device='cuda:0'); "
            "t.untyped_storage()._share_cuda_()")
    p = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0 and "invalid device pointer" in p.stderr:
        raise Skip("PyTorch with PYTORCH_NO_CUDA_MEMORY_CACHING=1 cannot share CUDA tensors, without libemm "
                   "too (its uncached allocator keeps no blocks: %s)" % err)


def main():
    from emmstats import Case, import_torch, ipc_refused_by_backend
    case = Case("py-ipc-torch-" + MODE)
    torch = import_torch()
    import torch.multiprocessing as mp
    dev = torch.device("cuda:0")
    torch.zeros(1, device=dev)
    case.require_emm()

    def test_share_tensors():
        ts = [expected(torch, i, n).to(dev) for i, n in enumerate(SIZES)]
        torch.cuda.synchronize()
        # What PyTorch sends for each: the handle of the cudaMalloc'd block
        # the storage lies in. Every one is a block inside a libemm segment.
        for i, t in enumerate(ts):
            try:
                handle = t.untyped_storage()._share_cuda_()[1]
            except Exception as e:
                if MODE == "nocache" and "invalid device pointer" in str(e):
                    without_libemm_refuses_too(e)
                ipc_refused_by_backend(e)
                raise
            # PyTorch prefixes the IPC handle with its own type byte(s).
            case.check(MAGIC in bytes(handle),
                       "tensor %d: PyTorch's handle holds no libemm block handle" % i)
        ctx = mp.get_context("spawn")
        q, r = ctx.Queue(), ctx.Queue()
        p = ctx.Process(target=consumer, args=(q, r))
        p.start()
        q.put(ts)
        libemm, bad = r.get(timeout=240)
        p.join(timeout=120)
        case.check(p.exitcode == 0, "the consumer exited with %s" % p.exitcode)
        case.check(libemm, "libemm is not loaded in the consumer")
        for msg in bad:
            case.fail(msg)
        case.check(torch.equal(ts[1].cpu(), expected(torch, 1, SIZES[1]) + 1),
                   "the consumer's in-place add is not seen by the producer")
        for i in (0, 2, 3, 4, 5):
            case.check(torch.equal(ts[i].cpu(), expected(torch, i, SIZES[i])),
                       "tensor %d changed in the producer" % i)
        del ts

    faulthandler.enable()
    case.run(test_share_tensors)
    try:
        case.finish()
    except SystemExit as e:
        os._exit(e.code if isinstance(e.code, int) else 1)


if __name__ == "__main__":
    main()
