from . import memory  # noqa: F401


def current_device():
    return 0
