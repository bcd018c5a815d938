"""muser.compare, BoundedLogitPolicy and the `compare` CLI, checked against numpy
recomputations of every statistic on small, hand-shaped logits."""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pytest

import muser
from muser import _cli_compare
from muser.compare import BoundedLogitPolicy, CompareResult, compare


def _kl_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """KL(softmax(b) || softmax(a)) per row, float64, the textbook way."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    pa = np.exp(a - a.max(1, keepdims=True))
    pa /= pa.sum(1, keepdims=True)
    pb = np.exp(b - b.max(1, keepdims=True))
    pb /= pb.sum(1, keepdims=True)
    return (pb * (np.log(pb) - np.log(pa))).sum(1)


@pytest.fixture
def pair(rng):
    b = rng.standard_normal((37, 500)).astype(np.float32) * 4
    a = b + rng.standard_normal(b.shape).astype(np.float32) * 0.01
    a[5, 7] = b[5, 7] + 3.0  # one large delta
    a[11] = b[11]  # one byte-equal row
    top = int(np.argmax(b[20]))
    a[20, (top + 1) % 500] = b[20, top] + 1.0  # move row 20's argmax
    return a, b


def test_statistics_match_numpy(pair):
    a, b = pair
    r = compare(a, b, k=5)
    d = np.abs(a.astype(np.float64) - b)
    assert r.rows == 37 and r.vocab == 500 and r.k == 5
    assert r.max_abs == pytest.approx(d.max(), rel=0, abs=0)
    assert r.mean_abs == pytest.approx(d.mean(), rel=1e-12)
    assert r.byte_equal == pytest.approx(np.mean(a.view(np.uint32) == b.view(np.uint32)))
    agree = a.argmax(1) == b.argmax(1)
    assert r.argmax_agreement == pytest.approx(agree.mean())
    assert r.argmax_disagree == [20]
    np.testing.assert_allclose(r.per_row["kl"], _kl_ref(a, b), rtol=1e-9, atol=1e-15)
    assert r.kl_divergence == pytest.approx(_kl_ref(a, b).mean(), rel=1e-9)
    np.testing.assert_array_equal(r.per_row["max_abs"], d.max(1))
    assert r.per_row["max_abs"][11] == 0 and r.per_row["kl"][11] == pytest.approx(0, abs=1e-15)
    srt = np.sort(b.astype(np.float64), axis=1)
    np.testing.assert_allclose(r.per_row["gap_b"], srt[:, -1] - srt[:, -2])


def test_topk_overlap_counts_shared_indices():
    b = np.array([[10, 9, 8, 7, 6, 0, 0, 0]], np.float32)
    a = np.array([[10, 9, 8, 0, 0, 7.5, 6.5, 0]], np.float32)  # top-5 of a: {0,1,2,5,6}; of b: {0,1,2,3,4}
    r = compare(a, b, k=5)
    assert r.topk_overlap == pytest.approx(3 / 5)
    assert compare(a, b, k=3).topk_overlap == 1.0
    assert compare(a, b, k=100).topk_overlap == 1.0  # k above the vocabulary: everything overlaps


def test_kl_direction_is_b_reference():
    a = np.array([[0.0, 0.0]], np.float32)
    b = np.array([[3.0, 0.0]], np.float32)
    r_ab, r_ba = compare(a, b), compare(b, a)
    assert r_ab.kl_divergence == pytest.approx(_kl_ref(a, b)[0])
    assert r_ba.kl_divergence == pytest.approx(_kl_ref(b, a)[0])
    assert r_ab.kl_divergence != pytest.approx(r_ba.kl_divergence)  # asymmetric, so the direction is real


@pytest.mark.parametrize("chunk_rows", [1, 4, 36, 37, 1000, None])
def test_streaming_chunks_give_identical_results(pair, chunk_rows):
    a, b = pair
    whole = compare(a, b, chunk_rows=10_000)
    r = compare(a, b, chunk_rows=chunk_rows)
    for key in ("max_abs", "byte_equal", "argmax_agreement", "topk_overlap"):
        assert getattr(r, key) == getattr(whole, key)
    assert r.mean_abs == pytest.approx(whole.mean_abs, rel=1e-12)
    for key, v in whole.per_row.items():
        np.testing.assert_array_equal(r.per_row[key], v)


def test_callables_are_called_in_chunks_on_hidden(pair):
    a, b = pair
    hidden = np.arange(37 * 3, dtype=np.float32).reshape(37, 3)
    calls = []

    def head(h):
        calls.append(h.shape[0])
        rows = h[:, 0].astype(int) // 3
        return a[rows]

    r = compare(head, b, hidden=hidden, chunk_rows=8)
    assert calls == [8, 8, 8, 8, 5]
    assert r.max_abs == compare(a, b).max_abs


def test_a_head_that_reuses_its_buffer_is_copied(pair):
    """muser.Head returns a view it overwrites on the next call; compare must own each chunk."""
    a, b = pair
    buf = np.empty((4, a.shape[1]), np.float32)

    def reusing(h):
        rows = h[:, 0].astype(int)
        buf[: len(rows)] = a[rows]
        return buf[: len(rows)]

    hidden = np.arange(37, dtype=np.float32)[:, None]
    r = compare(reusing, reusing, hidden=hidden, chunk_rows=4)
    assert r.max_abs == 0 and r.byte_equal == 1.0


def test_saved_logits_from_npy_and_npz(tmp_path, pair):
    a, b = pair
    np.save(tmp_path / "a.npy", a)
    np.savez(tmp_path / "b.npz", logits=b, hidden=np.zeros((37, 2), np.float32))
    r = compare(str(tmp_path / "a.npy"), tmp_path / "b.npz", chunk_rows=5)
    ref = compare(a, b)
    assert r.max_abs == ref.max_abs and r.argmax_disagree == ref.argmax_disagree
    assert r.a.endswith("a.npy") and r.b.endswith("b.npz")


def test_heads_on_the_same_file_compare_routes(head_file, rng):
    path = head_file(hidden=512, vocab=1000, weight_type="Q8_0")
    hidden = rng.standard_normal((9, 512)).astype(np.float32)
    graph = muser.Head.load(path, route="graph")
    fused = muser.Head.load(path, route="fused")
    r = compare(graph, fused, hidden=hidden, chunk_rows=4)
    ref = np.array(graph(hidden)) - np.array(fused(hidden))
    assert r.max_abs == np.abs(ref.astype(np.float64)).max()
    assert r.argmax_agreement == 1.0  # the two epilogues differ by rounding only
    same = compare(graph, f"{path}:graph@cpu", hidden=hidden)
    assert same.byte_equal == 1.0 and same.b == f"{path}:graph@cpu"


def test_errors_are_muser_errors(pair, tmp_path):
    a, b = pair
    with pytest.raises(muser.Error, match="row counts differ"):
        compare(a, b[:5])
    with pytest.raises(muser.Error, match="hidden="):
        compare(lambda h: h, b)
    with pytest.raises(muser.Error, match="a gives"):
        compare(a[:, :10], b)
    with pytest.raises(muser.Error, match="2-d"):
        compare(a[0], b)
    with pytest.raises(muser.Error, match="k must be"):
        compare(a, b, k=0)
    with pytest.raises(muser.Error, match="no such file"):
        compare(str(tmp_path / "missing.gguf"), b)
    with pytest.raises(muser.Error, match="cannot compare"):
        compare(3, b)
    with pytest.raises(muser.Error, match="0 rows"):
        compare(a[:0], b[:0])


def test_nan_propagates_and_never_passes_a_policy(pair):
    a, b = pair
    a = a.copy()
    a[3, 4] = np.nan
    r = compare(a, b)
    assert math.isnan(r.max_abs)
    v = BoundedLogitPolicy(1e9, 1e9).check(r)
    assert not v and 3 in v.offending_rows


# ---------------------------------------------------------------------------
# the bounded-logit policy (the seed's Ch 32: max delta < 11, mean < 1.25)

def _result_with(deltas: np.ndarray) -> CompareResult:
    b = np.zeros_like(deltas, dtype=np.float32)
    return compare(deltas.astype(np.float32), b)


def test_policy_passes_inside_strict_bounds():
    d = np.full((4, 10), 1.0, np.float32)
    d[2, 3] = 10.5
    v = BoundedLogitPolicy(max_delta=11, mean_delta=1.25).check(_result_with(d))
    assert v.passed and bool(v) and v.offending_rows == [] and "PASS" in str(v)


def test_policy_bounds_are_strict_and_name_rows():
    d = np.full((4, 10), 0.5, np.float32)
    d[1, 0] = 11.0  # exactly at the bound: fails (strict <)
    d[3, 9] = 12.0
    v = BoundedLogitPolicy(max_delta=11, mean_delta=1.25).check(_result_with(d))
    assert not v.passed
    assert v.offending_rows == [1, 3]
    assert "max |delta| 12" in v.reasons[0] and "on 2 rows" in v.reasons[0]
    assert "rows 1, 3" in str(v)


def test_policy_mean_failure_names_the_heavy_rows():
    d = np.full((5, 8), 1.0, np.float32)
    d[4] = 3.0  # mean over all = 1.4 >= 1.25; row 4's own mean is 3
    v = BoundedLogitPolicy(max_delta=11, mean_delta=1.25).check(_result_with(d))
    assert not v.passed and v.offending_rows == [4]
    assert "mean |delta| 1.4" in v.reasons[0]


def test_policy_mean_failure_names_every_row_at_or_over_the_bound():
    d = np.where(np.arange(30)[:, None] % 2 == 1, 1.6, 1.0).astype(np.float32) * np.ones((1, 8), np.float32)
    v = BoundedLogitPolicy(11, 1.25).check(_result_with(d))  # mean 1.3: the odd rows carry it
    assert not v.passed and v.offending_rows == list(range(1, 30, 2))


def test_policy_argmax_requirement(pair):
    a, b = pair
    r = compare(a, b)
    assert BoundedLogitPolicy(11, 1.25).check(r).passed
    v = BoundedLogitPolicy(11, 1.25, min_argmax_agreement=1.0).check(r)
    assert not v.passed and v.offending_rows == [20]


@pytest.mark.parametrize("kw", [dict(max_delta=0, mean_delta=1), dict(max_delta=1, mean_delta=-1),
                                dict(max_delta=1, mean_delta=1, min_argmax_agreement=1.5)])
def test_policy_rejects_bad_bounds(kw):
    with pytest.raises(muser.Error):
        BoundedLogitPolicy(**kw)


def test_result_to_dict_is_json(pair):
    a, b = pair
    d = compare(a, b).to_dict(per_row=True)
    back = json.loads(json.dumps(d))
    assert back["argmax_disagree"] == [20] and len(back["per_row"]["kl"]) == 37


# ---------------------------------------------------------------------------
# CLI (wired as `python -m muser compare`; run() is tested directly)

def _run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="muser")
    sub = parser.add_subparsers(dest="command", required=True)
    _cli_compare.add_parser(sub)
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_table_and_json(tmp_path, pair, capsys):
    a, b = pair
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    assert _run_cli(["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]) == 0
    out = capsys.readouterr().out
    assert "max |a-b|" in out and "argmax agreement" in out and "rows 20" in out
    assert _run_cli(["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--json",
                     "--max-delta", "11", "--mean-delta", "1.25"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows"] == 37 and d["policy"]["passed"] is True


def test_cli_policy_failure_exit_1(tmp_path, pair, capsys):
    a, b = pair
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    rc = _run_cli(["compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                   "--max-delta", "2", "--mean-delta", "1"])
    assert rc == 1
    assert "FAIL" in capsys.readouterr().out


def test_cli_gguf_routes_on_hidden(tmp_path, head_file, rng, capsys):
    path = head_file(hidden=512, vocab=1000, weight_type="Q8_0")
    np.save(tmp_path / "h.npy", rng.standard_normal((6, 512)).astype(np.float32))
    rc = _run_cli(["compare", f"{path}:fused", f"{path}:graph", "--hidden", str(tmp_path / "h.npy"), "--json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    assert d["rows"] == 6 and d["vocab"] == 1000 and d["argmax_agreement"] == 1.0
    assert d["a"].endswith(":fused@cpu") and d["b"].endswith(":graph@cpu")


def test_cli_usage_errors_exit_2(tmp_path, pair, capsys):
    a, b = pair
    np.save(tmp_path / "a.npy", a)
    assert _run_cli(["compare", str(tmp_path / "a.npy"), str(tmp_path / "nope.npy")]) == 2
    assert "muser compare:" in capsys.readouterr().err
    assert _run_cli(["compare", str(tmp_path / "a.npy"), str(tmp_path / "a.npy"), "--max-delta", "1"]) == 2


def test_python_dash_m_muser_compare(tmp_path, pair):
    import subprocess
    import sys

    a, b = pair
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    out = subprocess.run([sys.executable, "-m", "muser", "compare", str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                          "--json", "--max-delta", "2", "--mean-delta", "1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr  # max |delta| is 3: the policy fails
    d = json.loads(out.stdout)
    expect = np.flatnonzero(np.abs(a.astype(np.float64) - b).max(axis=1) >= 2).tolist()
    assert 5 in expect and d["policy"]["passed"] is False and d["policy"]["offending_rows"] == expect
