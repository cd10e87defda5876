#!/usr/bin/env bash
# tests/bench/run-shims.sh [BUILD_DIR] - the CPU hot-path benchmark
# (bench-shims.c) through libemm's shims over the test-double driver (and
# the test-double shared cudart for the runtime APIs):
#   1. throughput (M pairs/s) and driver calls per pair, working set and
#      LIFO, sync and async, 1/2/4 threads (more if the host has the cores),
#      and cudaMalloc/cudaMallocAsync through the runtime shims (rt,
#      rt-async) and, EMM_RUNTIME_SHIMS=0, through cudart to the driver shims;
#      and what an epoch close costs (EMM_EPOCH_BLOCKS=1: one per free) with
#      0 and 16 idle non-blocking streams; and one XLA platform-allocator
#      buffer (--api vmm) from the VMM cache with 0 and XLA's 18 non-blocking
#      streams, and with EMM_FREE_MODE=stream (no fence);
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
export LD_LIBRARY_PATH="$build/tests/fakecuda:$build/tests/interpose/fakecudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
threads="${THREADS:-1,2,4}"
for api in sync async rt rt-async; do
	"$exe" --pattern ws --api "$api" --threads "$threads" --pairs "${PAIRS:-200000}"
	"$exe" --pattern lifo --api "$api" --threads "$threads" --pairs "${PAIRS:-200000}"
done
EMM_RUNTIME_SHIMS=0 "$exe" --pattern lifo --api rt --threads "$threads" --pairs "${PAIRS:-200000}"
# Large requests: the allocation that misses while the open epoch holds 64 MiB
# (EMM_EPOCH_BYTES) closes it; with FAKECUDA_EVENT_DELAY=3 (an event completes
# at its third query, as a device's a few microseconds after the record) the
# closes spread over the blocks the heap grows to meanwhile.
for delay in 0 3; do
	for size in 16777216 67108864 268435456; do
		for api in sync rt async; do
			FAKECUDA_EVENT_DELAY=$delay "$exe" --pattern lifo --api "$api" --threads 1 --pairs 50000 \
				--size "$size" --nb-streams 1
		done
	done
done
# Epoch closes: every sync free closes one (EMM_EPOCH_BLOCKS=1), with no and
# with 16 idle non-blocking streams (each asked with cuStreamQuery).
for nb in 0 16; do
	EMM_EPOCH_BLOCKS=1 "$exe" --pattern lifo --api sync --threads 1 --pairs 50000 --nb-streams "$nb"
done
# XLA's platform-allocator buffer from the VMM cache (issue 10): each free
# asks every live non-blocking stream (cuStreamQuery) and records the legacy
# event, and an event only on a busy stream (none here: they are idle).
for nb in 0 18; do
	"$exe" --api vmm --threads 1 --pairs 100000 --size 2097152 --nb-streams "$nb"
done
EMM_FREE_MODE=stream "$exe" --api vmm --threads 1 --pairs 100000 --size 2097152 --nb-streams 18
command -v valgrind >/dev/null || { echo "no valgrind: instructions per pair not measured"; exit 0; }
irs() { # PATTERN API PAIRS [ARGS...] -> "total libemm" instructions (libemm: its own functions)
	local out="$(mktemp)" pattern="$1" api="$2" pairs="$3"
	shift 3
	valgrind --tool=callgrind --callgrind-out-file="$out" "$exe" --pattern "$pattern" --api "$api" \
		--threads 1 --pairs "$pairs" "$@" >/dev/null 2>&1
	local total="$(awk '/^summary:/ { print $2 }' "$out")"
	local own="$(callgrind_annotate --inclusive=no --threshold=100 "$out" 2>/dev/null |
		awk '/libemm\.so/ { gsub(",", "", $1); s += $1 } END { print s + 0 }')"
	echo "$total $own"
	rm -f "$out"
}
for api in sync async rt rt-async; do
	for pattern in ws lifo; do
		read -r a ao < <(irs "$pattern" "$api" 20000)
		read -r b bo < <(irs "$pattern" "$api" 60000)
		echo "callgrind $pattern $api: $(( (b - a) / 40000 )) instructions per pair," \
			"$(( (bo - ao) / 40000 )) of them in libemm (1 thread; the rest: fake driver, libc)"
	done
done
read -r a ao < <(EMM_RUNTIME_SHIMS=0 irs lifo rt 20000)
read -r b bo < <(EMM_RUNTIME_SHIMS=0 irs lifo rt 60000)
echo "callgrind lifo rt, EMM_RUNTIME_SHIMS=0: $(( (b - a) / 40000 )) instructions per pair," \
	"$(( (bo - ao) / 40000 )) of them in libemm"
for size in 16777216 67108864; do
	for api in sync rt; do
		read -r a ao < <(irs lifo "$api" 2000 --size "$size" --nb-streams 1)
		read -r b bo < <(irs lifo "$api" 6000 --size "$size" --nb-streams 1)
		echo "callgrind lifo $api $size B, 1 idle non-blocking stream: $(( (b - a) / 4000 ))" \
			"instructions per pair, $(( (bo - ao) / 4000 )) of them in libemm"
	done
done
for nb in 0 16; do
	read -r a ao < <(EMM_EPOCH_BLOCKS=1 irs lifo sync 2000 --nb-streams "$nb")
	read -r b bo < <(EMM_EPOCH_BLOCKS=1 irs lifo sync 6000 --nb-streams "$nb")
	echo "callgrind lifo sync, EMM_EPOCH_BLOCKS=1 (an epoch per free), $nb idle non-blocking streams:" \
		"$(( (b - a) / 4000 )) instructions per pair, $(( (bo - ao) / 4000 )) of them in libemm"
done
for nb in 0 18; do
	read -r a ao < <(irs lifo vmm 2000 --size 2097152 --nb-streams "$nb")
	read -r b bo < <(irs lifo vmm 6000 --size 2097152 --nb-streams "$nb")
	echo "callgrind vmm (XLA's buffer from the VMM cache), $nb idle non-blocking streams:" \
		"$(( (b - a) / 4000 )) instructions per buffer, $(( (bo - ao) / 4000 )) of them in libemm"
done
