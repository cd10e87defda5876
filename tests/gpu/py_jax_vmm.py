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

    python3 py_jax_vmm.py [--steps N] [--child] [--bench SECONDS]

--child: only train and print the digest (the run without libemm).
--bench: train for about SECONDS after the warm-up and print steps/s
(tests/bench/run-jax.sh). Exits 77 when jax or a GPU is missing.
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


def train(jax, jnp, steps, case=None, bench=0.0):
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
    if losses:
        host.append(np.asarray(jnp.stack(losses)))
    all_losses = np.concatenate(host)
    h = hashlib.sha256()
    h.update(all_losses.tobytes())
    for w, b in params:
        h.update(np.asarray(w).tobytes())
        h.update(np.asarray(b).tobytes())
    return h.hexdigest(), before, (i - warm) / elapsed, float(all_losses[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--bench", type=float, default=0.0)
    args = ap.parse_args()
    jax, jnp = setup()
    if args.child or args.bench:
        digest, _, rate, last = train(jax, jnp, args.steps, bench=args.bench)
        print("digest %s" % digest)
        print("steps/s %.1f (last loss %.6f)" % (rate, last), flush=True)
        return 0

    case = Case("py-jax-vmm")
    case.require_emm()
    print("jax %s, XLA_PYTHON_CLIENT_ALLOCATOR=%s" % (jax.__version__, os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]))
    digest, a, rate, last = train(jax, jnp, args.steps, case=case)
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
