#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/race/run-test.sh - how meson runs each program of the race suite
# (meson 1.0's test() cannot run a custom target's output directly).
#
#   run-test.sh [--compare-disabled] PROGRAM [ARGS...]
#
# A program that links libcuda.so.1 directly (-lcuda) cannot even start
# without the driver (the loader fails with 127), so this exits 77 (skip)
# first; the others skip with 77 themselves. With --compare-disabled the
# program runs twice, as EMM_DISABLE=1 (libemm loaded but a pure
# pass-through: the driver's own answers) and as given (libemm on); both must
# pass and their "RC ..." lines (results the driver decides) must match.
set -u
compare=0
if [ "${1:-}" = "--compare-disabled" ]; then
	compare=1
	shift
fi
[ $# -ge 1 ] || { echo "usage: $0 [--compare-disabled] PROGRAM [ARGS...]" >&2; exit 2; }

if env -u LD_PRELOAD ldd "$1" 2>/dev/null | grep -q 'libcuda\.so\.1 => not found'; then
	echo "SKIP: libcuda.so.1 cannot be loaded (no NVIDIA driver)"
	exit 77
fi

if [ $compare -eq 0 ]; then
	exec "$@"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-race.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

EMM_DISABLE=1 "$@" >"$tmp/base.out" 2>&1
rc_base=$?
echo "=== EMM_DISABLE=1 (the driver's answers): exit $rc_base"
cat "$tmp/base.out"
[ $rc_base -eq 77 ] && exit 77

env -u EMM_DISABLE "$@" >"$tmp/emm.out" 2>&1
rc_emm=$?
echo "=== libemm: exit $rc_emm"
cat "$tmp/emm.out"
[ $rc_emm -eq 77 ] && exit 77

grep '^RC ' "$tmp/base.out" >"$tmp/base.rc"
grep '^RC ' "$tmp/emm.out" >"$tmp/emm.rc"
status=0
if ! cmp -s "$tmp/base.rc" "$tmp/emm.rc"; then
	echo "FAIL: libemm's results differ from the driver's (- EMM_DISABLE=1, + libemm):"
	diff -u "$tmp/base.rc" "$tmp/emm.rc" | tail -n +3
	status=1
fi
if [ ! -s "$tmp/emm.rc" ]; then
	echo "FAIL: no RC lines to compare"
	status=1
fi
[ $rc_base -eq 0 ] || { echo "FAIL: the EMM_DISABLE=1 run failed (exit $rc_base)"; status=1; }
[ $rc_emm -eq 0 ] || { echo "FAIL: the libemm run failed (exit $rc_emm)"; status=1; }
[ $status -eq 0 ] && echo "ok: both runs passed and the driver's results match"
exit $status
