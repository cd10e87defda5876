#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/fakecuda/check-exports.py NM FAKE_LIB HEADER [REAL_STUB]

The fake exports only driver names and the fakecuda_* control API: every
other name stays hidden. Each name that is not fakecuda_* must be one the
real driver exports too (checked against the toolkit's stub libcuda.so when
it is there), and every function fakecuda.h declares must be exported.
"""
import re
import subprocess
import sys


def exports(nm, path):
    out = subprocess.run([nm, '-D', '--defined-only', path], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def main():
    nm, fake_lib, header = sys.argv[1:4]
    stub = sys.argv[4] if len(sys.argv) > 4 else None
    names = exports(nm, fake_lib)
    control = {n for n in names if n.startswith('fakecuda_')}
    driver = names - control
    errors = []
    for n in sorted(driver):
        if not re.fullmatch(r'cu[A-Z]\w*', n):
            errors.append(f'exports {n}: neither a driver name nor fakecuda_*')
    try:
        real = exports(nm, stub) if stub else None
    except (OSError, subprocess.CalledProcessError):
        real = None
    if real is not None:
        for n in sorted(driver - real):
            errors.append(f'exports {n}: the real driver has no such symbol')
    declared = set(re.findall(r'FAKECUDA_API\s+[\w\s\*]+?\b(fakecuda_\w+)\s*\(',
                              open(header).read()))
    for n in sorted(declared - control):
        errors.append(f'fakecuda.h declares {n}, the library does not export it')
    for n in sorted(control - declared):
        errors.append(f'exports {n}, fakecuda.h does not declare it')
    for e in errors:
        print(e)
    print(f'{len(driver)} driver entry points, {len(control)} control functions'
          f'{", checked against " + stub if real is not None else " (no stub to compare with)"}')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
