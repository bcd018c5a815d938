"""muser.lens: the head applied to every layer, checked against per-layer calls of the head's
own methods (bit for bit) and against a float64 numpy head read with the gguf package."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import muser

from conftest import hidden_states

H, V = 256, 1200


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    from muser.fixtures import write_head_gguf

    return write_head_gguf(tmp_path_factory.mktemp("lens") / "h.gguf", hidden=H, vocab=V, weight_type="Q8_0",
                           logit_scale=0.5, softcap=5.0, seed=11)


@pytest.fixture
def layers(rng):
    return np.stack([hidden_states(rng, 9, H) * (0.5 + l) for l in range(4)])  # [L=4, t=9, H]


def _head64(path: str, x: np.ndarray) -> np.ndarray:
    """The head in float64 numpy from the file's tensors (gguf's reader and dequantizer)."""
    import gguf

    r = gguf.GGUFReader(path)
    t = {x.name: x for x in r.tensors}
    gamma = np.asarray(t["output_norm.weight"].data, np.float64)
    w = gguf.quants.dequantize(t["output.weight"].data, t["output.weight"].tensor_type).astype(np.float64)
    x = x.astype(np.float64)
    normed = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * gamma
    return 5.0 * np.tanh(normed @ w.T * 0.5 / 5.0)


def _lp64(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_lens_equals_the_heads_own_methods_per_layer(path, layers, rng):
    head = muser.Head.load(path)
    targets = rng.integers(0, V, size=9)
    r = muser.lens(head, layers, k=7, targets=targets, chunk=4)
    assert r.top_ids.shape == (4, 9, 7) and r.top_ids.dtype == np.int64 and r.top_logprobs.dtype == np.float32
    assert r.entropy.shape == r.kl_to_final.shape == r.target_logprobs.shape == r.target_ranks.shape == (4, 9)
    for layer in range(4):
        tk = head.topk(layers[layer], 7, logprobs=True)
        np.testing.assert_array_equal(r.top_ids[layer], tk.indices)
        np.testing.assert_array_equal(r.top_logprobs[layer], tk.logprobs)
        sc = head.score(layers[layer], targets)
        np.testing.assert_array_equal(r.target_logprobs[layer], sc.logprobs)
        np.testing.assert_array_equal(r.target_ranks[layer], sc.ranks)


def test_entropy_and_kl_match_a_float64_head(path, layers):
    head = muser.Head.load(path)
    r = muser.lens(head, layers)
    lp = _lp64(_head64(path, layers))  # [L, t, V]
    p = np.exp(lp)
    np.testing.assert_allclose(r.entropy, -(p * lp).sum(-1), rtol=1e-5)
    kl = (p[-1] * (lp[-1] - lp)).sum(-1)
    np.testing.assert_allclose(r.kl_to_final, kl, rtol=2e-3, atol=1e-7)  # float32 logits vs float64 head
    assert np.all(r.kl_to_final[-1] == 0) and np.all(r.kl_to_final[:-1] > 1e-3)
    np.testing.assert_array_equal(r.top_ids[:, :, 0], lp.argmax(-1))
    # the soft cap is applied: no log-probability can beat cap - (cap + log V) ... so the top
    # probability is bounded by e^(2 cap) / (e^(2 cap) + V - 1)
    assert np.all(np.exp(r.top_logprobs[:, :, 0]) <= np.exp(10) / (np.exp(10) + V - 1) + 1e-6)


@pytest.mark.parametrize("chunk", [1, 2, 5, 9, 100, None])
def test_chunking_gives_identical_results(path, layers, rng, chunk):
    head = muser.Head.load(path)
    targets = rng.integers(0, V, size=9)
    whole = muser.lens(head, layers, targets=targets, chunk=9)
    r = muser.lens(head, layers, targets=targets, chunk=chunk)
    for a, b in zip(r, whole):
        np.testing.assert_array_equal(a, b)


def test_list_input_and_no_targets(path, layers):
    head = muser.Head.load(path)
    r = muser.lens(head, list(layers), k=3)
    ref = muser.lens(path, layers, k=3)  # a path is loaded with the defaults (cpu, graph)
    assert r.target_logprobs is None and r.target_ranks is None
    np.testing.assert_array_equal(r.entropy, ref.entropy)
    np.testing.assert_array_equal(r.top_ids, ref.top_ids)
    one = muser.lens(head, layers[-1:], k=3)  # L = 1: the final layer alone
    np.testing.assert_array_equal(one.kl_to_final, 0)
    np.testing.assert_array_equal(one.top_ids[0], r.top_ids[-1])


def test_bad_arguments(path, layers):
    head = muser.Head.load(path)
    with pytest.raises(ValueError, match=r"L >= 1.*\(0, 9, 256\)"):
        muser.lens(head, np.empty((0, 9, H), np.float32))
    with pytest.raises(ValueError, match="L >= 1"):
        muser.lens(head, [])
    with pytest.raises(ValueError, match=r"\[L, t, H\].*H=256.*\(9, 256\)"):
        muser.lens(head, layers[0])
    with pytest.raises(ValueError, match=r"layer 2 must have shape \(9, 256\).*got \(8, 256\)"):
        muser.lens(head, [layers[0], layers[1], layers[2][:8]])
    with pytest.raises(ValueError, match=r"\(9, 256\).*got \(9, 128\)"):
        muser.lens(head, layers[:, :, :128])
    with pytest.raises(ValueError, match=r"k must be in \[1, 1200\].*got 0"):
        muser.lens(head, layers, k=0)
    with pytest.raises(ValueError, match="got 1201"):
        muser.lens(head, layers, k=V + 1)
    with pytest.raises(TypeError, match="k must be an int"):
        muser.lens(head, layers, k=2.0)
    with pytest.raises(ValueError, match=r"shape \(9,\).*got \(8,\)"):
        muser.lens(head, layers, targets=np.zeros(8, np.int64))
    with pytest.raises(ValueError, match=r"\[0, 1200\).*1200 at row 0"):
        muser.lens(head, layers, targets=np.full(9, V))
    with pytest.raises(TypeError, match="integer"):
        muser.lens(head, layers, targets=np.zeros(9, np.float32))
    with pytest.raises(ValueError, match=r"18446744073709551615 at index \(4,\)"):  # would wrap to -1
        muser.lens(head, layers, targets=np.where(np.arange(9) == 4, np.uint64(2**64 - 1), np.uint64(1)))
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        muser.lens(head, layers, chunk=0)
    bad = layers.copy()
    bad[1, 3, 4] = np.nan
    with pytest.raises(muser.NonFiniteError):
        muser.lens(head, bad)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "muser", *args], capture_output=True, text=True)


def test_cli_table_and_json(path, layers, rng, tmp_path):
    targets = rng.integers(0, V, size=9)
    np.save(tmp_path / "L.npy", layers)
    np.save(tmp_path / "t.npy", targets)
    out = _cli("lens", path, "--hidden", str(tmp_path / "L.npy"), "--targets", str(tmp_path / "t.npy"), "--k", "3")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "4 layers x 9 positions" in lines[0] and "target logprob" in lines[1] and "KL to final" in lines[1]
    ref = muser.lens(muser.Head.load(path), layers, k=3, targets=targets)
    for layer, row in enumerate(ref.summary()):
        cells = lines[2 + layer].split()
        assert int(cells[0]) == layer and float(cells[1]) == pytest.approx(row["mean_entropy"], abs=1e-4)
        assert float(cells[2]) == pytest.approx(row["mean_target_logprob"], abs=1e-4)
        assert int(cells[5]) == row["last_top1_id"]
    js = json.loads(_cli("lens", path, "--hidden", str(tmp_path / "L.npy"), "--json").stdout)
    assert [r["last_top1_id"] for r in js["layers"]] == [int(i) for i in ref.top_ids[:, -1, 0]]
    assert "mean_target_logprob" not in js["layers"][0]
    np.save(tmp_path / "flat.npy", layers[0])
    bad = _cli("lens", path, "--hidden", str(tmp_path / "flat.npy"))
    assert bad.returncode == 2 and "[L, t, H]" in bad.stderr and "Traceback" not in bad.stderr
