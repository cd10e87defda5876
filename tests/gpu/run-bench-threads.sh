#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# tests/gpu/run-bench-threads.sh - the thread-scaling benchmark of project
# issue 11 in one run: tests/gpu/bench-threads (every thread keeps 64 live
# buffers of 256 B - 8 MiB and replaces one per iteration) for 1, 2, 4, 8,
# 16 threads, in ROUNDS (3) interleaved rounds of
#
#   emm        libemm, cudaMalloc/cudaFree with EMM_THREAD_CACHE=1
#   emm-notc   libemm with EMM_THREAD_CACHE=0 (the default: the shared
#              arenas alone)
#   emm-inline the same, its random numbers drawn inside the timed loop
#              (bench-threads --inline-rng: the loop up to RESULTS.md
#              section 37; the others draw them before it)
#   emm-async  libemm, cudaMallocAsync/cudaFreeAsync on per-thread
#              non-blocking streams
#   cuda-async no libemm: cudaMallocAsync on CUDA's default pool (kept),
#              per-thread non-blocking streams
#
# then one Markdown table of million pairs per second (all threads), each
# cell the rounds' values and their median, and the ratios the issue sets
# targets for (16 threads / 1 thread; libemm / CUDA's pool at 16 threads).
#
# usage: tests/gpu/run-bench-threads.sh [BUILDDIR]   (build-gpu by default)
#   ROUNDS, ITERS (1000000), THREADS (1,2,4,8,16) override. CUDA's pool runs
#   ITERS/50 iterations (it is 100-200x slower on many threads); rates are
#   per second, so the counts compare. Each thread warms up for a tenth of
#   its iterations first (bench-threads). 50000 iterations and 256 warm-up
#   pairs measured the arenas' growth (backend allocations, serialised in
#   the driver): 16 threads made 16.7 M pairs/s there, 24.0 at 300000 and
#   29.4 at 3 M (tests/bench/RESULTS.md section 33, runs E1, E3, E5).
# Exit: 0, 1 if a run failed, 77 without a GPU.
set -u

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build-gpu}
bench=$build/tests/gpu/bench-threads
lib=$(cd "$build" && pwd)/libemm.so
rounds=${ROUNDS:-3}
iters=${ITERS:-1000000}
threads=${THREADS:-1,2,4,8,16}

[ -x "$bench" ] || { echo "run-bench-threads: $bench not found (-Dgpu_tests=enabled)" >&2; exit 1; }
"$bench" --iters 10 --threads 1 --api malloc >/dev/null 2>&1
rc=$?
[ "$rc" = 77 ] && { echo "run-bench-threads: no GPU: skipped"; exit 77; }
[ "$rc" = 0 ] || { echo "run-bench-threads: bench-threads failed ($rc)" >&2; exit 1; }

tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
failed=0
for r in $(seq 1 "$rounds"); do
	for v in emm emm-notc emm-inline emm-async cuda-async; do
		case $v in
		emm) cmd=(env LD_PRELOAD="$lib" EMM_THREAD_CACHE=1 "$bench" --api malloc) ;;
		emm-notc) cmd=(env LD_PRELOAD="$lib" EMM_THREAD_CACHE=0 "$bench" --api malloc) ;;
		emm-inline) cmd=(env LD_PRELOAD="$lib" EMM_THREAD_CACHE=0 "$bench" --api malloc --inline-rng) ;;
		emm-async) cmd=(env LD_PRELOAD="$lib" "$bench" --api async) ;;
		cuda-async) cmd=(env -u LD_PRELOAD "$bench" --api async) ;;
		esac
		n=$iters
		[ $v = cuda-async ] && n=$(( iters / 50 > 0 ? iters / 50 : 1 ))
		# One process per thread count: threads take arenas round-robin
		# for the life of a process, so a count run after others would
		# start on the arenas (and the idle memory) they left behind.
		for t in ${threads//,/ }; do
			out=$("${cmd[@]}" --iters "$n" --threads "$t") || { failed=1; echo "$v round $r failed" >&2; }
			# THREADS <emm|raw> <malloc|async> <threads> <Mpairs/s> <median ns>
			printf '%s\n' "$out" | awk -v v="$v" '$1 == "THREADS" { print v, $4, $5 }' >>"$tmp"
		done
	done
done

echo "bench-threads: $rounds interleaved rounds, $iters iterations per thread (CUDA's pool $(( iters / 50 > 0 ? iters / 50 : 1 ))), $(nvidia-smi -L 2>/dev/null | head -1)"
echo
echo "| threads | libemm cudaMalloc, EMM_THREAD_CACHE=1 | libemm cudaMalloc, EMM_THREAD_CACHE=0 (default) | libemm cudaMallocAsync | CUDA pool cudaMallocAsync | default, random numbers in the timed loop |"
echo "|---|---|---|---|---|---|"
awk '
function median(s,   a, n, i, j, t) {
	n = split(s, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n ? a[int((n + 1) / 2)] : ""
}
{ v[$1 SUBSEP $2] = v[$1 SUBSEP $2] (v[$1 SUBSEP $2] == "" ? "" : " ") $3; seen[$2] = 1 }
END {
	nv = split("emm emm-notc emm-async cuda-async emm-inline", names, " ")
	n = 0; for (t in seen) ts[++n] = t + 0
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (ts[j] < ts[i]) { x = ts[i]; ts[i] = ts[j]; ts[j] = x }
	for (i = 1; i <= n; i++) {
		line = "| " ts[i]
		for (k = 1; k <= nv; k++) {
			s = v[names[k] SUBSEP ts[i]]
			m[k, ts[i]] = median(s)
			line = line " | " s " (median " m[k, ts[i]] ")"
		}
		print line " |"
	}
	lo = ts[1]; hi = ts[n]
	if (m[2, lo] > 0 && m[4, hi] > 0)
		printf "\nlibemm cudaMalloc, defaults (cache off): %d threads / %d thread = %.2fx (target >= 8x); vs CUDA pool at %d threads = %.1fx (target >= 20x)\n",
		       hi, lo, m[2, hi] / m[2, lo], hi, m[2, hi] / m[4, hi]
	if (m[1, lo] > 0 && m[4, hi] > 0)
		printf "libemm cudaMalloc, EMM_THREAD_CACHE=1: %d threads / %d thread = %.2fx; vs CUDA pool at %d threads = %.1fx; cache on/off at %d threads = %.2fx\n",
		       hi, lo, m[1, hi] / m[1, lo], hi, m[1, hi] / m[4, hi], hi, (m[2, hi] > 0 ? m[1, hi] / m[2, hi] : 0)
	if (m[2, lo] > 0 && m[5, lo] > 0)
		printf "%d thread, defaults: %.1f ns a pair (target <= 150); %.1f ns with the random numbers drawn in the timed loop\n",
		       lo, 1000 / (m[2, lo] / lo), 1000 / (m[5, lo] / lo)
}' "$tmp"
exit $failed
