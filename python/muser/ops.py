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


def matvec(w: np.ndarray, weight_type: str, x: np.ndarray, *, order: str = "canonical", acts: str = "f32",
           isa: Optional[str] = None, threads: int = 0) -> np.ndarray:
    """``x @ W.T`` for quantized rows ``w`` (uint8 ``[rows, row_bytes]``) and float32 ``x`` ``[t, cols]``.

    ``order="canonical"`` is the lane order every fast route uses (docs/numerics.md);
    ``"reference"`` the scalar oracle. ``acts="q8"`` quantizes ``x`` as ggml's CPU
    does for the weight type and multiplies in integers (quantized weights only).
    ``isa`` forces one CPU twin ("scalar", "avx2", "avx512"). ``threads``: 0 (every
    CPU) up to ``muser.build_info()["max_threads"]``; outside that, ValueError.
    """
    w = np.ascontiguousarray(w)
    if acts == "q8":
        if order != "canonical":
            raise ValueError("acts='q8' has one order; leave order='canonical'")
        return _core.ops_matvec_q8(w, weight_type, _2d(x, "x"), isa, int(threads))
    if acts != "f32":
        raise ValueError(f"acts must be 'f32' or 'q8', got {acts!r}")
    return _core.ops_matvec(w, weight_type, _2d(x, "x"), order, isa, int(threads))


def quantize_acts(x: np.ndarray, weight_type: str) -> np.ndarray:
    """The q8 mode's activation blocks for ``x`` (float32 ``[t, cols]``) as bytes:
    Q8_K for K-quant weights, Q8_0 for Q8_0 weights (ggml's CPU rules)."""
    return _core.ops_quantize_acts(_2d(x, "x"), weight_type)
