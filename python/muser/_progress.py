"""Progress bars on stderr for muser's long steps (writing the bench's 925 MB
head, bench runs): tqdm's when it is installed (``pip install "muser[progress]"``),
else a plain one-line bar when stderr is a terminal, else nothing."""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional


def _tqdm(total: int, desc: str, unit: str) -> Optional[Any]:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
                unit_scale=unit != "step")


class Progress:
    """``update(done)`` moves the bar to ``done`` of ``total``; ``write(line)`` prints a
    line above it; ``close()`` removes it. Disabled: every call does nothing."""

    def __init__(self, total: int, desc: str, unit: str = "step", enabled: bool = True) -> None:
        self.total, self.desc, self.done = max(1, int(total)), desc, 0
        self._bar = _tqdm(self.total, desc, unit) if enabled else None
        self._plain = enabled and self._bar is None and sys.stderr.isatty()
        self._enabled = enabled

    def update(self, done: int) -> None:
        done = min(int(done), self.total)
        if self._bar is not None:
            self._bar.update(done - self.done)
        elif self._plain:
            width = 40
            filled = width * done // self.total
            sys.stderr.write(f"\r  {self.desc} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{self.total:,}")
            sys.stderr.flush()
        self.done = done

    def step(self) -> None:
        self.update(self.done + 1)

    def write(self, line: str) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            if self._plain and self.done:
                sys.stderr.write("\r\033[K")
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._plain and self.done:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
        self._plain = False

    def rows(self) -> Callable[[int, int], None]:
        """A ``progress(done, total)`` callback (muser.fixtures.write_head_gguf's)."""
        def cb(done: int, total: int) -> None:
            self.update(done)
        return cb
