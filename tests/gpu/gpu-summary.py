#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""tests/gpu/gpu-summary.py - the summary table scripts/gpu-check prints.

Reads meson's JSON test logs (one object per line, as written by
`meson test --logbase NAME`) and prints Markdown: per suite the counts of
passed, partial, failed and skipped tests (partial: passed with an
"EMM-PARTIAL: ran R, skipped S (...)" line, tests/common/README.md; listed
with that line), then one row per test of the suites named with --table, with
the numbers from its "emm-served:" line (what libemm's pool served for that
case) and the "ESCAPE:" lines of any path that did not reach libemm; last a
line "N passed, N failed, N skipped (N partial)" over every log.

    gpu-summary.py [--table SUITE]... [--compact SUITE]... LOG.json...
"""
import argparse
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from testlog import MARKER, PASSED, read_log, split_name  # noqa: E402

COLUMNS = ("made", "allocs", "pinned_allocs", "hits", "misses", "passthrough_allocs", "backend_allocs")
BAD = ("FAIL", "TIMEOUT", "ERROR", "UNEXPECTEDPASS")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", action="append", default=[], help="suite to list test by test")
    ap.add_argument("--compact", action="append", default=[],
                    help="suite to list only tests that failed or printed an emm-served line")
    ap.add_argument("logs", nargs="+")
    args = ap.parse_args()

    out = []
    rows = []
    escapes = []
    partials = []
    totals = {"passed": 0, "failed": 0, "skipped": 0, "partial": 0}
    for path in args.logs:
        tests = read_log(path) or []
        if not tests:
            continue
        label = os.path.basename(path).replace("-testlog.json", "")
        counts = {}
        failed = []
        npartial = 0
        for t in tests:
            res = t.get("result", "?")
            counts[res] = counts.get(res, 0) + 1
            suite, name = split_name(t.get("name", "?"))
            text = (t.get("stdout") or "") + "\n" + (t.get("stderr") or "")
            if res in PASSED:
                totals["passed"] += 1
                marks = MARKER.findall(text)
                if marks:
                    npartial += 1
                    partials.append("%s: %s" % (name, " | ".join(m.strip() for m in marks)))
            elif res == "SKIP":
                totals["skipped"] += 1
            else:
                totals["failed"] += 1
                failed.append(name)
            in_table = any(s in args.table for s in suite.split("+"))
            compact = any(s in args.compact for s in suite.split("+"))
            if in_table or compact:
                served = {}
                for line in text.splitlines():
                    if line.startswith("emm-served:"):
                        served = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
                esc = [line.strip() for line in text.splitlines() if "ESCAPE:" in line]
                escapes += ["%s: %s" % (name, re.sub(r"^.*?ESCAPE:", "ESCAPE:", e)) for e in esc]
                if in_table or served or esc or res in BAD:
                    rows.append((suite, name, res, t.get("duration", 0.0), served, len(esc)))
        totals["partial"] += npartial
        summary = ", ".join("%d %s" % (n, r.lower()) for r, n in sorted(counts.items()))
        if npartial:
            summary += " (%d of them partial)" % npartial
        out.append("- **%s**: %d tests: %s%s" % (label, len(tests), summary,
                                                  ("; failed: " + ", ".join(failed)) if failed else ""))

    print("## GPU check results\n")
    print("\n".join(out) if out else "- no test logs found")
    if rows:
        print("\n### Allocations libemm's pool served, per case\n")
        print("(`made`: allocations the test made and asserts were pooled; `allocs`: the pool's count "
              "for the whole process, including what cudart and the libraries allocated themselves)\n")
        print("| suite | test | result | s | " + " | ".join(COLUMNS) + " | escapes |")
        print("|---|---|---|---|" + "---|" * len(COLUMNS) + "---|")
        for suite, name, res, dur, served, nesc in rows:
            mark = "**%s**" % res if res in BAD else res
            cells = [served.get(c, "") for c in COLUMNS]
            if served.get("libemm") == "absent":
                cells[1] = "libemm absent"
            print("| %s | %s | %s | %.1f | %s | %s |" % (suite, name, mark, dur or 0.0, " | ".join(cells),
                                                        nesc or ""))
    if escapes:
        print("\n### Paths that escaped libemm\n")
        for e in escapes:
            print("- " + e)
    if partials:
        print("\n### Partial: passed with some cases skipped\n")
        for p in partials:
            print("- " + p)
    print("\n%d passed, %d failed, %d skipped (%d partial)" % (totals["passed"], totals["failed"],
                                                             totals["skipped"], totals["partial"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
