"""Misuse that mypy must reject (tests/test_typing.py): each line marked
`# bad` is a type error a user would otherwise meet only at run time."""
from __future__ import annotations

import numpy as np

import muser


def misuse(head: muser.Head, row: np.ndarray[tuple[int], np.dtype[np.float32]]) -> None:
    head.topk(row, "5")  # bad: k is an int
    head.topk(row, 5, logprobs="yes")  # bad: logprobs is a bool
    n: str = head.argmax(row)  # bad: one row's argmax is an int
    muser.Head.load(42)  # bad: a path, not an int
    head.spec.vocab_size.upper()  # bad: vocab_size is an int
    muser.GGUFFile(3.5)  # bad: _core.pyi types the path (without the stub this passes as Any)
