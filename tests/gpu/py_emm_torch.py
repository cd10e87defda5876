# SPDX-License-Identifier: MIT
"""tests/gpu/py_emm_torch.py - PyTorch with libemm as its allocator through
the package, without LD_PRELOAD (emm.torch.use(): CUDAPluggableAllocator over
emm_alloc/emm_free, stream-ordered): a small transformer trained for 40 steps
with sequence lengths changing every step and part of each step on a side
stream, once under emm.torch.use() and once under PyTorch's own caching
allocator, each in a child process, alternating 3 times. The losses must be
bit-identical across all runs, and libemm's counters must show it served the
emm runs (and nothing passed to the driver unchanged).

    py_emm_torch.py                  the test (runs the children)
    py_emm_torch.py --child emm|torch   one run: prints LOSSES and STATS lines
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
here = os.path.dirname(os.path.abspath(__file__))


def child(variant):
    import emmpkg  # noqa: F401 - python/ on sys.path
    import torch
    if variant == "emm":
        import emm
        import emm.torch
        emm.torch.use()
    torch.manual_seed(7)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.enable_flash_sdp(False)  # the math attention: deterministic
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    dev = torch.device("cuda:0")
    d = 256
    layer = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 3).to(dev)
    head = torch.nn.Linear(d, 1).to(dev)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-3)
    g = torch.Generator().manual_seed(7)
    side = torch.cuda.Stream()
    losses = []
    for step in range(40):
        n = int(torch.randint(16, 300, (1,), generator=g))
        x = torch.randn(8, n, d, generator=g).to(dev)
        y = torch.randn(8, n, 1, generator=g).to(dev)
        # A regulariser computed on a side stream, joined back on the main one.
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            reg = sum((p.float() ** 2).sum() for p in head.parameters()) * 1e-4
        torch.cuda.current_stream().wait_stream(side)
        out = head(model(x))
        loss = torch.nn.functional.mse_loss(out, y) + reg
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # a host sync every step: no tensor outlives its stream's work
        del reg
    torch.cuda.synchronize()
    print("LOSSES " + json.dumps(losses), flush=True)
    if variant == "emm":
        # What the pluggable interface carries in this PyTorch (printed for the README).
        for what, fn in (("memory_allocated", lambda: torch.cuda.memory_allocated()),
                         ("memory_stats", lambda: torch.cuda.memory_stats()),
                         ("empty_cache", lambda: torch.cuda.empty_cache()),
                         ("record_stream", lambda: torch.ones(4, device=dev).record_stream(side))):
            try:
                fn()
                print("PLUGGABLE %s: works" % what, file=sys.stderr)
            except Exception as e:  # noqa: BLE001 - reported, not a failure
                print("PLUGGABLE %s: %s" % (what, str(e).splitlines()[0][:120]), file=sys.stderr)
        s = emm.stats(0)
        print("STATS " + json.dumps({k: s[k] for k in ("allocs", "frees", "hits", "passthrough_allocs",
                                                        "events_recorded", "epochs_closed")}), flush=True)
    return 0


def main():
    sys.path.insert(0, here)
    from emmpkg import package_case, skip
    case = package_case("py-emm-torch")
    try:
        import torch
    except ImportError as e:
        skip("torch is not installed: %s" % e)
    if not torch.cuda.is_available():
        skip("torch finds no usable GPU")
    from torch.cuda.memory import CUDAPluggableAllocator  # noqa: F401 - the interface this needs
    runs = []

    def test_training_identical_losses():
        for r in range(3):
            for variant in ("emm", "torch"):
                p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", variant],
                                   capture_output=True, text=True, timeout=600)
                sys.stderr.write(p.stderr[-3000:])
                if variant == "emm" and r == 0:
                    print("\n".join(l for l in p.stderr.splitlines() if l.startswith("PLUGGABLE")), flush=True)
                if not case.check(p.returncode == 0, "%s run %d exited %d" % (variant, r, p.returncode)):
                    continue
                out = {l.split(" ", 1)[0]: json.loads(l.split(" ", 1)[1]) for l in p.stdout.splitlines()
                       if l.startswith(("LOSSES ", "STATS "))}
                runs.append((variant, out))
        ref = runs[0][1]["LOSSES"]
        print("first losses %s ... last %s" % (ref[:3], ref[-1]), flush=True)
        for variant, out in runs:
            same = out["LOSSES"] == ref
            diff = max(abs(a - b) for a, b in zip(out["LOSSES"], ref))
            case.check(same, "%s: losses differ from the first run (max |diff| %g)" % (variant, diff))
            if variant == "emm":
                s = out["STATS"]
                print("emm run: %s" % s, flush=True)
                case.check(s["allocs"] > 1000, "libemm served only %d allocations" % s["allocs"])
                case.check(s["passthrough_allocs"] == 0, "%d allocations passed to the driver"
                           % s["passthrough_allocs"])
                case.check(s["epochs_closed"] == 0, "stream-ordered frees closed %d epochs" % s["epochs_closed"])
                case.made += s["allocs"]

    case.run(test_training_identical_losses)
    case.finish()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(child(sys.argv[2]))
    main()
