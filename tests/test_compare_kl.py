"""compare(..., targets=): llama-perplexity's KL-divergence statistics, checked against a
direct float64 computation from probabilities (softmax, then log of the ratio: not the
log-softmax path compare takes), on saved logits and on two real heads of one weight."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

import muser
from muser.compare import compare

from conftest import hidden_states


def _oracle(a: np.ndarray, b: np.ndarray, targets: np.ndarray) -> dict:
    """b is llama's base, a its Q. Probabilities first, moments by sums of powers (llama's way)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    pa = np.exp(a - a.max(1, keepdims=True))
    pa /= pa.sum(1, keepdims=True)
    pb = np.exp(b - b.max(1, keepdims=True))
    pb /= pb.sum(1, keepdims=True)
    kl = np.array([sum(q * math.log(q / r) for q, r in zip(pb_row, pa_row) if q > 0)
                   for pb_row, pa_row in zip(pb, pa)])
    rows = np.arange(len(targets))
    qa, qb = pa[rows, targets], pb[rows, targets]
    nll_a, nll_b, dp = -np.log(qa), -np.log(qb), qa - qb
    n = len(targets)

    def mean_unc(x):
        m = x.sum() / n
        return m, math.sqrt((np.sum(x * x) / n - m * m) / (n - 1))

    def pct(x, f):  # linear between sorted values at f * (n - 1), as perplexity.cpp's lambda
        v = np.sort(x)
        p = f * (n - 1)
        i = int(p)
        p -= i
        return (1 - p) * v[i] + p * v[min(i + 1, n - 1)]

    ma, ua = mean_unc(nll_a)
    mb, ub = mean_unc(nll_b)
    cov = (np.sum(nll_a * nll_b) / n - ma * mb) / (n - 1)
    same = np.mean(a.argmax(1) == b.argmax(1))
    mse, umse = mean_unc(dp * dp)
    srt = np.sort(kl)
    return dict(
        kl=kl, kld_mean=mean_unc(kl)[0], kld_mean_se=mean_unc(kl)[1],
        kld_median=0.5 * (srt[n // 2] + srt[n // 2 - 1]) if n % 2 == 0 else srt[n // 2],
        kld_p99=pct(kl, 0.99), kld_p999=pct(kl, 0.999), kld_max=kl.max(), kld_min=kl.min(),
        delta_p_mean=mean_unc(dp)[0], delta_p_mean_se=mean_unc(dp)[1],
        delta_p_rms=math.sqrt(mse), delta_p_rms_se=0.5 / math.sqrt(mse) * umse,
        same_top_p=same, same_top_p_se=math.sqrt(same * (1 - same) / (n - 1)),
        ppl_a=math.exp(ma), ppl_a_se=math.exp(ma) * ua, ppl_b=math.exp(mb), ppl_b_se=math.exp(mb) * ub,
        ppl_cor=cov / (ua * ub), ln_ppl_ratio=ma - mb, ln_ppl_ratio_se=math.sqrt(ua * ua + ub * ub - 2 * cov),
        ppl_ratio=math.exp(ma - mb), ppl_diff=math.exp(ma) - math.exp(mb),
    )


@pytest.fixture
def logits_pair(rng):
    b = (rng.standard_normal((203, 300)) * 3).astype(np.float32)
    a = (b + rng.standard_normal(b.shape) * 0.3).astype(np.float32)
    t = rng.integers(0, 300, size=203)
    return a, b, t


def _check_against_oracle(r, ref, rel=1e-9):
    np.testing.assert_allclose(r.per_row["kl"], ref["kl"], rtol=1e-8, atol=1e-15)
    for name, want in ref.items():
        if name == "kl":
            continue
        got = getattr(r, name)
        assert got == pytest.approx(want, rel=rel, abs=1e-14), name


def test_statistics_of_saved_logits_match_a_float64_oracle(logits_pair):
    a, b, t = logits_pair
    r = compare(a, b, targets=t)
    ref = _oracle(a, b, t)
    _check_against_oracle(r, ref, rel=1e-7)
    assert 0 < r.same_top_p < 1 and r.ppl_a > r.ppl_b  # a is b plus noise: worse, and sometimes another argmax
    assert r.kld_mean == r.kl_divergence  # one per-row KL behind both
    assert r.ppl_ratio_se == pytest.approx(r.ppl_ratio * r.ln_ppl_ratio_se)
    nll = r.per_row["nll_a"]
    assert r.ppl_a == pytest.approx(math.exp(nll.mean()), rel=1e-12)


def test_statistics_of_two_heads_of_one_weight(head_file, rng):
    """Q8_0 and Q4_K files of the same random weight and γ (write_head_gguf draws them from one seed)."""
    kw = dict(hidden=256, vocab=2000, seed=3)
    base = muser.Head.load(head_file(weight_type="Q8_0", **kw))
    quant = muser.Head.load(head_file(weight_type="Q4_K", **kw))
    h = hidden_states(rng, 150, 256)
    t = rng.integers(0, 2000, size=150)
    r = compare(quant, base, hidden=h, targets=t, chunk_rows=32)
    la, lb = np.array(quant(h)), np.array(base(h))
    ref = _oracle(la, lb, t)
    _check_against_oracle(r, ref, rel=1e-7)
    assert r.kld_mean > 0 and r.kld_max >= r.kld_p999 >= r.kld_p99 >= r.kld_median >= r.kld_min


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 202, 203, None])
def test_chunking_gives_identical_results(logits_pair, chunk_rows):
    a, b, t = logits_pair
    whole = compare(a, b, targets=t, chunk_rows=10_000)
    r = compare(a, b, targets=t, chunk_rows=chunk_rows)
    for key, v in whole.per_row.items():
        np.testing.assert_array_equal(r.per_row[key], v, err_msg=key)
    assert r.to_dict() == whole.to_dict()


def test_identical_sources_give_zero_divergence(logits_pair):
    a, _, t = logits_pair
    r = compare(a, a.copy(), targets=t)
    assert r.kld_max == 0 and r.kld_mean == 0 and r.delta_p_rms == 0 and r.delta_p_rms_se == 0
    assert r.same_top_p == 1 and r.ppl_ratio == 1 and r.ln_ppl_ratio == 0 and r.ppl_cor == pytest.approx(1)


def test_without_targets_the_fields_are_none(logits_pair):
    a, b, _ = logits_pair
    r = compare(a, b)
    assert not r.has_targets and r.kld_mean is None and r.ppl_a is None and "nll_a" not in r.per_row
    assert "kld_mean" not in r.to_dict()
    with pytest.raises(muser.Error, match="need targets"):
        r.llama_table()


def test_llama_layout(logits_pair):
    a, b, t = logits_pair
    r = compare(a, b, targets=t)
    text = r.llama_table()
    lines = text.splitlines()
    assert lines[0] == "====== Perplexity statistics ======"
    assert f"Mean PPL(Q)                   : {r.ppl_a:10.6f} ± {r.ppl_a_se:10.6f}" in lines
    assert f"Mean    KLD: {r.kld_mean:10.6f} ± {r.kld_mean_se:10.6f}" in lines
    assert f"Maximum KLD: {r.kld_max:10.6f}" in lines and f"99.9%   KLD: {r.kld_p999:10.6f}" in lines
    assert f"Median  KLD: {r.kld_median:10.6f}" in lines
    assert f"RMS Δp    : {100 * r.delta_p_rms:6.3f} ± {100 * r.delta_p_rms_se:5.3f} %" in lines
    assert lines[-1] == f"Same top p: {100 * r.same_top_p:6.3f} ± {100 * r.same_top_p_se:5.3f} %"
    ref = _oracle(a, b, t)
    p95 = re.search(r"^95\.0%   KLD: +([-0-9.]+)$", text, re.M)
    assert float(p95.group(1)) == pytest.approx(float(np.percentile(ref["kl"], 95)), abs=1e-6)


def test_bad_targets(logits_pair, tmp_path):
    a, b, t = logits_pair
    with pytest.raises(ValueError, match=r"shape \(203,\).*got \(202,\)"):
        compare(a, b, targets=t[:-1])
    with pytest.raises(ValueError, match=r"shape \(203,\).*got \(203, 1\)"):
        compare(a, b, targets=t[:, None])
    with pytest.raises(TypeError, match="integer token ids, got dtype float64"):
        compare(a, b, targets=t.astype(np.float64))
    with pytest.raises(TypeError, match="bool"):
        compare(a, b, targets=t > 5)
    bad = t.copy()
    bad[17] = -1
    with pytest.raises(ValueError, match="-1 at row 17"):
        compare(a, b, targets=bad)
    bad[17] = 300
    with pytest.raises(ValueError, match=r"\[0, 300\).*300 at row 17"):
        compare(a, b, targets=bad)
    wrapping = t.astype(np.uint64)  # 2^64 - 1 cast to int64 is -1: a valid index of the last token
    wrapping[17] = 2**64 - 1
    with pytest.raises(ValueError, match=r"18446744073709551615 at index \(17,\)"):
        compare(a, b, targets=wrapping)
    with pytest.raises(muser.Error, match="a gives"):
        compare(a, np.ascontiguousarray(np.concatenate([b, b[:, :1]], axis=1)), targets=t)  # vocab 300 vs 301
    np.save(tmp_path / "t.npy", t)
    assert compare(a, b, targets=str(tmp_path / "t.npy")).kld_mean == compare(a, b, targets=t).kld_mean


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "muser", *args], capture_output=True, text=True)


def test_cli_prints_llama_layout_and_json(head_file, rng, tmp_path):
    kw = dict(hidden=256, vocab=1500, seed=5)
    qa, qb = head_file(weight_type="Q4_K", **kw), head_file(weight_type="Q8_0", **kw)
    h = hidden_states(rng, 120, 256)
    t = rng.integers(0, 1500, size=120)
    np.save(tmp_path / "h.npy", h)
    np.save(tmp_path / "t.npy", t)
    out = _cli("compare", qa, qb, "--hidden", str(tmp_path / "h.npy"), "--targets", str(tmp_path / "t.npy"))
    assert out.returncode == 0, out.stderr
    ref = compare(qa, qb, hidden=h, targets=t)
    m = re.search(r"^Mean    KLD: +([0-9.]+) ± +([0-9.]+)$", out.stdout, re.M)
    assert m and float(m.group(1)) == pytest.approx(ref.kld_mean, abs=1e-6)
    assert re.search(r"^Mean PPL\(Q\)/PPL\(base\) +: +[0-9.]+ ± +[0-9.]+$", out.stdout, re.M)
    assert "Same top p:" in out.stdout and "argmax agreement" in out.stdout
    js = json.loads(_cli("compare", qa, qb, "--hidden", str(tmp_path / "h.npy"), "--targets",
                         str(tmp_path / "t.npy"), "--json").stdout)
    assert js["kld_mean"] == pytest.approx(ref.kld_mean, rel=1e-12) and js["ppl_ratio"] == pytest.approx(ref.ppl_ratio)
    np.save(tmp_path / "bad.npy", t[:-3])
    bad = _cli("compare", qa, qb, "--hidden", str(tmp_path / "h.npy"), "--targets", str(tmp_path / "bad.npy"))
    assert bad.returncode == 2 and "shape (120,)" in bad.stderr and "Traceback" not in bad.stderr
