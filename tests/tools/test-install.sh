#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/tools/test-install.sh BUILDDIR - `meson install` (into a scratch
# DESTDIR) puts the user-facing programs in bindir: emm-run (its copy
# pointing at the installed libemm.so), emm-plot, emm-replay, emm-options.
B=$1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-install.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
check() { # DESCRIPTION COMMAND...
	what=$1
	shift
	if "$@" >"$tmp/out" 2>&1; then passed=$((passed + 1)); echo "ok: $what"
	else failed=$((failed + 1)); echo "FAILED: $what"; sed 's/^/  | /' "$tmp/out"; fi
}
if ! meson install -C "$B" --destdir "$tmp/dest" --no-rebuild --quiet >"$tmp/log" 2>&1; then
	cat "$tmp/log"
	echo "0 passed, 1 failed, 0 skipped"
	exit 1
fi
bin=$(dirname "$(find "$tmp/dest" -path '*/bin/emm-run' | head -1)")
check "bin/emm-run, emm-plot, emm-replay, emm-options are installed" \
	test -x "$bin/emm-run" -a -x "$bin/emm-plot" -a -x "$bin/emm-replay" -a -x "$bin/emm-options"
check "libemm.so is installed" sh -c "find '$tmp/dest' -name 'libemm.so*' | grep -q ."
check "the installed emm-run knows where libemm is installed" \
	sh -c "grep -q \"^installed_libdir='/\" '$bin/emm-run'"
check "installed emm-run --help" "$bin/emm-run" --help
check "installed emm-replay --version" "$bin/emm-replay" --version
# Its libemm lies under DESTDIR, not yet where it was configured to be.
lib="$(sed -n "s/^installed_libdir='\(.*\)'$/\1/p" "$bin/emm-run")/libemm.so"
if [ -e "$lib" ]; then
	echo "skip: $lib exists here (libemm is installed on this machine)"
else
	check "installed emm-run says where it looked for libemm" \
		sh -c "'$bin/emm-run' -- true 2>&1 | grep -q 'is libemm installed there'"
fi
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
