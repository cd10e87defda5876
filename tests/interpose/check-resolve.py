#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Run test-resolve without libemm, with it, and with EMM_DISABLE=1, and
check that libemm replaced exactly the pointers it has shims for.

usage: check-resolve.py LIBEMM EXPORTS_LIST... -- PROGRAM...

LD_LIBRARY_PATH must point at the test-double libcuda.so.1. The rule for
every row (one lookup): the result code and symbolStatus equal the driver's;
under EMM_DISABLE=1 the pointer is the driver's; with libemm the pointer is
libemm's export of the same name when the driver answered CUDA_SUCCESS,
status SUCCESS (or none asked), with a driver export libemm shims, and the
driver's own pointer in every other case. Named rows pin down the cases the
design depends on (ABI versions, per-thread variants, the resolver itself).
"""
import os
import subprocess
import sys

failures = []
checks = 0


def check(cond, msg):
    global checks
    checks += 1
    if not cond:
        failures.append(msg)


def run(prog, config, libemm):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMM_") and k != "LD_PRELOAD"}
    if config != "ref":
        env["LD_PRELOAD"] = libemm
    if config == "disabled":
        env["EMM_DISABLE"] = "1"
    p = subprocess.run([prog, config], env=env, capture_output=True, text=True, timeout=120)
    if os.environ.get("RESOLVE_SAVE_ROWS"):
        with open(os.path.join(os.environ["RESOLVE_SAVE_ROWS"], f"{os.path.basename(prog)}-{config}.txt"), "w") as f:
            f.write(p.stdout + p.stderr)
    rows = {}
    for line in p.stdout.splitlines():
        if not line.startswith("row\t"):
            continue
        f = line.split("\t")
        if len(f) != 6:
            check(False, f"{config}: malformed row {line!r}")
            continue
        key = f[1]
        check(key not in rows, f"{config}: duplicate row {key}")
        rows[key] = dict(result=f[2], status=f[3], owner=f[4], name=f[5])
    check(p.returncode == 0, f"{os.path.basename(prog)} {config}: exit {p.returncode}\n{p.stderr}{p.stdout[-400:]}")
    return rows


def is_libemm(r):
    return r["owner"].startswith("libemm")


def is_driver(r):
    return r["owner"].startswith("libcuda.so")


def main():
    args = sys.argv[1:]
    sep = args.index("--")
    libemm, lists, progs = args[0], args[1:sep], args[sep + 1:]
    exported = set()
    for path in lists:
        with open(path) as f:
            exported |= {l.strip() for l in f if l.strip() and not l.startswith("#")}
    shimmed = {n for n in exported if n.startswith("cu")}

    for prog in progs:
        name = os.path.basename(prog)
        linked = "linked" in name
        ref = run(prog, "ref", libemm)
        emm = run(prog, "emm", libemm)
        dis = run(prog, "disabled", libemm)
        check(len(ref) > 1000, f"{name}: only {len(ref)} rows")
        check(set(ref) == set(emm) == set(dis), f"{name}: row sets differ")

        for key, r in ref.items():
            e, d = emm.get(key), dis.get(key)
            if e is None or d is None:
                continue
            special = key.startswith(("dlsym-default", "dlsym-next", "direct &"))
            check(not is_libemm(r), f"{name} ref {key}: libemm pointer without libemm")
            for cfg, x in (("emm", e), ("disabled", d)):
                check(x["result"] == r["result"], f"{name} {cfg} {key}: result {x['result']} != driver's {r['result']}")
                check(x["status"] == r["status"], f"{name} {cfg} {key}: status {x['status']} != driver's {r['status']}")
            if special:
                # Answered by glibc's global scope: the preloaded libemm comes
                # first, with or without EMM_DISABLE.
                check(is_libemm(e) and is_libemm(d), f"{name} {key}: expected libemm's export, got {e} / {d}")
                check(is_driver(r) if linked or key.startswith("direct") else r["owner"] == "null",
                      f"{name} ref {key}: {r}")
                continue
            check((d["owner"], d["name"]) == (r["owner"], r["name"]),
                  f"{name} disabled {key}: {d['owner']}:{d['name']} != driver's {r['owner']}:{r['name']}")
            substitutable = (r["result"] == "0" and r["status"] in ("-", "0") and is_driver(r)
                             and r["name"] in shimmed)
            if substitutable:
                check(is_libemm(e) and e["name"] == r["name"],
                      f"{name} emm {key}: expected libemm's {r['name']}, got {e['owner']}:{e['name']}")
            else:
                check((e["owner"], e["name"]) == (r["owner"], r["name"]),
                      f"{name} emm {key}: {e['owner']}:{e['name']} != driver's {r['owner']}:{r['name']}")

        def expect(key, cfg_rows, owner_pred, sym, what):
            r = cfg_rows.get(key)
            check(r is not None and owner_pred(r) and (sym is None or r["name"] == sym),
                  f"{name} {what} {key}: got {r}")

        fake = is_driver(ref.get("dlsym fakecuda_calls", {"owner": "null"}))
        # The driver's ABI choices (the fake must behave like CUDA 13.0's).
        expect("gpa2 cuMemAlloc v2000 f0 nostatus", ref, is_driver, "cuMemAlloc", "ref")
        expect("gpa2 cuMemAlloc v3020 f0 nostatus", ref, is_driver, "cuMemAlloc_v2", "ref")
        expect("gpa2 cuMemAllocAsync v11020 f2 nostatus", ref, is_driver, "cuMemAllocAsync_ptsz", "ref")
        expect("gpa2 cuMemAllocAsync v11020 f1 nostatus", ref, is_driver, "cuMemAllocAsync", "ref")
        expect("gpa2 cuGetProcAddress v11030 f0 nostatus", ref, is_driver, "cuGetProcAddress", "ref")
        expect("gpa2 cuGetProcAddress v12000 f0 nostatus", ref, is_driver, "cuGetProcAddress_v2", "ref")
        # What libemm makes of them.
        expect("gpa2 cuMemAlloc v2000 f0 status", emm, is_driver, "cuMemAlloc", "emm (v1 ABI untouched)")
        expect("gpa2 cuMemAlloc v3020 f0 status", emm, is_libemm, "cuMemAlloc_v2", "emm")
        expect("gpa2 cuMemAlloc v13000 f1 nostatus", emm, is_libemm, "cuMemAlloc_v2", "emm")
        expect("gpa2 cuMemAllocAsync v11020 f2 status", emm, is_libemm, "cuMemAllocAsync_ptsz", "emm (PTDS)")
        expect("gpa2 cuMemAllocAsync v12000 f0 nostatus", emm, is_libemm, "cuMemAllocAsync", "emm")
        expect("gpa2 cuMemFreeAsync v12000 f2 nostatus", emm, is_libemm, "cuMemFreeAsync_ptsz", "emm (PTDS)")
        expect("gpa1 cuMemAlloc v3020 f0", emm, is_libemm, "cuMemAlloc_v2", "emm")
        expect("gpa2 cuGetProcAddress v11030 f0 nostatus", emm, is_libemm, "cuGetProcAddress", "emm (own v1)")
        expect("gpa2 cuGetProcAddress v12000 f0 status", emm, is_libemm, "cuGetProcAddress_v2", "emm (own v2)")
        expect("gpa1 cuGetProcAddress v12000 f0", emm, is_libemm, "cuGetProcAddress_v2", "emm (own v2)")
        expect("self11030-v1 cuMemAlloc v3020 f0", emm, is_libemm, "cuMemAlloc_v2", "emm via own v1")
        expect("self12000-v2 cuMemAllocAsync v12000 f2 nostatus", emm, is_libemm, "cuMemAllocAsync_ptsz",
               "emm via own v2")
        expect("gpa2 cuNoSuchFunction v13000 f0 status", emm, lambda r: r["owner"] == "null", None, "emm")
        expect("gpa2 cuInit v2000 f0 nostatus", emm, is_driver, "cuInit", "emm (no shim)")
        expect("dlsym cuMemAlloc_v2", emm, is_libemm, "cuMemAlloc_v2", "emm")
        expect("dlsym cuMemAlloc", emm, is_driver, "cuMemAlloc", "emm (v1 ABI untouched)")
        expect("dlsym cuMemAllocAsync_ptsz", emm, is_libemm, "cuMemAllocAsync_ptsz", "emm")
        expect("dlsym cuGetProcAddress_v2", emm, is_libemm, "cuGetProcAddress_v2", "emm")
        expect("dlsym cuGetProcAddress", emm, is_libemm, "cuGetProcAddress", "emm")
        if fake:
            expect("dlsym fakecuda_calls", emm, is_driver, "fakecuda_calls", "emm (not a driver name)")
        expect("dlsym cuNoSuchFunction", emm, lambda r: r["owner"] == "null", None, "emm")
        # A version above the driver's: the driver's error, pfn as it left it.
        r = ref.get("gpa2 cuMemAlloc v99000 f0 status")
        check(r is not None and r["result"] != "0", f"{name} ref: version above the driver's gave {r}")
        if linked:
            expect("direct2 cuMemAlloc v3020 f0 nostatus", emm, is_libemm, "cuMemAlloc_v2", "emm (ELF-bound)")
            expect("direct1 cuMemAlloc v3020 f0", dis, is_driver, "cuMemAlloc_v2", "disabled (ELF-bound)")

    for f in failures[:60]:
        print("FAIL:", f, file=sys.stderr)
    if len(failures) > 60:
        print(f"... and {len(failures) - 60} more", file=sys.stderr)
    print(f"{checks - len(failures)} passed, {len(failures)} failed, 0 skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
