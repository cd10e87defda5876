#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/obs/check-obs.py LIBEMM FAKECUDA_DIR OBS_DRIVER SCENARIO [TMPDIR]

Runs tests/obs/obs_driver with LD_PRELOAD=LIBEMM over the test-double
driver and checks what libemm told the user in one SCENARIO (the names
below): the out-of-memory report, segment sizes refused at start-up,
EMM_STATS as JSON, the statistics signal, the trace (EMM_LOG) and the
snapshot (EMM_SNAPSHOT). Prints 'ok: ...' / 'FAILED: ...' per check and
'N passed, N failed, 0 skipped'; exits 1 on any failure.
"""
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time

LIB, FAKE_DIR, DRIVER, SCENARIO = sys.argv[1:5]
passed = failed = 0


def check(cond, what, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print("ok: " + what)
    else:
        failed += 1
        print("FAILED: " + what)
        if detail:
            print("  | " + detail.replace("\n", "\n  | "))


def run(steps, env=None, expect_rc=0, wait=True):
    e = {k: v for k, v in os.environ.items() if not k.startswith("EMM_") and not k.startswith("FAKECUDA_")}
    e["LD_LIBRARY_PATH"] = FAKE_DIR
    e["LD_PRELOAD"] = os.environ.get("EMM_TEST_PRELOAD_FIRST", "") + LIB
    e.update(env or {})
    p = subprocess.Popen([DRIVER] + steps, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=60)
    check(p.returncode == expect_rc, "obs_driver %s exits %d" % (" ".join(steps), expect_rc),
          "exit %d\n%s" % (p.returncode, err))
    return err


def lines_with(text, needle):
    return [l for l in text.splitlines() if needle in l]


# --- scenarios ------------------------------------------------------------

def oom():
    """Four 4 MiB blocks fill a 16 MiB device; three failures, two bursts."""
    err = run(["a:4M"] * 4 + ["o:4M", "o:4M", "s:1100", "o:4M"], {"FAKECUDA_MEM_CAPACITY": "16M"})
    reports = lines_with(err, "out of memory: tried to allocate")
    check(len(reports) == 2, "one report per burst without EMM_VERBOSE (2 bursts)", err)
    if not reports:
        return
    r = reports[0]
    check(r.startswith("emm: error: out of memory: tried to allocate 4.0 MiB (4194304 bytes) on device 0"),
          "what was asked, where", r)
    check("16.0 MiB total, 0 B free" in r, "device total and free", r)
    check("libemm holds 16.0 MiB allocated and 0 B reserved but unallocated" in r, "allocated, unallocated", r)
    check("largest free block 0 B" in r, "largest free block", r)
    check("Hint: the program needs more memory than the device holds" in r, "hint: the device is too small", r)
    check(len(reports) == 2 and "(1 more failed since the last report)" in reports[1],
          "the next burst's report counts the unreported failure", err)


def oom_fragmented():
    """Two 8 MiB segments, each with a 3 MiB hole and a 2 MiB tail: 10 MiB
    unallocated, none of it 6 MiB in one piece."""
    err = run(["a:3M"] * 4 + ["f:0", "f:2", "o:6M"],
              {"FAKECUDA_MEM_CAPACITY": "16M", "EMM_LARGE_SEGMENT": "8M"})
    r = "".join(lines_with(err, "out of memory"))
    check("libemm holds 6.0 MiB allocated and 10.0 MiB reserved but unallocated" in r, "unallocated bytes", err)
    check("largest free block 3.0 MiB" in r, "largest free block", r)
    check("EMM_BACKEND=vmm" in r, "hint: vmm for fragmented memory", r)


def fit():
    """Segment sizes larger than the device are refused at start-up."""
    err = run(["a:2M", "a:2M", "a:5M"], {"FAKECUDA_MEM_CAPACITY": "16M", "EMM_LARGE_SEGMENT": "64M"})
    line = lines_with(err, "EMM_LARGE_SEGMENT")
    check(len(line) == 1 and "emm: error: EMM_LARGE_SEGMENT=64M is larger than device 0 (16.0 MiB): refused, "
          "using 8M" in line[0], "EMM_LARGE_SEGMENT=64M refused on a 16 MiB device, once", err)
    err = run(["a:12M"], {"FAKECUDA_MEM_CAPACITY": "16M", "EMM_SMALL_SEGMENT": "32M", "EMM_SMALL_SIZE": "20M",
                          "EMM_LARGE_SEGMENT": "40M"})
    for name, using in (("SMALL_SEGMENT=32M", "8M"), ("LARGE_SEGMENT=40M", "8M"), ("SMALL_SIZE=20M", "8M")):
        check(any("EMM_%s is larger than device 0" % name in l and "using " + using in l
                  for l in err.splitlines()), "EMM_%s refused, using %s" % (name, using), err)
    # Defaults on a 16 MiB simulated device: adjusted quietly, allocations work.
    err = run(["a:3M", "a:1M", "a:5M"], {"EMM_BACKEND": "hostsim", "EMM_BACKEND_OPTIONS": "capacity=16M"})
    check("error" not in err and "warning" not in err, "hostsim capacity=16M with defaults: no complaint", err)
    err = run(["a:3M"], {"EMM_BACKEND": "hostsim", "EMM_BACKEND_OPTIONS": "capacity=16M", "EMM_VERBOSE": "1"})
    check(any("EMM_LARGE_SEGMENT's default 20M is larger than device 0 (16.0 MiB): using 8M" in l
              for l in err.splitlines()), "EMM_VERBOSE=1 says the default was cut", err)


SCENARIOS = {
    "oom": oom,
    "oom-fragmented": oom_fragmented,
    "fit": fit,
}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()
    print("%d passed, %d failed, 0 skipped" % (passed, failed))
    sys.exit(1 if failed else 0)
