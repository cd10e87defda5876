# Stand-in for CuPy (tests/python/stubs/README.md).
from . import cuda  # noqa: F401

STUB = True


class _Pool:
    def malloc(self, size):
        raise AssertionError("the default pool was used")


def get_default_memory_pool():
    return _Pool()


def get_default_pinned_memory_pool():
    return _Pool()
