#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/interpose/check-layers.py NM LAYER=ARCHIVE...

The layers call only downward. LAYER=ARCHIVE pairs are given bottom first
(common, config, allocator, process, interpose): every symbol an archive's
objects use from another of the archives must be defined in a layer below
it. A use of a layer above is a call up - a loop between folders - and
fails the check with the symbol, the file using it and the file defining it.
"""
import subprocess
import sys


def symbols(nm, archive):
    """(defined {symbol: object}, used [(object, symbol)])"""
    out = subprocess.run([nm, '-A', archive], check=True, capture_output=True, text=True).stdout
    defined, used = {}, []
    for line in out.splitlines():
        # "ARCHIVE:OBJECT:VALUE TYPE NAME" (VALUE blank for an undefined use)
        fields = line.split(':')
        if len(fields) < 3:
            continue
        obj = fields[-2].split('/')[-1]
        parts = fields[-1].split()
        if len(parts) == 2 and parts[0] == 'U':
            used.append((obj, parts[1]))
        elif len(parts) == 3 and parts[1] in 'TDBRC':
            defined[parts[2]] = obj
    return defined, used


def main():
    nm = sys.argv[1]
    layers = [arg.split('=', 1) for arg in sys.argv[2:]]
    tables = [(name, *symbols(nm, path)) for name, path in layers]
    errors = []
    for rank, (name, _, used) in enumerate(tables):
        for obj, sym in used:
            for other_rank, (other, defined, _) in enumerate(tables):
                if other_rank > rank and sym in defined:
                    errors.append(f'{name}/{obj} calls up into {other}/{defined[sym]}: {sym}')
    for e in errors:
        print(e)
    print(f'{len(layers)} layers, {sum(len(t[2]) for t in tables)} uses checked, {len(errors)} calls up')
    return 1 if errors else 0


if __name__ == '__main__':
    sys.exit(main())
