# SPDX-License-Identifier: MIT
"""tests/gpu/py_torch.py - PyTorch with its caching allocator off
(PYTORCH_NO_CUDA_MEMORY_CACHING=1): every tensor is a cudaMalloc/cudaFree of
PyTorch's shared cudart; a matmul brings in cuBLAS (its own static cudart,
its workspace); the backward pass of a small MLP allocates gradients and
temporaries. Results are compared with the same computation on the CPU, and
libemm's counters must show the pool served at least the allocations the
test can account for. PyTorch and cuBLAS may make calls of their own that
libemm passes through; those are printed, not failed."""
import copy
import os
import sys

os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import PINNED, Case, import_torch  # noqa: E402

case = Case("py-torch")

torch = import_torch()

if os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING") != "1":
    case.fail("PYTORCH_NO_CUDA_MEMORY_CACHING is not 1: PyTorch's own cache would hide the allocations")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda:0")
torch.zeros(1, device=dev)
torch.cuda.synchronize()
case.require_emm()
print("torch %s, CUDA %s" % (torch.__version__, torch.version.cuda), flush=True)


def test_tensors():
    sizes = [1, 1000, 1 << 16, 1 << 20, (3 << 20) + 11]
    a = case.snap()
    ts = []
    for i, n in enumerate(sizes):
        t = torch.empty(n, device=dev, dtype=torch.float32)
        t.fill_(i + 0.5)
        ts.append(t)
    torch.cuda.synchronize()
    b = case.snap()
    case.served("torch.empty on cuda (no caching: cudaMalloc)", a, b, len(sizes), strict_passthrough=False)
    for i, t in enumerate(ts):
        case.check(bool((t.cpu() == i + 0.5).all()), "tensor %d (%d elements) has wrong contents" % (i, t.numel()))
    del ts, t
    torch.cuda.synchronize()
    c = case.snap()
    case.freed("tensor deallocation (no caching: cudaFree)", b, c, len(sizes))


def test_matmul():
    g = torch.Generator().manual_seed(1)
    A = torch.randn(256, 512, generator=g)
    B = torch.randn(512, 128, generator=g)
    a = case.snap()
    Ad, Bd = A.to(dev), B.to(dev)
    Cd = Ad @ Bd  # cuBLAS: handle, workspace, the result
    torch.cuda.synchronize()
    b = case.snap()
    case.served("tensors + torch.matmul (cuBLAS)", a, b, 3, strict_passthrough=False)
    C = A @ B
    err = (Cd.cpu() - C).abs().max().item()
    case.check(torch.allclose(Cd.cpu(), C, rtol=1e-4, atol=1e-3), "GPU matmul differs from CPU by %g" % err)
    print("  matmul max abs difference GPU vs CPU: %g" % err, flush=True)


def test_mlp_backward():
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    x = torch.randn(32, 64)
    y = torch.randn(32, 10)
    loss_cpu = torch.nn.functional.mse_loss(cpu_model(x), y)
    loss_cpu.backward()

    a = case.snap()
    gpu_model = copy.deepcopy(cpu_model).to(dev)
    gpu_model.zero_grad(set_to_none=True)
    loss_gpu = torch.nn.functional.mse_loss(gpu_model(x.to(dev)), y.to(dev))
    loss_gpu.backward()
    torch.cuda.synchronize()
    b = case.snap()
    # 4 parameters, 2 inputs, 4 gradients at least.
    case.served("MLP forward + backward", a, b, 10, strict_passthrough=False)
    case.check(abs(loss_gpu.item() - loss_cpu.item()) <= 1e-5 * max(1.0, abs(loss_cpu.item())),
               "loss differs: GPU %r, CPU %r" % (loss_gpu.item(), loss_cpu.item()))
    for (name, pc), pg in zip(cpu_model.named_parameters(), gpu_model.parameters()):
        case.check(pg.grad is not None and torch.allclose(pg.grad.cpu(), pc.grad, rtol=1e-4, atol=1e-5),
                   "gradient of %s differs from the CPU's" % name)


def test_pinned():
    n = 1 << 20
    a = case.snap()
    p = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    b = case.snap()
    case.served("torch pin_memory=True (cudaHostAlloc)", a, b, 1, scope=PINNED, strict_passthrough=False)
    p.copy_(torch.arange(n, dtype=torch.int64).to(torch.uint8))
    d = torch.empty(n, dtype=torch.uint8, device=dev)
    d.copy_(p, non_blocking=True)
    back = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    back.copy_(d, non_blocking=True)
    torch.cuda.synchronize()
    case.check(torch.equal(back, p), "pinned round trip differs")


case.run(test_tensors)
case.run(test_matmul)
case.run(test_mlp_backward)
case.run(test_pinned)
print("  torch.cuda.memory_reserved: %d, memory_allocated: %d"
      % (torch.cuda.memory_reserved(), torch.cuda.memory_allocated()), flush=True)
case.finish()
