# Stand-in for Numba (tests/python/stubs/README.md).
STUB = True
