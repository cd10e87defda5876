#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check which dlsym test-dlsym-versions binds to, per symbol version.

usage: check-dlsym-versions.py LIBEMM PROGRAM

1. The program really references dlsym at two versions (objdump -T).
2. It passes its own checks without libemm, with it, and with EMM_DISABLE=1.
3. With libemm preloaded the loader binds every dlsym reference of the
   program, whatever its version, to libemm (LD_DEBUG=bindings).
"""
import os
import platform
import re
import subprocess
import sys

failures = []
checks = 0


def check(cond, msg):
    global checks
    checks += 1
    if not cond:
        failures.append(msg)


def main():
    libemm, prog = sys.argv[1], sys.argv[2]
    old = {"x86_64": "GLIBC_2.2.5", "aarch64": "GLIBC_2.17"}.get(platform.machine())

    dyn = subprocess.run(["objdump", "-T", prog], capture_output=True, text=True, check=True).stdout
    versions = set(re.findall(r"\(?(GLIBC_[0-9.]+)\)?\s+dlsym\s*$", dyn, re.M))
    glibc = platform.libc_ver()[1]
    new_glibc = tuple(int(x) for x in glibc.split(".")[:2]) >= (2, 34) if glibc else True
    if new_glibc:
        check("GLIBC_2.34" in versions, f"no dlsym@GLIBC_2.34 reference: {versions}")
    if old:
        check(old in versions, f"no dlsym@{old} reference: {versions}")

    base = {k: v for k, v in os.environ.items() if not k.startswith("EMM_") and k != "LD_PRELOAD"}
    for config in ("ref", "emm", "disabled"):
        env = dict(base)
        if config != "ref":
            env["LD_PRELOAD"] = libemm
        if config == "disabled":
            env["EMM_DISABLE"] = "1"
        p = subprocess.run([prog, config], env=env, capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, f"{config}: exit {p.returncode}\n{p.stdout}{p.stderr}")

    env = dict(base, LD_PRELOAD=libemm, LD_DEBUG="bindings")
    p = subprocess.run([prog, "emm"], env=env, capture_output=True, text=True, timeout=60)
    progname = os.path.basename(prog)
    bound = {}
    for m in re.finditer(r"binding file (\S+) \[0\] to (\S+) \[0\]: normal symbol `dlsym' \[(GLIBC_[0-9.]+)\]",
                         p.stderr):
        if os.path.basename(m.group(1)) == progname:
            bound[m.group(3)] = os.path.basename(m.group(2))
    print(f"dlsym bindings of {progname}: {bound}")
    for v in versions:
        check(bound.get(v, "").startswith("libemm"), f"dlsym@{v} bound to {bound.get(v)}, not libemm")

    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(f"{checks - len(failures)} passed, {len(failures)} failed, 0 skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
