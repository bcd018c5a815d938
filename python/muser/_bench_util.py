"""Pieces the benchmarks share."""
from __future__ import annotations

import json
from typing import Any


def write_json(results: Any, dest: str, indent: int = 1) -> None:
    """Write a bench's results as JSON to ``dest``, or to stdout when it is "-"."""
    text = json.dumps(results, indent=indent)
    if dest == "-":
        print(text)
    else:
        with open(dest, "w") as f:
            f.write(text + "\n")
