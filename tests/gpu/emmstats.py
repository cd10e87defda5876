# SPDX-License-Identifier: MIT
"""tests/gpu/emmstats.py - libemm's counters from Python, for the GPU tests.

emm_stats_get is found in the process (ctypes.CDLL(None): libemm is
preloaded), struct emm_stats is mirrored field by field, and Case gives each
test script the same checks and output as the C programs (gpu_common.h):
ESCAPE lines naming a path the pool did not see, and one summary line

    emm-served: case=NAME made=N allocs=N pinned_allocs=N ...

that scripts/gpu-check collects. Exit codes: 0 pass, 1 fail, 77 skip (the
whole script). A step that cannot be tested here raises Skip("why") (or the
script calls case.skip_part("why")): the script still passes, and finish()
prints the partial-skip line of tests/common/README.md,

    EMM-PARTIAL: ran R, skipped S (step: why; ...)

with R and S counted in steps; 77 if every step was skipped.
"""
import ctypes
import os
import re
import sys
import traceback

DEVICE = 0
PROCESS = -1
PINNED = -2
SKIP = 77
PARTIAL_PREFIX = "EMM-PARTIAL:"

# struct emm_stats (include/emm/emm.h) after struct_size and version, in
# header order. Checked against the header when the source tree is there.
U64_FIELDS = (
    "allocs", "frees", "hits", "misses", "passthrough_allocs", "passthrough_frees", "bad_frees",
    "backend_allocs", "backend_frees", "oom_retries", "ooms",
    "splits", "merges",
    "events_recorded", "event_queries", "stream_waits", "host_waits", "epochs_closed",
    "allocated_bytes", "allocated_bytes_peak", "allocated_bytes_total",
    "requested_bytes", "requested_bytes_peak", "requested_bytes_total",
    "reserved_bytes", "reserved_bytes_peak", "reserved_bytes_total",
    "pending_bytes", "segments", "live_blocks",
    # version 2
    "page_unmaps", "page_maps", "unmapped_bytes_total", "remapped_bytes_total", "unmapped_bytes",
    "segment_grows", "grown_bytes_total",
    # version 3
    "vmm_allocs", "vmm_hits", "vmm_misses", "vmm_frees", "vmm_hit_bytes_total", "vmm_idle_bytes",
    "vmm_materializations", "vmm_idle_released", "pool_allocs", "pool_creates", "pool_destroys",
    # version 4
    "passby_array_calls", "passby_array_bytes",
    "passby_graph_mem_calls", "passby_graph_mem_bytes",
    "passby_managed_calls", "passby_managed_bytes",
    "passby_host_register_calls", "passby_host_register_bytes",
    "passby_vmm_calls", "passby_vmm_bytes",
    "passby_pool_calls", "passby_pool_bytes",
    "passby_capture_calls", "passby_capture_bytes",
    "passby_unknown_free_calls", "passby_unknown_free_bytes",
    "allocated_bytes_peak_error", "requested_bytes_peak_error",
    # version 5
    "passby_driver_calls", "passby_driver_bytes",
)


class EmmStats(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("version", ctypes.c_uint32)] + \
               [(name, ctypes.c_uint64) for name in U64_FIELDS]


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def skip(why):
    """Skip the whole script (exit 77)."""
    print("skip: " + why, flush=True)
    sys.exit(SKIP)


def import_torch():
    """torch, when it is installed and finds a usable GPU; else skip the
    whole script."""
    try:
        import torch
    except ImportError as e:
        skip("torch is not installed: %s" % e)
    try:
        available = torch.cuda.is_available()
    except Exception as e:  # noqa: BLE001
        skip("torch.cuda is unusable: %s" % e)
    if not available:
        skip("torch finds no usable GPU")
    return torch


def ipc_refused_by_backend(exc):
    """Skip the step (raise Skip) when exc is the clear refusal to export a block
    that a libemm backend whose memory the driver cannot share gives
    (EMM_BACKEND=vmm, async, managed: CUDA_ERROR_NOT_SUPPORTED); return otherwise."""
    backend = os.environ.get("EMM_BACKEND", "")
    text = str(exc)
    if backend in ("vmm", "async", "managed") and (
            "not supported" in text.lower() or "NotSupported" in text or "NOT_SUPPORTED" in text or "801" in text):
        raise Skip("EMM_BACKEND=%s: its memory cannot be exported with cuIpcGetMemHandle; refused clearly (%s)"
                   % (backend, text.splitlines()[0][:100] if text else type(exc).__name__))


class Skip(Exception):
    """Raised by a step run through Case.run: that step is skipped (why)."""


def header_fields():
    """The uint64 fields of struct emm_stats in the source tree's emm.h, or None."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include", "emm", "emm.h")
    try:
        text = open(path).read()
    except OSError:
        return None
    m = re.search(r"struct emm_stats \{(.*?)\};", text, re.S)
    if not m:
        return None
    return tuple(re.findall(r"^\s*uint64_t\s+(\w+);", m.group(1), re.M))


def where(fn):
    """(file, symbol) of the code a ctypes function or address points at."""
    addr = fn if isinstance(fn, int) else ctypes.cast(fn, ctypes.c_void_p).value
    info = DlInfo()
    dladdr = ctypes.CDLL(None).dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    dladdr.restype = ctypes.c_int
    if not addr or not dladdr(addr, ctypes.byref(info)):
        return ("?", "?")
    return ((info.dli_fname or b"?").decode(), (info.dli_sname or b"?").decode())


def in_libemm(fn):
    return os.path.basename(where(fn)[0]).startswith("libemm.so")


class Case:
    """One test script: checks, counters, the summary line, the exit code."""

    def __init__(self, name):
        self.name = name
        self.failures = 0
        self.made = 0
        self.ran = 0
        self.skipped = []  # reasons, one per skipped step or part
        try:
            fn = ctypes.CDLL(None).emm_stats_get
        except AttributeError:
            fn = None
        if fn is not None:
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.POINTER(EmmStats)]
        self._fn = fn
        fields = header_fields()
        if fields is not None and fields != U64_FIELDS:
            self.fail("tests/gpu/emmstats.py's struct emm_stats no longer matches include/emm/emm.h: "
                      "header %s, mirror %s" % (fields, U64_FIELDS))

    # -- counters --

    def present(self):
        return self._fn is not None

    def require_emm(self):
        if not self.present():
            self.fail("emm_stats_get not found: libemm is not loaded (LD_PRELOAD=%s)"
                      % os.environ.get("LD_PRELOAD", "(unset)"))
            self.finish()

    def stats(self, scope):
        """A dict of one scope's counters (zeros if the scope has none yet)."""
        st = EmmStats()
        st.struct_size = ctypes.sizeof(EmmStats)
        if self._fn is None or self._fn(scope, ctypes.byref(st)) != 0:
            return {name: 0 for name in U64_FIELDS}
        return {name: getattr(st, name) for name in U64_FIELDS}

    def snap(self):
        return {scope: self.stats(scope) for scope in (DEVICE, PINNED, PROCESS)}

    # -- checks --

    def fail(self, msg):
        print("FAIL: %s: %s" % (self.name, msg), file=sys.stderr, flush=True)
        self.failures += 1

    def check(self, cond, msg):
        if not cond:
            self.fail(msg)
        return bool(cond)

    def served(self, path, a, b, n, scope=DEVICE, strict_passthrough=True):
        """The pool served the n allocations made on `path` between snapshots
        a and b. With strict_passthrough, none went to the driver unchanged
        (frameworks may make pass-through calls of their own: there it is
        printed, not required)."""
        d = lambda f, s=scope: b[s][f] - a[s][f]
        got, pt, ptp = d("allocs"), d("passthrough_allocs"), d("passthrough_allocs", PROCESS)
        self.made += n
        print("  %-56s scope %2d: allocs +%d (made %d) hits +%d misses +%d backend +%d passthrough +%d"
              % (path, scope, got, n, d("hits"), d("misses"), d("backend_allocs"), max(pt, ptp)), flush=True)
        if got < n:
            self.fail("ESCAPE: %s: %d allocation(s) made, the pool counted %d (process allocs +%d, "
                      "passthrough +%d)" % (path, n, got, d("allocs", PROCESS), ptp))
        if strict_passthrough and (pt or ptp):
            self.fail("ESCAPE: %s: passed through to the driver (passthrough_allocs +%d in scope %d, "
                      "+%d process-wide)" % (path, pt, scope, ptp))

    def freed(self, path, a, b, n, scope=DEVICE):
        got = b[scope]["frees"] - a[scope]["frees"]
        if got < n:
            self.fail("ESCAPE: %s: %d free(s) made, the pool counted %d (passthrough_frees +%d)"
                      % (path, n, got, b[PROCESS]["passthrough_frees"] - a[PROCESS]["passthrough_frees"]))

    def skip_part(self, why):
        """One part of a step could not be checked here: counted as skipped."""
        why = " ".join(str(why).split())  # the marker is one line
        print("SKIP part: %s" % why, flush=True)
        self.skipped.append(why)

    def run(self, fn):
        """Run one step; an exception is a failure, and the next step runs;
        Skip skips the step."""
        name = fn.__name__
        before = self.failures
        try:
            fn()
        except Skip as e:
            if self.failures == before:
                self.skip_part("%s: %s" % (name, e))
                print("SKIP %s" % name, file=sys.stderr, flush=True)
                return
        except Exception:  # noqa: BLE001 - every error is a test failure
            self.fail("%s raised:\n%s" % (name, traceback.format_exc()))
        if self.failures == before:
            self.ran += 1
        print("%s %s" % ("FAIL" if self.failures != before else "ok  ", name), file=sys.stderr, flush=True)

    def finish(self):
        p, pin = self.stats(PROCESS), self.stats(PINNED)
        if self.present():
            print("emm-served: case=%s made=%d allocs=%d pinned_allocs=%d hits=%d misses=%d "
                  "passthrough_allocs=%d backend_allocs=%d frees=%d live_blocks=%d"
                  % (self.name, self.made, p["allocs"], pin["allocs"], p["hits"], p["misses"],
                     p["passthrough_allocs"], p["backend_allocs"], p["frees"], p["live_blocks"]), flush=True)
        else:
            print("emm-served: case=%s libemm=absent made=%d" % (self.name, self.made), flush=True)
        code = 1 if self.failures else 0
        if code == 0 and self.skipped and self.ran == 0:
            print("skip: every step skipped (%s)" % "; ".join(self.skipped), flush=True)
            code = SKIP
        elif code == 0 and self.skipped:
            print("%s ran %d, skipped %d (%s)" % (PARTIAL_PREFIX, self.ran, len(self.skipped),
                                                 "; ".join(self.skipped)), flush=True)
        print("%s: %s" % (self.name, "FAIL (%d)" % self.failures if self.failures
                          else "skipped" if code == SKIP else "ok"), flush=True)
        sys.stdout.flush()
        sys.stderr.flush()
        sys.exit(code)
