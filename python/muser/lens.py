"""The logit lens: the head -- final norm, LM head, logit scale, soft cap, i.e. just calling
the :class:`muser.Head` -- applied to every layer's residual stream.

:func:`lens` walks the rows in chunks, so memory is O(chunk * V): the [L, t, V] logits
are never made. Per layer and row it keeps the top-k tokens and their log-probabilities
(the head's own: :meth:`Head.topk` with ``logprobs=True``), the entropy of the layer's
distribution, the target's log-probability and rank (the head's :meth:`Head.score`), and
KL(final layer || layer). Entropy and KL are float64 statistics over the float32 logits
(as :func:`muser.compare`'s KL; docs/numerics.md says why), returned as float32.
"""
from __future__ import annotations

import json
import os
from typing import Any, NamedTuple, Optional, Sequence, Union

import numpy as np

from . import _core
from ._args import int_arg
from .compare import _CHUNK_ELEMENTS, _kl_rows, _log_softmax, check_target_range, load_targets

__all__ = ["lens", "LensResult"]


class LensResult(NamedTuple):
    """What :func:`lens` returns: for each of L layers and t rows.

    ``top_ids`` int64 [L, t, k] and ``top_logprobs`` float32 [L, t, k] (best first, ties to
    the lower id), ``entropy`` float32 [L, t] (nats), ``target_logprobs`` float32 [L, t] and
    ``target_ranks`` int64 [L, t] (1-based; None without targets), ``kl_to_final`` float32
    [L, t]: KL(last layer || layer) in nats (0 for the last layer itself).
    """

    top_ids: np.ndarray
    top_logprobs: np.ndarray
    entropy: np.ndarray
    target_logprobs: Optional[np.ndarray]
    target_ranks: Optional[np.ndarray]
    kl_to_final: np.ndarray

    def summary(self) -> list[dict[str, Any]]:
        """One dict per layer: means over rows, and the last row's top-1 token."""
        out = []
        for layer in range(self.entropy.shape[0]):
            row: dict[str, Any] = {
                "layer": layer,
                "mean_entropy": float(np.mean(self.entropy[layer], dtype=np.float64)),
                "mean_kl_to_final": float(np.mean(self.kl_to_final[layer], dtype=np.float64)),
                "last_top1_id": int(self.top_ids[layer, -1, 0]),
                "last_top1_logprob": float(self.top_logprobs[layer, -1, 0]),
            }
            if self.target_logprobs is not None:
                row["mean_target_logprob"] = float(np.mean(self.target_logprobs[layer], dtype=np.float64))
                row["median_target_rank"] = float(np.median(self.target_ranks[layer]))
            out.append(row)
        return out

    def table(self) -> str:
        """The per-layer summary as a text table."""
        rows = self.summary()
        targets = self.target_logprobs is not None
        head = f"{'layer':>5}  {'entropy':>9}"
        if targets:
            head += f"  {'target logprob':>14}  {'target rank':>11}"
        head += f"  {'KL to final':>11}  {'top-1 (last row)':>22}"
        lines = [head]
        for r in rows:
            line = f"{r['layer']:>5}  {r['mean_entropy']:>9.4f}"
            if targets:
                line += f"  {r['mean_target_logprob']:>14.4f}  {r['median_target_rank']:>11g}"
            line += f"  {r['mean_kl_to_final']:>11.4e}  {r['last_top1_id']:>10} ({r['last_top1_logprob']:+.4f})"
            lines.append(line)
        lines.append("means over rows; target rank: median; KL(final || layer) in nats")
        return "\n".join(lines)

    def to_json(self) -> str:
        """The per-layer summary as JSON."""
        return json.dumps({"layers": self.summary()}, indent=2)


HiddenByLayer = Union[np.ndarray, Sequence[np.ndarray]]


def _layers(hidden_by_layer: Any, hidden_size: int) -> list[np.ndarray]:
    if isinstance(hidden_by_layer, (list, tuple)):
        layers = [np.asarray(x) for x in hidden_by_layer]
        if not layers:
            raise ValueError("hidden_by_layer must hold at least one layer (L >= 1), got an empty sequence")
        for i, x in enumerate(layers):
            if x.ndim != 2:
                raise ValueError(f"layer {i} must be [t, H] with H={hidden_size}, got shape {x.shape}")
    else:
        arr = np.asarray(hidden_by_layer)
        if arr.ndim != 3:
            raise ValueError(f"hidden_by_layer must be [L, t, H] (or a list of [t, H]) with H={hidden_size}, "
                             f"got shape {arr.shape}")
        if arr.shape[0] == 0:
            raise ValueError(f"hidden_by_layer must hold at least one layer (L >= 1), got shape {arr.shape}")
        layers = list(arr)
    t = layers[0].shape[0]
    for i, x in enumerate(layers):
        if x.shape != (t, hidden_size):
            rows = "layer 0's t" if i else "t"
            raise ValueError(f"layer {i} must have shape ({t}, {hidden_size}) ({rows}, H={hidden_size}), got {x.shape}")
    if t == 0:
        raise ValueError("hidden_by_layer has no rows (t = 0)")
    return layers


def lens(head: Any, hidden_by_layer: HiddenByLayer, *, k: int = 5, targets: Any = None,
         chunk: Optional[int] = None, check_finite: bool = True) -> LensResult:
    """Apply ``head`` to every layer's hidden states (the logit lens).

    Args:
        head: a :class:`muser.Head` (or a GGUF path, loaded on the CPU, route ``graph``).
        hidden_by_layer: float32 [L, t, H] or a list of L arrays [t, H] (float16/bfloat16
            are widened exactly, as the head does); the last layer is the one the model's
            head reads, the reference of ``kl_to_final``.
        k: how many top tokens to keep per layer and row, 1..V.
        targets: the next token of each row, int [t] in [0, V) (or a ``.npy`` path): adds
            ``target_logprobs`` and ``target_ranks``.
        chunk: rows per head call (default: about 4 M logits per call). Memory is
            O(chunk * V).
        check_finite: passed to the head (NaN/inf hidden states raise NonFiniteError).

    Returns:
        A :class:`LensResult`.

    Raises:
        TypeError / ValueError: bad shapes, ``k``, ``chunk`` or targets (the message says
        what was expected and what was got).
    """
    if isinstance(head, (str, os.PathLike)):
        from .head import Head

        head = Head.load(head)
    spec = head.spec
    V, H = spec.vocab_size, spec.hidden_size
    k = int_arg("k", k)
    if not 1 <= k <= V:
        raise ValueError(f"k must be in [1, {V}] (V), got {k}")
    layers = _layers(hidden_by_layer, H)
    L, t = len(layers), layers[0].shape[0]
    tgt = None
    if targets is not None:
        tgt = load_targets(targets, t)
        check_target_range(tgt, V)
    if chunk is None:
        chunk = max(1, _CHUNK_ELEMENTS // V)
    elif isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise ValueError(f"chunk must be a positive int (rows per head call), got {chunk!r}")
    threads = int(getattr(head, "_threads", 0))

    top_ids = np.empty((L, t, k), np.int64)
    top_lp = np.empty((L, t, k), np.float32)
    entropy = np.empty((L, t), np.float32)
    kl = np.empty((L, t), np.float32)
    t_lp = None if tgt is None else np.empty((L, t), np.float32)
    t_rank = None if tgt is None else np.empty((L, t), np.int64)

    for s in range(0, t, int(chunk)):
        e = min(t, s + int(chunk))
        grid = None if tgt is None else np.ascontiguousarray(tgt[s:e, None])
        lp_final = p_final = None
        for layer in range(L - 1, -1, -1):  # the last layer first: the reference of the KL
            # one head call per layer and chunk; the reductions below are the ones Head.topk and
            # Head.score run on those logits (one definition of each, one pass over the weight)
            logits = head(layers[layer][s:e], check_finite=check_finite)
            if logits.ndim == 1:
                logits = logits.reshape(1, -1)
            ids, vals = _core.topk_rows(logits, k)
            if grid is None:
                lse = np.asarray(_core.logsumexp_rows(logits, threads), dtype=np.float32)
            else:
                lp, _, ranks, lse = _core.score_rows(logits, grid, threads)
                t_lp[layer, s:e] = np.asarray(lp, np.float32).reshape(-1)
                t_rank[layer, s:e] = np.asarray(ranks, np.int64).reshape(-1)
                lse = np.asarray(lse, np.float32)
            top_ids[layer, s:e] = np.asarray(ids, np.int64).reshape(-1, k)
            top_lp[layer, s:e] = np.asarray(vals, np.float32).reshape(-1, k) - lse[:, None]
            lp64 = _log_softmax(logits)
            del logits  # the head may reuse its buffer
            p64 = np.exp(lp64)
            plogp = np.multiply(p64, lp64)
            np.copyto(plogp, 0.0, where=p64 == 0)  # 0 log 0 = 0
            entropy[layer, s:e] = -plogp.sum(axis=1)
            del plogp
            if lp_final is None:
                lp_final, p_final = lp64, p64
                kl[layer, s:e] = 0.0
            else:
                kl[layer, s:e] = _kl_rows(lp_final, p_final, lp64)
                del lp64, p64
        del lp_final, p_final
    return LensResult(top_ids, top_lp, entropy, t_lp, t_rank, kl)
