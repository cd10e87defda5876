#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""libemm exports exactly the symbols its export lists name.

usage: check-exports.py NM LIBEMM EXPORT_LIST...

Compares the names of `nm -D --defined-only LIBEMM` (version tags dropped)
with the union of the lists (one name per line; blank lines and #
comments ignored). Any symbol exported but not listed, or listed but not
exported, fails; so does a name listed twice.
"""
import subprocess
import sys


def main():
    nm, lib, lists = sys.argv[1], sys.argv[2], sys.argv[3:]
    listed = {}
    failures = []
    for path in lists:
        with open(path) as f:
            for line in f:
                name = line.split("#", 1)[0].strip()
                if not name:
                    continue
                if name in listed:
                    failures.append(f"{name} listed twice ({listed[name]}, {path})")
                listed[name] = path
    out = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    exported = set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            exported.add(fields[2].split("@")[0])
    for name in sorted(exported - set(listed)):
        failures.append(f"exported but in no list: {name}")
    for name in sorted(set(listed) - exported):
        failures.append(f"listed in {listed[name]} but not exported: {name}")
    for f in failures:
        print("FAIL:", f, file=sys.stderr)
    print(f"{len(exported)} exported, {len(listed)} listed")
    print(f"{0 if failures else 1} passed, {1 if failures else 0} failed, 0 skipped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
