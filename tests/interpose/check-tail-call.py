#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""libemm's dlsym forwards by a jump, never by a call.

usage: check-tail-call.py OBJDUMP LIBEMM

glibc answers dlsym(RTLD_NEXT/RTLD_DEFAULT, ...) relative to the return
address of the call into dlsym, so libemm's exported dlsym must reach
glibc's with the caller's return address intact. Disassembles `dlsym` in
libemm.so and checks that it forwards with an indirect jump and that no
call comes before the first one (the only call allowed is the first-use
lookup of glibc's dlsym, which sits after the fast-path jump and is itself
followed by a jump). test-rtld-next checks the behaviour.
"""
import platform
import re
import subprocess
import sys


def main():
    objdump, lib = sys.argv[1], sys.argv[2]
    if platform.machine() not in ("x86_64", "aarch64"):
        # Elsewhere dlsym is C relying on a sibling call; test-rtld-next
        # checks the behaviour.
        print("0 passed, 0 failed, 1 skipped")
        return 77
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", "--disassemble=dlsym", lib],
                         capture_output=True, text=True, check=True).stdout
    body = out.split("<dlsym>:", 1)
    failures = []
    if len(body) < 2:
        failures.append("no dlsym in the disassembly")
        insns = []
    else:
        insns = [l.split("\t", 1)[1].strip() for l in body[1].splitlines() if re.match(r"\s+[0-9a-f]+:\t", l)]
    print("\n".join(insns))
    indirect = [i for i, s in enumerate(insns) if re.match(r"(jmp\s+\*|br\s+x)", s)]
    calls = [i for i, s in enumerate(insns) if re.match(r"(call|bl)\s", s)]
    if not indirect:
        failures.append("no indirect jump to glibc's dlsym")
    else:
        if any(c < indirect[0] for c in calls):
            failures.append("a call precedes the forwarding jump")
        if any(re.match(r"ret\b", s) for s in insns):
            failures.append("dlsym returns itself (it called glibc's instead of jumping)")
        for c in calls:
            rest = insns[c + 1:]
            if not any(re.match(r"(jmp\s+\*|br\s+x)", s) for s in rest):
                failures.append(f"call at instruction {c} is not followed by a forwarding jump")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed, 0 skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
