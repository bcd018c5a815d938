"""Conversions of callers' arguments that several entry points share.

Token ids (score's ``token_ids``, compare's and lens's ``targets``) become int64:
unsigned ids of 2^63 and above would wrap to negative int64 values in the cast, and a
negative id is a valid numpy index, so they are refused here, on the caller's own values:
the error names the id the caller gave. Each caller checks the range [0, V) itself.
``threads`` must be an int: ``int()`` would run ``True`` on one thread and truncate 2.5.
The command line's counts (``--tokens 1,8``, ``--reps``) are integers >= 1, refused by
argparse with its usage line rather than a traceback."""
from __future__ import annotations

import argparse
from numbers import Integral
from typing import Any, Optional

import numpy as np

_INT64_MAX = int(np.iinfo(np.int64).max)


def int64_ids(ids: Any, what: str) -> np.ndarray:
    """``ids`` as an int64 array of the same shape. TypeError unless they are integers (bool is
    not); ValueError for an unsigned id of 2^63 or more."""
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu" or arr.dtype == np.bool_:
        raise TypeError(f"{what} must be integer token ids, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > _INT64_MAX:
        where = tuple(int(i) for i in np.unravel_index(int(np.argmax(arr)), arr.shape))
        raise ValueError(f"{what} must be token ids (below 2^63), got {int(arr.max())} at index {where}")
    return arr.astype(np.int64, copy=False)


def int_arg(name: str, value: Any, expected: str = "an int") -> int:
    """``value`` as an int: Python and numpy ints are ints, bools are not (TypeError naming
    ``name`` and what was ``expected``)."""
    if type(value) is int:  # the common case, without the numbers ABC's isinstance
        return value
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__}")
    return int(value)


def threads_arg(threads: Optional[int]) -> int:
    """``threads`` (None or an int) as the int the core takes, 0 for None (every usable CPU).
    The core checks the range and names the maximum."""
    return 0 if threads is None else int_arg("threads", threads, "an int or None")


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated integers, each >= 1 ("1,8" -> [1, 8])."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def positive_int(text: str) -> int:
    """An argparse type: one integer >= 1."""
    values = positive_ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one integer >= 1, got {text!r}")
    return values[0]
