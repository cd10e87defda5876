#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/bench/test-bench-script.sh BENCH BUILDDIR - scripts/bench's options:
# --only 1 --no-build prints the header and section 1 (the allocator core's
# table) and no other section, and writes $OUT/bench.md; a bad --only, an
# unknown option, two build dirs and --no-build on a tree without the
# benchmarks exit 2 with usage and build nothing.
set -u
bench=$1 build=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-bench.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAILED: $1"; sed 's/^/  | /' "$tmp/out"; fail=1; }

OUT=$tmp "$bench" --only 1 --no-build "$build" >"$tmp/out" 2>&1
rc=$?
sections=$(grep -c '^## [0-9]' "$tmp/out")
if [ $rc -ne 0 ] || [ "$sections" != 1 ] || ! grep -q '^## 1\. Allocator core' "$tmp/out" ||
	! grep -q '^| 256 B | [0-9]' "$tmp/out" || ! cmp -s "$tmp/out" "$tmp/bench.md"; then
	bad "--only 1 --no-build (exit $rc, $sections sections)"
else
	echo "ok: --only 1 --no-build"
fi

for args in "--only 8" "--only 1,x" "--only" "--bogus" "$tmp/a $tmp/b" "--no-build $tmp/empty"; do
	# shellcheck disable=SC2086
	"$bench" $args >"$tmp/out" 2>&1
	rc=$?
	if [ $rc -eq 2 ] && grep -q 'bench' "$tmp/out" && [ ! -e "$tmp/a" ] && [ ! -e "$tmp/empty/build.ninja" ]; then
		echo "ok: '$args' exits 2"
	else
		bad "'$args' exited $rc"
	fi
done
exit $fail
