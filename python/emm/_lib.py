# SPDX-License-Identifier: MIT
"""emm._lib - finds libemm.so and declares its public API (include/emm/emm.h)
for ctypes: the statistics struct, and one prototype per exported function.

Which libemm: the copy already loaded in the process if there is one (it was
preloaded, or a framework loaded it), so that the preload and the package
share one heap; else the file named by $LIBEMM_PATH; else the libemm.so
bundled beside this file (the wheel); else libemm.so.0 from the loader's
search path (`meson install`). Nothing is loaded at import: the first call
that needs the library loads it, so `import emm` works anywhere.

tests/python/test_package.py checks PROTOTYPES and Stats._fields_ against
the C header, so a change to one without the other fails the CPU suite.
"""
import ctypes
import os
import threading

# EMM_STREAM_NONE: "no stream", all bits set (include/emm/emm.h).
STREAM_NONE = ctypes.c_void_p((1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1)

_U64_FIELDS = """
allocs frees hits misses passthrough_allocs passthrough_frees bad_frees
backend_allocs backend_frees oom_retries ooms
splits merges
events_recorded event_queries stream_waits host_waits epochs_closed
allocated_bytes allocated_bytes_peak allocated_bytes_total
requested_bytes requested_bytes_peak requested_bytes_total
reserved_bytes reserved_bytes_peak reserved_bytes_total
pending_bytes segments live_blocks
page_unmaps page_maps unmapped_bytes_total remapped_bytes_total unmapped_bytes
segment_grows grown_bytes_total
vmm_allocs vmm_hits vmm_misses vmm_frees vmm_hit_bytes_total vmm_idle_bytes
vmm_materializations vmm_idle_released pool_allocs pool_creates pool_destroys
passby_array_calls passby_array_bytes
passby_graph_mem_calls passby_graph_mem_bytes
passby_managed_calls passby_managed_bytes
passby_host_register_calls passby_host_register_bytes
passby_vmm_calls passby_vmm_bytes
passby_pool_calls passby_pool_bytes
passby_capture_calls passby_capture_bytes
passby_unknown_free_calls passby_unknown_free_bytes
allocated_bytes_peak_error requested_bytes_peak_error
passby_driver_calls passby_driver_bytes
""".split()


class Stats(ctypes.Structure):
    """struct emm_stats."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("version", ctypes.c_uint32)] + \
        [(name, ctypes.c_uint64) for name in _U64_FIELDS]


_vp = ctypes.c_void_p
_sz = ctypes.c_size_t

# name: (restype, argtypes), in the header's order.
PROTOTYPES = {
    "emm_version_string": (ctypes.c_char_p, []),
    "emm_stats_get": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(Stats)]),
    "emm_release_idle": (ctypes.c_longlong, [ctypes.c_int, _sz]),
    "emm_device_alloc": (ctypes.c_int, [_sz, ctypes.c_int, _vp, ctypes.POINTER(_vp)]),
    "emm_device_free": (ctypes.c_int, [_vp, ctypes.c_int, _vp]),
    "emm_alloc": (_vp, [_sz, ctypes.c_int, _vp]),
    "emm_free": (None, [_vp, _sz, ctypes.c_int, _vp]),
    "emm_param_alloc": (_vp, [_vp, _sz, ctypes.c_int]),
    "emm_param_free": (None, [_vp, _vp, ctypes.c_int]),
    "emm_host_alloc": (ctypes.c_int, [_sz, ctypes.c_uint, ctypes.POINTER(_vp)]),
    "emm_host_free": (ctypes.c_int, [_vp]),
    "emm_mem_info": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(_sz), ctypes.POINTER(_sz)]),
    "emm_settings": (_sz, [ctypes.c_char_p, _sz]),
}


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _loaded_path():
    """The path of a libemm already in the process's global scope, or None."""
    try:
        process = ctypes.CDLL(None)
        fn = process.emm_version_string
    except (OSError, AttributeError):
        return None
    info = _DlInfo()
    dladdr = process.dladdr
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    if not dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) or not info.dli_fname:
        return None
    return os.fsdecode(info.dli_fname)


def candidates():
    """Where libemm is looked for, in order (see the module's docstring)."""
    found = []
    loaded = _loaded_path()
    if loaded:
        found.append(loaded)
    if os.environ.get("LIBEMM_PATH"):
        found.append(os.environ["LIBEMM_PATH"])
    found.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libemm.so"))
    found.append("libemm.so.0")
    return found


_lock = threading.Lock()
_lib = None
_path = None


def declare(lib):
    """Set restype and argtypes of every function of PROTOTYPES on `lib`."""
    for name, (restype, argtypes) in PROTOTYPES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def load():
    """(library, path), loading it on first call; OSError if none is found."""
    global _lib, _path
    with _lock:
        if _lib is not None:
            return _lib, _path
        errors = []
        for path in candidates():
            if os.sep in path and not os.path.exists(path):
                continue
            try:
                lib = ctypes.CDLL(path)
                declare(lib)
            except (OSError, AttributeError) as e:
                errors.append(f"{path}: {e}")
                continue
            _lib, _path = lib, path
            return _lib, _path
        raise OSError("libemm not found (looked at: " + "; ".join(candidates()) + ")"
                      + ("; " + "; ".join(errors) if errors else ""))
