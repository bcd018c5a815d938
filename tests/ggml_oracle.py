"""llama.cpp's own ggml kernels as test oracles (through muser._ggml's ctypes binding).

Tests call :func:`ggml` first: it skips the test, naming the reason, only when
the ``llama-cpp-python`` package is not installed; when it is installed but its
ggml cannot be used (a missing symbol, an unknown struct layout) the test fails.
"""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from muser import _ggml

# block layouts, for naming the field where two quantizations differ
# (ggml-common.h: block_q8_0, block_q4_K, block_q5_K, block_q6_K)
BLOCK_FIELDS = {
    "Q8_0": (34, [("d", 0, 2), ("qs", 2, 34)]),
    "Q4_K": (144, [("d", 0, 2), ("dmin", 2, 4), ("scales", 4, 16), ("qs", 16, 144)]),
    "Q5_K": (176, [("d", 0, 2), ("dmin", 2, 4), ("scales", 4, 16), ("qh", 16, 48), ("qs", 48, 176)]),
    "Q6_K": (210, [("ql", 0, 128), ("qh", 128, 192), ("scales", 192, 208), ("d", 208, 210)]),
}


def ggml() -> _ggml.GGML:
    """The loaded ggml, or skip when llama-cpp-python is not installed."""
    if os.environ.get("MUSER_GGML_LIB_DIR") is None and importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed (pip install 'muser[pinned]'): "
                    "no llama.cpp ggml to compare against")
    return _ggml.lib()


def describe_block_diff(type_name: str, ours: np.ndarray, theirs: np.ndarray, limit: int = 8) -> str:
    """Name the rows, blocks and fields where two quantizations of the same input differ."""
    size, fields = BLOCK_FIELDS[type_name]
    a = ours.reshape(-1, size)
    b = theirs.reshape(-1, size)
    blocks_per_row = ours.shape[-1] // size if ours.ndim == 2 else a.shape[0]
    lines = []
    bad = np.flatnonzero((a != b).any(axis=1))
    for blk in bad[:limit]:
        parts = []
        for name, s, e in fields:
            diff = np.flatnonzero(a[blk, s:e] != b[blk, s:e])
            if diff.size:
                parts.append(f"{name}[{', '.join(map(str, diff[:6]))}{'...' if diff.size > 6 else ''}] "
                             f"muser={a[blk, s + diff[0]]:#04x} ggml={b[blk, s + diff[0]]:#04x}")
        lines.append(f"row {blk // blocks_per_row} block {blk % blocks_per_row}: " + "; ".join(parts))
    return f"{bad.size} of {a.shape[0]} {type_name} blocks differ:\n  " + "\n  ".join(lines)


def graph_epilogue(logits: np.ndarray, scale: float, cap: float, *, threads: int = 2) -> np.ndarray:
    """ggml's nodes scale(scale) -> scale(1/cap) -> tanh -> scale(cap) on the CPU backend.

    ``1/cap`` is rounded to f32 as llama.cpp's ``1.0f / hparams.f_final_logit_softcapping``;
    ``cap == 0`` leaves only the first scale.
    """
    g = ggml()
    with _ggml.GraphBuilder(g) as gb:
        cur = gb.scale(gb.leaf_f32(np.atleast_2d(logits)), float(np.float32(scale)))
        if cap:
            c = np.float32(cap)
            cur = gb.scale(cur, float(np.float32(1.0) / c))
            cur = gb.tanh(cur)
            cur = gb.scale(cur, float(c))
        return gb.compute(cur, threads).copy()


def rms_norm_mul(x: np.ndarray, gamma: np.ndarray, eps: float, *, use_ref: bool = False,
                 threads: int = 2) -> np.ndarray:
    """ggml_rms_norm(x, eps) then ggml_mul(., gamma) on the CPU backend.

    ``use_ref=False`` lets ggml-cpu fuse the pair (its RMS_NORM+MUL fusion);
    ``use_ref=True`` runs the two ops as separate nodes.
    """
    g = ggml()
    with _ggml.GraphBuilder(g) as gb:
        cur = gb.rms_norm(gb.leaf_f32(np.atleast_2d(x)), float(np.float32(eps)))
        cur = gb.mul(cur, gb.leaf_f32(gamma))
        return gb.compute(cur, threads, use_ref=use_ref).copy()


def layer_norm_mul(x: np.ndarray, gamma: np.ndarray, eps: float, *, threads: int = 2) -> np.ndarray:
    """ggml_norm(x, eps) then ggml_mul(., gamma) on the CPU backend."""
    g = ggml()
    with _ggml.GraphBuilder(g) as gb:
        cur = gb.norm(gb.leaf_f32(np.atleast_2d(x)), float(np.float32(eps)))
        cur = gb.mul(cur, gb.leaf_f32(gamma))
        return gb.compute(cur, threads).copy()


def rms_norm_ggml_numpy(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """ggml-cpu's rms_norm(+mul) re-derived (ops.cpp, ggml_compute_forward_rms_norm_f32):
    ``sum += (ggml_float)(x*x)`` (square in f32, sum in double, index order),
    ``mean = (float)(sum/n)``, ``scale = 1.0f/sqrtf(mean + eps)``, ``y = x*scale*w`` in f32."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float32))
    out = np.empty_like(x)
    e = np.float32(eps)
    for r in range(x.shape[0]):
        sq = (x[r] * x[r]).astype(np.float64)
        s = 0.0
        for v in sq:  # sequential, as the C loop
            s += float(v)
        mean = np.float32(s / x.shape[1])
        scale = np.float32(1.0) / np.sqrt(np.float32(mean + e), dtype=np.float32)
        out[r] = (x[r] * scale) * gamma
    return out


def vec_dot_logits(w: np.ndarray, type_name: str, normed: np.ndarray) -> np.ndarray:
    """One ``mul_mat`` of a single activation row, taken apart: ggml-cpu quantizes
    ``normed`` with its ``from_float`` to the weight type's ``vec_dot_type`` and
    calls ``vec_dot`` once per weight row. Returns float32 [t, rows]."""
    g = ggml()
    tr = g.traits_cpu(type_name)
    vd = _ggml.VecDot(tr.vec_dot)
    xq = g.cpu_from_float(np.atleast_2d(normed), tr.vec_dot_type)
    n = normed.shape[-1]
    out = np.empty((xq.shape[0], w.shape[0]), np.float32)
    s = np.zeros(1, np.float32)
    for t in range(xq.shape[0]):
        y = xq[t].ctypes.data
        for r in range(w.shape[0]):
            vd(n, s.ctypes.data, 0, w[r].ctypes.data, 0, y, 0, 1)
            out[t, r] = s[0]
    return out


def activation_error_bound(w: np.ndarray, type_name: str, normed: np.ndarray, scale: float) -> np.ndarray:
    """A per-logit bound [t, rows] on |exact-activation logit - ggml logit|.

    ggml-cpu quantizes each block of B activations (B = 32 for Q8_0, 256 for Q8_K)
    to int8 with step d = amax/127, so each activation moves by at most d/2 (Q8_0
    also rounds d to f16: at most 127*d/2048 more; 0.6*d covers both); for F16 and
    BF16 weights it rounds activations to that type, for F32 not at all. A logit
    moves by at most sum_j |W_ij| * 0.6*d(j), plus f32 rounding (1e-5 relative to
    sum_j |W_ij x_j|), times the logit scale; the soft cap is 1-Lipschitz.
    """
    g = ggml()
    vdt = g.vec_dot_type(type_name)
    x = np.atleast_2d(normed).astype(np.float64)
    t, n = x.shape
    if vdt.name in ("q8_0", "q8_K"):
        amax = np.abs(x).reshape(t, n // vdt.blck_size, vdt.blck_size).max(axis=2)
        err = 0.6 * np.repeat(amax / 127.0, vdt.blck_size, axis=1)  # [t, n]
    elif vdt.name == "f16":  # activations rounded to f16: half an ulp, or half the subnormal step
        err = np.maximum(np.abs(x) * 2.0**-11, 2.0**-25)
    elif vdt.name == "bf16":
        err = np.abs(x) * 2.0**-8
    elif vdt.name == "f32":
        err = np.zeros_like(x)
    else:
        raise ValueError(f"no bound for activations of type {vdt.name}")
    wabs = np.abs(g.to_float(w, type_name, w.shape[0] * n).reshape(w.shape[0], n)).astype(np.float64) \
        if g.type(type_name).id != 0 else np.abs(w.view(np.float32)).astype(np.float64)
    bound = err @ wabs.T + 1e-5 * np.abs(x) @ wabs.T + 1e-6
    return bound * abs(float(scale))


def emulated_q8_logits(w: np.ndarray, type_name: str, normed: np.ndarray, scale: float, cap: float,
                       chunk: int = 16384) -> np.ndarray:
    """ggml's head math evaluated exactly: ``normed`` quantized by ggml-cpu's own
    ``from_float`` to the weight type's ``vec_dot_type``, decoded, dotted with the
    decoded weight rows in float64 (every product of two short-mantissa values is
    exact), then scale and cap in float64. Only ggml's f32 block-sum rounding is
    left between this and llama.cpp. ``w`` is uint8 [rows, row_bytes]."""
    import muser

    g = ggml()
    vdt = g.vec_dot_type(type_name)
    n = normed.shape[-1]
    xq = g.cpu_from_float(np.atleast_2d(normed), vdt.id)
    x = np.stack([g.to_float(r, vdt.id, n) for r in xq]).astype(np.float64)
    out = np.empty((x.shape[0], w.shape[0]), np.float64)
    for r0 in range(0, w.shape[0], chunk):
        part = np.ascontiguousarray(w[r0:r0 + chunk])
        out[:, r0:r0 + part.shape[0]] = x @ muser.dequantize(part, type_name, (part.shape[0], n)).astype(np.float64).T
    out *= np.float64(np.float32(scale))
    if cap:
        c = np.float64(np.float32(cap))
        out = c * np.tanh(out / c)
    return out.astype(np.float32)
