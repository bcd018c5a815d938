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
            logit of b: a disagreement where ``gap_b`` is below the max |Δ| is a near-tie).
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

    def __str__(self) -> str:
        return self.table()


def _num(x: Any) -> Any:
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else str(x)
    if isinstance(x, np.integer):
        return int(x)
    return x


# ---------------------------------------------------------------------------

def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = np.max(x, axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    z = x - m
    return z - np.log(np.sum(np.exp(z), axis=1, keepdims=True))


def _topk(x: np.ndarray, k: int) -> np.ndarray:
    if k >= x.shape[1]:
        return np.broadcast_to(np.arange(x.shape[1]), x.shape)
    return np.argpartition(-x, k - 1, axis=1)[:, :k]


def compare(a: Source, b: Source, *, hidden: np.ndarray | str | None = None, k: int = 5,
            chunk_rows: int | None = None) -> CompareResult:
    """Compare logits source ``a`` (candidate) against ``b`` (reference), streaming in chunks.

    Args:
        a, b: a Head or callable (needs ``hidden``), saved logits (ndarray,
            ``.npy`` or ``.npz`` path), or a ``path.gguf[:route][@device]`` string.
        hidden: float32 [N, H] hidden states (or a ``.npy`` path, or an ``.npz``
            with a ``hidden`` array) for sources that compute logits.
        k: top-k size for the overlap.
        chunk_rows: rows per chunk (default: about 4 M logits per chunk).

    Returns:
        A :class:`CompareResult`. KL is KL(softmax(b) || softmax(a)), mean over rows.

    Raises:
        muser.Error: shapes disagree, no rows, or a source needs ``hidden`` that was not given.
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

    vocab: int | None = None
    pr: dict[str, list[np.ndarray]] = {key: [] for key in
                                        ("max_abs", "mean_abs", "argmax_a", "argmax_b", "topk_overlap", "kl", "gap_b")}
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
        elif la.shape[1] != vocab:
            raise Error(f"rows {s}:{e}: vocab changed from {vocab} to {la.shape[1]}")
        d = np.abs(la.astype(np.float64) - lb.astype(np.float64))
        pr["max_abs"].append(d.max(axis=1))
        pr["mean_abs"].append(d.mean(axis=1))
        sum_abs += float(d.sum())
        n_equal += int(np.count_nonzero(la.view(np.uint32) == lb.view(np.uint32)))
        pr["argmax_a"].append(np.argmax(la, axis=1))
        pr["argmax_b"].append(np.argmax(lb, axis=1))
        kk = min(k, vocab)
        ta, tb = _topk(la, kk), _topk(lb, kk)
        pr["topk_overlap"].append((ta[:, :, None] == tb[:, None, :]).any(axis=2).sum(axis=1) / kk)
        lpa, lpb = _log_softmax(la), _log_softmax(lb)
        pb = np.exp(lpb)
        with np.errstate(invalid="ignore"):
            pr["kl"].append(np.where(pb > 0, pb * (lpb - lpa), 0.0).sum(axis=1))
        if vocab >= 2:
            top2 = -np.partition(-lb, 1, axis=1)[:, :2]
            pr["gap_b"].append((top2[:, 0].astype(np.float64) - top2[:, 1]))
        else:
            pr["gap_b"].append(np.full(e - s, np.inf))
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
    )


def _load_hidden(hidden: np.ndarray | str | os.PathLike | None) -> np.ndarray | None:
    if hidden is None:
        return None
    if isinstance(hidden, (str, os.PathLike)):
        p = os.fspath(hidden)
        if p.endswith(".npz"):
            with np.load(p, allow_pickle=False) as z:
                if "hidden" not in z:
                    raise Error(f"{p}: no 'hidden' array (has {list(z.keys())})")
                hidden = np.asarray(z["hidden"])
        else:
            hidden = np.load(p, mmap_mode="r", allow_pickle=False)
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
