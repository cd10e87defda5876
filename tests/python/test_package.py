#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The Python package emm (python/emm) on the CPU.

usage: test_package.py MODE ROOT LIBEMM

  header    the ctypes declarations (emm._lib.PROTOTYPES, Stats) match
            include/emm/emm.h, parsed here, and every function is exported
            (interpose/exports-*.txt); the package imports without a GPU,
            a driver or libemm
  nodriver  no libcuda.so.1 at all: every entry point raises EmmError ENODEV
            cleanly; stats(), settings(), version(), release_idle() answer
  fake      the test-double driver (LD_LIBRARY_PATH): the door, errors, out
            of memory, and the three adapters over the stand-in frameworks
            of tests/python/stubs (the real ones run in the GPU suite)
  preload   libemm also preloaded, LIBEMM_PATH naming another copy: the
            package uses the preloaded one, and a driver call made by the
            program and the package's door share one heap

Exit 0 passed, 1 failed, 77 skipped (nodriver on a machine with a driver).
"""
import ctypes
import errno
import gc
import os
import re
import sys

MODE, ROOT, LIBEMM = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(ROOT, "python"))
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, file=sys.stderr)


def raises(fn, exc, err=None):
    try:
        fn()
    except exc as e:
        return err is None or e.errno == err
    return False


# --- header ------------------------------------------------------------------

C_TYPES = {
    "int": ctypes.c_int, "unsigned int": ctypes.c_uint, "size_t": ctypes.c_size_t,
    "long long": ctypes.c_longlong, "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64,
    "const char *": ctypes.c_char_p, "char *": ctypes.c_char_p, "void *": ctypes.c_void_p,
    "struct CUstream_st *": ctypes.c_void_p, "void": None,
}


def c_type(text, lib):
    """The ctypes type of a C type as the header spells it."""
    t = re.sub(r"\s+", " ", text.replace("*", " * ")).strip()
    stars, base = t.count("*"), t.replace("*", "").strip()
    if stars == 0:
        return C_TYPES[base]
    if stars == 1:
        if base == "struct emm_stats":
            return ctypes.POINTER(lib.Stats)
        return C_TYPES[base + " *"] if base + " *" in C_TYPES else ctypes.POINTER(C_TYPES[base])
    if stars == 2:
        return ctypes.POINTER(C_TYPES[base + " *"])
    raise ValueError(f"unknown C type {text!r}")


def parse_header(path):
    src = open(path).read()
    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    src = re.sub(r"^\s*#.*$", "", src, flags=re.M)
    body = re.search(r"struct emm_stats\s*\{(.*?)\};", src, re.S).group(1)
    fields = [tuple(m.groups()) for m in re.finditer(r"(\w+)\s+(\w+)\s*;", body)]
    protos = {}
    for m in re.finditer(r"([A-Za-z_][\w\s\*]*?)\b(emm_\w+)\s*\(([^)]*)\)\s*;", src):
        ret, name, args = m.group(1).strip(), m.group(2), m.group(3).strip()
        params = []
        if args != "void":
            for a in args.split(","):
                params.append(re.sub(r"\s*\b[A-Za-z_]\w*$", "", a.strip()))  # drop the name
        protos[name] = (ret, params)
    return fields, protos


def test_header():
    from emm import _lib
    fields, protos = parse_header(os.path.join(ROOT, "include", "emm", "emm.h"))
    check(len(protos) >= 11, f"header parse found only {sorted(protos)}")
    ours = [(n, t) for n, t in _lib.Stats._fields_]
    theirs = [(n, C_TYPES[t]) for t, n in fields]
    check(ours == theirs, f"Stats fields differ from struct emm_stats: {set(ours) ^ set(theirs)}")
    check(set(protos) == set(_lib.PROTOTYPES),
          f"functions differ: header only {set(protos) - set(_lib.PROTOTYPES)}, "
          f"package only {set(_lib.PROTOTYPES) - set(protos)}")
    for name, (ret, params) in protos.items():
        if name not in _lib.PROTOTYPES:
            continue
        restype, argtypes = _lib.PROTOTYPES[name]
        check(c_type(ret, _lib) == restype, f"{name}: returns {ret}, ctypes says {restype}")
        want = [c_type(p, _lib) for p in params]
        check(want == list(argtypes), f"{name}: parameters {params}, ctypes says {argtypes}")
    exported = set()
    for f in os.listdir(os.path.join(ROOT, "interpose")):
        if f.startswith("exports-") and f.endswith(".txt"):
            exported |= {l.split("#")[0].strip() for l in open(os.path.join(ROOT, "interpose", f))}
    check(set(protos) <= exported, f"not in an export list: {set(protos) - exported}")
    # the library really has them, with the header's types declared
    _lib.declare(ctypes.CDLL(LIBEMM))
    # no GPU, no framework needed to import the package
    import emm  # noqa: F401
    for sub in ("numba", "torch", "cupy"):
        try:
            __import__(f"emm.{sub}")
        except ImportError as e:
            check(sub in str(e), f"emm.{sub} without {sub}: {e}")


# --- no driver -----------------------------------------------------------------

def test_nodriver():
    try:
        ctypes.CDLL("libcuda.so.1")
        print("a libcuda.so.1 is installed here: nothing to test", file=sys.stderr)
        sys.exit(77)
    except OSError:
        pass
    import emm
    nodev = errno.ENODEV
    check(raises(lambda: emm.device_alloc(4096, 0), emm.EmmError, nodev), "device_alloc: ENODEV")
    check(raises(lambda: emm.device_alloc(4096, 0, None), emm.EmmError, nodev), "device_alloc(stream): ENODEV")
    check(raises(lambda: emm.device_free(0x10000, 0), emm.EmmError, nodev), "device_free: ENODEV")
    emm.device_free(0, 0)  # NULL, as cudaFree(NULL)
    check(raises(lambda: emm.host_alloc(4096), emm.EmmError, nodev), "host_alloc: ENODEV")
    check(raises(lambda: emm.host_free(0x10000), emm.EmmError, nodev), "host_free: ENODEV")
    check(raises(lambda: emm.mem_info(0), emm.EmmError, nodev), "mem_info: ENODEV")
    check(emm._api().emm_alloc(4096, 0, None) is None, "emm_alloc: NULL")
    s = emm.stats()
    check(s["allocs"] == 0 and s["version"] >= 3, f"stats {s['allocs']} {s['version']}")
    check(emm.settings()["EMM_FREE_MODE"] == "fence", "settings")
    check(emm.release_idle() == 0, "release_idle")
    check(re.match(r"\d+\.\d+", emm.version()) is not None, "version")


# --- the test-double driver -----------------------------------------------------

def test_fake():
    import emm
    check(os.path.samefile(emm.library_path(), LIBEMM), f"library {emm.library_path()}")
    s0 = emm.stats()
    p = emm.device_alloc(1 << 20, 0, None)
    emm.device_free(p, 0, None)
    q = emm.device_alloc(1 << 20, 0, None)
    check(q == p, "reused at once on its stream")

    class Stream:  # a framework's stream object
        cuda_stream = 0
    emm.device_free(q, 0, Stream())
    s1 = emm.stats()
    check(s1["allocs"] - s0["allocs"] == 2 and s1["hits"] > s0["hits"], "counted, one hit")
    check(raises(lambda: emm.device_free(q, 0, None), emm.EmmError, errno.EINVAL), "double free: EINVAL")
    check(raises(lambda: emm.device_alloc(0, 0), emm.EmmError, errno.EINVAL), "size 0: EINVAL")
    free, total = emm.mem_info(0)
    check(total == 256 << 20 and free <= total, f"mem_info {free} {total}")
    big = emm.device_alloc(64 << 20, 0)  # a segment of its own, freed without a stream
    emm.device_free(big, 0)
    check(emm.release_idle(0) >= 64 << 20, "release_idle gave the idle segment back")
    check(raises(lambda: emm.device_alloc(1 << 30, 0), emm.OutOfMemoryError, errno.ENOMEM), "OOM")
    check(raises(lambda: emm.device_alloc(1 << 30, 0), MemoryError), "OOM is a MemoryError")
    h = emm.host_alloc(100000)
    ctypes.memset(h, 1, 100000)
    emm.host_free(h)
    check(emm.stats(-2)["allocs"] == 1, "pinned counted")
    check(emm.settings(sources=True)["EMM_FREE_MODE"] == ("fence", "default"), "settings sources")
    adapters()


def stub_subpackages(top, names):
    """Load the stand-in's subpackages from tests/python/stubs by path: an
    installed numba-cuda puts a finder for numba.cuda ahead of sys.path, which
    would mix the real package into the stand-in."""
    import importlib.util
    base = os.path.join(ROOT, "tests", "python", "stubs")
    for name in names:
        rel = os.path.join(base, *name.split("."))
        path = os.path.join(rel, "__init__.py") if os.path.isdir(rel) else rel + ".py"
        spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[rel] if os.path.isdir(rel) else None)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        parent, _, leaf = name.rpartition(".")
        setattr(sys.modules[parent], leaf, mod)


def adapters():
    """emm.torch, emm.cupy, emm.numba over the stubs (or the real frameworks, if installed)."""
    import emm
    sys.path.insert(0, os.path.join(ROOT, "tests", "python", "stubs"))
    import torch
    if getattr(torch, "STUB", False):
        import emm.torch
        a = emm.torch.use()
        check(emm.torch.use() is a, "use() once")
        live = emm.stats()["live_blocks"]
        p = a.alloc(3000, 0, 0)
        check(p is not None and emm.stats()["live_blocks"] == live + 1, "torch alloc through the path")
        a.free(p, 3000, 0, 0)
        check(a.alloc(0, 0, 0) is None, "torch alloc of 0 bytes: NULL")
        check(emm.torch.memory_stats(0)["live_blocks"] == live, "torch free")
    import cupy
    if getattr(cupy, "STUB", False):
        cupy_adapter(cupy)
    import numba
    if getattr(numba, "STUB", False):
        stub_subpackages("numba", ["numba.cuda", "numba.cuda.cudadrv", "numba.cuda.cudadrv.driver"])
        import emm.numba
        from numba.cuda.cudadrv import driver

        class Ctx:
            class device:
                id = 0
        m = emm.numba._numba_memory_manager(context=Ctx())
        m.initialize()
        check(m.interface_version == 1, "interface_version")
        live = emm.stats()["live_blocks"]
        mp = m.memalloc(12345)
        check(mp.size == 12345 and emm.stats()["live_blocks"] == live + 1, "numba memalloc")
        del mp
        gc.collect()
        check(emm.stats()["live_blocks"] == live, "numba finalizer frees at once")
        hp = m.memhostalloc(4096, mapped=True)
        check(len(m.allocations) == 1, "mapped memory kept in allocations")
        del hp
        m.allocations.clear()
        gc.collect()
        check(emm.stats(-2)["live_blocks"] == 0, "numba pinned freed")
        info = m.get_memory_info()
        check(info.total == 256 << 20 and info.free <= info.total, "numba memory info")
        try:
            m.memalloc(1 << 30)
            check(False, "numba OOM")
        except driver.CudaAPIError as e:
            check(e.code == 2, "numba OOM code")
        m.reset()
        check(m.resets == 1, "numba reset")


def cupy_hook(cupy, hook):
    """One door of emm.cupy over the stand-in CuPy: served, freed, 0 bytes, out of memory, other errors."""
    import emm
    import emm.cupy
    check(emm.cupy.use(hook=hook) == hook and emm.cupy.hook == hook, f"cupy hook {hook} taken")
    live, s0 = emm.stats()["live_blocks"], emm.stats()
    mp = cupy.cuda.allocator(5000)
    check(mp.ptr and mp.mem.size == 5000 and emm.stats()["live_blocks"] == live + 1, f"cupy {hook}: malloc")
    ctypes.memset(mp.ptr, 7, 5000)  # the test double's device memory is host memory
    del mp
    gc.collect()
    check(emm.stats()["live_blocks"] == live, f"cupy {hook}: block freed with its last reference")
    s1 = emm.stats()
    check(s1["allocs"] - s0["allocs"] == 1 and s1["frees"] - s0["frees"] == 1 and s1["bad_frees"] == s0["bad_frees"],
          f"cupy {hook}: one alloc, one free through libemm")
    check(cupy.cuda.allocator(0).ptr == 0, f"cupy {hook}: 0 bytes")
    try:
        mp = cupy.cuda.allocator(1 << 30)
        check(False, f"cupy {hook}: out of memory gave a block at {mp.ptr:#x}")
    except cupy.cuda.memory.OutOfMemoryError as e:
        check(e.size == 1 << 30, f"cupy {hook}: OutOfMemoryError size {e.size}")
    gc.collect()
    check(emm.stats()["live_blocks"] == live, f"cupy {hook}: nothing kept after out of memory")
    check(emm.stats()["ooms"] > s1["ooms"], f"cupy {hook}: libemm counted the out of memory")
    get_device = cupy.cuda.runtime.getDevice
    cupy.cuda.runtime.getDevice = lambda: 5  # a device the test double lacks: libemm's own error, not OOM
    try:
        check(raises(lambda: cupy.cuda.allocator(4096), emm.EmmError, errno.ENODEV), f"cupy {hook}: ENODEV")
    finally:
        cupy.cuda.runtime.getDevice = get_device


def cupy_adapter(cupy):
    """emm.cupy: each door, the cheapest one by default, falling back on an older CuPy; pinned memory."""
    import emm
    import emm.cupy
    memory = cupy.cuda.memory
    for hook in emm.cupy.HOOKS:
        cupy_hook(cupy, hook)
    check(emm.cupy.use() == "c", "cupy: CFunctionAllocator taken when CuPy has it")
    hidden = {}
    try:
        hidden["CFunctionAllocator"] = memory.__dict__.pop("CFunctionAllocator")
        check(emm.cupy.use() == "python", "cupy without CFunctionAllocator: PythonFunctionAllocator")
        check(raises(lambda: emm.cupy.use(hook="c"), ValueError), "cupy: hook c refused without it")
        hidden["PythonFunctionAllocator"] = memory.__dict__.pop("PythonFunctionAllocator")
        check(emm.cupy.use() == "object", "cupy without either: the object door")
        cupy_hook(cupy, "object")
    finally:
        for name, value in hidden.items():
            setattr(memory, name, value)
    check(raises(lambda: emm.cupy.use(hook="cython"), ValueError), "cupy: unknown hook refused")
    emm.cupy.use()
    pp = cupy.cuda.pinned_allocator(7000)
    check(pp.ptr and emm.stats(-2)["live_blocks"] == 1, "cupy pinned")
    del pp
    gc.collect()
    check(emm.stats(-2)["live_blocks"] == 0, "cupy pinned freed")
    emm.cupy.unuse()
    check(emm.cupy.hook is None, "cupy unuse")


# --- preloaded as well -----------------------------------------------------------

def test_preload():
    import emm
    preloaded = emm._lib._loaded_path()
    check(preloaded is not None, "the preloaded libemm is found")
    check(os.environ.get("LIBEMM_PATH") and emm.library_path() == preloaded,
          f"package uses the preloaded copy, not LIBEMM_PATH: {emm.library_path()}")
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    check(cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
          and cuda.cuCtxSetCurrent(ctx) == 0, "context")
    s0 = emm.stats()
    d = ctypes.c_uint64()
    check(cuda.cuMemAlloc_v2(ctypes.byref(d), ctypes.c_size_t(65536)) == 0, "cuMemAlloc")
    emm.device_free(d.value, 0)  # the program's driver allocation, freed through the door
    s1 = emm.stats()
    check(s1["allocs"] - s0["allocs"] == 1 and s1["frees"] - s0["frees"] == 1
          and s1["passthrough_frees"] == s0["passthrough_frees"], "one heap for both doors")


{"header": test_header, "nodriver": test_nodriver, "fake": test_fake, "preload": test_preload}[MODE]()
print(f"{MODE}: {'FAILED' if failures else 'ok'}")
sys.exit(1 if failures else 0)
