"""Low-level kernels, one node at a time, on the CPU. The routes are built from
these; the parity tests compare each against ggml's own node."""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import _core


def _2d(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {a.dtype}")
    return np.ascontiguousarray(a.reshape(1, -1) if a.ndim == 1 else a)


def epilogue(logits: np.ndarray, scale: float, cap: float, route: str = "graph") -> np.ndarray:
    """Scale and soft-cap ``logits`` (float32 ``[t, V]``) as ``route`` does; ``cap=0`` means no cap."""
    return _core.ops_epilogue(_2d(logits, "logits"), float(scale), float(cap), route)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float, order: str = "ggml") -> np.ndarray:
    """RMSNorm(x)·γ per row of ``x`` (float32 ``[t, H]``) in ``order`` ("ggml" or "canonical")."""
    return _core.ops_norm(_2d(x, "x"), np.ascontiguousarray(gamma, dtype=np.float32), float(eps), "rms", order)


def layer_norm(x: np.ndarray, gamma: np.ndarray, eps: float, order: str = "ggml") -> np.ndarray:
    """LayerNorm(x)·γ per row of ``x`` (float32 ``[t, H]``), no bias."""
    return _core.ops_norm(_2d(x, "x"), np.ascontiguousarray(gamma, dtype=np.float32), float(eps), "layer", order)


def matvec(w: np.ndarray, weight_type: str, x: np.ndarray, *, order: str = "canonical",
           isa: Optional[str] = None, threads: int = 0) -> np.ndarray:
    """``x @ W.T`` for quantized rows ``w`` (uint8 ``[rows, row_bytes]``) and float32 ``x`` ``[t, cols]``.

    ``order="canonical"`` is the lane order every fast route uses (docs/numerics.md);
    ``"reference"`` the scalar oracle. ``isa`` forces one CPU twin ("scalar", "avx2", "avx512").
    """
    return _core.ops_matvec(np.ascontiguousarray(w), weight_type, _2d(x, "x"), order, isa, int(threads))
