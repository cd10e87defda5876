#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/interpose/gpu-check.sh BUILDDIR - the interpose tests against the
# real driver and the real shared cudart, on a machine with a GPU, from a
# build made elsewhere (no meson needed): resolver rows with and without
# libemm, dlsym symbol-version bindings, the first-call race, the runtime
# shims against libcudart.so, RTLD_NEXT transparency. A step that exits 77
# is skipped; one that passes with an "EMM-PARTIAL:" line
# (tests/common/README.md) is counted as partial. Ends with
# "N passed, N failed, N skipped (N partial)". Exit status: the number of
# failed steps; 77 without a GPU (nvidia-smi absent or failing, or no
# /dev/nvidia[0-9]*) or when every step skipped.
B=${1:-build}
T=$B/tests/interpose
L=$(cd "$B" && pwd)/libemm.so
if ! nvidia-smi -L >/dev/null 2>&1 || ! ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
	echo "tests/interpose/gpu-check.sh: no GPU here (nvidia-smi -L fails or no /dev/nvidia[0-9]*): skipped"
	exit 77
fi
failed=0 passed=0 skipped=0 partial=0
out=$(mktemp "${TMPDIR:-/tmp}/emm-gpu-check.XXXXXX") || exit 1
trap 'rm -f "$out"' EXIT
step() {
	name=$1
	shift
	echo "=== $name"
	"$@" >"$out" 2>&1
	rc=$?
	cat "$out"
	if [ $rc -eq 0 ]; then
		passed=$((passed + 1))
		if grep -q '^EMM-PARTIAL:' "$out"; then
			partial=$((partial + 1))
			echo "--- $name: ok, partial: $(grep '^EMM-PARTIAL:' "$out" | head -1)"
		else
			echo "--- $name: ok"
		fi
	elif [ $rc -eq 77 ]; then
		skipped=$((skipped + 1))
		echo "--- $name: skipped"
	else
		echo "--- $name: FAILED ($rc)"
		failed=$((failed + 1))
	fi
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
echo "$passed passed, $failed failed, $skipped skipped ($partial partial)"
[ $failed -eq 0 ] && [ $passed -eq 0 ] && exit 77
exit $failed
