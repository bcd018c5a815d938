"""muser: the head of a GGUF language model — final norm, quantized LM head,
logit scale and soft cap — on CPU, CUDA and Metal, with zero-copy numpy logits.

>>> head = muser.Head.load("model.gguf", device="cpu", route="graph")
>>> logits = head(hidden)            # float32 [H] -> [V], a view of the head's buffer
"""
from __future__ import annotations

from . import _core, ops
from ._core import GGUFFile, build_info
from ._quant import dequantize, quantize
from .errors import DeviceError, Error, GGUFError, NonFiniteError, SpecError
from .compare import BoundedLogitPolicy, CompareResult, compare
from .lens import LensResult, lens
from .requantize import requantize
from ._device import DeviceArray
from .head import Head, HeadSpec, NodeProfile, Scores, TopK
from ._sampling import Sample

__version__: str = build_info()["version"]

__all__ = [
    "Head",
    "HeadSpec",
    "NodeProfile",
    "Scores",
    "TopK",
    "Sample",
    "DeviceArray",
    "GGUFFile",
    "quantize",
    "dequantize",
    "ops",
    "compare", "CompareResult", "BoundedLogitPolicy",
    "lens", "LensResult",
    "requantize",
    "build_info",
    "Error",
    "GGUFError",
    "SpecError",
    "DeviceError",
    "NonFiniteError",
]
