# SPDX-License-Identifier: MIT
"""tests/bench/torch_train.py - one variant of a fragmentation-heavy PyTorch
training loop: a 6-layer transformer encoder trained on batches whose
sequence length changes every step (so tensor sizes keep changing), with
NVML's used device memory sampled by a thread every 2 ms. Prints one line

    TORCH-TRAIN variant=NAME steps=N steps_per_s=X peak_nvml_gib=Y loss=L
        peak_nvml_mib=P base_nvml_mib=B pool_peak_mib=R

(`loss` is the last step's loss, for comparing variants' results; B is
NVML's used memory as the loop starts, model and context in place, and R
the allocator's own peak of reserved memory: PyTorch's
max_memory_reserved, or libemm's reserved_bytes_peak under the preload or
the door, python/ on PYTHONPATH). The
variant (how PyTorch allocates) is chosen by the caller's environment:
PYTORCH_NO_CUDA_MEMORY_CACHING=1 (every tensor a cudaMalloc, served by
libemm when it is preloaded), PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
or neither (PyTorch's caching allocator); with --door (or TORCH_TRAIN_DOOR=1)
libemm is PyTorch's allocator through the Python package without the
preload (emm.torch.use(): CUDAPluggableAllocator over emm_alloc/emm_free;
python/ on PYTHONPATH, LIBEMM_PATH naming libemm.so), and the line ends with
emm_allocs=N (allocations libemm served). tests/bench/run-torch-train.sh
runs the variants interleaved.

    torch_train.py NAME [--steps N] [--seed S] [--door]
Exit 77 without torch or a GPU.
"""
import argparse
import ctypes
import os
import sys
import threading
import time


def nvml_index(ordinal=0):
    """NVML's index of CUDA device `ordinal`: NVML numbers every GPU of the
    host by PCI bus, CUDA's default order is the same unless
    CUDA_VISIBLE_DEVICES renumbers them (its entry, when a number)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        try:
            return int(vis.split(",")[ordinal])
        except (ValueError, IndexError):
            pass
    return ordinal


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_reader(index=None):
    """A function giving NVML's used bytes of GPU `index` (cuda:0's by default), 0 on failure."""
    if index is None:
        index = nvml_index()
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    lib.nvmlInit_v2()
    handle = ctypes.c_void_p()
    lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
    m = NvmlMemory()

    def used():
        return m.used if lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(m)) == 0 else 0

    return used


def nvml_used_sampler(index=None):
    """Sample NVML's used memory of GPU `index` (cuda:0's by default) every
    2 ms from a thread; returns finish(), which stops it and gives the peak
    used bytes."""
    used = nvml_reader(index)
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], used())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()

    def finish():
        stop.set()
        t.join()
        return peak[0]

    return finish


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--door", action="store_true", default=os.environ.get("TORCH_TRAIN_DOOR") == "1")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("SKIP: torch is not installed")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: no GPU")
        return 77
    if args.door:
        import emm.torch
        emm.torch.use()  # before the first CUDA allocation
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda:0")
    d_model, heads, layers, batch = 1024, 16, 6, 16
    layer = torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers).to(dev)
    head = torch.nn.Linear(d_model, 1).to(dev)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
    g = torch.Generator().manual_seed(args.seed)
    lengths = [int(x) for x in torch.randint(64, 1024, (args.steps,), generator=g)]
    torch.cuda.synchronize()
    base = nvml_reader()()
    finish = nvml_used_sampler()
    t0 = time.perf_counter()
    loss_v = float("nan")
    for step, n in enumerate(lengths):
        x = torch.randn(batch, n, d_model, device=dev)
        y = torch.randn(batch, n, 1, device=dev)
        out = head(model(x))
        loss = torch.nn.functional.mse_loss(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == len(lengths) - 1:
            loss_v = loss.item()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = finish()
    served = ""
    pool_peak = torch.cuda.max_memory_reserved(dev)
    if args.door or os.environ.get("LD_PRELOAD"):
        import emm
        st = emm.stats(0)
        if args.door:
            served = " emm_allocs=%d" % st["allocs"]
        pool_peak = st["reserved_bytes_peak"]
    print("TORCH-TRAIN variant=%s steps=%d steps_per_s=%.3f peak_nvml_gib=%.3f loss=%.6f%s"
          " peak_nvml_mib=%.1f base_nvml_mib=%.1f pool_peak_mib=%.1f"
          % (args.name, len(lengths), len(lengths) / dt, peak / 2**30, loss_v, served,
             peak / 2**20, base / 2**20, pool_peak / 2**20), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
