#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/run-bench-poison.sh - what EMM_POISON costs: host time per cached
# alloc+free pair (tests/gpu/bench-paths, libemm's paths only) with
# EMM_POISON unset and EMM_POISON=165, interleaved ROUNDS times on one
# machine, and the median of each row's medians:
#
#   tests/gpu/run-bench-poison.sh [BUILDDIR] [ROUNDS]
#
# BUILDDIR defaults to build-gpu; BENCH_ITERS (2000). The poisoned pair adds
# one cuMemsetD8Async per free (host time to enqueue it; the fill itself
# runs on the GPU in stream order). Exit 77 without a GPU.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-gpu}
rounds=${2:-3}
bench=$build/tests/gpu/bench-paths
lib=$build/libemm.so
iters=${BENCH_ITERS:-2000}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for r in $(seq 1 "$rounds"); do
	for v in off 165; do
		if [ $v = off ]; then
			env -u EMM_POISON LD_PRELOAD="$lib" "$bench" --iters "$iters" --no-out >"$tmp/$v-$r.txt" 2>&1
		else
			EMM_POISON=$v LD_PRELOAD="$lib" "$bench" --iters "$iters" --no-out >"$tmp/$v-$r.txt" 2>&1
		fi
		rc=$?
		[ $rc -eq 77 ] && { echo "skip: no GPU"; exit 77; }
		[ $rc -ne 0 ] && { echo "bench-paths failed ($v, round $r):"; cat "$tmp/$v-$r.txt"; exit 1; }
	done
done
# BENCH lines: BENCH<TAB>mode<TAB>path<TAB>size<TAB>median_us<TAB>p10<TAB>p90<TAB>ok
# (bench-paths.cu; path 0 cudaMalloc, 1 cuMemAlloc, 2 cudaMallocAsync)
echo "| path | size | EMM_POISON off (us) | EMM_POISON=165 (us) | ratio |"
echo "|---|---|---|---|---|"
cat "$tmp"/off-*.txt | grep '^BENCH' | cut -f3,4 | sort -u | while IFS=$'\t' read -r path size; do
	med() { grep -hP "^BENCH\t[^\t]*\t$path\t$size\t" "$tmp"/$1-*.txt | cut -f5 | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
	a=$(med off)
	b=$(med 165)
	awk -v p="$path" -v s="$size" -v a="$a" -v b="$b" \
		'BEGIN { printf "| %s | %s | %s | %s | %.2f |\n", p, s, a, b, (a > 0 ? b / a : 0) }'
done
