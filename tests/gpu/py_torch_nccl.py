# SPDX-License-Identifier: MIT
"""tests/gpu/py_torch_nccl.py - NCCL collectives on tensors from libemm, one
process per GPU (issue 14 part 2). Needs torch with NCCL and two or more
GPUs; exits 77 otherwise.

Run plainly (as meson does) it is the launcher: it starts
`python3 -m torch.distributed.run --standalone --nproc-per-node=G` on
itself (G = min(GPUs, 2), or $NCCL_TEST_GPUS) once per variant:

  emm-driver  libemm preloaded in every rank (the LD_PRELOAD the launcher got),
              PYTORCH_NO_CUDA_MEMORY_CACHING=1: every tensor a cudaMalloc
  emm-vmm     the same with EMM_BACKEND=vmm
  torch       no libemm, PyTorch's caching allocator (the reference)

Each rank runs all_reduce (sum, max), all_gather, all_gather_into_tensor,
broadcast (from the last rank), reduce_scatter_tensor and a send/recv ring
on float32, int64 and bfloat16 tensors of 1 to 16 Mi elements, checks every
result against its exact value (integer-valued data: no rounding anywhere)
and prints a digest of all result bytes. The launcher then requires:
each variant's ranks all passed; digests identical across the variants;
under libemm, each rank's own device counted at least the tensors the rank
made (emm_stats_get(rank's device)), the other device's counters did not
move in that process, and NCCL's own buffers (VMM calls with shareable
handles, when NCCL uses them) are reported.
"""
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import Case  # noqa: E402

# NVLink multicast stays off on the shared machines (KINDS.md).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SIZES = (1, 7, 1000, 65537, 1 << 20, 16 << 20)


def worker(out_dir):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    case = Case("torch-nccl-rank%d" % rank)
    emm = case.present()
    before = {d: case.stats(d) for d in range(torch.cuda.device_count())} if emm else None

    # A rank that dies leaves the others in a collective: PyTorch's watchdog
    # ends them after this (its default is 10 minutes, past the test's limit).
    dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=120))
    digest = hashlib.sha256()
    made = 0

    def keep(t):
        digest.update(t.cpu().view(torch.uint8).numpy().tobytes() if t.dtype != torch.bfloat16
                      else t.float().cpu().numpy().tobytes())

    def same(got, want, what):
        ok = torch.equal(got, want)
        if not ok:
            # Read again after the device is idle: data that changed between
            # the two reads (a block reused under in-flight work) shows here.
            torch.cuda.synchronize()
            bad = (got != want).nonzero()
            if bad.shape[0] == 0:
                case.fail("%s: torch.equal was false, and read again no element differs (equal now: %s, "
                          "shapes %s %s, dtypes %s %s): the data changed between the reads"
                          % (what, torch.equal(got, want), tuple(got.shape), tuple(want.shape),
                             got.dtype, want.dtype))
            else:
                case.fail("%s: %d element(s) differ, first at %s: got %s want %s"
                          % (what, bad.shape[0], bad[0].tolist(), got[tuple(bad[0])].item(),
                             want[tuple(bad[0])].item()))
        return ok

    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        # bfloat16 holds integers exactly only up to 256: keep its values small.
        mod = 7 if dtype == torch.bfloat16 else 1000
        for n in SIZES:
            if dtype == torch.bfloat16 and n > (1 << 20):
                continue
            base = (torch.arange(n, device=dev, dtype=torch.int64) % mod).to(dtype)
            made += 1
            what = "%s n=%d" % (str(dtype).replace("torch.", ""), n)

            t = base + (rank + 1)
            made += 2
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
            same(t, base * world + world * (world + 1) // 2, "all_reduce sum " + what)
            keep(t)

            t = base + rank
            made += 2
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            same(t, base + (world - 1), "all_reduce max " + what)
            keep(t)

            mine = base + 3 * rank
            outs = [torch.empty_like(mine) for _ in range(world)]
            made += 2 + world
            dist.all_gather(outs, mine)
            for r, o in enumerate(outs):
                same(o, base + 3 * r, "all_gather[%d] %s" % (r, what))
                keep(o)

            flat = torch.empty(world * n, device=dev, dtype=dtype)
            made += 1
            dist.all_gather_into_tensor(flat, mine)
            for r in range(world):
                same(flat[r * n:(r + 1) * n], base + 3 * r, "all_gather_into_tensor[%d] %s" % (r, what))
            keep(flat)

            src = world - 1
            t = base * 2 if rank == src else torch.zeros_like(base)
            made += 1
            dist.broadcast(t, src=src)
            same(t, base * 2, "broadcast " + what)
            keep(t)

            if n % world == 0:
                full = torch.arange(n, device=dev, dtype=torch.int64).remainder(mod).to(dtype) + rank
                part = torch.empty(n // world, device=dev, dtype=dtype)
                made += 2
                dist.reduce_scatter_tensor(part, full, op=dist.ReduceOp.SUM)
                chunk = (torch.arange(n, device=dev, dtype=torch.int64).remainder(mod).to(dtype))
                chunk = chunk[rank * (n // world):(rank + 1) * (n // world)]
                same(part, chunk * world + world * (world - 1) // 2, "reduce_scatter_tensor " + what)
                keep(part)

            # a ring of point-to-point sends
            send = base + 10 * rank
            recv = torch.empty_like(base)
            made += 2
            ops = [dist.P2POp(dist.isend, send, (rank + 1) % world),
                   dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
            same(recv, base + 10 * ((rank - 1) % world), "send/recv ring " + what)
            keep(recv)
    torch.cuda.synchronize()
    dist.barrier()
    result = {"rank": rank, "device": local, "failures": case.failures, "digest": digest.hexdigest(),
              "made": made, "emm": emm}
    if emm:
        after = {d: case.stats(d) for d in range(torch.cuda.device_count())}
        mine_a = after[local]["allocs"] - before[local]["allocs"]
        result["allocs_own_device"] = mine_a
        result["allocs_other_devices"] = sum(after[d]["allocs"] - before[d]["allocs"]
                                             for d in after if d != local)
        for f in ("hits", "misses", "backend_allocs", "vmm_allocs", "vmm_hits", "vmm_frees",
                  "passthrough_allocs", "reserved_bytes_peak"):
            result[f] = after[local][f] - (0 if f.endswith("_peak") else before[local][f])
        result["process_passthrough_allocs"] = case.stats(-1)["passthrough_allocs"]
        if mine_a < made:
            case.fail("ESCAPE: rank %d made at least %d tensors on cuda:%d, libemm counted %d allocations there"
                      % (rank, made, local, mine_a))
        if result["allocs_other_devices"]:
            case.fail("rank %d (cuda:%d): %d allocation(s) counted on other devices"
                      % (rank, local, result["allocs_other_devices"]))
        result["failures"] = case.failures
    dist.destroy_process_group()
    with open(os.path.join(out_dir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    return 1 if case.failures else 0


def launch():
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("SKIP: torch is not installed")
        return 77
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print("SKIP: no GPU or no NCCL")
        return 77
    ngpu = torch.cuda.device_count()
    want = int(os.environ.get("NCCL_TEST_GPUS", "2"))
    if ngpu < 2:
        print("SKIP: %d GPU(s) here; this test needs 2 or more" % ngpu)
        return 77
    nproc = min(ngpu, want)
    emm_lib = os.environ.get("LD_PRELOAD", "")
    if "libemm" not in emm_lib:
        print("FAIL: the launcher needs LD_PRELOAD naming libemm.so (as meson sets it)")
        return 1
    base_env = {k: v for k, v in os.environ.items()
                if k not in ("LD_PRELOAD", "PYTORCH_NO_CUDA_MEMORY_CACHING", "PYTORCH_CUDA_ALLOC_CONF",
                             "EMM_BACKEND")}
    base_env.update(SAFE_ENV)
    base_env["PYTHONUNBUFFERED"] = "1"
    variants = [
        ("emm-driver", {"LD_PRELOAD": emm_lib, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "EMM_BACKEND": "driver"}),
        ("emm-vmm", {"LD_PRELOAD": emm_lib, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "EMM_BACKEND": "vmm"}),
        ("torch", {}),
    ]
    failures = 0
    digests = {}
    for name, extra in variants:
        with tempfile.TemporaryDirectory() as out:
            env = dict(base_env, **extra)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc-per-node=%d" % nproc, os.path.abspath(__file__), "--worker", out]
            print("== %s: %s" % (name, " ".join("%s=%s" % kv for kv in extra.items()) or "(no libemm)"),
                  flush=True)
            rc = subprocess.call(cmd, env=env, timeout=500)
            ranks = []
            for r in range(nproc):
                try:
                    with open(os.path.join(out, "rank%d.json" % r)) as f:
                        ranks.append(json.load(f))
                except OSError:
                    ranks.append(None)
            for r, res in enumerate(ranks):
                print("   rank %d: %s" % (r, json.dumps(res, sort_keys=True)), flush=True)
                if res is None:
                    print("FAIL: %s: rank %d wrote no result (torchrun exit %d)" % (name, r, rc))
                    failures += 1
                elif res["failures"]:
                    print("FAIL: %s: rank %d had %d failure(s)" % (name, r, res["failures"]))
                    failures += 1
                elif extra and not res["emm"]:
                    print("FAIL: %s: rank %d did not have libemm loaded" % (name, r))
                    failures += 1
                else:
                    digests.setdefault(r, {})[name] = res["digest"]
            if rc != 0:
                print("FAIL: %s: torchrun exited %d" % (name, rc))
                failures += 1
    for r, by_variant in sorted(digests.items()):
        if len(set(by_variant.values())) != 1:
            print("FAIL: rank %d: result digests differ between variants: %s" % (r, by_variant))
            failures += 1
    print("torch-nccl: %d rank(s), %d variant(s), %s" % (nproc, len(variants),
                                                         "FAILED" if failures else "all results identical"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2]))
    sys.exit(launch())
