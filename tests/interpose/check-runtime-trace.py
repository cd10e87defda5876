#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Allocations the runtime shims serve appear in the EMM_LOG trace.

usage: check-runtime-trace.py PROGRAM [ARG...]

Runs test-runtime-shims with EMM_LOG set (the environment supplies
LD_PRELOAD and LD_LIBRARY_PATH), then checks that every pointer the program
got from the runtime API ("ptr" lines) has an "allocate" event in the
trace, and a "free" event (the test frees everything it allocates).
"""
import csv
import os
import subprocess
import sys
import tempfile


def main():
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "trace.csv")
        env = dict(os.environ, EMM_LOG=log)
        p = subprocess.run(sys.argv[1:], env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            failures.append(f"program exit {p.returncode}\n{p.stdout}{p.stderr}")
        ptrs = [int(l.split("\t")[1], 16) for l in p.stdout.splitlines() if l.startswith("ptr\t")]
        if not ptrs:
            failures.append("the program reported no pointers")
        rows = []
        if os.path.exists(log):
            with open(log, newline="") as f:
                rows = list(csv.DictReader(f))
        else:
            failures.append("no trace file written")
    allocs, frees = {}, {}
    for r in rows:
        ptr = int(r["Pointer"], 16)
        if r["Action"] == "allocate":
            allocs[ptr] = allocs.get(ptr, 0) + 1
        elif r["Action"] == "free":
            frees[ptr] = frees.get(ptr, 0) + 1
    for ptr in ptrs:
        if ptr not in allocs:
            failures.append(f"{ptr:#x} handed out but not traced")
    # Each pointer the fast path handed out was freed by it too.
    for ptr in ptrs:
        if ptr not in frees:
            failures.append(f"{ptr:#x} handed out but its free not traced")
    print(f"{len(rows)} events, {len(ptrs)} pointers checked")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed, 0 skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
