# Stand-in for PyTorch (tests/python/stubs/README.md).
from . import cuda  # noqa: F401

STUB = True
