# SPDX-License-Identifier: MIT
"""emm - libemm from Python, without LD_PRELOAD.

Pure Python over ctypes (libemm.so is the only compiled part). The adapters
install libemm as a framework's allocator through the framework's own door:

    NUMBA_CUDA_MEMORY_MANAGER=emm.numba python app.py   # Numba (NBEP 7)
    import emm.torch; emm.torch.use()                    # PyTorch, before its first allocation
    import emm.cupy; emm.cupy.use()                      # CuPy (device and pinned)

and one process that uses several frameworks gets one heap. When libemm is
also preloaded, the package uses that copy (one heap with the preload).

Functions here: stats(), release_idle(), settings(), version(),
library_path(), and the raw door (device_alloc, device_free, host_alloc,
host_free, mem_info) the adapters are built on. Errors are EmmError (an
OSError with the errno) or OutOfMemoryError (also a MemoryError).
"""
import ctypes
import errno as _errno

from . import _lib

__all__ = ["EmmError", "OutOfMemoryError", "STREAM_NONE", "stats", "release_idle", "settings", "version",
           "library_path", "device_alloc", "device_free", "host_alloc", "host_free", "mem_info"]

#: "No stream": allocate for, or free behind, any stream (cuMemAlloc/cuMemFree semantics).
STREAM_NONE = _lib.STREAM_NONE.value


class EmmError(OSError):
    """A libemm call failed; .errno holds the (positive) errno."""


class OutOfMemoryError(EmmError, MemoryError):
    """The device (or pinned host memory) is out of memory, after libemm released its idle cache."""


def _check(ret, what):
    if ret < 0:
        code = -ret
        cls = OutOfMemoryError if code == _errno.ENOMEM else EmmError
        raise cls(code, f"{what}: {_errno.errorcode.get(code, code)}")
    return ret


def _api():
    return _lib.load()[0]


def library_path():
    """The path of the libemm this package uses (loading it if needed)."""
    return _lib.load()[1]


def version():
    """libemm's version string."""
    return _api().emm_version_string().decode()


def stats(device=-1):
    """libemm's counters as a dict: device -1 the whole process, -2 pinned host memory, else a device ordinal."""
    s = _lib.Stats()
    s.struct_size = ctypes.sizeof(s)
    _check(_api().emm_stats_get(device, ctypes.byref(s)), "emm_stats_get")
    return {name: getattr(s, name) for name, _ in _lib.Stats._fields_ if name != "struct_size"}


def release_idle(device=-1, keep_bytes=0):
    """Give idle cached memory back to the device (after its fences), down to keep_bytes per heap; bytes released."""
    return _check(_api().emm_release_idle(device, keep_bytes), "emm_release_idle")


def settings(sources=False):
    """The EMM_* settings libemm runs with: {name: value}, or {name: (value, source)} with sources=True
    (source: default, env, or invalid when the environment's value was refused)."""
    api = _api()
    size = api.emm_settings(None, 0) + 1
    buf = ctypes.create_string_buffer(size)
    api.emm_settings(buf, size)
    out = {}
    for line in buf.value.decode().splitlines():
        name, _, rest = line.partition("=")
        value, _, source = rest.partition("\t")
        out[name] = (value, source) if sources else value
    return out


def _stream(stream):
    """A stream argument as a pointer value: None is the legacy default stream (0), STREAM_NONE no stream;
    an int, or an object with .handle / .ptr / .value (framework streams), its handle."""
    if stream is None:
        return None
    if not isinstance(stream, int):
        for attr in ("cuda_stream", "ptr", "handle"):  # torch, CuPy, Numba
            if hasattr(stream, attr):
                stream = getattr(stream, attr)
                break
        if isinstance(stream, ctypes.c_void_p):
            stream = stream.value or 0
    return int(stream) or None


def device_alloc(size, device=-1, stream=STREAM_NONE):
    """Device memory: the address (int). stream=STREAM_NONE frees are fenced like cuMemFree; a stream
    makes the block stream-ordered (reusable at once on that stream)."""
    p = ctypes.c_void_p()
    _check(_api().emm_device_alloc(size, device, _stream(stream), ctypes.byref(p)), "emm_device_alloc")
    return p.value


def device_free(ptr, device=-1, stream=STREAM_NONE):
    """Free device memory from device_alloc (or any driver allocation) on `stream`."""
    _check(_api().emm_device_free(ptr, device, _stream(stream)), "emm_device_free")


def host_alloc(size, flags=0):
    """Pinned host memory (cuMemHostAlloc flags): the address (int)."""
    p = ctypes.c_void_p()
    _check(_api().emm_host_alloc(size, flags, ctypes.byref(p)), "emm_host_alloc")
    return p.value


def host_free(ptr):
    """Free pinned host memory from host_alloc."""
    _check(_api().emm_host_free(ptr), "emm_host_free")


def mem_info(device=-1):
    """(free, total) bytes of the device, libemm's idle cache counted as free."""
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _check(_api().emm_mem_info(device, ctypes.byref(free), ctypes.byref(total)), "emm_mem_info")
    return free.value, total.value
