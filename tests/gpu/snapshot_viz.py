# SPDX-License-Identifier: MIT
"""tests/gpu/snapshot_viz.py OBS_DRIVER LIBEMM - EMM_SNAPSHOT under a
PyTorch-free CUDA program (tests/obs/obs_driver.c built against the real
driver), loaded by PyTorch's own viewer code: torch.cuda._memory_viz's
segsum (which asserts that every segment's blocks add up), trace,
trace_plot and segment_plot (the HTML pytorch.org/memory_viz draws). The
snapshot taken on EMM_STATS_SIGNAL mid-run and the one taken at exit are
each compared with the EMM_STATS JSON written at the same moment: the same
number of segments, reserved and allocated bytes, and live blocks
(tests/obs/snapshot_check.py). Exit 77 without a GPU or without torch.

    python3 tests/gpu/snapshot_viz.py build-gpu/tests/gpu/gpu-obs-driver build-gpu/libemm.so
"""
import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "obs"))
import snapshot_check  # noqa: E402
from snapshot_check import wait_for  # noqa: E402

driver, lib = sys.argv[1], sys.argv[2]
try:
    import torch.cuda._memory_viz as viz
except Exception as e:  # noqa: BLE001
    print("skip: torch.cuda._memory_viz cannot be imported: %s" % e)
    sys.exit(77)

failed = 0


def check(cond, what, detail=""):
    global failed
    print(("ok: " if cond else "FAILED: ") + what)
    if not cond:
        failed += 1
        if detail:
            print("  | " + str(detail).replace("\n", "\n  | "))


def viewer(s, when):
    """PyTorch's own functions over the snapshot; their text for the log."""
    try:
        summary = viz.segsum(s)
        text = viz.trace(s)
        html = viz.trace_plot(s) + viz.segment_plot(s)
    except Exception as e:  # noqa: BLE001
        check(False, "%s: torch.cuda._memory_viz reads the snapshot" % when, repr(e))
        return
    blocks = sum(len(x["blocks"]) for x in s["segments"])
    live = sum(1 for x in s["segments"] for b in x["blocks"] if b["state"] == "active_allocated")
    print("%s: %d segments, %d blocks (%d active_allocated), %d trace entries" %
          (when, len(s["segments"]), blocks, live, sum(len(d) for d in s["device_traces"])))
    print(summary.split("Legend")[0].rstrip())
    print("\n".join(text.splitlines()[:12]))
    check(len(html) > 1000 and "segments: %d" % len(s["segments"]) in summary,
          "%s: segsum, trace, trace_plot and segment_plot accept it" % when)


with tempfile.TemporaryDirectory() as tmp:
    snap, stats, go = (os.path.join(tmp, n) for n in ("snap.pickle", "stats.json", "go"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMM_")}
    env.update({"LD_PRELOAD": lib, "EMM_SNAPSHOT": snap, "EMM_STATS": stats, "EMM_STATS_SIGNAL": "SIGUSR2"})
    # 1 MiB blocks share 2 MiB small-pool segments; 4 MiB ones a 20 MiB
    # large segment; one stream-ordered block; a pinned one (left out).
    steps = ["a:1M", "a:1M", "a:1M", "a:4M", "a:4M", "A:2M", "h:4K", "f:1", "a:512K",
             "k:%d" % signal.SIGUSR2, "w:" + stats, "w:" + go, "f:0", "f:3", "a:64M"]
    p = subprocess.Popen([driver] + steps, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait_for(stats) or not wait_for(snap):
        open(go, "w").write("go\n")
        out, err = p.communicate(timeout=60)
        if "no device" in err:
            print("skip: no usable GPU: " + err.strip())
            sys.exit(77)
        check(False, "the signal writes the statistics and the snapshot", err)
        sys.exit(1)
    time.sleep(0.2)
    mid, mid_stats = pickle.load(open(snap, "rb")), json.load(open(stats))
    open(go, "w").write("go\n")
    out, err = p.communicate(timeout=120)
    check(p.returncode == 0, "the program ran", err)
    end, end_stats = pickle.load(open(snap, "rb")), json.load(open(stats))
    for s, st, when in ((mid, mid_stats, "signal"), (end, end_stats, "exit")):
        bad = snapshot_check.problems(s, st)
        check(not bad, "%s: the format, and segments/blocks/bytes as the statistics count them" % when, "\n".join(bad))
        viewer(s, when)
    live = sum(1 for x in mid["segments"] for b in x["blocks"] if b["state"] == "active_allocated")
    check(live == 6, "signal: the 6 live device blocks are active_allocated", live)

print("%d failed" % failed)
sys.exit(1 if failed else 0)
