#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/race/run-free-latency.sh - cudaFree latency while a 50 ms kernel runs
# on a non-blocking stream, with and without libemm, side by side.
#
#   tests/race/run-free-latency.sh [BUILD_DIR] [free-latency args...]
#
# BUILD_DIR (default: ./build) holds libemm.so and tests/race/free-latency.
# Prints the two medians (and the strict mode's, which must wait like the
# real free). Exits 77 without a GPU, 1 if a run failed.
set -u
build=${1:-build}
[ $# -gt 0 ] && shift
prog="$build/tests/race/free-latency"
lib="$build/libemm.so"
for f in "$prog" "$lib"; do
	[ -e "$f" ] || { echo "run-free-latency: $f not found (build with -Dgpu_tests=enabled)" >&2; exit 1; }
done
case "$lib" in /*) ;; *) lib="$(pwd)/$lib" ;; esac

run() { # label, then the command; prints the median line
	label=$1
	shift
	out=$("$@" 2>&1)
	rc=$?
	if [ $rc -eq 77 ]; then
		echo "$out" | tail -n 1
		exit 77
	fi
	line=$(echo "$out" | grep 'kernel runs: median' | tail -n 1)
	printf '%-26s %s (exit %d)\n' "$label:" "${line:-no result}" "$rc"
	[ $rc -eq 0 ] || { echo "$out" | sed 's/^/    /'; status=1; }
}

status=0
run "without libemm" env -u LD_PRELOAD "$prog" --allow-no-emm "$@"
run "with libemm (fence)" env LD_PRELOAD="$lib" EMM_FREE_MODE=fence "$prog" "$@"
run "with libemm (strict)" env LD_PRELOAD="$lib" EMM_FREE_MODE=strict "$prog" "$@"
exit $status
