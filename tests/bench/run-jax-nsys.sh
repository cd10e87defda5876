#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/bench/run-jax-nsys.sh - which CUDA driver calls a JAX training step
# makes, per allocator (tests/bench/JAX-PLATFORM.md): the timed steps of
# tests/gpu/py_jax_vmm.py --bench run under Nsight Systems' CUDA trace, the
# capture limited to those steps (--profile-range: cuProfilerStart/Stop),
# and per variant a table of calls per step and host µs per step for the
# calls that matter here: host waits (cuCtxSynchronize, cuStreamSynchronize,
# cuEventSynchronize), the VMM family, XLA's per-allocation queries
# (cuMemGetAllocationGranularity, cuDeviceGet, context switches), libemm's
# fences (cuEventRecord, cuEventQuery) and the launches.
#
#   bfc            XLA's BFC allocator
#   platform       XLA_PYTHON_CLIENT_ALLOCATOR=platform
#   platform+emm   the same under libemm: only the calls its cache did not
#                  answer reach the driver, so what is left is XLA's own
#                  (the syncs) plus libemm's (its fence events)
#
#   tests/bench/run-jax-nsys.sh [LIBEMM.so] [SECONDS]
#
# Defaults: build/libemm.so, 10 s. The tracer slows every call: read the
# counts, and the µs only against each other. Exit 77 without nsys or jax.
set -u
here=$(cd "$(dirname "$0")" && pwd)
lib=${1:-$here/../../build/libemm.so}
secs=${2:-10}
script=$here/../gpu/py_jax_vmm.py
command -v nsys >/dev/null 2>&1 || { echo "SKIP: nsys (Nsight Systems) is not on PATH"; exit 77; }
python3 -c 'import jax' 2>/dev/null || { echo "SKIP: jax is not installed"; exit 77; }
[ -f "$lib" ] || { echo "no $lib: build libemm first (scripts/test)" >&2; exit 2; }
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-jax-nsys.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

# calls per step from nsys's cuda_api_sum CSV (argv: csv, steps)
summ='
import csv, sys
want = ("cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuStreamWaitEvent",
        "cuMemCreate", "cuMemAddressReserve", "cuMemMap", "cuMemSetAccess", "cuMemUnmap", "cuMemRelease",
        "cuMemAddressFree", "cuMemGetAllocationGranularity", "cuDeviceGet", "cuCtxSetCurrent",
        "cuCtxGetCurrent", "cuCtxPushCurrent", "cuCtxPopCurrent", "cuPointerGetAttribute",
        "cuMemRetainAllocationHandle", "cuMemAlloc", "cuMemFree", "cuEventRecord", "cuEventQuery",
        "cuLaunchKernel", "cuLaunchKernelEx", "cuGraphLaunch", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
        "cuMemsetD8Async", "cuMemsetD32Async", "cuLaunchHostFunc")
steps = int(sys.argv[2])
rows = {}
lines = [l for l in open(sys.argv[1]) if "," in l]
start = next((i for i, l in enumerate(lines) if "Num Calls" in l), None)
if start is None or steps <= 0:
    print("    no cuda_api_sum table or no steps")
    sys.exit(0)
for r in csv.DictReader(lines[start:]):
    name = r.get("Name", "").split("_v")[0].split("_ptsz")[0].split("_ptds")[0]
    calls, total = int(float(r.get("Num Calls", 0) or 0)), float(r.get("Total Time (ns)", 0) or 0)
    c, t = rows.get(name, (0, 0.0))
    rows[name] = (c + calls, t + total)
print("    %-32s %12s %14s" % ("driver call", "calls/step", "host us/step"))
for name in want:
    if name in rows:
        c, t = rows[name]
        print("    %-32s %12.2f %14.1f" % (name, c / steps, t / 1000.0 / steps))
c = sum(v[0] for v in rows.values()); t = sum(v[1] for v in rows.values())
print("    %-32s %12.2f %14.1f" % ("(all traced calls)", c / steps, t / 1000.0 / steps))
'

run() { # NAME ENV...
	name=$1; shift
	# the variant's environment (LD_PRELOAD) for the traced program only
	nsys profile --trace=cuda --sample=none --cpuctxsw=none \
		--capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite=true \
		-o "$tmp/$name" env "$@" XLA_PYTHON_CLIENT_PREALLOCATE=false \
		python3 "$script" --bench "$secs" --profile-range >"$tmp/out" 2>"$tmp/err"
	rc=$?
	steps=$(sed -n 's/^steps\/s [0-9.]* (\([0-9]*\) timed steps.*/\1/p' "$tmp/out")
	printf '%-13s %s steps/s under the tracer, %s timed steps (exit %d)\n' "$name" \
		"$(sed -n 's/^steps\/s \([0-9.]*\).*/\1/p' "$tmp/out")" "${steps:-?}" "$rc"
	grep '^emm-step:' "$tmp/out" | sed 's/^/    /'
	if [ $rc -ne 0 ] || [ ! -f "$tmp/$name.nsys-rep" ]; then
		tail -5 "$tmp/err" | sed 's/^/    /'
		return
	fi
	nsys stats --report cuda_api_sum --format csv "$tmp/$name.nsys-rep" >"$tmp/$name.csv" 2>>"$tmp/err"
	python3 -c "$summ" "$tmp/$name.csv" "${steps:-0}"
}

run bfc XLA_PYTHON_CLIENT_ALLOCATOR=default
run platform XLA_PYTHON_CLIENT_ALLOCATOR=platform
run platform+emm XLA_PYTHON_CLIENT_ALLOCATOR=platform LD_PRELOAD="$lib"
