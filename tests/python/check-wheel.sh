#!/bin/sh
# SPDX-License-Identifier: MIT
# tests/python/check-wheel.sh ROOT - the wheel builds from a clean copy of the
# tree (the files git tracks or would track: no build folders) with
# meson-python, holds the package and libemm.so with its backends, and the
# package loads the bundled libemm from it. Skips (77) where no Python has
# meson-python (Debian: apt-get install python3-mesonpy) or without git.
set -eu
root=$1
py=
for p in python3 /usr/bin/python3; do
	if "$p" -c 'import mesonpy' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then echo "no Python with meson-python: skipped"; exit 77; fi
if ! git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then echo "not a git checkout: skipped"; exit 77; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src" "$tmp/wheel" "$tmp/unpacked"
git -C "$root" ls-files -z --cached --others --exclude-standard |
	(cd "$root" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
	(cd "$root" && xargs -0 tar cf -) | tar xf - -C "$tmp/src"
if "$py" -m pip --version >/dev/null 2>&1; then
	"$py" -m pip wheel --no-build-isolation --no-deps -q -w "$tmp/wheel" "$tmp/src"
else
	(cd "$tmp/src" && "$py" -c 'import mesonpy, sys; mesonpy.build_wheel(sys.argv[1])' "$tmp/wheel")
fi
whl=$(ls "$tmp"/wheel/emm-*.whl)
echo "built $(basename "$whl")"
"$py" - "$whl" "$tmp/unpacked" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
want = {"emm/__init__.py", "emm/_lib.py", "emm/numba.py", "emm/torch.py", "emm/cupy.py", "emm/libemm.so",
        "emm/libemm-backend-driver.so", "emm/libemm-backend-vmm.so"}
missing = want - names
stray = [n for n in names if not n.startswith(("emm/", "emm-"))]
print("\n".join(sorted(names)))
if missing or stray:
    sys.exit(f"missing {sorted(missing)}, stray {stray}")
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
cd "$tmp"
env -u LIBEMM_PATH PYTHONPATH="$tmp/unpacked" "$py" -c '
import os, sys, emm
path = emm.library_path()
assert path == os.path.join(sys.argv[1], "emm", "libemm.so"), path
print("emm", emm.version(), "from", path, "; EMM_BACKEND =", emm.settings()["EMM_BACKEND"])
' "$tmp/unpacked"
