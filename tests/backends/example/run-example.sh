#!/bin/sh
# tests/backends/example/run-example.sh BUILD_ROOT SOURCE TEST_PROGRAM FAKECUDA_DIR CC PKG_CONFIG
#
# The out-of-tree backend story end to end: `meson install --destdir` of
# the build into a temporary folder, the example backend compiled there with
# CC and `pkg-config --cflags emm` from the installed emm.pc (and nothing
# else of libemm's tree), then TEST_PROGRAM run with the installed libemm.so
# preloaded and EMM_BACKEND naming the example .so, over the fake driver.
# emm.pc names an absolute prefix, so the staged copy is found the standard
# way: PKG_CONFIG_PATH into the destdir plus PKG_CONFIG_SYSROOT_DIR=destdir.
# Exits 77 (skip) without a C compiler or pkg-config.
set -eu
build=$1 src=$2 prog=$3 fakecuda=$4 cc=$5 pkgconfig=$6

if ! command -v "$cc" >/dev/null 2>&1 || ! command -v "$pkgconfig" >/dev/null 2>&1; then
	echo "no C compiler or pkg-config: skipped"
	exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/emm-example.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
	echo "example backend: $*" >&2
	echo "0 passed, 1 failed, 0 skipped"
	exit 1
}

meson install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log" >&2; fail "meson install --destdir failed"; }
pc=$(find "$tmp/root" -name emm.pc | head -n 1)
[ -n "$pc" ] || fail "no emm.pc installed"
libemm=$(find "$tmp/root" -name libemm.so | head -n 1)
[ -n "$libemm" ] || fail "no libemm.so installed"

cflags=$(PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR="$tmp/root" "$pkgconfig" --cflags emm) ||
	fail "pkg-config --cflags emm failed"
echo "pkg-config --cflags emm: $cflags"
# The header must come from the staged install, not from a copy elsewhere.
case "$cflags" in
*"-I$tmp/root/"*) ;;
*) fail "the cflags do not point into the destdir" ;;
esac
[ -f "$tmp/root$(echo "$cflags" | sed -n "s|.*-I$tmp/root\([^ ]*\).*|\1|p")/emm/emm_backend.h" ] ||
	fail "no emm/emm_backend.h under the -I folder"

# shellcheck disable=SC2086 # cflags is a list of words
"$cc" -std=c11 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden $cflags \
	-o "$tmp/libexample-backend.so" "$src" || fail "the example does not compile against the installed header"

env LD_LIBRARY_PATH="$fakecuda" LD_PRELOAD="${EMM_TEST_PRELOAD_FIRST:-}$libemm" EMM_BACKEND="$tmp/libexample-backend.so" \
	"$prog" example "$tmp/libexample-backend.so"
