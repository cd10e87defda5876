#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/race/torch_graph.py - PyTorch CUDA graphs on libemm with PyTorch's
caching allocator switched off (PYTORCH_NO_CUDA_MEMORY_CACHING=1).

Captures a small MLP forward with torch.cuda.graph, then replays it 20 times
with fresh inputs copied into the static input. Between replays it allocates
tensors of the temporaries' sizes and fills them with a sentinel: the
captured kernels still write the temporaries freed during capture, so if
libemm handed those blocks out again the sentinels (or the output) change.
Each replay's output must match eager execution.

PyTorch's uncached allocator calls cudaMalloc/cudaFree directly during the
capture; on the real driver a global-mode capture forbids that, but libemm
serves them (a pool miss reaches the driver in relaxed mode, frees are held
for the graph), so under libemm with caching off a refused capture is a
failure. Without libemm (or with PyTorch's caching on) a refusal is PyTorch's
or the driver's: printed, and the test exits 77 (skip).

The replays' outputs are also compared with those of the same capture made
with PyTorch's own caching allocator, in a child process without libemm
(LD_PRELOAD and PYTORCH_NO_CUDA_MEMORY_CACHING removed) fed the same inputs:
the graph must give the same results as under PyTorch's own allocator.

Usage: LD_PRELOAD=libemm.so PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
           python3 torch_graph.py [--capture-error-mode global|thread_local|relaxed]
                                  [--replays N] [--allow-no-emm] [--no-reference]
       (--reference-out PATH: the child's mode, writes its replays' outputs)
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile

SKIP = 77


class EmmStats(ctypes.Structure):
    # include/emm/emm.h, struct emm_stats (EMM_STATS_VERSION 1)
    _fields_ = [("struct_size", ctypes.c_uint32), ("version", ctypes.c_uint32)] + [
        (name, ctypes.c_uint64)
        for name in (
            "allocs frees hits misses passthrough_allocs passthrough_frees bad_frees "
            "backend_allocs backend_frees oom_retries ooms splits merges "
            "events_recorded event_queries stream_waits host_waits epochs_closed "
            "allocated_bytes allocated_bytes_peak allocated_bytes_total "
            "requested_bytes requested_bytes_peak requested_bytes_total "
            "reserved_bytes reserved_bytes_peak reserved_bytes_total "
            "pending_bytes segments live_blocks"
        ).split()
    ]


def emm_stats_fn():
    try:
        fn = ctypes.CDLL(None).emm_stats_get
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(EmmStats)]
    fn.restype = ctypes.c_int
    return fn


def emm_stats(fn, device=0):
    s = EmmStats()
    if fn is None:
        return s
    s.struct_size = ctypes.sizeof(EmmStats)
    rc = fn(device, ctypes.byref(s))
    if rc != 0:
        print(f"FAIL: emm_stats_get({device}) -> {rc}")
        sys.exit(1)
    return s


COUNTERS = ("allocs frees hits misses passthrough_allocs passthrough_frees bad_frees "
            "events_recorded event_queries stream_waits host_waits epochs_closed "
            "pending_bytes live_blocks segments").split()


def print_stats(label, fn, a, b=None):
    if fn is None:
        print(f"emm counters [{label}]: libemm not loaded")
        return
    level = {"pending_bytes", "live_blocks", "segments"}
    parts = []
    for k in COUNTERS:
        v = getattr(a, k) if b is None or k in level else getattr(a, k) - getattr(b, k)
        parts.append(f"{k}={v}")
    print(f"emm counters [{label}]: " + " ".join(parts), flush=True)


def compare_with_reference(torch, args, outputs):
    """The same capture and replays with PyTorch's own caching allocator, in
    a child without libemm: its outputs must match ours. 0, or 1."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.pop("PYTORCH_NO_CUDA_MEMORY_CACHING", None)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "reference.pt")
        cmd = [sys.executable, os.path.abspath(__file__), "--capture-error-mode", args.capture_error_mode,
               "--replays", str(args.replays), "--reference-out", path]
        child = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=240)
        if child.returncode != 0 or not os.path.exists(path):
            print(f"FAIL: the reference run with PyTorch's own allocator failed (exit {child.returncode}):")
            print(child.stdout)
            return 1
        ref = torch.load(path)
    if ref.shape != outputs.shape:
        print(f"FAIL: reference outputs {tuple(ref.shape)}, ours {tuple(outputs.shape)}")
        return 1
    diff = (ref - outputs).abs().max().item()
    same = torch.allclose(ref, outputs, rtol=1e-4, atol=1e-4)
    print(f"graph replays against PyTorch's own allocator (capture_error_mode={args.capture_error_mode}): "
          f"max abs diff {diff:g}")
    if not same:
        print("FAIL: the graph's replays differ from those under PyTorch's own caching allocator")
        return 1
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--capture-error-mode", default="global", choices=["global", "thread_local", "relaxed"])
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--allow-no-emm", action="store_true")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--reference-out", default=None)
    args = ap.parse_args()
    if args.reference_out:
        args.allow_no_emm = True

    try:
        import torch
    except Exception as e:  # noqa: BLE001 - any import failure is a skip
        print(f"SKIP: cannot import torch: {e!r}")
        return SKIP
    if not torch.cuda.is_available():
        print("SKIP: torch.cuda.is_available() is False")
        return SKIP

    fn = emm_stats_fn()
    if fn is None and not args.allow_no_emm:
        print("FAIL: libemm is not loaded (emm_stats_get not found): run with LD_PRELOAD=<build>/libemm.so")
        return 1
    caching_off = os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0")
    emm_active = fn is not None and os.environ.get("EMM_DISABLE", "").lower() not in ("1", "true", "yes", "on")
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device {torch.cuda.get_device_name(0)}; "
          f"PYTORCH_NO_CUDA_MEMORY_CACHING={'1' if caching_off else 'unset'}; "
          f"EMM_FREE_MODE={os.environ.get('EMM_FREE_MODE', 'fence(default)')}; "
          f"capture_error_mode={args.capture_error_mode}", flush=True)

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda", 0)
    batch, d_in, d_hid, d_out = 64, 256, 1024, 128
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, d_hid), torch.nn.GELU(),
        torch.nn.Linear(d_hid, d_hid), torch.nn.GELU(),
        torch.nn.Linear(d_hid, d_out),
    ).to(dev).eval()
    static_x = torch.randn(batch, d_in, device=dev)

    s0 = emm_stats(fn)
    # Warm up on a side stream (as the PyTorch documentation asks), so that
    # lazy initialisation (cuBLAS handles, workspaces) happens before capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    g = torch.cuda.CUDAGraph()
    c0 = emm_stats(fn)
    try:
        with torch.no_grad(), torch.cuda.graph(g, capture_error_mode=args.capture_error_mode):
            static_y = model(static_x)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - report whatever PyTorch raised
        verdict = "FAIL" if emm_active and caching_off else "SKIP"
        print(f"{verdict}: PyTorch refused CUDA graph capture (capture_error_mode={args.capture_error_mode}) "
              f"with PYTORCH_NO_CUDA_MEMORY_CACHING={'1' if caching_off else 'unset'}"
              f"{' under libemm, which must serve it' if verdict == 'FAIL' else ''}:")
        print(f"  {type(e).__name__}: {e}")
        print_stats("device 0, during the capture attempt", fn, emm_stats(fn), c0)
        return 1 if verdict == "FAIL" else SKIP
    c1 = emm_stats(fn)
    print_stats("device 0, during the capture", fn, c1, c0)

    bad = 0
    sentinel_hits = 0
    outputs = []
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)  # the same inputs in the reference child
    for r in range(args.replays):
        x = torch.randn(batch, d_in, device=dev, generator=gen)
        static_x.copy_(x)
        # New owners of memory the size of the captured temporaries.
        junk = [torch.full((batch, d_hid), 7.0, device=dev) for _ in range(8)]
        junk += [torch.full((batch, d_out), 7.0, device=dev) for _ in range(4)]
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        outputs.append(static_y.detach().clone().cpu())
        with torch.no_grad():
            ref = model(x)
        if not torch.allclose(static_y, ref, rtol=1e-4, atol=1e-4):
            bad += 1
            if bad <= 3:
                err = (static_y - ref).abs().max().item()
                print(f"replay {r}: graph output differs from eager (max abs diff {err:g})")
        for j, t in enumerate(junk):
            if not bool((t == 7.0).all()):
                sentinel_hits += 1
                if sentinel_hits <= 3:
                    print(f"replay {r}: tensor allocated after capture (#{j}, {tuple(t.shape)}) was "
                          f"overwritten by the graph replay")
        del junk
    torch.cuda.synchronize()
    s1 = emm_stats(fn)
    print(f"{args.replays} replays: {bad} wrong outputs, {sentinel_hits} overwritten tensors")
    print_stats("device 0, whole test", fn, s1, s0)
    if args.reference_out:
        torch.save(torch.stack(outputs), args.reference_out)
        return 1 if bad or sentinel_hits else 0

    rc = 0
    if bad or sentinel_hits:
        print("FAIL: CUDA graph replay under libemm gave wrong results")
        rc = 1
    if not args.no_reference:
        rc |= compare_with_reference(torch, args, torch.stack(outputs))
    if emm_active and caching_off and s1.allocs - s0.allocs < args.replays:
        print(f"FAIL: libemm served only {s1.allocs - s0.allocs} allocations: PyTorch's allocations did "
              "not go through the pool")
        rc = 1
    if rc == 0:
        print("ok")
    return rc


if __name__ == "__main__":
    sys.exit(main())
