#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/gpu/run-bench-paths.sh - run tests/gpu/bench-paths in its modes and
# print one Markdown table of host time per cached alloc+free pair:
#
#   (a) libemm, cudaMalloc served by its runtime shim (shared cudart)
#   (b) libemm with EMM_RUNTIME_SHIMS=0: cudaMalloc through cudart to the
#       driver shim
#   (c) no libemm: the raw cudaMalloc and cuMemAlloc
#   (d) no libemm: cudaMallocAsync + cudaFreeAsync on CUDA's default pool
#       (release threshold raised, so the pool keeps its memory)
#
# plus libemm's cuMemAlloc_v2 and cudaMallocAsync paths, and each run's mode line (whether
# emm_stats_get was present, where cudaMalloc resolved); then a second table,
# the VMM path: host time per XLA platform-allocator buffer (cuMemCreate +
# cuMemAddressReserve + cuMemMap + cuMemSetAccess, then cuMemUnmap +
# cuMemRelease + cuMemAddressFree) at 2, 8 and 64 MiB, raw and from libemm's
# VMM cache (with the cache's hits of the timed sequences), alone, with the
# cuCtxSynchronize XLA makes before each unmap (its fixed cost on an idle
# device), and with XLA's 18 non-blocking streams alive (libemm asks each at
# a cached free, cuStreamQuery, and fences the busy ones). With $OUT set the whole report also goes to
# $OUT/bench-paths.md.
#
# usage: tests/gpu/run-bench-paths.sh [BUILDDIR]
#   BUILDDIR defaults to build-gpu in the source tree; BENCH=path and
#   EMM_LIB=path override the binary and the library; BENCH_ITERS (2000).
# Exit: 0, 1 if a run failed, 77 if there is no GPU or driver here.
set -u

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-gpu}
bench=${BENCH:-$build/tests/gpu/bench-paths}
lib=${EMM_LIB:-$build/libemm.so}
iters=${BENCH_ITERS:-2000}

if [ ! -x "$bench" ]; then
	echo "run-bench-paths: $bench not found (build with -Dgpu_tests=enabled)" >&2
	exit 1
fi
if [ ! -e "$lib" ]; then
	echo "run-bench-paths: $lib not found" >&2
	exit 1
fi
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
missing=$(env -u LD_PRELOAD ldd "$bench" 2>/dev/null | awk '/=> not found/ {print $1}' | tr '\n' ' ')
if [ -n "$missing" ]; then
	echo "skip: bench-paths needs ${missing}which is not installed here"
	exit 77
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0

# run LABEL ENV... : one mode; its output in $tmp/LABEL.txt
run() {
	local label=$1 rc
	shift
	echo "== bench-paths: $label" >&2
	env -u LD_PRELOAD -u EMM_RUNTIME_SHIMS -u EMM_DISABLE "$@" "$bench" --iters "$iters" --no-out \
		>"$tmp/$label.txt" 2>&1
	rc=$?
	cat "$tmp/$label.txt" >&2
	if [ "$rc" -eq 77 ]; then
		echo "skip: no GPU (bench-paths exited 77)"
		exit 77
	fi
	if [ "$rc" -ne 0 ]; then
		echo "run-bench-paths: mode $label FAILED (exit $rc)" >&2
		failed=1
	fi
}

run emm LD_PRELOAD="$lib"
run noshims LD_PRELOAD="$lib" EMM_RUNTIME_SHIMS=0
run raw

report=$tmp/report.md
{
	echo "## Host time per cached alloc+free pair (µs, median of $iters after warm-up)"
	echo
	for label in emm noshims raw; do
		grep -E '^bench-paths mode:' "$tmp/$label.txt" | sed 's/^/- /'
		grep -E '^  (cudaMalloc|cuMemAlloc_v2) resolves in' "$tmp/$label.txt" | sed 's/^  /  - /'
	done
	echo
	awk -F'\t' '
	$1 == "BENCH" && $3 < 3 { t[$2 "," $3 "," $4] = ($8 == 1) ? sprintf("%.2f", $5) : "FAILED"; v[$2 "," $3 "," $4] = $5 + 0; sizes[$4] = 1 }
	function get(m, a, s) { k = m "," a "," s; return (k in t) ? t[k] : "n/a" }
	function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.1fx", x / y) : "n/a" }
	function sname(s) { return s >= 1048576 ? (s / 1048576) " MiB" : s >= 1024 ? (s / 1024) " KiB" : s " B" }
	END {
		print "| size | (a) cudaMalloc+cudaFree, libemm runtime shim | (b) same, EMM_RUNTIME_SHIMS=0 (driver shim) | libemm cuMemAlloc+cuMemFree | libemm cudaMallocAsync+cudaFreeAsync | (c) raw cudaMalloc+cudaFree | (c) raw cuMemAlloc+cuMemFree | (d) raw cudaMallocAsync+cudaFreeAsync, pool kept | raw / (a) | (a) / (d) |"
		print "|---|---|---|---|---|---|---|---|---|---|"
		n = asorti_num(sizes, order)
		for (i = 1; i <= n; i++) {
			s = order[i]
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sname(s),
				get("emm", 0, s), get("emm-noshims", 0, s), get("emm", 1, s), get("emm", 2, s),
				get("raw", 0, s), get("raw", 1, s), get("raw", 2, s),
				ratio(v["raw,0," s], v["emm,0," s]), ratio(v["emm,0," s], v["raw,2," s])
		}
	}
	# sizes in numeric order, without gawk extensions
	function asorti_num(src, dst,    k, n, i, j, tmpv) {
		n = 0
		for (k in src) dst[++n] = k + 0
		for (i = 2; i <= n; i++) {
			tmpv = dst[i]
			for (j = i - 1; j >= 1 && dst[j] > tmpv; j--) dst[j + 1] = dst[j]
			dst[j + 1] = tmpv
		}
		return n
	}' "$tmp/emm.txt" "$tmp/noshims.txt" "$tmp/raw.txt"
	echo
	echo "## Host time per XLA platform-allocator buffer, the VMM path (µs, median of $iters after warm-up)"
	echo
	echo "One buffer = cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess + cuMemUnmap +"
	echo "cuMemRelease + cuMemAddressFree, XLA's order and properties (bench-paths.cu). libemm: served"
	echo "by its VMM cache (hits = timed sequences the cache served). + sync: with XLA's cuCtxSynchronize"
	echo "before the unmap, on an idle device (its fixed cost only; in XLA it also waits for queued work)."
	echo "+ 18 streams: XLA's idle non-blocking streams alive (libemm asks each with cuStreamQuery at a"
	echo "cached free and records an event only on busy ones). libemm's host time per JAX step = VMM allocations"
	echo "per step (tests/bench/run-jax.sh) x column (e), the closer to XLA's process."
	echo
	awk -F'\t' '
	$1 == "BENCH" && $3 >= 3 { t[$2 "," $3 "," $4] = ($8 == 1) ? sprintf("%.2f", $5) : "FAILED"; v[$2 "," $3 "," $4] = $5 + 0
		h[$2 "," $3 "," $4] = $9 + 0; m[$2 "," $3 "," $4] = $10 + 0; sizes[$4] = 1 }
	function get(k) { return (k in t) ? t[k] : "n/a" }
	function hits(k) { return (k in t) ? sprintf("%d of %d", h[k], h[k] + m[k]) : "n/a" }
	function ratio(x, y) { return (x > 0 && y > 0) ? sprintf("%.1fx", x / y) : "n/a" }
	function sname(s) { return (s / 1048576) " MiB" }
	END {
		print "| size | (a) libemm, VMM cache | cache hits (a) | (b) raw driver | raw / libemm | (c) libemm + sync | (d) raw + sync | (e) libemm + 18 streams | cache hits (e) | (f) raw + 18 streams |"
		print "|---|---|---|---|---|---|---|---|---|---|"
		n = 0
		for (k in sizes) order[++n] = k + 0
		for (i = 2; i <= n; i++) { x = order[i]; for (j = i - 1; j >= 1 && order[j] > x; j--) order[j + 1] = order[j]; order[j + 1] = x }
		for (i = 1; i <= n; i++) {
			s = order[i]
			printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", sname(s), get("emm,3," s), hits("emm,3," s),
				get("raw,3," s), ratio(v["raw,3," s], v["emm,3," s]), get("emm,4," s), get("raw,4," s),
				get("emm,5," s), hits("emm,5," s), get("raw,5," s)
		}
	}' "$tmp/emm.txt" "$tmp/raw.txt"
	echo
	for label in emm noshims raw; do
		if ! grep -q "^bench-paths mode: ${label/noshims/emm-noshims} " "$tmp/$label.txt"; then
			echo "**WARNING**: the '$label' run reported mode: $(grep -E '^bench-paths mode:' "$tmp/$label.txt" | cut -d' ' -f3) (was libemm loaded as intended?)"
		fi
	done
	echo
	echo "<details><summary>per-mode output</summary>"
	echo
	for label in emm noshims raw; do
		echo '```'
		grep -v $'^BENCH\t' "$tmp/$label.txt"
		echo '```'
	done
	echo "</details>"
} >"$report"

cat "$report"
if [ -n "${OUT:-}" ]; then
	mkdir -p "$OUT" && cp "$report" "$OUT/bench-paths.md"
fi
exit "$failed"
