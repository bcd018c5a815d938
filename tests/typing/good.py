"""A typed user of muser: mypy must accept this file (tests/test_typing.py),
and every assert_type must hold. It also runs: use(path) on a demo head."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np
from numpy.typing import NDArray

import muser

if TYPE_CHECKING:
    from typing_extensions import assert_type
else:
    def assert_type(value, _type):
        return value

Row = np.ndarray[tuple[int], np.dtype[np.float32]]
Batch = np.ndarray[tuple[int, int], np.dtype[np.float32]]


def use(path: str) -> None:
    head: muser.Head = muser.Head.load(path, device="cpu", route="graph", threads=1)
    spec: muser.HeadSpec = head.spec
    h: int = spec.hidden_size
    rng = np.random.default_rng(0)
    row: Row = rng.standard_normal(h).astype(np.float32)
    batch: Batch = rng.standard_normal((4, h)).astype(np.float32)

    # one row -> [V], a batch -> [t, V]: the overloads keep the shapes apart
    logits = head(row)
    assert_type(logits, "np.ndarray[tuple[int], np.dtype[np.float32]]")
    many = head(batch)
    assert_type(many, "np.ndarray[tuple[int, int], np.dtype[np.float32]]")
    assert logits.shape == (spec.vocab_size,) and many.shape == (4, spec.vocab_size)

    best = head.argmax(row)
    assert_type(best, int)
    bests = head.argmax(batch)
    assert_type(bests, NDArray[np.int64])
    assert isinstance(best, int) and bests.shape == (4,)

    top = head.topk(row, 5, logprobs=True)
    assert_type(top, muser.TopK)
    values: NDArray[np.float32] = top.values
    ids: NDArray[np.int64] = top.indices
    lps: Optional[NDArray[np.float32]] = top.logprobs
    assert int(ids[0]) == best and values.shape == (5,) and lps is not None

    lse = head.logsumexp(batch)
    logp = head.log_softmax(row)
    assert np.shape(lse) == (4,) and np.shape(logp) == (spec.vocab_size,)

    scores: muser.Scores = head.score(batch, np.arange(4))
    assert scores.ranks.shape == (4,)
    for kernel in head.profile(row):
        label: str = kernel.label
        seconds: float = kernel.seconds
        assert label and seconds >= 0

    device_logits: Optional[muser.DeviceArray] = None  # what head(x, on_device=True) gives on CUDA
    if head.caps["resident_logits"]:
        device_logits = head(row, on_device=True)
    del device_logits

    result: muser.CompareResult = muser.compare(head, head, hidden=batch, k=5)
    assert result.argmax_agreement == 1.0
    q = muser.quantize(batch, "Q8_0")
    back: np.ndarray = muser.dequantize(q, "Q8_0", batch.shape)
    assert back.shape == batch.shape
    info: dict = muser.build_info()
    assert "version" in info
