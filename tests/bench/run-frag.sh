#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/bench/run-frag.sh - the fragmentation benchmark (tests/bench/frag.cu,
# project issue 9) for several size pairs, each run raw (no libemm), under
# libemm with EMM_BACKEND=driver and with EMM_BACKEND=vmm, every run in its
# own process. Prints one Markdown table: GiB the program got in phase 1
# (fill with the small size), in phase 2 (after freeing every other block,
# fill with the big size) and their sum.
#
#   tests/bench/run-frag.sh [BUILD_DIR] [PAIRS...]
#
# BUILD_DIR defaults to ./build-rel (configured here, release, GPU programs
# on, if missing); PAIRS default to "7M:64M 512K:4M 48M:200M 64M:7M".
# ROUNDS=N repeats every run N times in turn (default 1) and reports the
# median. Exit 77 without a GPU.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build-rel}"
[ $# -gt 0 ] && shift
pairs=("$@")
[ ${#pairs[@]} -eq 0 ] && pairs=(7M:64M 512K:4M 48M:200M 64M:7M)
rounds="${ROUNDS:-1}"

if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$root" --buildtype=release -Dgpu_tests=enabled >/dev/null || exit 2
fi
ninja -C "$build" >/dev/null || exit 2
frag="$build/tests/bench/frag"
lib="$build/libemm.so"
[ -x "$frag" ] || { echo "run-frag: $frag not built (needs nvcc: -Dgpu_tests=enabled)"; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
variants=(raw driver vmm)

run() { # VARIANT SMALL BIG OUT
	local v=$1 small=$2 big=$3 out=$4
	case $v in
	raw) env -u LD_PRELOAD -u EMM_BACKEND "$frag" "$small" "$big" >"$out" 2>&1 ;;
	*) env LD_PRELOAD="$lib" EMM_BACKEND="$v" "$frag" "$small" "$big" >"$out" 2>&1 ;;
	esac
}

for r in $(seq 1 "$rounds"); do
	for pair in "${pairs[@]}"; do
		small=${pair%%:*} big=${pair##*:}
		for v in "${variants[@]}"; do
			out="$tmp/$pair-$v-$r.txt"
			run "$v" "$small" "$big" "$out"
			rc=$?
			[ $rc -eq 77 ] && { echo "skip: no GPU"; exit 77; }
			[ $rc -ne 0 ] && { echo "run-frag: $v $pair failed (exit $rc):"; tail -5 "$out"; }
		done
	done
done

# field FILE NAME: the value of NAME= on the RESULT line
field() { sed -n "s/.*RESULT.* $2=\([^ ]*\).*/\1/p" "$1" | head -1; }

echo "| sizes (fill, then) | variant | phase 1 GiB | phase 2 GiB | sum GiB | phase 1 s | phase 2 s |"
echo "|---|---|---|---|---|---|---|"
for pair in "${pairs[@]}"; do
	for v in "${variants[@]}"; do
		p1=() p2=() s1=() s2=()
		for r in $(seq 1 "$rounds"); do
			f="$tmp/$pair-$v-$r.txt"
			p1+=("$(field "$f" phase1_bytes)") p2+=("$(field "$f" phase2_bytes)")
			s1+=("$(field "$f" phase1_s)") s2+=("$(field "$f" phase2_s)")
		done
		python3 - "$pair" "$v" "${p1[*]}" "${p2[*]}" "${s1[*]}" "${s2[*]}" <<'PY'
import statistics, sys
pair, v, p1, p2, s1, s2 = sys.argv[1:]
def med(s):
    vals = [float(x) for x in s.split() if x]
    return statistics.median(vals) if vals else float('nan')
g = 1 << 30
a, b = med(p1) / g, med(p2) / g
print(f"| {pair.replace(':', ' then ')} | {v} | {a:.1f} | {b:.1f} | {a + b:.1f} | {med(s1):.1f} | {med(s2):.1f} |")
PY
	done
done
