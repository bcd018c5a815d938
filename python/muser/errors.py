"""muser's exceptions. Every one derives from :class:`muser.Error`."""
from __future__ import annotations

from ._core import DeviceError, Error, GGUFError, SpecError


class GGUFFileNotFoundError(GGUFError, FileNotFoundError):
    """The GGUF path does not exist (catch it as GGUFError or as FileNotFoundError)."""


class NonFiniteError(Error, ValueError):
    """A hidden state holds NaN or ±inf (the message names the row and column)."""


__all__ = ["Error", "GGUFError", "SpecError", "DeviceError", "NonFiniteError", "GGUFFileNotFoundError"]
