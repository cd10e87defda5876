#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/tools/test-scripts.sh SOURCE_ROOT LIBEMM - the scripts a new user
# runs first, on a copy of scripts/ in a scratch tree: every --help prints
# usage and leaves nothing behind; gpu-check exits 77 without a GPU before
# building; emm-run (with stand-in meson and ninja) shows progress on a first
# build, shows the compiler's or meson's error when a build fails, rejects
# unknown options with usage, and lets -v win over EMM_VERBOSE=0.
set -u
src=$1 lib=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-scripts.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; sed 's/^/  | /' "$tmp/out"; }
unset OUT EMM_VERBOSE

mkdir -p "$tmp/tree/tests/data" "$tmp/bin"
cp -r "$src/scripts" "$tmp/tree/scripts"
cp "$src/tests/data/record-traces.sh" "$src/tests/data/gen-synthetic-trace.py" "$tmp/tree/tests/data/"
S=$tmp/tree/scripts

# --help: usage on stdout, status 0, no file created anywhere in the tree.
for s in emm-run emm-plot test gpu-check bench ../tests/data/record-traces.sh ../tests/data/gen-synthetic-trace.py; do
	before=$(cd "$tmp/tree" && find . | sort)
	(cd "$tmp/tree" && "$S/$s" --help) >"$tmp/out" 2>&1
	rc=$?
	after=$(cd "$tmp/tree" && find . | sort)
	if [ "$rc" -eq 0 ] && [ "$before" = "$after" ] && grep -qi "usage\|$(basename "$s")" "$tmp/out"; then
		ok "$s --help"
	else bad "$s --help (exit $rc, tree changed: $([ "$before" = "$after" ] && echo no || echo yes))"; fi
done

if nvidia-smi -L >/dev/null 2>&1; then
	echo "skip: gpu-check without a GPU (there is one here)"
else
	"$S/gpu-check" "$tmp/build-gpu" >"$tmp/out" 2>&1
	rc=$?
	if [ "$rc" -eq 77 ] && [ ! -e "$tmp/build-gpu/build.ninja" ] && grep -q 'no GPU here' "$tmp/out"; then
		ok "gpu-check exits 77 without a GPU, before building"
	else bad "gpu-check without a GPU (exit $rc)"; fi
fi

# Stand-ins for meson and ninja: what emm-run shows of them is under test.
cat >"$tmp/bin/meson" <<'STUB'
#!/bin/sh
[ "$1" = setup ] || exit 0
if [ -n "${STUB_MESON_FAIL:-}" ]; then
	echo "The Meson build system"
	echo "meson.build:40:0: ERROR: Dependency \"cuda\" not found"
	exit 1
fi
mkdir -p "$2" && : >"$2/build.ninja"
STUB
cat >"$tmp/bin/ninja" <<STUB
#!/bin/sh
[ "\$1" = -C ] || exit 2
if [ -n "\${STUB_NINJA_FAIL:-}" ]; then
	echo "[1/3] Compiling C object allocator/heap.c.o"
	echo "FAILED: allocator/heap.c.o"
	echo "../allocator/heap.c:12:5: error: expected ';' before '}' token"
	exit 1
fi
i=1
while [ \$i -le 50 ]; do echo "[\$i/50] Compiling C object f\$i.o"; i=\$((i + 1)); done
ln -sf "$lib" "\$2/libemm.so"
STUB
chmod +x "$tmp/bin/meson" "$tmp/bin/ninja"
run_emm() { PATH="$tmp/bin:$PATH" "$S/emm-run" "$@" >"$tmp/out" 2>&1; }

if EMM_VERBOSE=0 run_emm -v --build "$tmp/b1" -- sh -c 'echo "V=$EMM_VERBOSE"' &&
	grep -q 'first build of libemm' "$tmp/out" && grep -q 'building \[25/50\]' "$tmp/out" &&
	grep -q 'building \[50/50\]' "$tmp/out" && grep -q '^V=1$' "$tmp/out"; then
	ok "first build shows progress; -v wins over EMM_VERBOSE=0"
else bad "first build progress / -v"; fi

if EMM_VERBOSE=0 run_emm --build "$tmp/b1" -- sh -c 'echo "V=$EMM_VERBOSE"' && grep -q '^V=0$' "$tmp/out" &&
	! grep -q 'building' "$tmp/out" && EMM_VERBOSE=2 run_emm -v --build "$tmp/b1" -- sh -c 'echo "V=$EMM_VERBOSE"' &&
	grep -q '^V=2$' "$tmp/out"; then
	ok "later builds are quiet; without -v EMM_VERBOSE stays; -v keeps a higher level"
else bad "EMM_VERBOSE handling"; fi

STUB_NINJA_FAIL=1 run_emm --build "$tmp/b2" -- true
rc=$?
if [ "$rc" -eq 1 ] && grep -q "error: expected ';' before '}' token" "$tmp/out" && grep -q 'the build failed' "$tmp/out"; then
	ok "a failed build shows the compiler's error"
else bad "failed build (exit $rc)"; fi

STUB_MESON_FAIL=1 run_emm --build "$tmp/b3" -- true
rc=$?
if [ "$rc" -eq 1 ] && grep -q 'ERROR: Dependency "cuda" not found' "$tmp/out"; then
	ok "a failed meson setup shows meson's error"
else bad "failed setup (exit $rc)"; fi

run_emm --frobnicate
rc=$?
if [ "$rc" -eq 2 ] && grep -q "unknown option '--frobnicate'" "$tmp/out" && grep -q 'scripts/emm-run \[-v\]' "$tmp/out" &&
	[ ! -e "$tmp/tree/build" ]; then
	ok "unknown option: usage, exit 2, nothing built"
else bad "unknown option (exit $rc)"; fi

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
