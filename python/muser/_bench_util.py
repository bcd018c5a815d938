"""Pieces the benchmarks share."""
from __future__ import annotations

import json
import statistics
import time
from typing import Any, Callable


def write_json(results: Any, dest: str, indent: int = 1) -> None:
    """Write a bench's results as JSON to ``dest``, or to stdout when it is "-"."""
    text = json.dumps(results, indent=indent)
    if dest == "-":
        print(text)
    else:
        with open(dest, "w") as f:
            f.write(text + "\n")


def median_call_seconds(fn: Callable[[], Any], reps: int, warmup: int) -> float:
    """The median host-clock seconds of ``reps`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    return float(statistics.median(times))
