#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/bench/run-before-after.sh - the cached-pair cost of two versions of
# libemm in one run on a GPU machine, interleaved: host time per cached
# alloc+free pair through cudaMalloc (runtime fast path), cuMemAlloc and
# cudaMallocAsync (tests/gpu/bench-paths), and the allocator core
# (tests/bench/bench-core --quick), each variant ROUNDS times in turn.
#
#   tests/bench/run-before-after.sh BASE_SRC [ROUNDS]
#
# BASE_SRC is a source tree of the earlier version (git archive of its
# commit); it is built in ./build-base (release), this tree in ./build-rel
# (release, GPU programs on). Prints a Markdown table: the median over the
# rounds of each variant's median, and new/base. Exit 77 without a GPU.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
base_src="${1:?usage: run-before-after.sh BASE_SRC [ROUNDS]}"
rounds="${2:-3}"
iters="${BENCH_ITERS:-2000}"
base_src="$(cd "$base_src" && pwd)"

build() { # DIR SRC ARGS...
	local dir=$1 src=$2
	shift 2
	[ -f "$dir/build.ninja" ] || meson setup "$dir" "$src" --buildtype=release "$@" >/dev/null || exit 2
	ninja -C "$dir" >/dev/null || exit 2
}
build "$root/build-rel" "$root" -Dgpu_tests=enabled
build "$root/build-base" "$base_src" -Dgpu_tests=disabled

bench="$root/build-rel/tests/gpu/bench-paths"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
	for v in base new; do
		dir=$root/build-rel
		[ $v = base ] && dir=$root/build-base
		env -u EMM_DISABLE LD_PRELOAD="$dir/libemm.so" "$bench" --iters "$iters" --no-out >"$tmp/paths-$v-$r.txt" 2>&1
		rc=$?
		[ $rc -eq 77 ] && { echo "skip: no GPU"; exit 77; }
		[ $rc -ne 0 ] && { echo "bench-paths ($v, round $r) failed: $rc" >&2; cat "$tmp/paths-$v-$r.txt" >&2; exit 1; }
		"$dir/tests/bench/bench-core" --quick >"$tmp/core-$v-$r.txt" 2>&1 || exit 1
	done
done

echo "## Cached pair, before ($base_src) and after (this tree): median of $rounds interleaved rounds"
echo
echo "Host µs per cached alloc+free pair (tests/gpu/bench-paths, median of $iters each):"
echo
for v in base new; do
	for r in $(seq 1 "$rounds"); do
		awk -F'\t' -v v=$v '$1 == "BENCH" && $2 == "emm" { print v "\t" $3 "\t" $4 "\t" $5 }' "$tmp/paths-$v-$r.txt"
	done
done | python3 -c '
import sys, statistics, collections
d = collections.defaultdict(list)
for line in sys.stdin:
    v, api, size, us = line.split("\t")
    d[(int(api), int(size), v)].append(float(us))
names = {0: "cudaMalloc+cudaFree", 1: "cuMemAlloc+cuMemFree", 2: "cudaMallocAsync+cudaFreeAsync"}
def sname(s):
    return f"{s >> 20} MiB" if s >= 1 << 20 else f"{s >> 10} KiB" if s >= 1024 else f"{s} B"
print("| path | size | before | after | after/before |")
print("|---|---|---|---|---|")
for api, size in sorted({(a, s) for a, s, _ in d}):
    b = statistics.median(d[(api, size, "base")]) if d[(api, size, "base")] else float("nan")
    n = statistics.median(d[(api, size, "new")]) if d[(api, size, "new")] else float("nan")
    print(f"| {names.get(api, api)} | {sname(size)} | {b:.3f} | {n:.3f} | {n / b:.2f} |")
'
echo
echo "Allocator core (tests/bench/bench-core --quick), ns per pair, round 1 of each:"
for v in base new; do
	echo
	echo "$v:"
	echo
	grep -E '^\|' "$tmp/core-$v-1.txt"
done
