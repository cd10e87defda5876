#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/run-suites-sanitized.sh - the GPU and race suites under
# compute-sanitizer's memcheck with libemm (issue 16): every test runs once
# as usual and once wrapped in `compute-sanitizer --tool memcheck`; prints
# the wall time of both passes, each test whose result changed, and each
# test for which memcheck reported errors (with the report's first lines),
# so that they can be compared with the same program run without libemm.
#
#   tests/gpu/run-suites-sanitized.sh [BUILDDIR]
#
# BUILDDIR defaults to build-gpu; SUITES (default "gpu race") picks the
# suites, e.g. SUITES=race to fit one pass in a time limit; MEMCHECK_LIMIT
# (seconds) or MEMCHECK_UNTIL (epoch seconds) cuts the memcheck pass short; TESTS (test names, space-separated)
# runs those tests instead of whole suites; PLAIN=reuse skips the plain pass
# when an earlier call's log is there. Exit 77 without compute-sanitizer, 0
# otherwise (the report is the result).
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-gpu}
cs="${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}"
[ -x "$cs" ] || { echo "skip: compute-sanitizer not found (set COMPUTE_SANITIZER)"; exit 77; }

suites=()
if [ -n "${TESTS:-}" ]; then
	read -r -a suites <<<"$TESTS"
else
	for s in ${SUITES:-gpu race}; do suites+=(--suite "$s"); done
fi
t0=$(date +%s)
mkdir -p "$build/meson-logs"
# PLAIN=reuse keeps the plain pass of an earlier call (its meson log) and
# runs only the memcheck pass: the race suite's plain pass alone takes
# minutes (its tests run one at a time).
if [ "${PLAIN:-}" = reuse ] && [ -f "$build/meson-logs/plain.json" ]; then
	echo "plain pass reused from $build/meson-logs/plain.json"
else
	rm -f "$build/meson-logs/plain.json"
	meson test -C "$build" "${suites[@]}" --logbase plain >"$build/meson-logs/plain-out.txt" 2>&1
fi
t1=$(date +%s)
if [ ! -f "$build/meson-logs/plain.json" ]; then
	echo "run-suites-sanitized: the plain pass wrote no log; meson said:" >&2
	tail -20 "$build/meson-logs/plain-out.txt" >&2
	exit 1
fi
# MEMCHECK_LIMIT (seconds, default none) stops the memcheck pass, or
# MEMCHECK_UNTIL (a time in seconds since the epoch) does, whatever the
# plain pass took; meson's log holds the tests that finished, and the
# report names the others.
limit=${MEMCHECK_LIMIT:-0}
if [ -n "${MEMCHECK_UNTIL:-}" ]; then
	limit=$((MEMCHECK_UNTIL - $(date +%s)))
	[ "$limit" -gt 10 ] || limit=10
fi
timeout "$limit" meson test -C "$build" "${suites[@]}" --logbase memcheck --timeout-multiplier 10 \
	--wrapper "$cs --tool memcheck" >/dev/null 2>&1
t2=$(date +%s)
echo "plain: $((t1 - t0)) s; under memcheck: $((t2 - t1)) s"
# meson names the wrapped pass's log after the wrapper: memcheck-<name>.json
memlog=$(ls -t "$build"/meson-logs/memcheck*.json | head -1)
python3 - "$build/meson-logs/plain.json" "$memlog" <<'PY'
import json, re, sys
def load(p):
    tests = {}
    for line in open(p):
        try:
            t = json.loads(line)
        except ValueError:  # the last line of a pass cut by MEMCHECK_LIMIT
            continue
        tests[t['name']] = t
    return tests
# "ERROR SUMMARY: N errors" per process; not the "M errors were not
# printed" line that follows it past the print limit (it was added in).
def summary(out):
    return [int(n) for n in re.findall(r'ERROR SUMMARY: (\d+) errors?\s*$', out, re.M)]
plain, mem = load(sys.argv[1]), load(sys.argv[2])
print(f'{len(mem)} of {len(plain)} tests ran under memcheck')
for name in sorted(set(plain) - set(mem)):
    print(f'{name}: not run under memcheck (time limit)')
clean = [n for n in sorted(mem) if mem[n]['result'] == plain.get(n, {}).get('result')
         and not any(summary(mem[n].get('stdout') or ''))]
print(f'{len(clean)} with the same result and no memcheck error')
for name in sorted(mem):
    t = mem[name]
    before = plain.get(name, {}).get('result', '?')
    if t['result'] != before:
        print(f'{name}: {before} -> {t["result"]} under memcheck')
    out = t.get('stdout') or ''
    errs = summary(out)
    if any(errs):
        print(f'{name}: memcheck reported {sum(errs)} errors')
        for line in [l for l in out.splitlines() if l.startswith('=========')][:6]:
            print('    ' + line)
PY
