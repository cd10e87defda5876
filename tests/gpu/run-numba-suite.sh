#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tests/gpu/run-numba-suite.sh - NBEP 7's own validation: Numba's CUDA test
# suite with its default memory manager and with libemm's
# (NUMBA_CUDA_MEMORY_MANAGER=emm.numba, the package from python/, libemm
# from BUILDDIR, no LD_PRELOAD). Prints the failures and errors of each run,
# those only the emm run has (the result: must be none), the tests the emm
# run skipped because an external manager is active (Numba's own
# skip_if_external_memmgr: its deallocation internals), and libemm's
# EMM_STATS of the emm run (that it served the allocations).
#
#   tests/gpu/run-numba-suite.sh [BUILDDIR] [JOBS] [TESTS]
#
# BUILDDIR defaults to build-gpu, JOBS (numba.runtests -m) to 16, TESTS to
# numba.cuda.tests (several names: separated by spaces). Exit 0: no failure beyond the default run's; 1: some;
# 77: no numba or no GPU.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build-gpu}" && pwd)
jobs=${2:-16}
tests=${3:-numba.cuda.tests}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# numba-cuda on NumPy 2 needs numpy.row_stack; a sitecustomize on PYTHONPATH
# puts it back in every process the suite starts.
printf 'import numpy\nif not hasattr(numpy, "row_stack"):\n    numpy.row_stack = numpy.vstack\n' >"$tmp/sitecustomize.py"
# numba-cuda's testing module imports the `filecheck` package (its FileCheck
# assertions on generated PTX/LLVM); where it is absent (the GPU image has no
# network to install it) a stand-in makes those assertions skip, in both runs
# alike: they check the compiler's output, not memory management.
if ! python3 -c 'import filecheck' 2>/dev/null; then
	echo "note: no filecheck package: FileCheck-based tests skip in both runs" >&2
	mkdir -p "$tmp/filecheck"
	cat >"$tmp/filecheck/__init__.py" <<'PY'
import unittest


class _Absent:
    def __init__(self, *args, **kwargs):
        raise unittest.SkipTest("filecheck is not installed")

    @classmethod
    def from_opts(cls, *args, **kwargs):
        raise unittest.SkipTest("filecheck is not installed")


def _absent(*args, **kwargs):
    raise unittest.SkipTest("filecheck is not installed")
PY
	for m in matcher options parser finput; do
		printf 'from filecheck import _Absent as Matcher, _Absent as Options, _Absent as Parser, _Absent as FInput\nfrom filecheck import _absent as pattern_for_opts, _absent as parse_argv_options\n' >"$tmp/filecheck/$m.py"
	done
fi
python3 -c 'import numpy; numpy.row_stack = numpy.vstack; from numba import cuda; assert cuda.is_available()' 2>/dev/null ||
	{ echo "numba or a GPU is missing: skipped"; exit 77; }

run() { # NAME ENV...
	local name=$1
	shift
	echo "== $name: python3 -m numba.runtests -m $jobs -v $tests" >&2
	env -u LD_PRELOAD PYTHONPATH="$tmp:$root/python${PYTHONPATH:+:$PYTHONPATH}" "$@" \
		python3 -m numba.runtests -m "$jobs" -v $tests >"$tmp/$name.log" 2>&1
	local rc=$?
	echo "   exit $rc; $(grep -E '^(Ran|OK|FAILED)' "$tmp/$name.log" | tr '\n' ' ')" >&2
	grep -qE '^Ran ' "$tmp/$name.log" || tail -15 "$tmp/$name.log" >&2
	# Subtest lines carry an object's address: the same test differs per run.
	grep -E '^(FAIL|ERROR): ' "$tmp/$name.log" | sed -E 's/ at 0x[0-9a-f]+>/>/g' | sort -u >"$tmp/$name.bad"
}

run default
run emm NUMBA_CUDA_MEMORY_MANAGER=emm.numba LIBEMM_PATH="$build/libemm.so" EMM_STATS=1
echo
echo "failures/errors with Numba's manager: $(wc -l <"$tmp/default.bad")"
sed 's/^/  /' "$tmp/default.bad"
echo "failures/errors with emm.numba: $(wc -l <"$tmp/emm.bad")"
sed 's/^/  /' "$tmp/emm.bad"
comm -13 "$tmp/default.bad" "$tmp/emm.bad" >"$tmp/new.bad"
echo "only with emm.numba (must be empty): $(wc -l <"$tmp/new.bad")"
sed 's/^/  /' "$tmp/new.bad"
# The traceback of each (the log's block from its FAIL/ERROR header to the
# next separator), its last lines only.
python3 - "$tmp/emm.log" "$tmp/new.bad" <<'PY'
import re, sys
log = open(sys.argv[1], errors='replace').read().split('\n')
want = {l.strip() for l in open(sys.argv[2]) if l.strip()}
i = 0
while i < len(log):
    head = re.sub(r' at 0x[0-9a-f]+>', '>', log[i])
    if head in want:
        j = i + 2
        while j < len(log) and not log[j].startswith(('=====', '-----')):
            j += 1
        print('--- ' + head)
        for line in log[max(i + 2, j - 8):j]:
            print('    ' + line)
        want.discard(head)
        i = j
    else:
        i += 1
PY
echo "skipped under emm.numba for an external memory manager:"
grep -iE "skipped .*(external|EMM|memory manager|deallocation)" "$tmp/emm.log" | sed 's/^/  /' | sort -u | head -60
echo "libemm statistics of the emm run (EMM_STATS=1, one table per process):"
grep -E "^emm: (statistics|device|0 |all )" "$tmp/emm.log" | head -40
[ -s "$tmp/new.bad" ] && exit 1
exit 0
