"""Shared fixtures: small real GGUF heads written with the gguf package."""
from __future__ import annotations

import os

import numpy as np
import pytest

from muser.fixtures import write_head_gguf


def cuda_skip_reason() -> str:
    """Why the CUDA tests cannot run here ("" when a GPU and a CUDA build are present)."""
    import muser
    from muser import _core

    if not muser.build_info()["cuda"]:
        return "this build of muser has no CUDA backend (built without nvcc)"
    if _core.cuda_device_count() == 0:
        return "no GPU: " + _core.cuda_no_device_reason()
    return ""


@pytest.fixture(scope="session")
def head_file(tmp_path_factory):
    """Factory: head_file(**kwargs) -> path of a GGUF head (cached per kwargs)."""
    cache: dict = {}
    base = tmp_path_factory.mktemp("heads")

    def make(**kw) -> str:
        key = tuple(sorted((k, repr(v)) for k, v in kw.items()))
        if key not in cache:
            path = os.path.join(base, f"head{len(cache)}.gguf")
            cache[key] = write_head_gguf(path, **kw)
        return cache[key]

    return make


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def bits(a) -> np.ndarray:
    """A float32 array as its uint32 bit patterns (byte equality: NaN payloads and -0 included)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_bitwise(got, want, what: str, backend: str = "got") -> None:
    """got's float32 bytes equal want's (the CPU's), else the count and the first difference."""
    g, w = bits(got), bits(want)
    if not np.array_equal(g, w):
        diff = np.argwhere(g != w)
        first = tuple(diff[0])
        raise AssertionError(f"{what}: {len(diff)} of {g.size} logits differ; first at {first}: "
                             f"{backend} {np.asarray(got)[first]!r} vs cpu {np.asarray(want)[first]!r}")


def hidden_states(rng: np.random.Generator, t: int, h: int) -> np.ndarray:
    """Hidden states with a trained model's spread: mostly small, a few large features."""
    x = rng.standard_normal((t, h)).astype(np.float32)
    x[:, rng.integers(0, h, size=max(1, h // 64))] *= 20
    return x
