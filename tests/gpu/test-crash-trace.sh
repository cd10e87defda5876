#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/test-crash-trace.sh LIBCRASHTRACE - the crash tracer (crash_trace.c)
# on the CPU: a Python process loads it, crashes in an atexit handler after
# faulthandler is off (as the py-ipc-torch producer did), and must die of
# SIGSEGV after printing its frames, the tracer's own among them, to stderr
# and to CRASH_TRACE_DIR/crash-PID.txt; a process that does not crash writes
# no file.
set -u
lib=${1:?usage: test-crash-trace.sh LIBCRASHTRACE}
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
prog='import ctypes, os, atexit, faulthandler
ctypes.CDLL(os.environ["CRASH_TRACE_LIB"])
faulthandler.enable()
if os.environ.get("CRASH"):
    atexit.register(lambda: ctypes.string_at(0))
faulthandler.disable()
print("finished")'
CRASH=1 CRASH_TRACE_LIB=$lib CRASH_TRACE_DIR=$dir python3 -c "$prog" >"$dir/out" 2>"$dir/err"
rc=$?
cat "$dir/err"
if [ $rc -eq 139 ] && grep -q '^crash-trace: signal SIGSEGV, pid 0x[0-9a-f]*, address 0x0$' "$dir/err" &&
	grep -q 'libcrashtrace.so+0x' "$dir/err" && grep -q '^crash-trace: end$' "$dir/err" &&
	grep -q finished "$dir/out"; then
	echo "ok: a crash at exit died of SIGSEGV (rc 139) with its frames"
else
	echo "FAIL: a crash at exit: rc $rc, stderr above"
	fail=1
fi
files=("$dir"/crash-*.txt)
if [ ${#files[@]} -eq 1 ] && [ -f "${files[0]}" ] && cmp -s "${files[0]}" "$dir/err"; then
	echo "ok: the same frames in ${files[0]##*/}"
else
	echo "FAIL: CRASH_TRACE_DIR holds ${#files[@]} file(s), not one copy of stderr"
	fail=1
fi
rm -f "$dir"/crash-*.txt
CRASH_TRACE_LIB=$lib CRASH_TRACE_DIR=$dir python3 -c "$prog" >"$dir/out" 2>"$dir/err"
rc=$?
if [ $rc -eq 0 ] && [ ! -s "$dir/err" ] && ! ls "$dir"/crash-*.txt >/dev/null 2>&1; then
	echo "ok: no crash, no output and no file"
else
	echo "FAIL: no crash: rc $rc, stderr: $(cat "$dir/err")"
	fail=1
fi
exit $fail
