"""Seeded sampling from a head's logits (docs/numerics.md, "Sampling"): the
argument checks and conversions of :meth:`muser.Head.sample`; the per-row work
runs in C++ (src/cpp/muser/sample.h, rows in parallel on the CPU)."""
from __future__ import annotations

import math
import struct
from numbers import Integral, Real
from typing import Any, NamedTuple, Optional

import numpy as np

from . import _core
from ._args import int_arg

_U64_LIMIT = 1 << 64
_F32_MAX = float(np.finfo(np.float32).max)
_F32 = struct.Struct("f")


class Sample(NamedTuple):
    """What :meth:`Head.sample` returns: one token per row (an int and floats for
    one row ``[H]``; int64 ``[t]`` and float32 ``[t]`` arrays for a batch)."""

    tokens: Any              # int64 token ids
    logprobs: Any            # float32: log-probability under the raw capped logits (equals score's)
    processed_logprobs: Any  # float32: log-probability in the processed, renormalized distribution
    kept_mass: Any           # float32: the raw probability of the kept set


class _Params(NamedTuple):
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int
    bias: Optional[np.ndarray]     # float32 [V]
    allowed: Optional[np.ndarray]  # bool [V]


# top_p's integer weights (at most 2^38 each, muser/sample.h) sum below 2^62 for this many tokens
_TOP_P_MAX_VOCAB = 1 << 24


def _f32(value: float) -> float:
    """``value`` rounded to float32 once (an overflow gives inf, as numpy's cast)."""
    try:
        return _F32.unpack(_F32.pack(value))[0]
    except OverflowError:
        return float(np.float32(value))


def _real(name: str, value: Any) -> float:
    if type(value) is float:  # the common case, without the numbers ABC's isinstance
        return value
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    return float(value)


def _bias(logit_bias: Any, V: int) -> Optional[np.ndarray]:
    if logit_bias is None:
        return None
    dense = np.zeros(V, np.float32)
    if isinstance(logit_bias, dict):
        for tok, val in logit_bias.items():
            tok = int_arg("a logit_bias key (token id)", tok)
            if not 0 <= tok < V:
                raise ValueError(f"logit_bias token ids must lie in [0, {V}), got {tok}")
            v = _real(f"logit_bias[{tok}]", val)
            if not (math.isfinite(v) and abs(v) <= _F32_MAX):
                raise ValueError(f"logit_bias values must be finite float32 numbers, got {v} for token {tok}")
            dense[tok] = np.float32(v)
        return dense
    arr = np.asarray(logit_bias)
    if arr.dtype.kind != "f":
        raise TypeError(f"logit_bias must be a {{token: value}} dict or a float array [V], got dtype {arr.dtype}")
    if arr.shape != (V,):
        raise ValueError(f"logit_bias must have shape ({V},) (V), got {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        dense[...] = arr  # rounded to float32 once; an overflow is caught below
    bad = ~np.isfinite(dense)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"logit_bias values must be finite float32 numbers, got {arr[i]} for token {i}")
    return dense


def _allowed(allowed: Any, V: int) -> Optional[np.ndarray]:
    if allowed is None:
        return None
    arr = np.asarray(allowed)
    if arr.dtype != np.bool_:
        raise TypeError(f"allowed must be a bool array [V], got dtype {arr.dtype}")
    if arr.shape != (V,):
        raise ValueError(f"allowed must have shape ({V},) (V), got {arr.shape}")
    if not arr.any():
        raise ValueError("allowed must allow at least one token, got all False")
    return np.ascontiguousarray(arr)


def check_params(V: int, *, seed: Any, positions: Any, temperature: Any, top_k: Any, top_p: Any, min_p: Any,
                 logit_bias: Any, allowed: Any) -> _Params:
    """Checks every argument of :meth:`Head.sample` but ``positions``' length (see
    :func:`check_positions`); numbers are rounded to float32 once, here."""
    t = _real("temperature", temperature)
    if not (math.isfinite(t) and t >= 0.0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if t > 0.0 and _f32(t) == 0.0:
        raise ValueError(f"temperature {temperature} rounds to 0 in float32: pass 0 for greedy or a larger value")
    k = int_arg("top_k", top_k)
    if not 0 <= k <= V:
        raise ValueError(f"top_k must be in [0, {V}] (0: off, at most V), got {top_k}")
    p = _real("top_p", top_p)
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] (1: off), got {top_p}")
    if p < 1.0 and V > _TOP_P_MAX_VOCAB:
        raise ValueError(f"top_p's fixed-point mass holds vocabularies of up to {_TOP_P_MAX_VOCAB} tokens, "
                         f"not {V} (docs/numerics.md, Sampling)")
    mp = _real("min_p", min_p)
    if not 0.0 <= mp <= 1.0:
        raise ValueError(f"min_p must be in [0, 1] (0: off), got {min_p}")
    if t > 0.0:
        missing = [name for name, v in (("seed", seed), ("positions", positions)) if v is None]
        if missing:
            raise ValueError(f"sampling at temperature {temperature} > 0 needs seed= and positions= "
                             f"(the caller owns reproducibility); missing: {', '.join(missing)}")
    s = 0
    if seed is not None:
        s = int_arg("seed", seed)
        if not 0 <= s < _U64_LIMIT:
            raise ValueError(f"seed must be in [0, 2^64), got {seed}")
    return _Params(_f32(t), k, _f32(p), _f32(mp), s, _bias(logit_bias, V), _allowed(allowed, V))


def check_positions(positions: Any, t: int, single: bool) -> np.ndarray:
    """positions as uint64 ``[t]``: an int for one row, an int array ``[t]`` for a batch;
    each in ``[0, 2^64)``. None (greedy without positions) gives zeros."""
    if positions is None:
        return np.zeros(t, np.uint64)
    if single:
        if isinstance(positions, np.ndarray) and positions.ndim != 0:
            raise ValueError(f"positions for one row must be an int, got an array of shape {positions.shape}")
        p = int_arg("positions", positions.item() if isinstance(positions, np.ndarray) else positions)
        if not 0 <= p < _U64_LIMIT:
            raise ValueError(f"positions must be in [0, 2^64), got {p}")
        return np.array([p], np.uint64)
    if isinstance(positions, (Integral, bool)):
        raise ValueError(f"positions for {t} rows must be an int array of shape ({t},), got a single int")
    if isinstance(positions, (list, tuple)):  # Python ints: numpy would mix int64 and uint64 into float64
        for v in positions:
            if isinstance(v, bool) or not isinstance(v, Integral):
                raise TypeError(f"positions must be integers, got {type(v).__name__}")
            if not 0 <= int(v) < _U64_LIMIT:
                raise ValueError(f"positions must be in [0, 2^64), got {v}")
        arr = np.array([int(v) for v in positions], np.uint64)
    else:
        arr = np.asarray(positions)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"positions must be integers, got dtype {arr.dtype}")
    if arr.shape != (t,):
        raise ValueError(f"positions for {t} rows must have shape ({t},), got {arr.shape}")
    if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
        raise ValueError(f"positions must be in [0, 2^64), got {arr.min()}")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def sample_logits(logits: np.ndarray, single: bool, params: _Params, positions: np.ndarray,
                  threads: int = 0) -> Sample:
    """Draws one token per row of host logits ``[t, V]`` (float32, C-contiguous)."""
    return sample_result(_core.sample_rows(
        logits, positions, params.seed, params.temperature, params.top_k, params.top_p, params.min_p,
        params.bias, params.allowed, threads), single)


def sample_result(drawn: Any, single: bool) -> Sample:
    """A :class:`Sample` of an engine's ``(tokens, logprobs, processed_logprobs, kept_mass)``."""
    tokens, lp, plp, mass = drawn
    if single:
        return Sample(int(tokens[0]), float(lp[0]), float(plp[0]), float(mass[0]))
    tokens = np.asarray(tokens, np.int64).reshape(-1)
    lp, plp, mass = (np.asarray(a, np.float32).reshape(-1) for a in (lp, plp, mass))
    return Sample(tokens, lp, plp, mass)
