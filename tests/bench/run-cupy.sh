#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/bench/run-cupy.sh - CuPy's allocators against CuPy with its pool off
# under libemm (project issue 11: target 1.3x CuPy's pool), on one workload
# (tests/bench/cupy_bench.py: temporaries of changing sizes), interleaved
# ROUNDS times in one run: steps/s and NVML peak device memory, the median
# over the rounds, as one Markdown table.
#
#   tests/bench/run-cupy.sh [BUILDDIR] [ROUNDS] [STEPS]
#
# Variants, in this order in every round:
#   cupy-pool     CuPy's MemoryPool (its default)
#   cupy-async    CuPy's MemoryAsyncPool (cudaMallocAsync on CUDA's pool)
#   emm-nopool    set_allocator(None) under LD_PRELOAD=libemm.so
#   nopool        set_allocator(None) without libemm (every array a cudaMalloc)
# CUPY_VARIANTS overrides the list (names above); "emm-nopool+EMM_X=V+..."
# is emm-nopool with libemm settings of its own. CUPY_ALLOC_PAIRS=N adds
# what the allocator costs a step (cupy_bench.py --alloc-pairs N): a second
# table, with the most a free allocator could gain over CuPy's pool.
# Exit 77 without CuPy or a GPU.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-rel}
rounds=${2:-3}
steps=${3:-400}
lib=$(cd "$build" && pwd)/libemm.so
variants=${CUPY_VARIANTS:-cupy-pool cupy-async emm-nopool nopool}
[ -f "$lib" ] || { echo "no $lib: build libemm first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # NAME VARIANT ENV...
	local name=$1 variant=$2 err
	shift 2
	err="$tmp/err-${name//\//_}.txt" # a setting may name a path
	env -u LD_PRELOAD CUPY_BENCH_NAME="$name" "$@" python3 "$here/cupy_bench.py" "$variant" --steps "$steps" \
		${CUPY_ALLOC_PAIRS:+--alloc-pairs "$CUPY_ALLOC_PAIRS"} \
		>>"$tmp/out.txt" 2>"$err"
	local rc=$?
	if [ $rc -eq 77 ]; then
		cat "$err"
		exit 77
	fi
	[ $rc -eq 0 ] || { echo "variant $name failed ($rc):"; tail -20 "$err"; }
}

for r in $(seq 1 "$rounds"); do
	for v in $variants; do
		case $v in
		cupy-pool) run cupy-pool pool ;;
		cupy-async) run cupy-async async ;;
		emm-nopool) run emm-nopool nopool LD_PRELOAD="$lib" ;;
		emm-nopool+*)
			IFS=+ read -r -a extra <<<"${v#emm-nopool+}"
			run "$v" nopool LD_PRELOAD="$lib" "${extra[@]}" ;;
		nopool) run nopool nopool ;;
		*) echo "unknown variant '$v' (cupy-pool, cupy-async, emm-nopool, nopool)" >&2; exit 2 ;;
		esac
	done
done
cat "$tmp/out.txt" >&2
python3 "$here/bench_table.py" "$tmp/out.txt" CUPY cupy-pool checksum \
	"CuPy workload (tests/bench/cupy_bench.py, $steps steps), median of $rounds interleaved rounds:"
