# SPDX-License-Identifier: MIT
"""tests/gpu/emmpkg.py - for the GPU tests of the Python package
(py_emm_*.py): the package from the source tree (python/ on sys.path), libemm
from LIBEMM_PATH (the build's libemm.so), never preloaded. package_case()
gives an emmstats.Case whose counters are read through the package's libemm,
so the checks and the "emm-served:" line are those of the preload tests.

Numba's CUDA target on the GPU machine needs numpy.row_stack (removed from
NumPy 2.x): patched here before anything imports numba.
"""
import ctypes
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, here)
sys.path.insert(0, os.path.join(here, "..", "..", "python"))

try:
    import numpy  # noqa: E402
except ImportError:  # each test skips when its framework (which needs NumPy) is missing
    numpy = None
if numpy is not None and not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack

import emm  # noqa: E402,F401
from emmstats import DEVICE, PINNED, PROCESS, Case, EmmStats, Skip, skip  # noqa: E402,F401


def package_case(name):
    """A Case over the package's libemm; fails if libemm is preloaded (these tests are the other door)."""
    case = Case(name)
    if case.present():
        case.fail("libemm is preloaded (LD_PRELOAD=%s): these tests check the package without it"
                  % os.environ.get("LD_PRELOAD"))
    try:
        fn = ctypes.CDLL(emm.library_path()).emm_stats_get
    except OSError as e:
        case.fail("the package finds no libemm: %s" % e)
        case.finish()
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(EmmStats)]
    case._fn = fn
    print("libemm %s from %s (not preloaded)" % (emm.version(), emm.library_path()), flush=True)
    return case


def libemm_mappings():
    """The distinct libemm*.so files mapped in this process (one libemm: one heap)."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if os.path.basename(p).startswith("libemm") and ".so" in p and "backend" not in p:
                paths.add(p)
    return paths
