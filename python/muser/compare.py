"""Comparing two sources of logits row by row: :func:`compare` and :class:`BoundedLogitPolicy`.

A *source* is anything that yields logits for the same rows:

* a :class:`muser.Head` or any callable ``f(hidden[t, H]) -> logits[t, V]``
  (called on chunks of the ``hidden`` array you pass);
* saved logits: a float32 ``np.ndarray`` [N, V], a ``.npy`` path (memory
  mapped), or an ``.npz`` path with a ``logits`` array (as
  :meth:`muser.pinned.Capture.save` writes);
* a GGUF path string, optionally ``path.gguf:route`` and/or ``path.gguf@device``
  (``"head.gguf:pinned"``, ``"head.gguf:graph@cpu"``), loaded with
  :meth:`muser.Head.load`.

:func:`compare` streams both sources ``chunk_rows`` rows at a time, so neither
side's full logits need to be in memory, and returns a :class:`CompareResult`.
The seed's Ch 32 accepts a remote engine's logits by a *bounded-logit policy*
(``max delta < 11, mean < 1.25``, measured on soft-capped logits):
:class:`BoundedLogitPolicy` states one and checks a result against it, naming
the rows that break it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Union

import numpy as np

from ._core import Error
from ._args import int64_ids

__all__ = ["compare", "CompareResult", "BoundedLogitPolicy", "PolicyVerdict", "load_source", "Source"]

Source = Union[np.ndarray, str, os.PathLike, Callable[[np.ndarray], np.ndarray]]

# elements per streamed chunk when chunk_rows is not given (~32 MiB per float64 temporary)
_CHUNK_ELEMENTS = 1 << 22


# ---------------------------------------------------------------------------
# sources

@dataclass
class _Src:
    label: str
    logits: np.ndarray | None = None      # saved logits [N, V]
    fn: Callable[[np.ndarray], np.ndarray] | None = None

    def rows(self) -> int | None:
        return None if self.logits is None else int(self.logits.shape[0])

    def get(self, hidden: np.ndarray | None, s: int, e: int) -> np.ndarray:
        if self.logits is not None:
            return np.asarray(self.logits[s:e], dtype=np.float32)
        if hidden is None:
            raise Error(f"{self.label} computes logits from hidden states: pass hidden=")
        out = self.fn(np.ascontiguousarray(hidden[s:e], dtype=np.float32))
        # any callable may return a view of memory it reuses: own the bytes now
        out = np.array(out, dtype=np.float32, copy=True)
        if out.ndim != 2 or out.shape[0] != e - s:
            raise Error(f"{self.label} returned shape {out.shape} for {e - s} hidden rows")
        return out


def _split_spec(spec: str) -> tuple[str, str | None, str | None]:
    """``path[:route][@device]`` -> (path, route, device); a ':' inside the path is kept
    unless what follows it is a route name."""
    device = None
    if "@" in spec:
        spec, device = spec.rsplit("@", 1)
    route = None
    head, sep, tail = spec.rpartition(":")
    if sep and tail in ("reference", "fused", "graph", "canonical", "pinned") and head:
        spec, route = head, tail
    return spec, route, device


def load_source(src: Source, *, route: str | None = None, device: str | None = None,
                acts: str | None = None) -> _Src:
    """Turn a source (see the module docstring) into something :func:`compare` can stream.

    ``route``/``device``/``acts`` apply to GGUF paths that do not spell their own.
    """
    if isinstance(src, _Src):
        return src
    if isinstance(src, np.ndarray):
        if src.ndim != 2:
            raise Error(f"saved logits must be a 2-d [rows, vocab] array; got shape {src.shape}")
        return _Src(f"array{list(src.shape)}", logits=src)
    if isinstance(src, (str, os.PathLike)):
        text = os.fspath(src)
        if text.endswith(".npy"):
            arr = _load_npy(text)
            return _Src(text, logits=arr)
        if text.endswith(".npz"):
            with np.load(text, allow_pickle=False) as z:
                if "logits" not in z:
                    raise Error(f"{text}: no 'logits' array (has {list(z.keys())})")
                return _Src(text, logits=np.asarray(z["logits"]))
        path, r, d = _split_spec(text)
        if not os.path.exists(path):
            raise Error(f"no such file: {path}")
        import muser
        kw: dict[str, Any] = {"route": r or route or "graph", "device": d or device or "cpu"}
        if acts:
            kw["acts"] = acts
        head = muser.Head.load(path, **kw)
        label = f"{path}:{kw['route']}@{kw['device']}" + (f" acts={acts}" if acts else "")
        return _Src(label, fn=head)
    if callable(src):
        path, route = getattr(src, "path", None), getattr(src, "route", None)
        if isinstance(path, str) and isinstance(route, str):  # a muser.Head
            label = f"{path}:{route}@{getattr(src, 'device', '?')}"
            acts = getattr(src, "acts", "f32")
            return _Src(label + (f" acts={acts}" if acts != "f32" else ""), fn=src)
        return _Src(getattr(src, "__name__", None) or type(src).__name__, fn=src)
    raise Error(f"cannot compare a {type(src).__name__}: expected a Head, a callable, "
                "an ndarray of logits, or a .npy/.npz/.gguf path")


def _load_npy(path: str) -> np.ndarray:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        raise Error(f"{path}: cannot read as .npy: {e}") from e
    if arr.ndim != 2:
        raise Error(f"{path}: saved logits must be 2-d [rows, vocab]; got shape {arr.shape}")
    return arr


# ---------------------------------------------------------------------------
# the result

@dataclass
class CompareResult:
    """Row-by-row comparison of two logits sources ``a`` (candidate) and ``b`` (reference).

    Attributes:
        a, b: labels of the sources.
        rows, vocab: the compared shape.
        k: the k of the top-k overlap.
        max_abs: max over every element of ``|a - b|`` (NaN if any element is NaN).
        mean_abs: mean over every element of ``|a - b|``.
        byte_equal: fraction of elements whose float32 bits are identical.
        argmax_agreement: fraction of rows where ``argmax(a) == argmax(b)``.
        argmax_disagree: the row indices where they differ.
        topk_overlap: mean over rows of ``|topk(a) & topk(b)| / k``.
        kl_divergence: mean over rows of KL(softmax(b) || softmax(a)) in nats,
            computed in float64 (b is the reference distribution).
        per_row: arrays of length ``rows``: ``max_abs``, ``mean_abs``, ``argmax_a``,
            ``argmax_b``, ``topk_overlap``, ``kl``, ``gap_b`` (top-1 minus top-2
            logit of b: a disagreement where ``gap_b`` is below the max |Δ| is a near-tie);
            with ``targets`` also ``nll_a``, ``nll_b`` (-log p of the target) and ``delta_p``.

    With ``targets`` (the next token of each row) the result also carries
    llama-perplexity's KL-divergence statistics, b in the role of its *base*
    (the reference) and a in the role of *Q*; each ``*_se`` is the standard error
    of the value before it (as llama-perplexity prints ±). Without targets they are None.

        kld_mean, kld_median, kld_p99, kld_p999, kld_max, kld_min: over the per-row
            KL(b || a) (``per_row["kl"]``); percentiles interpolate linearly, as llama's.
        delta_p_mean, delta_p_rms: over Δp = p_a(target) - p_b(target).
        same_top_p: fraction of rows where argmax(a) == argmax(b).
        ppl_a, ppl_b: exp(mean -log p(target)) of each side; ln_ppl_ratio = ln(ppl_a / ppl_b),
            ppl_ratio, ppl_diff = ppl_a - ppl_b, ppl_cor: the correlation of the two sides'
            -log p (llama's "Cor(ln(PPL(Q)), ln(PPL(base)))").
    """

    a: str
    b: str
    rows: int
    vocab: int
    k: int
    max_abs: float
    mean_abs: float
    byte_equal: float
    argmax_agreement: float
    argmax_disagree: list[int]
    topk_overlap: float
    kl_divergence: float
    per_row: dict[str, np.ndarray] = field(repr=False)
    kld_mean: float | None = None
    kld_mean_se: float | None = None
    kld_median: float | None = None
    kld_p99: float | None = None
    kld_p999: float | None = None
    kld_max: float | None = None
    kld_min: float | None = None
    delta_p_mean: float | None = None
    delta_p_mean_se: float | None = None
    delta_p_rms: float | None = None
    delta_p_rms_se: float | None = None
    same_top_p: float | None = None
    same_top_p_se: float | None = None
    ppl_a: float | None = None
    ppl_a_se: float | None = None
    ppl_b: float | None = None
    ppl_b_se: float | None = None
    ppl_cor: float | None = None
    ln_ppl_ratio: float | None = None
    ln_ppl_ratio_se: float | None = None
    ppl_ratio: float | None = None
    ppl_ratio_se: float | None = None
    ppl_diff: float | None = None
    ppl_diff_se: float | None = None

    @property
    def has_targets(self) -> bool:
        """True when the comparison was given targets (the KL-divergence statistics are set)."""
        return self.kld_mean is not None

    def to_dict(self, per_row: bool = False) -> dict[str, Any]:
        """JSON-ready summary (``per_row=True`` adds the per-row lists)."""
        d = {
            "a": self.a, "b": self.b, "rows": self.rows, "vocab": self.vocab, "k": self.k,
            "max_abs": _num(self.max_abs), "mean_abs": _num(self.mean_abs),
            "byte_equal": _num(self.byte_equal),
            "argmax_agreement": _num(self.argmax_agreement),
            "argmax_disagree": [int(r) for r in self.argmax_disagree],
            "topk_overlap": _num(self.topk_overlap), "kl_divergence": _num(self.kl_divergence),
        }
        if self.has_targets:
            d.update({name: _num(getattr(self, name)) for name in _TARGET_FIELDS})
        if per_row:
            d["per_row"] = {k: [_num(x) for x in v.tolist()] for k, v in self.per_row.items()}
        return d

    def table(self) -> str:
        """A small human-readable table."""
        dis = self.argmax_disagree
        shown = ", ".join(map(str, dis[:10])) + (f", ... ({len(dis)} rows)" if len(dis) > 10 else "")
        lines = [
            f"a: {self.a}",
            f"b: {self.b}",
            f"{'rows x vocab':<22}{self.rows} x {self.vocab}",
            f"{'max |a-b|':<22}{self.max_abs:.6g}",
            f"{'mean |a-b|':<22}{self.mean_abs:.6g}",
            f"{'byte-equal':<22}{100 * self.byte_equal:.2f} %",
            f"{'argmax agreement':<22}{100 * self.argmax_agreement:.2f} %"
            + (f"  (differs at rows {shown})" if dis else ""),
            f"{f'top-{self.k} overlap':<22}{100 * self.topk_overlap:.2f} %",
            f"{'KL(b || a), mean':<22}{self.kl_divergence:.3e} nats",
        ]
        return "\n".join(lines)

    def llama_table(self) -> str:
        """The KL-divergence statistics in llama-perplexity's layout (its ``--kl-divergence``
        summary: perplexity, KL divergence and token-probability blocks); needs ``targets``."""
        if not self.has_targets:
            raise Error("the llama-perplexity statistics need targets: compare(..., targets=)")
        kl, dp = self.per_row["kl"], self.per_row["delta_p"]
        pct = lambda v, f: _percentile(v, f)  # noqa: E731
        out = [
            "====== Perplexity statistics ======",
            f"Mean PPL(Q)                   : {self.ppl_a:10.6f} ± {self.ppl_a_se:10.6f}",
            f"Mean PPL(base)                : {self.ppl_b:10.6f} ± {self.ppl_b_se:10.6f}",
            f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * self.ppl_cor:6.2f}%",
            f"Mean ln(PPL(Q)/PPL(base))     : {self.ln_ppl_ratio:10.6f} ± {self.ln_ppl_ratio_se:10.6f}",
            f"Mean PPL(Q)/PPL(base)         : {self.ppl_ratio:10.6f} ± {self.ppl_ratio_se:10.6f}",
            f"Mean PPL(Q)-PPL(base)         : {self.ppl_diff:10.6f} ± {self.ppl_diff_se:10.6f}",
            "",
            "====== KL divergence statistics ======",
            f"Mean    KLD: {self.kld_mean:10.6f} ± {self.kld_mean_se:10.6f}",
            f"Maximum KLD: {self.kld_max:10.6f}",
            f"99.9%   KLD: {self.kld_p999:10.6f}",
            f"99.0%   KLD: {self.kld_p99:10.6f}",
            f"95.0%   KLD: {pct(kl, 0.95):10.6f}",
            f"90.0%   KLD: {pct(kl, 0.90):10.6f}",
            f"Median  KLD: {self.kld_median:10.6f}",
            f"10.0%   KLD: {pct(kl, 0.10):10.6f}",
            f" 5.0%   KLD: {pct(kl, 0.05):10.6f}",
            f" 1.0%   KLD: {pct(kl, 0.01):10.6f}",
            f" 0.1%   KLD: {pct(kl, 0.001):10.6f}",
            f"Minimum KLD: {self.kld_min:10.6f}",
            "",
            "====== Token probability statistics ======",
            f"Mean    Δp: {100 * self.delta_p_mean:6.3f} ± {100 * self.delta_p_mean_se:5.3f} %",
            f"Maximum Δp: {100 * float(dp.max()):6.3f}%",
        ]
        for label, f in (("99.9%", 0.999), ("99.0%", 0.99), ("95.0%", 0.95), ("90.0%", 0.90), ("75.0%", 0.75),
                         ("Median", 0.5), ("25.0%", 0.25), ("10.0%", 0.10), (" 5.0%", 0.05), (" 1.0%", 0.01),
                         (" 0.1%", 0.001)):
            out.append(f"{label:<7} Δp: {100 * pct(dp, f):6.3f}%")
        out += [
            f"Minimum Δp: {100 * float(dp.min()):6.3f}%",
            f"RMS Δp    : {100 * self.delta_p_rms:6.3f} ± {100 * self.delta_p_rms_se:5.3f} %",
            f"Same top p: {100 * self.same_top_p:6.3f} ± {100 * self.same_top_p_se:5.3f} %",
        ]
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table()


_TARGET_FIELDS = ("kld_mean", "kld_mean_se", "kld_median", "kld_p99", "kld_p999", "kld_max", "kld_min",
                  "delta_p_mean", "delta_p_mean_se", "delta_p_rms", "delta_p_rms_se", "same_top_p", "same_top_p_se",
                  "ppl_a", "ppl_a_se", "ppl_b", "ppl_b_se", "ppl_cor", "ln_ppl_ratio", "ln_ppl_ratio_se",
                  "ppl_ratio", "ppl_ratio_se", "ppl_diff", "ppl_diff_se")


def _num(x: Any) -> Any:
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


# ---------------------------------------------------------------------------

def _log_softmax(x: np.ndarray) -> np.ndarray:
    """float64 log-softmax of float32 logit rows [r, V]: one [r, V] float64 result plus one
    temporary. The statistics are float64 on purpose: a float32 logsumexp's rounding
    (an ulp of ~10 is 1e-6 nats) is larger than the KL of an F16 head (docs/numerics.md)."""
    z = x.astype(np.float64)
    m = np.max(z, axis=1, keepdims=True)
    m[~np.isfinite(m)] = 0.0
    z -= m
    e = np.exp(z)
    s = np.sum(e, axis=1, keepdims=True)
    del e
    z -= np.log(s)
    return z


def _kl_rows(lp_ref: np.ndarray, p_ref: np.ndarray, lp: np.ndarray) -> np.ndarray:
    """Per-row KL(ref || other) = sum p_ref (log p_ref - log p), float64; overwrites ``lp``.
    Tokens with p_ref == 0 contribute nothing (even where a log-probability is -inf)."""
    with np.errstate(invalid="ignore"):
        np.subtract(lp_ref, lp, out=lp)
        lp *= p_ref
    np.copyto(lp, 0.0, where=p_ref == 0)
    return lp.sum(axis=1)


def _topk(x: np.ndarray, k: int) -> np.ndarray:
    if k >= x.shape[1]:
        return np.broadcast_to(np.arange(x.shape[1]), x.shape)
    # a copy of the k columns, so the [r, V] index array argpartition made is freed now
    return np.argpartition(-x, k - 1, axis=1)[:, :k].copy()


def _percentile(values: np.ndarray, fraction: float) -> float:
    """llama-perplexity's percentile: linear between the sorted values at fraction * (n - 1)."""
    return float(np.percentile(values, 100.0 * fraction, method="linear"))


def _mean_se(x: np.ndarray) -> tuple[float, float]:
    """Mean and its standard error sqrt(var / (n - 1)) (llama's ± ; NaN for one row)."""
    n = x.size
    mean = float(x.mean())
    se = float(np.sqrt(np.var(x) / (n - 1))) if n > 1 else math.nan
    return mean, se


def _target_stats(per_row: dict[str, np.ndarray]) -> dict[str, float]:
    """llama-perplexity's summary (kl_divergence() in tools/perplexity/perplexity.cpp) from the
    per-row values, with b as its base and a as Q; two-pass float64 moments."""
    kl, dp = per_row["kl"], per_row["delta_p"]
    nll_a, nll_b = per_row["nll_a"], per_row["nll_b"]
    n = kl.size
    out: dict[str, float] = {}
    out["kld_mean"], out["kld_mean_se"] = _mean_se(kl)
    out["kld_median"] = float(np.median(kl))
    out["kld_p99"], out["kld_p999"] = _percentile(kl, 0.99), _percentile(kl, 0.999)
    out["kld_max"], out["kld_min"] = float(kl.max()), float(kl.min())
    out["delta_p_mean"], out["delta_p_mean_se"] = _mean_se(dp)
    mse, mse_se = _mean_se(dp * dp)
    rms = math.sqrt(mse)
    out["delta_p_rms"] = rms
    out["delta_p_rms_se"] = 0.5 / rms * mse_se if rms > 0 else 0.0  # d sqrt(x) = dx / (2 sqrt(x))
    same = float(np.mean(per_row["argmax_a"] == per_row["argmax_b"]))
    out["same_top_p"] = same
    out["same_top_p_se"] = math.sqrt(same * (1 - same) / (n - 1)) if n > 1 else math.nan
    mean_a, se_a = _mean_se(nll_a)
    mean_b, se_b = _mean_se(nll_b)
    # covariance of the two means (llama's covariance(): the sample covariance / (n - 1))
    cov = float(np.mean((nll_a - mean_a) * (nll_b - mean_b)) / (n - 1)) if n > 1 else math.nan
    ppl_a, ppl_b = math.exp(mean_a), math.exp(mean_b)
    out["ppl_a"], out["ppl_a_se"] = ppl_a, ppl_a * se_a  # d exp(x) = exp(x) dx
    out["ppl_b"], out["ppl_b_se"] = ppl_b, ppl_b * se_b
    with np.errstate(invalid="ignore", divide="ignore"):
        out["ppl_cor"] = float(np.float64(cov) / (se_a * se_b))
    ln_ratio = mean_a - mean_b
    ln_ratio_se = math.sqrt(max(se_a * se_a + se_b * se_b - 2 * cov, 0.0)) if n > 1 else math.nan
    out["ln_ppl_ratio"], out["ln_ppl_ratio_se"] = ln_ratio, ln_ratio_se
    out["ppl_ratio"] = math.exp(ln_ratio)
    out["ppl_ratio_se"] = out["ppl_ratio"] * ln_ratio_se
    out["ppl_diff"] = ppl_a - ppl_b
    sa, sb = out["ppl_a_se"], out["ppl_b_se"]
    out["ppl_diff_se"] = math.sqrt(max(sa * sa + sb * sb - 2 * ppl_a * ppl_b * cov, 0.0)) if n > 1 else math.nan
    return out


def compare(a: Source, b: Source, *, hidden: np.ndarray | str | None = None, k: int = 5,
            chunk_rows: int | None = None, targets: np.ndarray | str | os.PathLike | None = None) -> CompareResult:
    """Compare logits source ``a`` (candidate) against ``b`` (reference), streaming in chunks.

    Args:
        a, b: a Head or callable (needs ``hidden``), saved logits (ndarray,
            ``.npy`` or ``.npz`` path), or a ``path.gguf[:route][@device]`` string.
        hidden: float32 [N, H] hidden states (or a ``.npy`` path, or an ``.npz``
            with a ``hidden`` array) for sources that compute logits.
        k: top-k size for the overlap.
        chunk_rows: rows per chunk (default: about 4 M logits per chunk). Memory is
            O(chunk_rows * V): no [N, V] array is ever made.
        targets: the next token of each row, int [N] in [0, V) (or a ``.npy`` path):
            adds llama-perplexity's KL-divergence, Δp, same-top-p and perplexity
            statistics (see :class:`CompareResult`), b as the base.

    Returns:
        A :class:`CompareResult`. KL is KL(softmax(b) || softmax(a)), mean over rows,
        computed in float64 from the float32 logits each source gives.

    Raises:
        muser.Error: shapes disagree, no rows, or a source needs ``hidden`` that was not given.
        TypeError: ``targets`` are not integers.
        ValueError: ``targets`` have the wrong shape or an id outside [0, V).
    """
    if int(k) < 1:
        raise Error(f"k must be >= 1; got {k}")
    k = int(k)
    sa, sb = load_source(a), load_source(b)
    h = _load_hidden(hidden)
    counts = {s.rows() for s in (sa, sb) if s.rows() is not None}
    if h is not None:
        counts.add(int(h.shape[0]))
    if len(counts) != 1:
        raise Error(f"row counts differ: a={sa.rows()}, b={sb.rows()}, "
                    f"hidden={None if h is None else h.shape[0]}")
    n = counts.pop()
    if n == 0:
        raise Error("nothing to compare: 0 rows")
    tgt = None if targets is None else load_targets(targets, n)

    vocab: int | None = None
    keys = ["max_abs", "mean_abs", "argmax_a", "argmax_b", "topk_overlap", "kl", "gap_b"]
    if tgt is not None:
        keys += ["nll_a", "nll_b", "delta_p"]
    pr: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    sum_abs = 0.0
    n_equal = 0
    step = chunk_rows
    if step is None:
        v = next((src.logits.shape[1] for src in (sa, sb) if src.logits is not None), None)
        step = max(1, _CHUNK_ELEMENTS // v) if v else None  # else decided after the first chunk
    elif int(step) < 1:
        raise Error(f"chunk_rows must be >= 1; got {chunk_rows}")
    s = 0
    while s < n:
        e = min(n, s + int(step or 8))
        la = sa.get(h, s, e)
        lb = sb.get(h, s, e)
        if la.shape != lb.shape:
            raise Error(f"rows {s}:{e}: a gives {la.shape}, b gives {lb.shape}")
        if vocab is None:
            vocab = la.shape[1]
            step = step or max(1, _CHUNK_ELEMENTS // max(vocab, 1))
            if tgt is not None:
                check_target_range(tgt, vocab)
        elif la.shape[1] != vocab:
            raise Error(f"rows {s}:{e}: vocab changed from {vocab} to {la.shape[1]}")
        # each [r, V] temporary is freed before the next is made (the chunk's memory bound)
        d = np.abs(np.subtract(la, lb, dtype=np.float64))
        pr["max_abs"].append(d.max(axis=1))
        pr["mean_abs"].append(d.mean(axis=1))
        sum_abs += float(d.sum())
        del d
        n_equal += int(np.count_nonzero(la.view(np.uint32) == lb.view(np.uint32)))
        pr["argmax_a"].append(np.argmax(la, axis=1))
        pr["argmax_b"].append(np.argmax(lb, axis=1))
        kk = min(k, vocab)
        ta, tb = _topk(la, kk), _topk(lb, kk)
        pr["topk_overlap"].append((ta[:, :, None] == tb[:, None, :]).any(axis=2).sum(axis=1) / kk)
        if vocab >= 2:
            top2 = -np.partition(-lb, 1, axis=1)[:, :2]
            pr["gap_b"].append((top2[:, 0].astype(np.float64) - top2[:, 1]))
        else:
            pr["gap_b"].append(np.full(e - s, np.inf))
        lpa = _log_softmax(la)
        del la
        lpb = _log_softmax(lb)
        del lb
        if tgt is not None:
            rows = np.arange(e - s)
            lta, ltb = lpa[rows, tgt[s:e]], lpb[rows, tgt[s:e]]
            pr["nll_a"].append(-lta)
            pr["nll_b"].append(-ltb)
            pr["delta_p"].append(np.exp(lta) - np.exp(ltb))
        pb = np.exp(lpb)
        pr["kl"].append(_kl_rows(lpb, pb, lpa))
        del lpa, lpb, pb
        s = e

    per_row = {key: np.concatenate(v) for key, v in pr.items()}
    agree = per_row["argmax_a"] == per_row["argmax_b"]
    return CompareResult(
        a=sa.label, b=sb.label, rows=n, vocab=int(vocab), k=k,
        max_abs=float(per_row["max_abs"].max()),
        mean_abs=sum_abs / (n * vocab),
        byte_equal=n_equal / (n * vocab),
        argmax_agreement=float(agree.mean()),
        argmax_disagree=[int(r) for r in np.flatnonzero(~agree)],
        topk_overlap=float(per_row["topk_overlap"].mean()),
        kl_divergence=float(per_row["kl"].mean()),
        per_row=per_row,
        **(_target_stats(per_row) if tgt is not None else {}),
    )


def load_targets(targets: np.ndarray | str | os.PathLike, rows: int) -> np.ndarray:
    """Targets (the next token of each of ``rows`` rows) as int64 [rows]: an integer array or a
    ``.npy`` path. Raises TypeError (not integers) or ValueError (wrong shape, negative)."""
    if isinstance(targets, (str, os.PathLike)):
        path = os.fspath(targets)
        try:
            targets = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise Error(f"{path}: cannot read targets as .npy: {e}") from e
    t = int64_ids(targets, "targets")
    if t.shape != (rows,):
        raise ValueError(f"targets must have shape ({rows},) (one token per row), got {t.shape}")
    if t.size and t.min() < 0:
        raise ValueError(f"targets must be token ids >= 0, got {int(t.min())} at row {int(np.argmin(t))}")
    return t


def check_target_range(targets: np.ndarray, vocab: int) -> None:
    """ValueError unless every target is a token id in [0, vocab)."""
    if targets.size and targets.max() >= vocab:
        r = int(np.argmax(targets))
        raise ValueError(f"targets must lie in [0, {vocab}) (the vocabulary), got {int(targets[r])} at row {r}")


def _read_hidden_file(path: str) -> np.ndarray:
    """Hidden states saved as a ``.npy`` (memory-mapped) or as the ``hidden`` array of an ``.npz``."""
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            if "hidden" not in z:
                raise Error(f"{path}: no 'hidden' array (has {list(z.keys())})")
            return np.asarray(z["hidden"])
    return np.load(path, mmap_mode="r", allow_pickle=False)


def _load_hidden(hidden: np.ndarray | str | os.PathLike | None) -> np.ndarray | None:
    if hidden is None:
        return None
    if isinstance(hidden, (str, os.PathLike)):
        hidden = _read_hidden_file(os.fspath(hidden))
    h = np.asarray(hidden)
    if h.ndim != 2 or h.dtype != np.float32:
        raise Error(f"hidden must be float32 [rows, hidden_size]; got {h.dtype} {h.shape}")
    return h


# ---------------------------------------------------------------------------
# policies

@dataclass
class PolicyVerdict:
    """The outcome of :meth:`BoundedLogitPolicy.check`; truthy when it passed.

    Attributes:
        passed: every bound held.
        reasons: one line per broken bound (empty when passed).
        offending_rows: rows that break a bound: row max |Δ| >= max_delta; for a
            broken mean bound, the rows whose own mean |Δ| >= mean_delta (there is
            always at least one); for a broken argmax bound, the disagreeing rows.
    """

    passed: bool
    reasons: list[str]
    offending_rows: list[int]
    policy: "BoundedLogitPolicy"

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        if self.passed:
            return f"PASS {self.policy}"
        rows = ", ".join(map(str, self.offending_rows[:20]))
        more = f" ... ({len(self.offending_rows)} rows)" if len(self.offending_rows) > 20 else ""
        return f"FAIL {self.policy}: " + "; ".join(self.reasons) + (f"; rows {rows}{more}" if rows else "")


@dataclass(frozen=True)
class BoundedLogitPolicy:
    """Accept a comparison when ``max |Δ| < max_delta`` and ``mean |Δ| < mean_delta``.

    The bounds are strict, as in the seed's Ch 32 native-lane rule (max delta < 11,
    mean < 1.25, measured on soft-capped logits: a tolerance only means something
    in the units it was measured in). ``min_argmax_agreement`` optionally also
    requires that fraction of rows to agree on the argmax. NaN never passes.
    """

    max_delta: float
    mean_delta: float
    min_argmax_agreement: float | None = None

    def __post_init__(self) -> None:
        if not (self.max_delta > 0 and self.mean_delta > 0):
            raise Error(f"policy bounds must be > 0; got max_delta={self.max_delta}, mean_delta={self.mean_delta}")
        if self.min_argmax_agreement is not None and not 0 <= self.min_argmax_agreement <= 1:
            raise Error(f"min_argmax_agreement must be in [0, 1]; got {self.min_argmax_agreement}")

    def check(self, result: CompareResult) -> PolicyVerdict:
        """Check ``result``; the verdict names the rows that break a bound."""
        reasons: list[str] = []
        bad: set[int] = set()
        row_max = result.per_row["max_abs"]
        row_mean = result.per_row["mean_abs"]
        if not result.max_abs < self.max_delta:
            over = np.flatnonzero(~(row_max < self.max_delta))
            bad.update(int(r) for r in over)
            reasons.append(f"max |delta| {result.max_abs:.6g} >= {self.max_delta:g} on {over.size} rows")
        if not result.mean_abs < self.mean_delta:
            # the mean over rows is >= the bound only if some row's mean is
            over = np.flatnonzero(~(row_mean < self.mean_delta))
            bad.update(int(r) for r in over)
            reasons.append(f"mean |delta| {result.mean_abs:.6g} >= {self.mean_delta:g}")
        if self.min_argmax_agreement is not None and not result.argmax_agreement >= self.min_argmax_agreement:
            bad.update(result.argmax_disagree)
            reasons.append(f"argmax agreement {result.argmax_agreement:.4f} < {self.min_argmax_agreement:g}")
        return PolicyVerdict(not reasons, reasons, sorted(bad), self)

    def __str__(self) -> str:
        s = f"max |delta| < {self.max_delta:g} and mean |delta| < {self.mean_delta:g}"
        if self.min_argmax_agreement is not None:
            s += f" and argmax agreement >= {self.min_argmax_agreement:g}"
        return s


def result_json(result: CompareResult, verdict: PolicyVerdict | None = None, per_row: bool = False) -> str:
    """``result`` (and a policy verdict) as a JSON string."""
    d = result.to_dict(per_row=per_row)
    if verdict is not None:
        d["policy"] = {"rule": str(verdict.policy), "passed": verdict.passed,
                       "reasons": verdict.reasons, "offending_rows": verdict.offending_rows}
    return json.dumps(d, indent=2)
