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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import snapshot_check  # noqa: E402
from snapshot_check import wait_for  # noqa: E402

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
    """Two 6 MiB segments (EMM_LARGE_SEGMENT=8M holds two 3 MiB blocks in
    6 MiB), each with a 3 MiB hole: 6 MiB unallocated, none of it 6 MiB in
    one piece, and the device's other 4 MiB too small as well."""
    err = run(["a:3M"] * 4 + ["f:0", "f:2", "o:6M"],
              {"FAKECUDA_MEM_CAPACITY": "16M", "EMM_LARGE_SEGMENT": "8M"})
    r = "".join(lines_with(err, "out of memory"))
    check("16.0 MiB total, 4.0 MiB free; libemm holds 6.0 MiB allocated and 6.0 MiB reserved but unallocated" in r, "unallocated bytes", err)
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


# --- EMM_STATS as JSON ------------------------------------------------------

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "stats-json.md")
TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "row": (dict,), "object": (dict,),
         "array of rows": (list,), "row or null": (dict, type(None)), "number or null": (int, float, type(None))}


def doc_tables():
    """{section title: {key: type}} from docs/stats-json.md."""
    tables, section = {}, None
    for line in open(DOC):
        if line.startswith("## "):
            section = line[3:].strip()
            tables[section] = {}
        m = re.match(r"\| `(\w+)` \| ([^|]+) \|", line)
        if m and section:
            tables[section][m.group(1)] = m.group(2).strip()
    return tables


def check_schema(doc, reason, what):
    t = doc_tables()
    top, row, proc = t["Top-level fields"], t["Row fields"], t["Process fields"]

    def typed(obj, spec, where):
        check(list(obj.keys()) == list(spec.keys()), "%s: %s has exactly the documented keys, in order" % (what, where),
              "missing %s, extra %s" % (sorted(set(spec) - set(obj)), sorted(set(obj) - set(spec))))
        bad = [k for k in spec if k in obj and (not isinstance(obj[k], TYPES[spec[k]]) or isinstance(obj[k], bool))]
        check(not bad, "%s: %s values have the documented types" % (what, where), str(bad))

    typed(doc, top, "top level")
    check(doc["schema"] == "emm-stats" and doc["schema_version"] == 1 and doc["reason"] == reason,
          "%s: schema, version, reason %s" % (what, reason), str(doc)[:300])
    for d in doc["devices"]:
        typed(d, dict([("device", "integer")] + list(row.items())), "a device row")
    if doc["pinned"] is not None:
        typed(doc["pinned"], row, "the pinned row")
    typed(doc["all"], row, "the all row")
    typed(doc["process"], proc, "process")


def stats_json():
    err = run(["a:1M", "a:3M", "h:4K", "f:0", "z"], {"EMM_STATS": "json"})
    docs = [l for l in err.splitlines() if l.startswith('{"schema":"emm-stats"')]
    check(len(docs) == 1, "EMM_STATS=json: one JSON line on stderr", err)
    if not docs:
        return
    doc = json.loads(docs[0])
    check_schema(doc, "exit", "stderr")
    dev, a = doc["devices"][0], doc["all"]
    check(dev["device"] == 0 and dev["allocs"] == 2 and dev["frees"] == 1 and dev["allocated_bytes"] == 3 << 20,
          "device 0: 2 allocations, 1 free, 3 MiB allocated", str(dev))
    check(doc["pinned"]["allocs"] == 1 and a["allocs"] == 3, "pinned row and all row", str(doc["pinned"]))
    check(doc["state"] == "on" and doc["backend"] == "driver" and doc["pid"] > 0, "state, backend, pid")
    # A path, with %p.
    with tempfile.TemporaryDirectory() as tmp:
        pattern = os.path.join(tmp, "stats-%p.json")
        p = run(["a:2M"], {"EMM_STATS": pattern}, wait=False)
        p.communicate(timeout=60)
        path = os.path.join(tmp, "stats-%d.json" % p.pid)
        check(os.path.exists(path) and sorted(os.listdir(tmp)) == [os.path.basename(path)],
              "EMM_STATS=DIR/stats-%p.json: written to stats-PID.json, no temporary file left", str(os.listdir(tmp)))
        if os.path.exists(path):
            doc = json.load(open(path))
            check_schema(doc, "exit", "file")
            check(doc["pid"] == p.pid and doc["all"]["allocs"] == 1, "the file's pid and counts")
    # Nothing reached libemm, and libemm off.
    e = {k: v for k, v in os.environ.items() if not k.startswith("EMM_")}
    e.update({"EMM_STATS": "json", "LD_PRELOAD": os.environ.get("EMM_TEST_PRELOAD_FIRST", "") + LIB})
    out = subprocess.run(["true"], env=e, stderr=subprocess.PIPE, text=True).stderr
    doc = json.loads([l for l in out.splitlines() if l.startswith("{")][0])
    check(doc["state"] == "not reached" and doc["devices"] == [] and doc["all"]["allocs"] == 0,
          "no CUDA call: state 'not reached'", out)
    err = run(["a:1M"], {"EMM_STATS": "json", "EMM_DISABLE": "1"})
    doc = json.loads([l for l in err.splitlines() if l.startswith("{")][0])
    check(doc["state"] == "off" and doc["all"]["allocs"] == 0, "EMM_DISABLE=1: state 'off'", err)


def stats_passby():
    """The "passed by" rows of the table and the JSON: managed memory, an
    array and the free of a pointer libemm did not hand out."""
    steps = ["a:1M", "m:3K", "f:1", "r:64K"]
    err = run(steps, {"EMM_STATS": "1"})
    check(re.search(r"passed by \(reached the driver, not served by libemm\): 3 calls, 67\.0 KiB known", err),
          "the passed-by summary line: 3 calls, 67 KiB", err)
    check(re.search(r"passed by +managed +1 calls +3\.0 KiB", err), "the managed row: 1 call, 3 KiB", err)
    check(re.search(r"passed by +arrays +1 calls +64\.0 KiB \(from the descriptors\)", err),
          "the arrays row: 1 call, 64 KiB from the descriptor", err)
    check(re.search(r"passed by +unknown frees +1 calls \(sizes are the driver's\)", err),
          "the unknown-frees row: 1 call", err)
    check(not re.search(r"passed by +host registration", err), "no row for a family with no call", err)
    err = run(steps, {"EMM_STATS": "json"})
    doc = json.loads([l for l in err.splitlines() if l.startswith('{"schema":"emm-stats"')][0])
    a, dev = doc["all"], doc["devices"][0]
    check(a["passby_managed_calls"] == 1 and a["passby_managed_bytes"] == 3 << 10 and
          a["passby_array_calls"] == 1 and a["passby_array_bytes"] == 64 << 10 and
          a["passby_unknown_free_calls"] == 1 and a["allocated_bytes_peak_error"] == 0,
          "JSON: the all row's passed-by fields", str(a))
    check(dev["passby_managed_calls"] == 0, "JSON: a device row carries no passed-by counts", str(dev))


def stats_signal():
    with tempfile.TemporaryDirectory() as tmp:
        stats, trace, go = (os.path.join(tmp, n) for n in ("stats.json", "trace.csv", "go"))
        # raise(SIGUSR2) by name: JSON file and trace written while the program runs.
        p = run(["a:1M", "k:%d" % signal.SIGUSR2, "w:" + stats, "w:" + go, "a:1M", "f:1"],
                {"EMM_STATS": stats, "EMM_STATS_SIGNAL": "SIGUSR2", "EMM_LOG": trace}, wait=False)
        check(wait_for(stats), "the signal writes the statistics file while the program runs")
        if os.path.exists(stats):
            doc = json.load(open(stats))
            check_schema(doc, "signal", "signal dump")
            check(doc["all"]["allocs"] == 1 and doc["all"]["frees"] == 0, "the dump counts what happened before it",
                  str(doc["all"]))
        check(wait_for(trace) and "allocate,0x" in open(trace).read(), "the signal flushes the EMM_LOG trace")
        open(go, "w").write("go\n")
        out, err = p.communicate(timeout=60)
        check(p.returncode == 0, "the program runs on after the signal", err)
        doc = json.load(open(stats))
        check(doc["reason"] == "exit" and doc["all"]["allocs"] == 2 and doc["all"]["frees"] == 1,
              "at exit the file is replaced by the final statistics", str(doc["all"]))
        # kill from outside by number, no EMM_STATS: the table on stderr.
        ready, go2, errf = (os.path.join(tmp, n) for n in ("ready", "go2", "stderr"))
        e = {k: v for k, v in os.environ.items() if not k.startswith("EMM_")}
        e.update({"LD_LIBRARY_PATH": FAKE_DIR, "EMM_STATS_SIGNAL": "12",
                  "LD_PRELOAD": os.environ.get("EMM_TEST_PRELOAD_FIRST", "") + LIB})
        with open(errf, "w") as ef:
            p = subprocess.Popen([DRIVER, "a:1M", "a:2M", "t:" + ready, "w:" + go2], env=e, stderr=ef)
            ok = wait_for(ready)
            if ok:
                p.send_signal(12)
                end = time.time() + 10
                while time.time() < end and "statistics (libemm" not in open(errf).read():
                    time.sleep(0.02)
            open(go2, "w").write("go\n")
            p.wait(timeout=60)
        text = open(errf).read()
        check(ok and p.returncode == 0 and "statistics (libemm" in text and re.search(r"emm: 0 +2 ", text),
              "kill -12 from outside: the table on stderr, the program lives on", "exit %s\n%s" % (p.returncode, text))


# --- the EMM_LOG trace -------------------------------------------------------

def read_trace(path):
    lines = open(path).read().splitlines()
    return lines[0], [l.split(",") for l in lines[1:]]


def trace():
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "trace.csv")
        # device sync and async, pinned, a 0-byte request, a pool failure, frees
        err = run(["a:1M", "A:2M", "h:4K", "z", "o:32M", "f:0", "f:1", "f:2"],
                  {"FAKECUDA_MEM_CAPACITY": "16M", "EMM_LOG": log, "EMM_STATS": "json"})
        header, rows = read_trace(log)
        check(header == "Thread,Time,Action,Pointer,Size,Stream,Memory", "header: RMM's six columns and Memory",
              header)
        check(all(len(r) == 7 for r in rows), "every line has seven columns")
        mem = [(r[2], r[4], r[6]) for r in rows]
        check(("allocate", "4096", "pinned") in mem and ("free", "4096", "pinned") in mem,
              "pinned-host events are told apart", str(mem))
        check(("allocate", str(1 << 20), "device") in mem and ("allocate", str(2 << 20), "device") in mem,
              "device events say device", str(mem))
        check(not any(r[4] == "0" for r in rows if r[2] == "allocate"), "no line for the 0-byte request", str(mem))
        doc = json.loads([l for l in err.splitlines() if l.startswith("{")][0])["all"]
        n = lambda action: sum(1 for r in rows if r[2] == action)
        check(n("allocate") == doc["allocs"] + doc["passthrough_allocs"] == 3, "allocate lines = allocations counted",
              "%d lines, %s" % (n("allocate"), doc))
        check(n("free") == doc["frees"] + doc["passthrough_frees"] == 3, "free lines = frees counted")
        check(n("allocate failure") == doc["ooms"] == 1, "failure lines = ooms = 1",
              "%d lines, ooms %d" % (n("allocate failure"), doc["ooms"]))


def trace_pid():
    """%p names one file per process; a second process never truncates the
    first one's trace."""
    with tempfile.TemporaryDirectory() as tmp:
        pattern = os.path.join(tmp, "t-%p.csv")
        go = os.path.join(tmp, "go")
        procs = [run(["a:1M", "w:" + go, "a:2M"], {"EMM_LOG": pattern}, wait=False) for _ in range(2)]
        time.sleep(0.2)
        open(go, "w").write("go\n")
        for p in procs:
            p.communicate(timeout=60)
        for p in procs:
            path = os.path.join(tmp, "t-%d.csv" % p.pid)
            ok = os.path.exists(path)
            rows = read_trace(path)[1] if ok else []
            check(ok and [r[4] for r in rows] == [str(1 << 20), str(2 << 20)],
                  "EMM_LOG=t-%p.csv: process's own file with its own two events", str(os.listdir(tmp)))
        # A fork child (which cannot use CUDA) leaves the parent's trace whole
        # and, with %p, makes no file of its own.
        p = run(["a:1M", "x:5M", "a:2M"], {"EMM_LOG": os.path.join(tmp, "f-%p.csv")}, wait=False)
        p.communicate(timeout=60)
        files = sorted(f for f in os.listdir(tmp) if f.startswith("f-"))
        parent = os.path.join(tmp, "f-%d.csv" % p.pid)
        check(files == [os.path.basename(parent)] and
              [r[4] for r in read_trace(parent)[1]] == [str(1 << 20), str(2 << 20)],
              "fork with EMM_LOG=f-%p.csv: the parent's file whole, none for the child", str(files))
        forked = os.path.join(tmp, "forked.csv")
        run(["a:1M", "x:5M", "a:2M"], {"EMM_LOG": forked})
        check([r[4] for r in read_trace(forked)[1]] == [str(1 << 20), str(2 << 20)],
              "fork without %p: the parent's trace whole", open(forked).read())
        # The same file for two live processes: the second writes beside it.
        log = os.path.join(tmp, "shared.csv")
        ready, go2 = os.path.join(tmp, "ready"), os.path.join(tmp, "go2")
        first = run(["a:1M", "t:" + ready, "w:" + go2, "a:2M"], {"EMM_LOG": log}, wait=False)
        check(wait_for(ready), "the first process started")
        p2 = run(["a:3M"], {"EMM_LOG": log, "EMM_VERBOSE": "0"}, wait=False)
        out, err2 = p2.communicate(timeout=60)
        open(go2, "w").write("go\n")
        first.communicate(timeout=60)
        rows = read_trace(log)[1]
        check([r[4] for r in rows] == [str(1 << 20), str(2 << 20)], "the first process's trace is whole",
              str(rows))
        other = os.path.join(tmp, "shared.%d.csv" % p2.pid)
        check(os.path.exists(other) and [r[4] for r in read_trace(other)[1]] == [str(3 << 20)],
              "the second process wrote shared.PID.csv", str(os.listdir(tmp)))
        check("is another process's trace" in err2 and other in err2, "and said so", err2)
        # A finished process's trace is replaced, as any log file.
        run(["a:4M"], {"EMM_LOG": log})
        check([r[4] for r in read_trace(log)[1]] == [str(4 << 20)], "a finished run's trace is replaced")


def runtime_oom():
    """A cudaMalloc that fails is one failure, though libemm tries it twice
    (its runtime fast path, then the driver shim under the real runtime)."""
    runtime = sys.argv[5]
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "trace.csv")
        e = {k: v for k, v in os.environ.items() if not k.startswith("EMM_") and not k.startswith("FAKECUDA_")}
        e.update({"LD_LIBRARY_PATH": FAKE_DIR + ":" + os.path.dirname(sys.argv[6]), "FAKECUDA_MEM_CAPACITY": "16M",
                  "EMM_LOG": log, "EMM_STATS": "json",
                  "LD_PRELOAD": os.environ.get("EMM_TEST_PRELOAD_FIRST", "") + LIB})
        p = subprocess.run([runtime], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        check(p.returncode == 0 and "served 4" in p.stdout, "four 4 MiB cudaMallocs, the fifth fails",
              p.stdout + p.stderr)
        doc = json.loads([l for l in p.stderr.splitlines() if l.startswith("{")][0])["all"]
        rows = read_trace(log)[1]
        fails = sum(1 for r in rows if r[2] == "allocate failure")
        check(doc["ooms"] == 1 and fails == 1, "one failure counted, one traced",
              "ooms %d, %d failure lines" % (doc["ooms"], fails))
        check(len(lines_with(p.stderr, "out of memory: tried to allocate")) == 1, "one report", p.stderr)


# --- EMM_SNAPSHOT -----------------------------------------------------------

def snapshot():
    with tempfile.TemporaryDirectory() as tmp:
        snap, stats, go = (os.path.join(tmp, n) for n in ("snap-%p.pickle", "stats.json", "go"))
        steps = ["a:1M", "a:1M", "a:1M", "a:4M", "a:4M", "A:2M", "h:4K", "f:1", "a:512K", "k:%d" % signal.SIGUSR2,
                 "w:" + stats, "w:" + go, "f:0", "f:3"]
        p = run(steps, {"EMM_SNAPSHOT": snap, "EMM_STATS": stats, "EMM_STATS_SIGNAL": "USR2"}, wait=False)
        path = snap.replace("%p", str(p.pid))
        ok = wait_for(stats) and wait_for(path)
        check(ok, "the signal writes EMM_SNAPSHOT=snap-%p.pickle as snap-PID.pickle")
        if ok:
            time.sleep(0.1)  # the snapshot is renamed into place whole; the stats were first
            s = pickle.load(open(path, "rb"))
            doc = json.load(open(stats))
            bad = snapshot_check.problems(s, doc)
            check(not bad, "the signal's snapshot: PyTorch's format, blocks tile segments, counts match the "
                  "statistics", "\n".join(bad))
            trace = s["device_traces"][0] if s["device_traces"] else []
            acts = [e["action"] for e in trace]
            check(acts.count("alloc") == 7 and acts.count("free_requested") == 1 and
                  acts.count("free_completed") == 1 and acts.count("segment_alloc") == doc["devices"][0]["backend_allocs"],
                  "trace entries: 7 allocs, 1 free, a segment_alloc per backend allocation", str(acts))
            check(len(s["segments"]) >= 3 and all(x["device"] == 0 for x in s["segments"]),
                  "device segments only (pinned memory left out)", str(len(s["segments"])))
        open(go, "w").write("go\n")
        out, err = p.communicate(timeout=60)
        check(p.returncode == 0, "the program runs on", err)
        s = pickle.load(open(path, "rb"))
        doc = json.load(open(stats))
        bad = snapshot_check.problems(s, doc)
        check(not bad, "the exit snapshot, against the exit statistics", "\n".join(bad))
        acts = [e["action"] for e in s["device_traces"][0]]
        check(acts.count("free_completed") == 3, "the exit snapshot's trace has the later frees", str(acts))


def disabled():
    """EMM_DISABLE=1 with EMM_VERBOSE or EMM_STATS says that libemm is off."""
    err = run(["a:1M"], {"EMM_DISABLE": "1", "EMM_VERBOSE": "1"})
    check(re.search(r"^emm: libemm \S+ disabled \(EMM_DISABLE\): every call goes to the driver$", err, re.M),
          "EMM_DISABLE=1 EMM_VERBOSE=1: one line says libemm is off", err)
    err = run(["a:1M"], {"EMM_DISABLE": "1", "EMM_STATS": "1"})
    check("statistics (libemm" in err and "off (EMM_DISABLE" in err, "EMM_DISABLE=1 EMM_STATS=1: the table says off",
          err)


SCENARIOS = {
    "disabled": disabled,
    "snapshot": snapshot,
    "runtime-oom": runtime_oom,
    "trace": trace,
    "trace-pid": trace_pid,
    "stats-json": stats_json,
    "stats-signal": stats_signal,
    "stats-passby": stats_passby,
    "oom": oom,
    "oom-fragmented": oom_fragmented,
    "fit": fit,
}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()
    print("%d passed, %d failed, 0 skipped" % (passed, failed))
    sys.exit(1 if failed else 0)
