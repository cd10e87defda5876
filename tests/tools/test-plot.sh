#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/tools/test-plot.sh EMM_PLOT EMM_REPLAY TRACE - emm-plot renders a
# bundled trace to a PNG (checked: PNG signature, more than 20 KB), with the
# replay and without it. Skips (77) when matplotlib is missing.
P=$1 R=$2 T=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-plot.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
for v in $(env | sed -n 's/^\(EMM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
passed=0 failed=0
png_ok() { # FILE: the PNG signature and a real picture's size
	[ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] &&
		[ "$(wc -c <"$1")" -gt 20000 ]
}
python3 "$P" "$T" --replay "$R" -o "$tmp/replayed.png" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 3 ]; then
	cat "$tmp/err"
	echo "0 passed, 0 failed, 1 skipped"
	exit 77
fi
if [ "$rc" -eq 0 ] && png_ok "$tmp/replayed.png"; then passed=$((passed + 1)); echo "ok: with the replay ($(wc -c <"$tmp/replayed.png") bytes)"
else failed=$((failed + 1)); echo "FAILED: with the replay (exit $rc)"; cat "$tmp/err"; fi
python3 "$P" "$T" --no-replay -o "$tmp/traced.png" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 0 ] && png_ok "$tmp/traced.png" && grep -q 'not replayed' "$tmp/err"; then passed=$((passed + 1)); echo "ok: --no-replay says what is missing"
else failed=$((failed + 1)); echo "FAILED: --no-replay (exit $rc)"; cat "$tmp/err"; fi
python3 "$P" "$T" --replay "$R" --capacity 16M -o "$tmp/failed.png" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 1 ] && png_ok "$tmp/failed.png"; then passed=$((passed + 1)); echo "ok: a failed replay is drawn up to the failure, exit 1"
else failed=$((failed + 1)); echo "FAILED: failed replay (exit $rc)"; cat "$tmp/err"; fi
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
