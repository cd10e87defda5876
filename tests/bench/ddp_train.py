# SPDX-License-Identifier: MIT
"""tests/bench/ddp_train.py - one variant of a data-parallel PyTorch training
loop, one process per GPU under torchrun (DistributedDataParallel over
NCCL): the 6-layer transformer of torch_train.py, batches whose sequence
length changes every step (the same lengths on every rank), NVML's used
memory of each rank's own GPU sampled every 2 ms. Rank 0 prints one line

    TORCH-DDP variant=NAME gpus=G steps=N steps_per_s=X peak_nvml_gib=P0,P1,.. loss=L

(steps/s over the timed steps after 3 warm-up steps, measured between two
barriers; one NVML peak per GPU; the last step's loss averaged over ranks).
How PyTorch allocates comes from the environment the caller (run-ddp.sh)
sets. Exit 77 without torch, NCCL or two GPUs.

    python3 -m torch.distributed.run --standalone --nproc-per-node=2 ddp_train.py NAME [--steps N]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train import nvml_index, nvml_used_sampler  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("name")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("SKIP: torch is not installed")
        return 77
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2 or not dist.is_nccl_available():
        print("SKIP: needs NCCL and two GPUs")
        return 77
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev)
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    d_model, heads, layers, batch = 1024, 16, 6, 16
    layer = torch.nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
    model = torch.nn.Sequential(torch.nn.TransformerEncoder(layer, layers), torch.nn.Linear(d_model, 1)).to(dev)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(args.seed)
    warm = 3
    lengths = [int(x) for x in torch.randint(64, 1024, (args.steps + warm,), generator=g)]
    data_g = torch.Generator(device=dev).manual_seed(args.seed + rank)
    finish = nvml_used_sampler(nvml_index(local))
    loss = None
    t0 = None
    for step, n in enumerate(lengths):
        if step == warm:
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
        x = torch.randn(batch, n, d_model, device=dev, generator=data_g)
        y = torch.randn(batch, n, 1, device=dev, generator=data_g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    dist.barrier()
    dt = time.perf_counter() - t0
    peak = finish()
    lv = loss.detach().clone()
    dist.all_reduce(lv)
    peaks = [None] * world
    dist.all_gather_object(peaks, peak)
    if rank == 0:
        print("TORCH-DDP variant=%s gpus=%d steps=%d steps_per_s=%.3f peak_nvml_gib=%s loss=%.6f"
              % (args.name, world, args.steps, args.steps / dt, ",".join("%.3f" % (p / 2**30) for p in peaks),
                 lv.item() / world), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
