#!/usr/bin/env bash
# tests/bench/run-shims.sh [BUILD_DIR] - the CPU hot-path benchmark
# (bench-shims.c) through libemm's shims over the test-double driver:
#   1. throughput (M pairs/s) and driver calls per pair, working set and
#      LIFO, sync and async, 1/2/4 threads (more if the host has the cores);
#   2. instructions per pair under callgrind (1 thread), in all and in
#      libemm.so itself: the difference of
#      two runs of different lengths over the difference of their pairs,
#      so start-up and the working set's fill cancel out. Repeatable.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
exe="$build/tests/bench/bench-shims"
[ -x "$exe" ] || { echo "no $exe: meson setup with -Dbench=true and build" >&2; exit 1; }
export LD_PRELOAD="$build/libemm.so"
export LD_LIBRARY_PATH="$build/tests/fakecuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
threads="${THREADS:-1,2,4}"
for api in sync async; do
	"$exe" --pattern ws --api "$api" --threads "$threads" --pairs "${PAIRS:-200000}"
	"$exe" --pattern lifo --api "$api" --threads "$threads" --pairs "${PAIRS:-200000}"
done
command -v valgrind >/dev/null || { echo "no valgrind: instructions per pair not measured"; exit 0; }
irs() { # PATTERN API PAIRS -> "total libemm" instructions (libemm: its own functions)
	local out="$(mktemp)"
	valgrind --tool=callgrind --callgrind-out-file="$out" "$exe" --pattern "$1" --api "$2" \
		--threads 1 --pairs "$3" >/dev/null 2>&1
	local total="$(awk '/^summary:/ { print $2 }' "$out")"
	local own="$(callgrind_annotate --inclusive=no --threshold=100 "$out" 2>/dev/null |
		awk '/libemm\.so/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')"
	echo "$total $own"
	rm -f "$out"
}
for api in sync async; do
	for pattern in ws lifo; do
		read -r a ao < <(irs "$pattern" "$api" 20000)
		read -r b bo < <(irs "$pattern" "$api" 60000)
		echo "callgrind $pattern $api: $(( (b - a) / 40000 )) instructions per pair," \
			"$(( (bo - ao) / 40000 )) of them in libemm (1 thread; the rest: fake driver, libc)"
	done
done
