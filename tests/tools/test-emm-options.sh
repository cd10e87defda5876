#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/tools/test-emm-options.sh EMM_OPTIONS - emm-options' exit status:
# 0 for a valid environment, 1 when a value is invalid (or breaks a
# relation between options), 2 for bad usage.
O=$1
passed=0 failed=0
for v in $(env | sed -n 's/^\(EMM_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
check() { # WANT DESCRIPTION COMMAND...
	want=$1 what=$2
	shift 2
	"$@" >/dev/null 2>&1
	rc=$?
	if [ "$rc" -eq "$want" ]; then passed=$((passed + 1)); echo "ok: $what"
	else failed=$((failed + 1)); echo "FAILED: $what: exit $rc, want $want"; fi
}
check 0 "no settings" env "$O"
check 0 "valid settings" env EMM_ARENAS=4 EMM_SMALL_SEGMENT=4M "$O"
check 1 "an out-of-range integer" env EMM_ARENAS=100 "$O"
check 1 "a bad size" env EMM_LARGE_SEGMENT=lots "$O"
check 1 "a bad enum" env EMM_FREE_MODE=sometimes "$O"
check 1 "a broken relation" env EMM_SMALL_SIZE=8M EMM_SMALL_SEGMENT=2M "$O"
check 0 "--markdown" "$O" --markdown
check 2 "an unknown argument" "$O" --frobnicate
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
