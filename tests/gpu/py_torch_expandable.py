# SPDX-License-Identifier: MIT
"""tests/gpu/py_torch_expandable.py - PyTorch with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True under libemm: its segments
are one large reservation grown with cuMemCreate + cuMemMap of 2 MiB (or
20 MiB) pages and shrunk with cuMemUnmap + cuMemRelease keeping the range -
never a whole-buffer free, so libemm must pass every such call through and
give the memory back when PyTorch does. Checks: a training loop's losses
are bit-identical to the same run without libemm (the script runs itself
again with LD_PRELOAD removed), and torch.cuda.empty_cache() still lowers
NVML's used memory by what PyTorch released. Exits 77 without torch or a GPU.
"""
import ctypes
import hashlib
import os
import subprocess
import sys
import time

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import PROCESS, Case, skip  # noqa: E402


class NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_used_fn(torch):
    """A function giving NVML's used bytes of cuda:0, or None."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    # NVML numbers the host's GPUs, CUDA those in CUDA_VISIBLE_DEVICES: find
    # cuda:0 by its UUID (a suite run with CUDA_VISIBLE_DEVICES=1 once read
    # GPU 0's memory here: 615 MiB before and after empty_cache).
    dev = ctypes.c_void_p()
    try:
        uuid = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
    except (AttributeError, RuntimeError):
        uuid = None
    if uuid is not None:
        if nvml.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(dev)) != 0:
            return None
    elif os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return None
    elif nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(dev)) != 0:
        return None

    def used():
        m = NvmlMemory()
        nvml.nvmlDeviceGetMemoryInfo(dev, ctypes.byref(m))
        return m.used
    return used


def train(torch, steps=60):
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda:0")
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for i in range(steps):
        n = (64, 256, 128, 512)[i % 4]
        g = torch.Generator(device="cpu").manual_seed(i)
        x = torch.randn(n, 512, generator=g).to(dev)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    h = hashlib.sha256(torch.stack(losses).cpu().numpy().tobytes())
    for p in model.parameters():
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    try:
        import torch
    except ImportError as e:
        skip("torch is not installed: %s" % e)
    if not torch.cuda.is_available():
        skip("torch finds no usable GPU")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    if "--child" in sys.argv:
        print("digest %s" % train(torch), flush=True)
        return 0
    case = Case("py-torch-expandable")
    case.require_emm()
    digest = train(torch)
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ref = [l.split()[1] for l in out.stdout.splitlines() if l.startswith("digest ")]
    print("digest with libemm %s, without %s" % (digest, ref[0] if ref else "?"), flush=True)
    if case.check(out.returncode == 0 and ref, "the run without libemm failed:\n" + out.stdout[-3000:]):
        case.check(ref[0] == digest, "results differ from the run without libemm")

    used = nvml_used_fn(torch)
    if used is None:
        case.skip_part("NVML unusable: empty_cache not measured")
    else:
        big = torch.empty(1 << 30, dtype=torch.uint8, device="cuda:0")  # 1 GiB
        big.fill_(1)
        torch.cuda.synchronize()
        u0 = used()
        del big
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        for _ in range(50):
            if used() + (768 << 20) <= u0:
                break
            time.sleep(0.01)
        u1 = used()
        print("empty_cache: NVML used %d MiB -> %d MiB" % (u0 >> 20, u1 >> 20), flush=True)
        case.check(u1 + (768 << 20) <= u0, "torch.cuda.empty_cache() did not lower NVML's used memory "
                                           "(%d MiB -> %d MiB)" % (u0 >> 20, u1 >> 20))
    s = case.stats(PROCESS)
    print("libemm: VMM allocations %d (cache %d), frees %d, deferrals made real %d"
          % (s["vmm_allocs"], s["vmm_hits"], s["vmm_frees"], s["vmm_materializations"]), flush=True)
    case.check(s["vmm_allocs"] > 0, "ESCAPE: PyTorch's expandable segments made no VMM allocation libemm saw")
    case.finish()


if __name__ == "__main__":
    sys.exit(main())
