# SPDX-License-Identifier: MIT
"""tests/gpu/py_jax_vmm.py - JAX with XLA_PYTHON_CLIENT_ALLOCATOR=platform:
every buffer XLA makes is cuMemAddressReserve + cuMemCreate + cuMemMap +
cuMemSetAccess, freed with cuMemUnmap + cuMemRelease + cuMemAddressFree
(found with dlsym on libcuda.so.1). A small MLP trains with changing batch
shapes; after a warm-up (every shape compiled and seen once) at least 99 % of
the device allocations must come from libemm's caches (VMM cache hits, and
pool hits for anything JAX allocates with cuMemAlloc), and the losses and
final parameters must be bit-identical to the same run without libemm (the
script runs itself again with LD_PRELOAD removed).

    python3 py_jax_vmm.py [--steps N] [--child] [--bench SECONDS] [--profile-range]

--child: only train and print the digest (the run without libemm).
--bench: train for about SECONDS after the warm-up and print steps/s
(tests/bench/run-jax.sh), and with libemm loaded one "emm-step:" line of
its counters per timed step: VMM allocations and the share its cache
served, pool allocations, and libemm's own fence work (events recorded,
event queries, host waits, stream waits). --profile-range: cuProfilerStart
and cuProfilerStop around the timed steps (for nsys --capture-range=
cudaProfilerApi: tests/bench/run-jax-nsys.sh). Exits 77 when jax or a GPU is
missing.
"""
import argparse
import hashlib
import os
import subprocess
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_ALLOCATOR", "platform")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# Deterministic reductions: the two runs must agree bit for bit.
if "--xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_gpu_deterministic_ops=true").strip()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from emmstats import PROCESS, Case, skip  # noqa: E402

BATCHES = (64, 128, 96, 32, 160)
WIDTHS = (256, 1024, 1024, 10)


def setup():
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as e:
        skip("jax is not installed: %s" % e)
    try:
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
    except Exception as e:  # noqa: BLE001
        skip("jax finds no GPU: %s" % e)
    if not gpus:
        skip("jax finds no GPU")
    return jax, jnp


def trainer(jax, jnp):
    key = jax.random.PRNGKey(0)
    params = []
    for i, (a, b) in enumerate(zip(WIDTHS[:-1], WIDTHS[1:])):
        k = jax.random.fold_in(key, 1000 + i)
        params.append((jax.random.normal(k, (a, b)) / jnp.sqrt(a), jnp.zeros((b,))))

    def loss_fn(ps, x, y):
        h = x
        for i, (w, b) in enumerate(ps):
            h = h @ w + b
            if i < len(ps) - 1:
                h = jax.nn.gelu(h)
        return jnp.mean(jax.nn.logsumexp(h, axis=-1) - jnp.take_along_axis(h, y[:, None], axis=-1)[:, 0])

    @jax.jit
    def step(ps, x, y):
        loss, g = jax.value_and_grad(loss_fn)(ps, x, y)
        return jax.tree_util.tree_map(lambda p, d: p - 0.05 * d, ps, g), loss

    def batch(i):
        n = BATCHES[i % len(BATCHES)]
        k = jax.random.fold_in(key, i)
        x = jax.random.normal(k, (n, WIDTHS[0]))
        y = jax.random.randint(jax.random.fold_in(k, 7), (n,), 0, WIDTHS[-1])
        return x, y

    return params, step, batch


def profiler(on):
    """cuProfilerStart (on) or cuProfilerStop in device 0's primary context
    (XLA's), made current on this thread for the call only."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    if cu.cuDeviceGet(ctypes.byref(dev), 0) or cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev):
        print("profile range: no primary context", flush=True)
        return
    cu.cuCtxPushCurrent_v2(ctx)
    rc = cu.cuProfilerStart() if on else cu.cuProfilerStop()
    cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    cu.cuDevicePrimaryCtxRelease_v2(dev)
    if rc:
        print("profile range: cuProfiler%s returned %d" % ("Start" if on else "Stop", rc), flush=True)


def train(jax, jnp, steps, case=None, bench=0.0, profile=False):
    import numpy as np

    params, step, batch = trainer(jax, jnp)
    # Losses go to the host every 25 steps: a device scalar kept per step
    # would be a new live 2 MiB VMM buffer each step (XLA's smallest), a
    # growth no cache can serve and no real training loop keeps.
    losses, host = [], []
    warm = 4 * len(BATCHES)
    before = None
    t0 = None
    i = 0
    while True:
        if i == warm:
            jax.block_until_ready(params)
            before = case.stats(PROCESS) if case else None
            if profile:
                profiler(True)
            t0 = time.perf_counter()
        if bench and t0 is not None and time.perf_counter() - t0 >= bench and i % len(BATCHES) == 0:
            break
        if not bench and i >= steps:
            break
        x, y = batch(i)
        params, loss = step(params, x, y)
        losses.append(loss)
        if len(losses) == 25:
            host.append(np.asarray(jnp.stack(losses)))
            losses = []
        i += 1
    jax.block_until_ready(params)
    elapsed = time.perf_counter() - t0
    after = case.stats(PROCESS) if case else None
    if profile:
        profiler(False)
    if losses:
        host.append(np.asarray(jnp.stack(losses)))
    all_losses = np.concatenate(host)
    h = hashlib.sha256()
    h.update(all_losses.tobytes())
    for w, b in params:
        h.update(np.asarray(w).tobytes())
        h.update(np.asarray(b).tobytes())
    return h.hexdigest(), before, (i - warm) / elapsed, float(all_losses[-1]), (after, i - warm)


def step_counters(a, b, steps):
    """The timed steps' libemm counters per step, one line (run-jax.sh)."""
    if a is None or b is None or steps <= 0:
        return "emm-step: libemm not loaded (no counters)"
    d = {k: b[k] - a[k] for k in b}
    vmm = d["vmm_allocs"]
    return ("emm-step: %d steps; per step: VMM allocations %.2f (cache hits %.2f, %.2f%% of them), "
            "pool allocations %.2f (hits %.2f), passed by %.2f; libemm's fence work: events recorded %.2f, "
            "event queries %.2f, host waits %.2f, stream waits %.2f; VMM idle buffers given back %d"
            % (steps, vmm / steps, d["vmm_hits"] / steps, 100.0 * d["vmm_hits"] / vmm if vmm else 0.0,
               d["allocs"] / steps, d["hits"] / steps, d["passthrough_allocs"] / steps,
               d["events_recorded"] / steps, d["event_queries"] / steps, d["host_waits"] / steps,
               d["stream_waits"] / steps, d["vmm_idle_released"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--bench", type=float, default=0.0)
    ap.add_argument("--profile-range", action="store_true")
    args = ap.parse_args()
    jax, jnp = setup()
    if args.child or args.bench:
        case = None
        if args.bench:
            case = Case("py-jax-vmm-bench")
            if not case.present():
                case = None
        digest, before, rate, last, (after, steps) = train(jax, jnp, args.steps, case=case, bench=args.bench,
                                                           profile=args.profile_range)
        print("digest %s" % digest)
        print("steps/s %.1f (%d timed steps, last loss %.6f)" % (rate, steps, last), flush=True)
        if args.bench:
            print(step_counters(before, after, steps), flush=True)
        return 0

    case = Case("py-jax-vmm")
    case.require_emm()
    print("jax %s, XLA_PYTHON_CLIENT_ALLOCATOR=%s" % (jax.__version__, os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]))
    digest, a, rate, last, _ = train(jax, jnp, args.steps, case=case)
    b = case.stats(PROCESS)
    d = {k: b[k] - a[k] for k in b}
    allocs, served = d["vmm_allocs"] + d["allocs"], d["vmm_hits"] + d["hits"]
    print("after warm-up: VMM allocations %d (cache %d), pool allocations %d (hits %d), passthrough %d; "
          "whole run: VMM %d (cache %d), %d deferrals made real; %.1f steps/s"
          % (d["vmm_allocs"], d["vmm_hits"], d["allocs"], d["hits"], d["passthrough_allocs"],
             b["vmm_allocs"], b["vmm_hits"], b["vmm_materializations"], rate), flush=True)
    case.made = allocs
    if case.check(b["vmm_allocs"] > 0, "ESCAPE: JAX made no VMM allocation libemm saw (platform allocator "
                                       "not in use, or its dlsym lookups passed libemm by)"):
        if os.environ.get("NVTX_INJECTION64_PATH"):
            # A memory checker: libemm keeps no freed VMM buffer then.
            case.check(d["vmm_hits"] == 0, "%d VMM buffers reused under a memory checker" % d["vmm_hits"])
        else:
            case.check(allocs > 0 and served >= 0.99 * allocs,
                       "%d of %d device allocations after the warm-up were served from libemm's caches "
                       "(want >= 99%%)" % (served, allocs))
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", "--steps", str(args.steps)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ref = [l.split()[1] for l in out.stdout.splitlines() if l.startswith("digest ")]
    print("digest with libemm %s, without %s (last loss %.6f)" % (digest, ref[0] if ref else "?", last))
    if case.check(out.returncode == 0 and ref, "the run without libemm failed:\n" + out.stdout[-3000:]):
        case.check(ref[0] == digest, "results differ from the run without libemm")
    case.finish()


if __name__ == "__main__":
    sys.exit(main())
