#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Check that README.md's option table is exactly `emm-options --markdown`.

usage: check-readme-options.py [--update] EMM_OPTIONS [README]

The table sits between the lines `<!-- options:begin -->` and
`<!-- options:end -->`. With --update the table is written there instead
(the markers and an "Options" section are appended when README has none).
README defaults to the README.md at the top of the source tree.
"""
import argparse
import os
import subprocess
import sys

BEGIN = '<!-- options:begin -->'
END = '<!-- options:end -->'
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_README = os.path.normpath(os.path.join(HERE, '..', '..', 'README.md'))
UPDATE_HINT = 'python3 tests/config/check-readme-options.py --update build/config/emm-options'


def table_from(exe):
    out = subprocess.run([exe, '--markdown'], check=True, stdout=subprocess.PIPE, universal_newlines=True).stdout
    return out.rstrip('\n').split('\n')


def find_markers(lines):
    """(begin index, end index), or None when the markers are not there once each, in order."""
    begins = [i for i, l in enumerate(lines) if l.strip() == BEGIN]
    ends = [i for i, l in enumerate(lines) if l.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
        return None
    return begins[0], ends[0]


def update(readme, table):
    lines = open(readme).read().split('\n') if os.path.exists(readme) else []
    markers = find_markers(lines)
    if markers is None:
        if any(l.strip() in (BEGIN, END) for l in lines):
            return 'the markers in %s are not one %s followed by one %s: fix them by hand' % (readme, BEGIN, END)
        while lines and lines[-1] == '':
            lines.pop()
        lines += ['', '## Options', '', BEGIN, END, '']
        markers = find_markers(lines)
    b, e = markers
    lines[b + 1:e] = table
    with open(readme, 'w') as f:
        f.write('\n'.join(lines))
    return None


def check(readme, table):
    if not os.path.exists(readme):
        return '%s does not exist' % readme
    lines = open(readme).read().split('\n')
    markers = find_markers(lines)
    if markers is None:
        return '%s lacks one %s line followed by one %s line' % (readme, BEGIN, END)
    b, e = markers
    current = lines[b + 1:e]
    if current == table:
        return None
    diff = ['README.md\'s option table differs from `emm-options --markdown`:']
    for i in range(max(len(current), len(table))):
        have = current[i] if i < len(current) else '(missing)'
        want = table[i] if i < len(table) else '(extra line)'
        if have != want:
            diff += ['  README:       ' + have, '  emm-options:  ' + want]
    return '\n'.join(diff)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--update', action='store_true', help='write the table into README instead of checking')
    ap.add_argument('emm_options', help='the built emm-options program')
    ap.add_argument('readme', nargs='?', default=DEFAULT_README)
    args = ap.parse_args()

    table = table_from(args.emm_options)
    if args.update:
        err = update(args.readme, table)
        if err is None:
            print('wrote %d table lines into %s' % (len(table), args.readme))
    else:
        err = check(args.readme, table)
        if err is not None:
            err += '\nTo fix: run `%s` (from the source tree, after building)' % UPDATE_HINT
    if err is not None:
        print(err, file=sys.stderr)
        print('0 passed, 1 failed')
        return 1
    print('1 passed, 0 failed')
    return 0


if __name__ == '__main__':
    sys.exit(main())
