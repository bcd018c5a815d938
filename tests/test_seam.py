"""The backend seam: a device says what it can do (caps) and callers never ask
what it is called; a backend that was not built raises DeviceError naming the
missing build; build_route alone picks the node kinds."""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import muser
from muser import _core

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_nothing_in_python_or_the_bindings_tests_a_device_name():
    # the head's own code paths; benches and the CUDA-only helpers module may name their backend
    files = [ROOT / "python/muser" / f for f in ("head.py", "_device.py", "ops.py", "compare.py", "_cli_bench.py")]
    files += sorted((ROOT / "src/cpp/bindings").glob("*.cpp"))
    pattern = re.compile(r"startswith\(\s*[\"'](cuda|metal|cpu)|[=!]=\s*[\"'](cuda|metal|cpu)[\"':]|dynamic_cast")
    hits = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}" for f in files
            for i, line in enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, "\n".join(hits)


def test_the_cpu_caps_are_the_host_defaults(head_file):
    head = muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=300))
    assert head.caps == {"resident_logits": False, "ranks_on_device": False, "dlpack_device": 1, "compute_device": 1,
                         "ordinal": 0, "max_topk": 0, "sample_on_device": False}
    assert _core.device_caps("cpu") == head.caps
    with pytest.raises(ValueError, match="memory of its own"):
        head(np.zeros(256, np.float32), on_device=True)


def test_a_backend_that_was_not_built_says_so(head_file):
    path = head_file(weight_type="Q8_0", hidden=256, vocab=300)
    with pytest.raises(muser.DeviceError, match="no Metal backend"):
        muser.Head.load(path, device="metal")
    if not muser.build_info()["cuda"]:
        with pytest.raises(muser.DeviceError, match="no CUDA backend"):
            muser.Head.load(path, device="cuda:0")
    with pytest.raises(ValueError, match="cuda:N"):
        muser.Head.load(path, device="cuda:x")
    with pytest.raises(ValueError, match="device must be"):
        muser.Head.load(path, device="tpu")


@pytest.mark.parametrize("route,acts,kind", [("graph", "f32", "mul_mv"), ("canonical", "q8", "mul_mv_q8"),
                                             ("reference", "f32", "mul_mv_reference"),
                                             ("reference", "q8", "mul_mv_q8_reference")])
def test_build_route_picks_the_matvec_kind(head_file, route, acts, kind):
    head = muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=300), route=route, acts=acts)
    assert dict(head.nodes)["lm_head"] == kind


def test_q8_on_float_weights_is_refused_before_the_device_is_made(head_file):
    with pytest.raises(ValueError, match="acts='q8'"):
        muser.Head.load(head_file(weight_type="F16", hidden=256, vocab=300), acts="q8")


def test_pinned_on_a_device_with_its_own_memory_is_refused_before_loading(head_file):
    if not (muser.build_info()["cuda"] and _core.cuda_device_count() > 0):
        pytest.skip("needs a CUDA device to show the refusal comes before the upload")
    with pytest.raises(ValueError, match="pinned"):
        muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=300), device="cuda", route="pinned")
