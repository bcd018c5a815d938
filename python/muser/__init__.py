"""muser: the head of a GGUF language model — final norm, quantized LM head,
logit scale and soft cap — on CPU, CUDA and Metal, with zero-copy numpy logits.
"""
from __future__ import annotations

from . import _core
from ._core import DeviceError, Error, GGUFError, SpecError, build_info

__version__ = build_info()["version"]

__all__ = [
    "Error",
    "GGUFError",
    "SpecError",
    "DeviceError",
    "build_info",
]
