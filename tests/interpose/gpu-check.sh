#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/interpose/gpu-check.sh BUILDDIR - the interpose tests against the
# real driver and the real shared cudart, on a machine with a GPU, from a
# build made elsewhere (no meson needed): resolver rows with and without
# libemm, dlsym symbol-version bindings, the first-call race, the runtime
# shims against libcudart.so, RTLD_NEXT transparency. Exit status: the
# number of failed steps.
B=${1:-build}
T=$B/tests/interpose
L=$(cd "$B" && pwd)/libemm.so
failed=0
step() {
	name=$1
	shift
	echo "=== $name"
	if "$@"; then echo "--- $name: ok"; else echo "--- $name: FAILED ($?)"; failed=$((failed + 1)); fi
}
run_cfg() { # config program [args]
	cfg=$1
	shift
	case $cfg in
	ref) env -u LD_PRELOAD "$@" ;;
	emm) env LD_PRELOAD="$L" "$@" ;;
	noshims) env LD_PRELOAD="$L" EMM_RUNTIME_SHIMS=0 "$@" ;;
	disabled) env LD_PRELOAD="$L" EMM_DISABLE=1 "$@" ;;
	esac
}
nvidia-smi -L 2>&1 | head -2
ldd --version 2>&1 | head -1
step resolve env LD_LIBRARY_PATH="$T" python3 tests/interpose/check-resolve.py "$L" interpose/exports-resolve.txt interpose/exports-shims.txt -- "$T/test-resolve"
step dlsym-versions python3 tests/interpose/check-dlsym-versions.py "$L" "$T/test-dlsym-versions"
step threads-first-call run_cfg emm "$T/test-threads-first-call"
for c in ref emm noshims disabled; do
	step "runtime-shims-cudart-$c" run_cfg $c "$T/test-runtime-shims-cudart" $c
done
step runtime-trace-cudart python3 tests/interpose/check-runtime-trace.py env LD_PRELOAD="$L" "$T/test-runtime-shims-cudart" emm
A=$T/libnext-a.so
N=$T/libnext-b.so
for order in "$A:$N" "$L:$A:$N" "$A:$L:$N" "$A:$N:$L"; do
	step "rtld-next $order" env LD_LIBRARY_PATH="$T" LD_PRELOAD="$order" "$T/test-rtld-next"
done
echo "failed steps: $failed"
exit $failed
