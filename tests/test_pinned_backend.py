"""The pinned route's ggml-backend path (PinnedHead(backend=...)), run here on
the registry's CPU backend: the code the Metal pinned route takes (weights
resident in a backend buffer, each call's graph allocated by
ggml_backend_alloc_ctx_tensors, tensor_set/get, ggml_backend_graph_compute),
checked on any machine with llama-cpp-python. ggml-cpu computes the same
kernels either way, so the logits are bit for bit the CPU path's. Also: the
Metal bench exits 2 with the reason on a build without Metal."""
from __future__ import annotations

import numpy as np
import pytest

import muser

pytest.importorskip("gguf", reason="the gguf package writes the test heads")
from muser import _ggml  # noqa: E402
from muser.fixtures import write_head_gguf  # noqa: E402

needs_ggml = pytest.mark.skipif(not _ggml.available(), reason=_ggml.unavailable_reason() or "-")


@needs_ggml
@pytest.mark.parametrize("weight_type,kw", [("Q5_K", {}), ("Q8_0", {"norm_bias": True}), ("F16", {"softcap": None}),
                                            ("Q6_K", {"seed": 5})])
def test_backend_path_on_the_cpu_backend_is_bitwise_the_cpu_path(tmp_path, weight_type, kw):
    from muser import pinned
    from muser._core import GGUFFile

    path = write_head_gguf(tmp_path / "h.gguf", hidden=256, vocab=700, weight_type=weight_type, **{"seed": 3, **kw})
    spec = muser.Head.load(path).spec.to_dict()
    f = GGUFFile(path)
    plain = pinned.PinnedHead(f, spec, 2)
    be = pinned.PinnedHead(f, spec, 2, backend="CPU")
    assert be.backend == "CPU" and plain.backend is None
    assert be.graph_ops() == plain.graph_ops()
    rng = np.random.default_rng(0)
    for t in (1, 3, 8):
        x = rng.standard_normal((t, 256), dtype=np.float32)
        assert np.array_equal(be(x).view(np.uint32), plain(x).view(np.uint32)), t
    assert np.array_equal(be(x[0]), plain(x[0]))
    be.close()
    be.close()  # idempotent


@needs_ggml
def test_an_absent_backend_is_a_clear_error(tmp_path):
    g = _ggml.lib()
    assert g.backend_unavailable_reason("CPU") is None
    reason = g.backend_unavailable_reason("NoSuchBackend")
    assert reason and "no NoSuchBackend backend" in reason


@pytest.mark.skipif(muser.build_info()["metal"], reason="this build has Metal: test_metal.py runs the bench")
def test_metal_bench_without_metal_exits_2_with_the_reason(capsys):
    from muser import _metal_bench

    assert _metal_bench.main(["--hidden", "256", "--vocab", "2048"]) == 2
    assert "no Metal backend" in capsys.readouterr().err
