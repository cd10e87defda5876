#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/data/record-traces.sh - record the real traces for tests/data on a
# machine with an NVIDIA GPU, PyTorch and CuPy (run from the source root):
#
#   tests/data/record-traces.sh [BUILDDIR]      (default ./build-rel)
#
# 1. builds libemm (release) in BUILDDIR if needed;
# 2. tests/data/pytorch-train.csv: tests/bench/torch_train.py (a 6-layer
#    transformer, sequence length changing every step) with PyTorch's cache
#    off (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so every tensor is a cudaMalloc
#    that libemm serves and EMM_LOG records;
# 3. tests/data/cupy-pool-off.csv: a CuPy workload with CuPy's pools off
#    (set_allocator(None)), two threads, each on its own stream;
# 4. keeps each trace under 2 MB (fewer steps until it fits) and prints
#    emm-replay's report of each, to be committed with the traces.
#
# tests/data/pytorch-train-40.csv was not made here: it is the first 30 999
# events (under 2 MB, its peak included) of a 40-step run of the same loop,
# `EMM_LOG=... tests/bench/torch_train.py emm --steps 40` under the preload
# with caching off (tests/bench/RESULTS.md section 37, run I2).
#
# Needs: meson, ninja, python3 with torch (CUDA) and cupy. A missing one is
# skipped with a message; exit 1 if no trace was recorded.
set -uo pipefail
case "${1:-}" in
-h|--help) awk 'NR > 1 && /SPDX-License/ { next } NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
-*) echo "record-traces.sh: unknown option '$1' (--help)" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build-rel}"
data="$root/tests/data"
max_bytes=$((2 * 1024 * 1024))
recorded=0

if [ ! -f "$build/build.ninja" ]; then
	meson setup "$build" "$root" --buildtype=release -Dtests=false -Dbench=false || exit 1
fi
ninja -C "$build" || exit 1
lib="$build/libemm.so"
replay="$build/tools/emm-replay"

# record NAME STEPS COMMAND...: EMM_LOG of COMMAND (STEPS substituted for
# the word @STEPS@) into tests/data/NAME.csv, halving STEPS until < 2 MB.
record() {
	local name=$1 steps=$2 out="$data/$1.csv" size
	shift 2
	while [ "$steps" -ge 1 ]; do
		local cmd=()
		for a in "$@"; do cmd+=("${a//@STEPS@/$steps}"); done
		rm -f "$out"
		echo "record-traces: $name, $steps steps: ${cmd[*]}"
		if ! LD_PRELOAD="$lib" EMM_LOG="$out" EMM_STATS=1 "${cmd[@]}"; then
			echo "record-traces: $name failed; not recorded" >&2
			rm -f "$out"
			return 1
		fi
		size=$(wc -c <"$out")
		if [ "$size" -lt "$max_bytes" ]; then
			echo "record-traces: $out: $size bytes, $(($(wc -l <"$out") - 1)) events"
			"$replay" "$out" | sed 's/^/    /'
			recorded=$((recorded + 1))
			return 0
		fi
		echo "record-traces: $size bytes is over 2 MB: again with fewer steps"
		steps=$((steps / 2))
	done
	return 1
}

if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	PYTORCH_NO_CUDA_MEMORY_CACHING=1 record pytorch-train 16 \
		python3 "$root/tests/bench/torch_train.py" no-caching --steps @STEPS@ --seed 7
else
	echo "record-traces: no PyTorch with CUDA here: pytorch-train.csv not recorded" >&2
fi

if python3 -c 'import cupy; cupy.cuda.runtime.getDeviceCount()' 2>/dev/null; then
	cupy_prog="$(mktemp "${TMPDIR:-/tmp}/cupy-workload.XXXXXX.py")"
	cat >"$cupy_prog" <<'PY'
import sys
import threading
import cupy

cupy.cuda.set_allocator(None)  # CuPy's pools off: every array is a cudaMalloc
cupy.cuda.set_pinned_memory_allocator(None)
steps = int(sys.argv[1])


def work(seed):
    cupy.cuda.Device(0).use()
    rs = cupy.random.RandomState(seed)
    with cupy.cuda.Stream(non_blocking=True):
        for step in range(steps):
            n = 256 * (1 + (step * 7 + seed) % 9)  # sizes change every step
            a = rs.standard_normal((n, n), dtype=cupy.float32)
            b = rs.standard_normal((n, n), dtype=cupy.float32)
            c = a @ b + cupy.sin(a) * 2.0
            d = cupy.fft.rfft(c, axis=1)
            s = float(cupy.abs(d).sum() + c.mean())
            parts = [c[i::4].copy() for i in range(4)]
            del a, b, d, parts
            cupy.cuda.get_current_stream().synchronize()
    return s


threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("cupy workload done")
PY
	record cupy-pool-off 40 python3 "$cupy_prog" @STEPS@
	rm -f "$cupy_prog"
else
	echo "record-traces: no CuPy with a GPU here: cupy-pool-off.csv not recorded" >&2
fi

echo "record-traces: $recorded trace(s) recorded in $data"
[ "$recorded" -gt 0 ]
