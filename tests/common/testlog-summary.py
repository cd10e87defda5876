#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/common/testlog-summary.py - the counts scripts/test ends with.

Reads a manifest (tab-separated, one pass per line) that scripts/test writes:

    run     LABEL  LOG.json  MESON_RC  SPLIT  NOTE
    notrun  LABEL  TESTS.json  SUITES  -  NOTE

`run`: meson's JSON test log of one `meson test` (one object per line: name,
result, stdout, stderr, ...), the exit status of that `meson test`, flags
(comma-separated: "split" gives one row per suite; "nogpu" says the machine
has no GPU, so a test that passes there instead of skipping is a failure)
and a note for the table. `notrun`: the tests of
`meson introspect --tests` (TESTS.json) in any of the comma-separated SUITES,
counted as skipped without being run (NOTE says why).

Results: OK and EXPECTEDFAIL pass; SKIP is skipped; anything else (FAIL,
TIMEOUT, UNEXPECTEDPASS, ERROR, ...) failed. A passed test whose output has
an "EMM-PARTIAL: ran R, skipped S (...)" line (tests/common/README.md) is
listed as partial, as is one that printed "N passed, 0 failed, S skipped"
with S > 0 but no such line. A `meson test` that failed without a failed
test in its log (a build error, a missing log) counts as one failure.

Prints a table per pass, the partial and failed tests, a line
"ran N of M tests (N partial)" and last "N passed, N failed, N skipped".
Exit 1 if anything failed.
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlog import MARKER, PASSED, read_log, split_name  # noqa: E402

SKIPPED = ("SKIP",)
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed, (\d+) skipped\s*$", re.M)


def partial_text(t):
    text = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
    marks = MARKER.findall(text)
    if marks:
        return " | ".join(m.strip() for m in marks)
    for m in SUMMARY.finditer(text):
        if int(m.group(1)) > 0 and int(m.group(3)) > 0:
            return "(no EMM-PARTIAL line) " + m.group(0).strip()
    return None


class Row:
    def __init__(self, label, note=""):
        self.label, self.note = label, note
        self.passed = self.partial = self.failed = self.skipped = 0

    @property
    def total(self):
        return self.passed + self.failed + self.skipped


def main():
    if len(sys.argv) != 2:
        print("usage: testlog-summary.py MANIFEST", file=sys.stderr)
        return 2
    rows, partials, failures = [], [], []
    with open(sys.argv[1]) as f:
        manifest = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    for fields in manifest:
        kind, label, path, arg, flags = fields[:5]
        flags = flags.split(",")
        note = fields[5] if len(fields) > 5 else ""
        if kind == "notrun":
            suites = set(arg.split(","))
            try:
                tests = json.load(open(path))
            except (OSError, ValueError):
                tests = []
            row = Row(label, note)
            for t in tests:
                if any(s.split(":", 1)[-1] in suites for s in t.get("suite", [])):
                    row.skipped += 1
            rows.append((row, []))
            continue
        tests = read_log(path)
        row = Row(label, note)
        sub = {}
        missing = tests is None
        if missing:
            tests = []
            row.failed += 1
            row.note = (note + "; " if note else "") + "no test log"
            failures.append("%s: no test log at %s (meson test exited %s)" % (label, path, arg))
        for t in tests:
            res = t.get("result", "?")
            suite, name = split_name(t.get("name", "?"))
            if "nogpu" in flags and res in PASSED:
                res = "PASSED WITHOUT A GPU (a GPU test must exit 77 here)"
            srow = sub.setdefault(suite, Row("  suite " + suite))
            for r in (row, srow):
                if res in PASSED:
                    r.passed += 1
                elif res in SKIPPED:
                    r.skipped += 1
                else:
                    r.failed += 1
            if res in PASSED:
                text = partial_text(t)
                if text:
                    row.partial += 1
                    srow.partial += 1
                    partials.append("%s / %s: %s" % (label, name, text))
            elif res not in SKIPPED:
                failures.append("%s / %s: %s" % (label, name, res))
        if not missing and arg not in ("", "0") and row.failed == 0:
            row.failed += 1
            failures.append("%s: meson test exited %s without a failed test (build or setup error?)"
                            % (label, arg))
        rows.append((row, [sub[s] for s in sorted(sub)] if "split" in flags and len(sub) > 1 else []))

    print("\n==== scripts/test summary ====")
    print("%-14s %6s %7s %8s %7s %8s" % ("pass", "tests", "passed", "partial", "failed", "skipped"))
    total = Row("total")
    for row, subs in rows:
        for r in [row] + subs:
            print("%-14s %6d %7d %8d %7d %8d%s" % (r.label, r.total, r.passed, r.partial, r.failed, r.skipped,
                                                  ("   " + r.note) if r.note else ""))
        for k in ("passed", "partial", "failed", "skipped"):
            setattr(total, k, getattr(total, k) + getattr(row, k))
    if partials:
        print("\npartial (passed, some cases skipped):")
        for p in partials:
            print("  " + p)
    if failures:
        print("\nfailed:")
        for p in failures:
            print("  " + p)
    print()
    print("ran %d of %d tests (%d partial)" % (total.passed + total.failed, total.total, total.partial))
    print("%d passed, %d failed, %d skipped" % (total.passed, total.failed, total.skipped))
    return 1 if total.failed else 0


if __name__ == "__main__":
    sys.exit(main())
