"""Independent float64 oracle of the head, built from the gguf package's own
dequantization (not muser's), and a float32 node-by-node emulation of the
epilogues using the C library's tanhf."""
from __future__ import annotations

import ctypes
import ctypes.util

import gguf
import numpy as np

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.tanhf.restype = ctypes.c_float
_libm.tanhf.argtypes = [ctypes.c_float]


def tanhf(x: np.ndarray) -> np.ndarray:
    """The platform's tanhf, element by element (numpy's float32 tanh is its own code)."""
    flat = np.asarray(x, dtype=np.float32).ravel()
    out = np.fromiter((_libm.tanhf(float(v)) for v in flat), dtype=np.float32, count=flat.size)
    return out.reshape(np.shape(x))


def weight_f64(path: str, name: str) -> np.ndarray:
    """A tensor decoded by gguf's own dequantization (its bytes located by
    muser.GGUFFile, which tests/test_gguf.py checks against gguf.GGUFReader;
    GGUFReader itself takes ~10 s on a 262k-token vocabulary)."""
    import muser
    t = muser.GGUFFile(path).tensor(name)
    raw = muser.GGUFFile(path).tensor_bytes(name)
    qtype = gguf.GGMLQuantizationType[t.type]
    shape = list(reversed(t.shape))
    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        dt = np.float32 if qtype == gguf.GGMLQuantizationType.F32 else np.float16
        return np.frombuffer(raw, dtype=dt).astype(np.float64).reshape(shape)
    rows = raw.reshape(shape[0] if len(shape) == 2 else 1, -1)
    return gguf.quants.dequantize(rows, qtype).astype(np.float64).reshape(shape)


def head_f64(path: str, spec, hidden: np.ndarray) -> np.ndarray:
    """The head in float64: norm, W (gguf's dequantization), scale, cap."""
    x = np.atleast_2d(hidden).astype(np.float64)
    gamma = weight_f64(path, spec.norm_weight)
    if spec.norm == "rms":
        normed = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + np.float64(np.float32(spec.eps)))
    else:
        d = x - x.mean(axis=1, keepdims=True)
        normed = d / np.sqrt((d * d).mean(axis=1, keepdims=True) + np.float64(np.float32(spec.eps)))
    normed = normed * gamma
    logits = normed @ weight_f64(path, spec.output_weight).T
    logits = logits * np.float64(np.float32(spec.applied_scale))
    if spec.softcap:
        cap = np.float64(np.float32(spec.softcap))
        logits = cap * np.tanh(logits / cap)
    return logits


def graph_epilogue_f32(raw: np.ndarray, scale: float, cap: float) -> np.ndarray:
    """ggml's four unary nodes in float32: ×scale, ×(1/cap) rounded to f32, tanhf, ×cap."""
    v = np.float32(raw) * np.float32(scale)
    if cap:
        v = v * np.float32(np.float32(1.0) / np.float32(cap))
        v = tanhf(v)
        v = v * np.float32(cap)
    return v.astype(np.float32)


def fused_epilogue_f32(raw: np.ndarray, scale: float, cap: float) -> np.ndarray:
    """The fused kernel in float32: v = l·scale; cap·tanhf(v / cap) (a division)."""
    v = np.float32(raw) * np.float32(scale)
    if cap:
        v = np.float32(cap) * tanhf(v / np.float32(cap))
    return v.astype(np.float32)
