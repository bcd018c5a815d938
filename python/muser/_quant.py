"""GGUF block (de)quantization: numpy float32 <-> the bytes a GGUF tensor stores.

The quantizers write ggml's reference bytes (``quantize_row_*_ref`` in
ggml-quants.c, what ``ggml_quantize_chunk`` runs without an importance matrix);
dequantization is bit-equal to ``gguf.quants.dequantize``. Both run in C++ with
the GIL released.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from . import _core

#: Type names quantize() and dequantize() accept (case-insensitive): the
#: engine's one table (src/cpp/quant_types.h, kSupportedTypes).
SUPPORTED_TYPES = tuple(_core.build_info()["weight_types"])

TypeName = Union[str, Any]  # a name, or an enum member with .name (gguf.GGMLQuantizationType)


def _type_name(type: TypeName) -> str:
    if isinstance(type, str):
        return type
    name = getattr(type, "name", None)
    if isinstance(name, str):
        return name
    raise TypeError(
        f"type must be a type name such as 'Q5_K' (one of {', '.join(SUPPORTED_TYPES)}), "
        f"got {type!r} of type {type.__class__.__name__}"
    )


def _require_ndarray(value: object, arg: str, dtype: str) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise TypeError(f"{arg} must be a numpy.ndarray of {dtype}, got {value.__class__.__name__}")
    return value


def quantize(array: np.ndarray, type: TypeName) -> np.ndarray:
    """Quantize float32 rows into GGUF blocks of ``type``.

    Args:
        array: C-contiguous float32 array, ``(rows, cols)``, or ``(cols,)`` for
            one row. Every value must be finite.
        type: ``"Q8_0"``, ``"Q4_K"``, ``"Q5_K"``, ``"Q6_K"``, or the plain
            conversions ``"F32"``, ``"F16"``, ``"BF16"`` (round to nearest
            even; F16 turns |x| >= 65520 into +-inf, as numpy and ggml do);
            a ``gguf.GGMLQuantizationType`` member works too.

    Returns:
        A new uint8 array of shape ``(rows, row_bytes)``: row ``r`` holds the
        blocks of ``array[r]`` exactly as a GGUF tensor stores them (Q5_K:
        176 bytes per 256 elements; Q8_0: 34 per 32).

    Raises:
        TypeError: ``array`` is not a float32 numpy array.
        ValueError: an unknown or unsupported type; not 1-D/2-D; not
            C-contiguous; ``cols`` not a multiple of the block size (256 for
            the K-quants, 32 for Q8_0); a NaN or infinity; a value so large
            that a block's f16 scale would overflow.
    """
    array = _require_ndarray(array, "array", "float32")
    return _core._quantize(array, _type_name(type))


def dequantize(data: np.ndarray, type: TypeName, shape: Union[int, Sequence[int]]) -> np.ndarray:
    """Decode GGUF block bytes of ``type`` into float32.

    Args:
        data: C-contiguous uint8 array holding ``rows`` consecutive rows of
            blocks (any shape; only the byte count must match), e.g. the
            output of :func:`quantize` or ``GGUFFile.tensor_bytes``.
        type: one of ``"Q8_0"``, ``"Q4_K"``, ``"Q5_K"``, ``"Q6_K"``,
            ``"F32"``, ``"F16"``, ``"BF16"``.
        shape: the logical ``(rows, cols)`` or ``(cols,)`` of the result
            (numpy order: GGUF's ``ne`` reversed).

    Returns:
        A new float32 array of ``shape``, bit-equal to
        ``gguf.quants.dequantize``.

    Raises:
        TypeError: ``data`` is not a uint8 numpy array.
        ValueError: unknown type, bad ``shape``, ``cols`` not a multiple of
            the block size, non-contiguous data, or a byte count that does
            not match ``shape``.
    """
    data = _require_ndarray(data, "data", "uint8")
    if isinstance(shape, (int, np.integer)):
        shape = (int(shape),)
    try:
        dims = [int(s) for s in shape]
    except TypeError:
        raise TypeError(f"shape must be a tuple of ints, got {shape!r}") from None
    return _core._dequantize(data, _type_name(type), dims)
