#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/bench/test-bench-scale.sh BENCH_SCALE - bench-scale prints one row
# per loop and thread count with a positive rate, one thread's ratio 1.00x,
# and refuses bad arguments with exit 2 and a usage line.
set -u
b=$1
fail=0
out=$("$b" --threads 1,2 --iters 20000 --rounds 1) || { echo "FAIL: exit $?"; exit 1; }
printf '%s\n' "$out"
rows=$(printf '%s\n' "$out" | grep -c '^| [ag].* | [12] | [0-9][0-9.]* | [0-9.]*x |$')
[ "$rows" = 4 ] || { echo "FAIL: $rows rows of 4"; fail=1; }
ones=$(printf '%s\n' "$out" | grep -c '| 1 | [0-9.]* | 1.00x |$')
[ "$ones" = 2 ] || { echo "FAIL: one thread's ratio is not 1.00x in both loops"; fail=1; }
if printf '%s\n' "$out" | grep -q '| 0.0 |'; then echo "FAIL: a zero rate"; fail=1; fi
for bad in "--threads 0" "--threads 1,x" "--iters 0" "--rounds 99" "--bogus 1" "--iters"; do
	# shellcheck disable=SC2086
	"$b" $bad >/dev/null 2>"${TMPDIR:-/tmp}/bs.$$"
	rc=$?
	if [ "$rc" != 2 ] || ! grep -q usage "${TMPDIR:-/tmp}/bs.$$"; then
		echo "FAIL: '$bad' exited $rc"
		fail=1
	fi
done
rm -f "${TMPDIR:-/tmp}/bs.$$"
[ $fail = 0 ] && echo "bench-scale: ok"
exit $fail
