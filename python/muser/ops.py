"""A route's own nodes over caller arrays, on the CPU device: the epilogue and the
norm are exactly the nodes ``build_route`` emits (so the parity tests, which
compare each against ggml's own node, test the route itself); the matvec runs
one weight matrix on a chosen ISA twin."""
from __future__ import annotations

from typing import Optional

import numpy as np

from . import _core
from ._args import threads_arg


def _2d(a: np.ndarray, name: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype != np.float32:
        raise TypeError(f"{name} must be float32, got {a.dtype}")
    return np.ascontiguousarray(a.reshape(1, -1) if a.ndim == 1 else a)


def epilogue(logits: np.ndarray, scale: float, cap: float, route: str = "graph", *, fuse: bool = True) -> np.ndarray:
    """Scale and soft-cap ``logits`` (float32 ``[t, V]``) with the nodes ``route`` emits
    after its LM head (``build_route``, run on the CPU device); ``cap=0`` means no cap.
    Returns a new array."""
    return _core.ops_route("epilogue", route, _2d(logits, "logits"), scale=float(scale), cap=float(cap), fuse=fuse)


def _norm(kind: str, x: np.ndarray, gamma: np.ndarray, eps: float, order: str, fuse: bool) -> np.ndarray:
    if order not in ("ggml", "canonical"):
        raise ValueError(f"order must be 'ggml' or 'canonical', got {order!r}")
    route = "canonical" if order == "canonical" else "graph"  # every non-canonical route runs ggml's order
    return _core.ops_route("norm", route, _2d(x, "x"), norm=kind, eps=float(eps),
                           gamma=np.ascontiguousarray(gamma, dtype=np.float32), fuse=fuse)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float, order: str = "ggml", *, fuse: bool = True) -> np.ndarray:
    """RMSNorm(x)·γ per row of ``x`` (float32 ``[t, H]``) in ``order`` ("ggml" or "canonical"):
    the route's own norm and γ nodes on the CPU device. Returns a new array."""
    return _norm("rms", x, gamma, eps, order, fuse)


def layer_norm(x: np.ndarray, gamma: np.ndarray, eps: float, order: str = "ggml", *, fuse: bool = True) -> np.ndarray:
    """LayerNorm(x)·γ per row of ``x`` (float32 ``[t, H]``), no bias: the route's own nodes."""
    return _norm("layer", x, gamma, eps, order, fuse)


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
        return _core.ops_matvec_q8(w, weight_type, _2d(x, "x"), isa, threads_arg(threads))
    if acts != "f32":
        raise ValueError(f"acts must be 'f32' or 'q8', got {acts!r}")
    return _core.ops_matvec(w, weight_type, _2d(x, "x"), order, isa, threads_arg(threads))


def quantize_acts(x: np.ndarray, weight_type: str) -> np.ndarray:
    """The q8 mode's activation blocks for ``x`` (float32 ``[t, cols]``) as bytes:
    Q8_K for K-quant weights, Q8_0 for Q8_0 weights (ggml's CPU rules)."""
    return _core.ops_quantize_acts(_2d(x, "x"), weight_type)
