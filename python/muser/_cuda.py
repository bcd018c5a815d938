"""The CUDA backend's own helpers: how many GPUs, why none, and the read
kernel whose time is the benches' limit. Running a head on a GPU goes through
:mod:`muser._device`, by the device's abilities."""
from __future__ import annotations

from . import _core
from ._device import route_seconds  # noqa: F401 -- the benches' one import


def device_count() -> int:
    """GPUs muser can use (0 without a CUDA build, driver or GPU; never raises)."""
    return int(_core.cuda_device_count())


def no_device_reason() -> str:
    """Why :func:`device_count` is 0 ('' when it is not)."""
    return str(_core.cuda_no_device_reason())


def read_bandwidth(nbytes: int, iters: int = 20, device: int = 0, held: bool = False) -> list[float]:
    """Seconds of each timed pass of a read-only kernel over ``nbytes`` (the read limit);
    ``held`` as in route_seconds."""
    return list(_core.cuda_read_bandwidth(int(nbytes), int(iters), int(device), bool(held)))
