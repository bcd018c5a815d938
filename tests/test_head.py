"""The Head on the CPU: each route equals its definition, batches equal single
steps, logits are zero-copy views, and bad input raises clear errors."""
from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

import muser
from conftest import hidden_states
from oracle import fused_epilogue_f32, graph_epilogue_f32, head_f64

ROUTES = ["reference", "fused", "graph", "canonical"]
TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]


def _file(head_file, weight_type="Q5_K", **kw):
    kw.setdefault("hidden", 512)
    kw.setdefault("vocab", 1003)  # not a multiple of any tile
    return head_file(weight_type=weight_type, **kw)


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("route", ROUTES)
def test_route_close_to_float64_oracle(head_file, rng, route, weight_type):
    path = _file(head_file, weight_type)
    head = muser.Head.load(path, route=route)
    x = hidden_states(rng, 4, 512)
    ref = head_f64(path, head.spec, x)
    got = head(x).astype(np.float64)
    # f32 accumulation over 512 products and a 2-ulp tanh: far below 1e-4 on logits of size ~1-20
    assert np.max(np.abs(got - ref)) < 1e-4
    assert np.array_equal(np.argmax(got, axis=1), np.argmax(ref, axis=1))


def _raw_logits(path, rng, t=6):
    """Pre-softcap logits (scale and cap switched off) and the hidden states."""
    raw_head = muser.Head.load(path, route="graph", softcap=None, logit_scale=None)
    x = hidden_states(rng, t, raw_head.spec.hidden_size) * np.float32(3)
    return raw_head(x).copy(), x


def test_graph_route_equals_four_float32_nodes_with_platform_tanhf(head_file, rng):
    path = _file(head_file)
    raw, x = _raw_logits(path, rng)
    head = muser.Head.load(path, route="graph")
    s = head.spec
    assert [lbl for lbl, _ in head.nodes][-4:] == ["logit_scale", "softcap_scale_in", "softcap_tanh",
                                                   "softcap_scale_out"]
    expect = graph_epilogue_f32(raw, s.applied_scale, s.softcap)
    assert np.array_equal(head(x).view(np.uint32), expect.view(np.uint32))


def test_fused_route_equals_its_definition(head_file, rng):
    path = _file(head_file)
    raw, x = _raw_logits(path, rng)
    head = muser.Head.load(path, route="fused")
    s = head.spec
    assert [lbl for lbl, _ in head.nodes][-1] == "softcap"
    expect = fused_epilogue_f32(raw, s.applied_scale, s.softcap)
    assert np.array_equal(head(x).view(np.uint32), expect.view(np.uint32))


def test_fused_and_graph_round_differently(head_file, rng):
    # x/cap versus x*(1/cap): algebraically equal, not always the same float.
    path = _file(head_file)
    _, x = _raw_logits(path, rng, t=16)
    g = muser.Head.load(path, route="graph")(x).copy()
    f = muser.Head.load(path, route="fused")(x).copy()
    assert not np.array_equal(g, f)
    assert np.max(np.abs(g - f)) < 1e-5  # they differ only in rounding


def test_every_route_shares_one_matvec(head_file, rng):
    # Routes differ in the norm and the epilogue; the lane-ordered matvec is one.
    path = _file(head_file, "Q6_K")
    x = hidden_states(rng, 3, 512)
    no_cap = dict(softcap=None, logit_scale=None)
    graph = muser.Head.load(path, route="graph", **no_cap)(x).copy()
    fused = muser.Head.load(path, route="fused", **no_cap)(x).copy()
    assert np.array_equal(graph.view(np.uint32), fused.view(np.uint32))


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("weight_type", ["Q5_K", "Q8_0", "F16"])
def test_batch_rows_equal_single_steps_bitwise(head_file, rng, route, weight_type):
    head = muser.Head.load(_file(head_file, weight_type), route=route)
    x = hidden_states(rng, 17, 512)
    batch = head(x).copy()
    for t in (1, 3, 8):
        assert np.array_equal(head(x[:t]).view(np.uint32), batch[:t].view(np.uint32))
    for r in (0, 5, 16):
        assert np.array_equal(head(x[r]).view(np.uint32), batch[r].view(np.uint32))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_results_do_not_depend_on_thread_count(head_file, rng, threads):
    path = _file(head_file)
    x = hidden_states(rng, 5, 512)
    one = muser.Head.load(path, route="canonical", threads=1)(x).copy()
    many = muser.Head.load(path, route="canonical", threads=threads)(x)
    assert np.array_equal(one.view(np.uint32), many.view(np.uint32))


def test_logits_are_a_zero_copy_view_that_outlives_the_head(head_file, rng):
    head = muser.Head.load(_file(head_file))
    x = hidden_states(rng, 2, 512)
    logits = head(x)
    assert logits.shape == (2, 1003) and logits.dtype == np.float32
    assert np.shares_memory(logits, head.buffer)
    assert not logits.flags.owndata
    saved = logits.copy()
    del head
    gc.collect()
    # the view keeps the buffer (and the head) alive
    assert np.array_equal(logits, saved)
    np.testing.assert_array_equal(logits + 0, saved)


def test_a_held_view_is_never_overwritten_and_out_writes_the_callers_array(head_file, rng):
    head = muser.Head.load(_file(head_file))
    x = hidden_states(rng, 2, 512)
    first = head(x[0])
    saved = first.copy()
    second = head(x[1])
    np.testing.assert_array_equal(first, saved)  # documented: a buffer is reused only once no view holds it
    assert not np.shares_memory(first, second)
    out = np.empty((2, 1003), dtype=np.float32)
    res = head(x, out=out)
    assert res is out
    assert not np.shares_memory(out, head.buffer)
    np.testing.assert_array_equal(out[0], saved)
    one = np.empty(1003, dtype=np.float32)
    head(x[1], out=one)
    np.testing.assert_array_equal(one, out[1])


def test_argmax_topk_and_ties_go_to_the_lowest_id(head_file, rng):
    path = _file(head_file)
    head = muser.Head.load(path)
    x = hidden_states(rng, 4, 512)
    logits = head(x).copy()
    assert np.array_equal(head.argmax(x), np.argmax(logits, axis=1))
    vals, ids, _ = head.topk(x, 5)
    assert ids.shape == (4, 5) and vals.shape == (4, 5)
    for r in range(4):
        order = sorted(range(1003), key=lambda i: (-logits[r, i], i))[:5]
        assert list(ids[r]) == order
        assert np.array_equal(vals[r], logits[r, order])
    assert isinstance(head.argmax(x[0]), int)


def test_tied_duplicate_rows_pick_the_lowest_token(head_file, rng):
    w = (rng.standard_normal((300, 256)) * 0.02).astype(np.float32)
    w[200] = w[77]  # identical rows -> identical logits
    path = head_file(hidden=256, vocab=300, weight=w, seed=3)
    head = muser.Head.load(path)
    gamma = muser.GGUFFile(path).tensor_bytes("output_norm.weight").view(np.float32)
    x = np.ascontiguousarray(muser.dequantize(muser.quantize(w[77:78], "Q5_K"), "Q5_K", (1, 256))[0] / gamma)
    logits = head(x)
    assert logits[77] == logits[200]
    assert head.argmax(x) == 77
    _, ids, _ = head.topk(x, 2)
    assert list(ids) == [77, 200]


def test_non_finite_hidden_raises_and_leaves_the_buffer_alone(head_file, rng):
    head = muser.Head.load(_file(head_file))
    x = hidden_states(rng, 3, 512)
    before = head(x).copy()
    bad = x.copy()
    bad[2, 100] = np.nan
    with pytest.raises(muser.NonFiniteError, match="row 2, column 100") as e:
        head(bad)
    assert isinstance(e.value, ValueError) and isinstance(e.value, muser.Error)
    assert np.array_equal(head.buffer[: before.size].reshape(before.shape), before)
    bad[1, 7] = np.inf
    got = head(bad, check_finite=False)
    assert np.isnan(got[2]).all()
    assert np.isfinite(got[0]).all()


@pytest.mark.parametrize(
    "make, exc, match",
    [
        (lambda: np.zeros(512, dtype=np.float64), TypeError, "float32"),
        (lambda: np.zeros(511, dtype=np.float32), ValueError, "512"),
        (lambda: np.zeros((2, 2, 512), dtype=np.float32), ValueError, "shape"),
        (lambda: np.zeros((0, 512), dtype=np.float32), ValueError, "at least one row"),
    ],
)
def test_bad_hidden_arguments(head_file, make, exc, match):
    head = muser.Head.load(_file(head_file))
    with pytest.raises(exc, match=match):
        head(make())


def test_non_contiguous_hidden_is_accepted_and_bad_out_is_rejected(head_file, rng):
    head = muser.Head.load(_file(head_file))
    x = hidden_states(rng, 4, 1024)[:, ::2]
    assert not x.flags.c_contiguous
    np.testing.assert_array_equal(head(x), head(np.ascontiguousarray(x)))
    with pytest.raises(ValueError, match="shape"):
        head(x, out=np.empty((3, 1003), dtype=np.float32))
    with pytest.raises(TypeError, match="float32"):
        head(x, out=np.empty((4, 1003), dtype=np.float64))


@pytest.mark.parametrize(
    "kw, exc, match",
    [
        (dict(route="fast"), ValueError, "route"),
        (dict(device="tpu"), ValueError, "device"),
        (dict(device="metal"), muser.DeviceError, "Metal"),
        (dict(acts="q4"), ValueError, "acts"),
        (dict(bogus=1), TypeError, "unknown override"),
    ],
)
def test_bad_load_arguments(head_file, kw, exc, match):
    with pytest.raises(exc, match=match):
        muser.Head.load(_file(head_file), **kw)


@pytest.mark.skipif(muser.build_info()["cuda"] and muser._core.__dict__.get("cuda_device_count", lambda: 0)() > 0,
                    reason="a GPU is present here; the no-GPU error is tested where there is none")
def test_cuda_without_a_gpu_is_a_clear_error(head_file):
    with pytest.raises(muser.DeviceError, match="cuda"):
        muser.Head.load(_file(head_file), device="cuda")


def test_gil_is_released_while_computing(head_file, rng):
    head = muser.Head.load(_file(head_file, hidden=2048, vocab=8192), route="reference", threads=1)
    x = hidden_states(rng, 8, 2048)
    start = time.perf_counter()
    head(x)
    step = time.perf_counter() - start
    ticks = 0
    worker = threading.Thread(target=head, args=(x,))
    worker.start()
    while worker.is_alive():
        ticks += 1
    worker.join()
    # with the GIL held the main thread could not run at all during the step
    assert step > 0.02 and ticks > 1000


def test_concurrent_calls_are_serialized_and_correct(head_file, rng):
    head = muser.Head.load(_file(head_file))
    xs = [hidden_states(rng, 3, 512) for _ in range(4)]
    expect = [head(x).copy() for x in xs]
    results = [None] * 4

    def work(i):
        out = np.empty((3, 1003), dtype=np.float32)
        for _ in range(5):
            head(xs[i], out=out)
        results[i] = out

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for got, want in zip(results, expect):
        np.testing.assert_array_equal(got, want)


def test_repr_and_properties(head_file):
    head = muser.Head.load(_file(head_file))
    assert "muse-glimmer" in repr(head) and "graph" in repr(head)
    assert head.weight_bytes == 1003 * 2 * 176
    assert head.device == "cpu" and head.acts == "f32" and head.route == "graph"
