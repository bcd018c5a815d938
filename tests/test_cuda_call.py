"""The CUDA call path (run on a GPU; skipped elsewhere): one graph per call with the NaN scan,
argmax/top-k and one small download; stream= on PyTorch and CuPy streams without waiting;
capture of head(x, on_device=True) in the caller's CUDA graph; the pooled buffers when the host
does not wait. Oracles: the head's own host logits ranked by _core.topk_rows (the CPU's rule) and
np.argmax, and the host call on the same rows.
"""
from __future__ import annotations

import numpy as np
import pytest

import muser
from muser import _core

pytest.importorskip("gguf", reason="the gguf package writes the test heads")
from muser.fixtures import write_head_gguf  # noqa: E402

from conftest import bits, cuda_skip_reason  # noqa: E402

_skip = cuda_skip_reason()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(_skip), reason=_skip or "-")]

H, V = 512, 40_000  # 40 chunks of 1024 logits: k <= 40 takes the threshold top-k, k > 40 the staged one


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_head_gguf(tmp_path_factory.mktemp("call") / "head.gguf", hidden=H, vocab=V, weight_type="Q8_0",
                           seed=3)


@pytest.fixture(scope="module")
def head(path):
    return muser.Head.load(path, device="cuda", route="fused", acts="q8")


def rows(t: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((t, H), dtype=np.float32)


def assert_ranked_like_the_cpu(head, x: np.ndarray, k: int) -> None:
    logits = np.ascontiguousarray(head(x, check_finite=False).reshape(len(x), V))
    want_ids, want_vals = _core.topk_rows(logits, k)
    vals, ids, _ = head.topk(x, k, check_finite=False)
    assert np.array_equal(ids, np.asarray(want_ids).reshape(len(x), k)), f"t={len(x)} k={k}"
    assert np.array_equal(bits(vals), bits(np.asarray(want_vals, dtype=np.float32).reshape(len(x), k)))
    assert np.array_equal(np.reshape(head.argmax(x, check_finite=False), -1),
                          np.asarray(_core.topk_rows(logits, 1)[0]).reshape(-1))


# the threshold top-k selects 16 rows at a time; argmax takes 1,024 logits a CTA below 8 rows,
# 4,096 below 256, a CTA a row from 256 on
@pytest.mark.parametrize("t", (1, 3, 17, 40, 260))
@pytest.mark.parametrize("k", (1, 7, 40, 41, 300))
def test_topk_and_argmax_equal_the_cpu_ranking(head, t, k):
    assert_ranked_like_the_cpu(head, rows(t, seed=t * 100 + k), k)


def test_topk_of_tied_and_nan_rows(head):
    # a zero row: every logit equal (ties to the lowest ids; many candidates: the radix select);
    # a NaN row: NaN never beats a number, so every id ties; both again in the second group of 16 rows
    x = rows(19)
    x[0] = x[17] = 0
    x[2, 5] = x[18, 30] = np.nan
    for k in (1, 2, 40, 64):
        assert_ranked_like_the_cpu(head, x, k)
    vals, ids, _ = head.topk(x[0], 40)
    assert np.array_equal(ids, np.arange(40))
    many = rows(260, seed=4)
    many[256] = 0
    many[259, 7] = np.nan
    assert_ranked_like_the_cpu(head, many, 3)


def test_argmax_of_a_device_row_and_single_row(head):
    torch = pytest.importorskip("torch")
    x = rows(4, seed=8)
    want = np.argmax(head(x), axis=1)
    assert np.array_equal(head.argmax(torch.from_numpy(x).cuda()), want)
    assert head.argmax(torch.from_numpy(x[2]).cuda()) == int(want[2])
    assert isinstance(head.argmax(x[1]), int)


def test_nonfinite_device_hidden_still_raises_everywhere(head):
    torch = pytest.importorskip("torch")
    x = rows(3)
    x[1, 9] = np.inf
    xd = torch.from_numpy(x).cuda()
    for call in (lambda: head(xd), lambda: head(xd, on_device=True), lambda: head.argmax(xd),
                 lambda: head.topk(xd, 5), lambda: head.topk(xd, 100),
                 lambda: head(xd, on_device=True, stream=torch.cuda.Stream())):
        with pytest.raises(muser.NonFiniteError, match="row 1, column 9"):
            call()
    # the same head goes on computing right answers after the error
    good = rows(3, seed=2)
    assert np.array_equal(bits(head(torch.from_numpy(good).cuda(), on_device=True).get()), bits(head(good)))


def test_the_scan_of_a_long_batch_finds_the_lowest_bad_index_across_its_ctas(head):
    # t * H = 153,600 values: the scan runs 3 CTAs over interleaved slices of 1,024. The lowest bad
    # index (2,055: CTA 2's) comes after CTA 0 has found its own (3,077) and CTA 1 a later one
    torch = pytest.importorskip("torch")
    x = rows(300, seed=11)
    for i in (100_000 + 1024, 3077, 2055):
        x.reshape(-1)[i] = np.nan
    xd = torch.from_numpy(x).cuda()
    for call in (lambda: head(xd, on_device=True), lambda: head.argmax(xd), lambda: head.score(xd, np.zeros(300, dtype=np.int64)),
                 lambda: head.sample(xd, temperature=0)):
        with pytest.raises(muser.NonFiniteError, match="row 4, column 7"):
            call()
    # the scan's state is back at rest: a clean batch passes, a later bad value is found alone
    good = rows(300, seed=12)
    assert np.array_equal(bits(head(torch.from_numpy(good).cuda(), on_device=True).get()), bits(head(good)))
    good.reshape(-1)[150_000] = np.inf
    with pytest.raises(muser.NonFiniteError, match=f"row {150_000 // H}, column {150_000 % H}"):
        head(torch.from_numpy(good).cuda(), on_device=True)


def test_a_scan_that_raises_leaves_later_results_whole(head):
    # on a stream the call waits for the NaN scan alone: when it raises, the route it did
    # not wait for still runs into a pooled buffer; later calls on either stream must not
    # get that buffer while it is being written
    torch = pytest.importorskip("torch")
    bad, good = rows(2), rows(2, seed=3)
    bad[0, 3] = np.nan
    want = head(good).copy()
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    bd, gd = torch.from_numpy(bad).cuda(), torch.from_numpy(good).cuda()
    torch.cuda.synchronize()
    held = []
    for i in range(6):
        with pytest.raises(muser.NonFiniteError, match="row 0, column 3"):
            head(bd, on_device=True, stream=s1)
        held.append(head(gd, on_device=True, stream=s2 if i % 2 else s1))
    for i, dev in enumerate(held):
        assert np.array_equal(bits(dev.get()), bits(want)), f"call {i}"


def test_stream_on_a_torch_stream_without_waiting(head):
    torch = pytest.importorskip("torch")
    x = rows(5, seed=4)
    want = head(x).copy()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        xd = torch.from_numpy(x).to("cuda", non_blocking=False)
        dev = head(xd, on_device=True, check_finite=False)  # torch's current stream: s
        assert dev.stream == s.cuda_stream
        assert dev.__cuda_array_interface__["stream"] == s.cuda_stream
        got = torch.from_dlpack(dev).clone()  # on s, in stream order
    s.synchronize()
    assert np.array_equal(bits(got.cpu().numpy()), bits(want))
    for stream in (s, s.cuda_stream):
        dev = head(xd, on_device=True, check_finite=False, stream=stream)
        assert dev.stream == s.cuda_stream
        assert np.array_equal(bits(dev.get()), bits(want))  # get() waits for the stream
    # the default stream consumes through DLPack: it is made to wait for s
    dev = head(xd, on_device=True, check_finite=False, stream=s)
    assert np.array_equal(bits(torch.from_dlpack(dev).cpu().numpy()), bits(want))
    # check_finite=True on a device row waits for the scan alone: the route is still the stream's
    dev = head(xd, on_device=True, stream=s)
    assert dev.stream == s.cuda_stream
    assert np.array_equal(bits(dev.get()), bits(want))


def test_stream_on_a_cupy_stream(head):
    cp = pytest.importorskip("cupy")
    x = rows(2, seed=5)
    want = head(x).copy()
    with cp.cuda.Stream(non_blocking=True) as s:
        xd = cp.asarray(x)
        dev = head(xd, on_device=True, check_finite=False)  # cupy's current stream
        assert dev.stream == s.ptr
        got = cp.asarray(dev).copy()
    s.synchronize()
    assert np.array_equal(bits(cp.asnumpy(got)), bits(want))
    dev = head(xd, on_device=True, check_finite=False, stream=s)
    assert np.array_equal(bits(dev.get()), bits(want))


def test_bad_streams_are_refused_clearly(head):
    x = rows(1)
    with pytest.raises(TypeError, match="stream must be"):
        head(x, on_device=True, stream="fast")
    with pytest.raises(TypeError, match="stream must be"):
        head(x, on_device=True, stream=True)
    with pytest.raises(ValueError, match="stream must be"):
        head(x, on_device=True, stream=-3)
    with pytest.raises(ValueError, match="on_device=True"):
        head(x, stream=0)


def test_capture_in_a_torch_cuda_graph(head):
    torch = pytest.importorskip("torch")
    t = 3
    static_x = torch.from_numpy(rows(t, seed=6)).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up torch asks for: the buffers for this t exist after it
        head(static_x, on_device=True, check_finite=False)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = head(static_x, on_device=True, check_finite=False)
        captured = torch.from_dlpack(out)
        doubled = captured * 2  # a consumer captured after it
    for seed in (7, 8, 9):
        x = rows(t, seed=seed)
        static_x.copy_(torch.from_numpy(x))
        g.replay()
        torch.cuda.synchronize()
        want = head(x)
        assert np.array_equal(bits(captured.cpu().numpy()), bits(want)), f"replay with seed {seed}"
        assert np.array_equal(bits(doubled.cpu().numpy()), bits(want * 2))
    # a call that must wait cannot be captured: refused before anything is enqueued
    g2 = torch.cuda.CUDAGraph()
    raised = None
    with torch.cuda.graph(g2):
        try:
            head(static_x, on_device=True)  # check_finite=True on a device row
        except ValueError as e:
            raised = e
        static_x.add_(0)
    assert raised is not None and "check_finite=False" in str(raised)
    del g, g2


def test_pooled_buffers_are_safe_when_the_host_does_not_wait(head):
    torch = pytest.importorskip("torch")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    xs = [rows(2, seed=20 + i) for i in range(10)]
    want = [head(x).copy() for x in xs]
    dx = [torch.from_numpy(x).cuda() for x in xs]
    torch.cuda.synchronize()
    # held results, more than the pool has: none is written again
    held = [head(d, on_device=True, check_finite=False, stream=s1) for d in dx]
    s1.synchronize()
    for i, dev in enumerate(held):
        assert np.array_equal(bits(dev.get()), bits(want[i])), f"held result {i}"
    del held
    # results dropped at once, calls alternating streams without waiting: each consumer,
    # queued on the call's stream before the drop, reads its own call's logits
    copies = []
    for i, d in enumerate(dx):
        s = (s1, s2)[i % 2]
        with torch.cuda.stream(s):
            dev = head(d, on_device=True, check_finite=False)
            copies.append(torch.from_dlpack(dev).clone())
            del dev
    torch.cuda.synchronize()
    for i, c in enumerate(copies):
        assert np.array_equal(bits(c.cpu().numpy()), bits(want[i])), f"call {i}"
