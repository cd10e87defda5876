#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/bench/run-jax.sh - JAX training steps/s and NVML peak device memory
# for three allocators, interleaved ROUNDS times (machines vary by up to
# 1.5x between runs: compare within one run only):
#   bfc        XLA's BFC allocator, XLA_PYTHON_CLIENT_PREALLOCATE=false
#   platform   XLA_PYTHON_CLIENT_ALLOCATOR=platform (a VMM buffer per op)
#   platform+emm   the same under LD_PRELOAD=libemm.so (EMM_STATS=1)
#
#   platform+emm-free   (FREE_STREAM=1 only) the same with EMM_FREE_MODE=stream:
#                  no fence event at a cached VMM free (libemm's fence cost)
#
#   tests/bench/run-jax.sh [LIBEMM.so] [SECONDS] [ROUNDS]
#
# Defaults: build/libemm.so, 20 s of steps after the warm-up, 3 rounds.
# The model and loop are tests/gpu/py_jax_vmm.py's (--bench SECONDS).
# Per variant also its "emm-step:" line: under libemm, the timed steps'
# VMM allocations per step and the share libemm's cache served (libemm's
# host time per step = that x the VMM row of tests/gpu/run-bench-paths.sh);
# the same process's steps/s with and without libemm bound what XLA's own
# work per buffer costs (tests/bench/JAX-PLATFORM.md).
set -u
here=$(cd "$(dirname "$0")" && pwd)
lib=${1:-$here/../../build/libemm.so}
secs=${2:-20}
rounds=${3:-3}
script=$here/../gpu/py_jax_vmm.py
[ -f "$lib" ] || { echo "no $lib: build libemm first (scripts/test)" >&2; exit 2; }
python3 -c 'import jax' 2>/dev/null || { echo "SKIP: jax is not installed"; exit 77; }
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-jax.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# NVML used memory of GPU 0 sampled every 20 ms until the file $1 exists;
# prints the peak in MiB.
sampler='
import ctypes, os, sys, time
class M(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
n = ctypes.CDLL("libnvidia-ml.so.1"); n.nvmlInit_v2()
sys.path.insert(0, sys.argv[2]); from torch_train import nvml_index
d = ctypes.c_void_p(); n.nvmlDeviceGetHandleByIndex_v2(nvml_index(), ctypes.byref(d))
m = M(); peak = 0
while not os.path.exists(sys.argv[1]):
    n.nvmlDeviceGetMemoryInfo(d, ctypes.byref(m)); peak = max(peak, m.used); time.sleep(0.02)
print(peak >> 20)
'

run() { # NAME ENV...
	name=$1; shift
	rm -f "$tmp/done"
	python3 -c "$sampler" "$tmp/done" "$here" >"$tmp/peak" 2>/dev/null &
	spid=$!
	env "$@" XLA_PYTHON_CLIENT_PREALLOCATE=false python3 "$script" --bench "$secs" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	touch "$tmp/done"
	wait $spid
	rate=$(sed -n 's/^steps\/s \([0-9.]*\).*/\1/p' "$tmp/out")
	printf '%-17s round %d: %8s steps/s  NVML peak %6s MiB  (exit %d)\n' "$name" "$r" "${rate:-?}" \
		"$(cat "$tmp/peak" 2>/dev/null || echo '?')" "$rc"
	grep '^emm-step:' "$tmp/out" | sed 's/^/    /'
	case "$name" in platform+emm*) grep '^emm: VMM\|^emm: all' "$tmp/err" | sed 's/^/    /' ;; esac
	[ $rc -eq 0 ] || tail -5 "$tmp/err" | sed 's/^/    /'
}

r=1
while [ $r -le "$rounds" ]; do
	run bfc XLA_PYTHON_CLIENT_ALLOCATOR=default
	run platform XLA_PYTHON_CLIENT_ALLOCATOR=platform
	run platform+emm XLA_PYTHON_CLIENT_ALLOCATOR=platform LD_PRELOAD="$lib" EMM_STATS=1
	[ "${FREE_STREAM:-0}" = 1 ] &&
		run platform+emm-free XLA_PYTHON_CLIENT_ALLOCATOR=platform LD_PRELOAD="$lib" EMM_STATS=1 \
			EMM_FREE_MODE=stream
	r=$((r + 1))
done
