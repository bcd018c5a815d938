"""HeadSpec per architecture, from tiny GGUF files: each row of
docs/architectures.md is a test here."""
from __future__ import annotations

import numpy as np
import pytest

import muser
from muser.fixtures import write_head_gguf


def _spec(tmp_path, name="h.gguf", **kw):
    kw.setdefault("hidden", 256)
    kw.setdefault("vocab", 64)
    path = write_head_gguf(tmp_path / name, **kw)
    return muser.Head.load(path).spec, path


def test_muse_glimmer_reads_scale_and_cap_from_metadata(tmp_path):
    s, _ = _spec(tmp_path)
    assert (s.arch, s.norm, s.output_weight, s.tied) == ("muse-glimmer", "rms", "output.weight", False)
    assert s.logit_scale == pytest.approx(0.196116) and s.logit_scale_mode == "multiply"
    assert s.applied_scale == np.float32(0.196116)
    assert s.softcap == 20.0 and s.softcap_source == "muse-glimmer.final_logit_softcapping"
    assert s.eps == np.float32(1e-5) and s.eps_source == "muse-glimmer.attention.layer_norm_rms_epsilon"


def test_muse_glimmer_fails_closed_without_logit_scale(tmp_path):
    with pytest.raises(muser.SpecError, match="muse-glimmer.logit_scale"):
        _spec(tmp_path, logit_scale=None)


def test_muse_glimmer_softcap_defaults_to_llama_cpp_30(tmp_path):
    s, _ = _spec(tmp_path, softcap=None)
    assert s.softcap == 30.0 and "default" in s.softcap_source


def test_gemma2_head_is_always_the_token_embedding(tmp_path):
    with pytest.raises(muser.SpecError, match="token_embd.weight"):
        _spec(tmp_path, arch="gemma2", logit_scale=None)  # only output.weight present
    s, _ = _spec(tmp_path, "t.gguf", arch="gemma2", logit_scale=None, tied=True, softcap=None)
    assert s.tied and s.output_weight == "token_embd.weight"
    assert s.softcap == 30.0  # llama.cpp's default when the key is absent
    s, _ = _spec(tmp_path, "u.gguf", arch="gemma2", logit_scale=None, tied=True, softcap=50.0)
    assert s.softcap == 50.0 and s.logit_scale is None and s.applied_scale == 1.0


def test_gemma3_is_tied_without_a_softcap(tmp_path):
    s, _ = _spec(tmp_path, arch="gemma3", logit_scale=None, softcap=None, tied=True)
    assert s.tied and s.softcap is None and s.logit_scale is None
    s, _ = _spec(tmp_path, "b.gguf", arch="gemma3", logit_scale=None, softcap=25.0, tied=True)
    assert s.softcap is None  # gemma3 graphs have no final soft cap, whatever the metadata says


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_llama_family_uses_output_then_falls_back_to_tied(tmp_path, arch):
    s, _ = _spec(tmp_path, arch=arch, logit_scale=None, softcap=None)
    assert s.output_weight == "output.weight" and not s.tied
    assert s.softcap is None and s.logit_scale is None
    s, _ = _spec(tmp_path, "t.gguf", arch=arch, logit_scale=None, softcap=None, tied=True)
    assert s.output_weight == "token_embd.weight" and s.tied


@pytest.mark.parametrize("arch", ["command-r", "cohere2"])
def test_cohere_layer_norm_and_multiply_when_nonzero(tmp_path, arch):
    s, path = _spec(tmp_path, arch=arch, logit_scale=0.0625, softcap=None, tied=True, norm_bias=True)
    assert s.norm == "layer" and s.eps_source == f"{arch}.attention.layer_norm_epsilon"
    assert s.logit_scale_mode == "multiply" and s.applied_scale == np.float32(0.0625)
    assert not hasattr(s, "norm_bias")  # llama.cpp's build_norm(..., NULL, LLM_NORM) ignores a file's bias
    s0, _ = _spec(tmp_path, "z.gguf", arch=arch, logit_scale=0.0, softcap=None, tied=True)
    assert s0.logit_scale_mode == "none" and s0.applied_scale == 1.0


def test_layer_norm_head_matches_float64_oracle(tmp_path, rng):
    from oracle import head_f64
    _, path = _spec(tmp_path, arch="command-r", logit_scale=0.0625, softcap=None, tied=True, norm_bias=True)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    for route in ("graph", "canonical", "reference"):
        head = muser.Head.load(path, route=route)
        assert np.max(np.abs(head(x) - head_f64(path, head.spec, x))) < 1e-4


def test_granite_multiplies_by_the_float_reciprocal(tmp_path, rng):
    s, path = _spec(tmp_path, arch="granite", logit_scale=8.0, softcap=None)
    assert s.logit_scale_mode == "divide" and s.logit_scale == 8.0
    assert s.applied_scale == np.float32(1.0) / np.float32(8.0)
    s3, path3 = _spec(tmp_path, "g3.gguf", arch="granite", logit_scale=3.0, softcap=None)
    assert s3.applied_scale == np.float32(np.float32(1.0) / np.float32(3.0))
    x = rng.standard_normal((2, 256)).astype(np.float32)
    scaled = muser.Head.load(path3, route="graph")(x).copy()
    raw = muser.Head.load(path3, route="graph", logit_scale=None)(x)
    np.testing.assert_array_equal(scaled, raw * (np.float32(1.0) / np.float32(3.0)))


def test_grok_multiplies_then_caps(tmp_path):
    s, _ = _spec(tmp_path, arch="grok", logit_scale=0.5, softcap=30.0)
    assert s.logit_scale_mode == "multiply" and s.applied_scale == 0.5 and s.softcap == 30.0
    s, _ = _spec(tmp_path, "d.gguf", arch="grok", logit_scale=None, softcap=None)
    assert s.applied_scale == np.float32(0.5773502691896257) and s.softcap is None  # grok-1 defaults


def test_overrides_switch_each_step(tmp_path):
    _, path = _spec(tmp_path)
    s = muser.Head.load(path, softcap=None, logit_scale=1.0, eps=1e-6).spec
    assert s.softcap is None and s.applied_scale == 1.0 and s.eps == np.float32(1e-6)
    assert s.softcap_source == "override" and s.eps_source == "override"
    head = muser.Head.load(path, route="graph", softcap=None, logit_scale=None)
    assert [k for _, k in head.nodes] == ["rms_norm", "mul", "mul_mv"]


def test_unknown_architecture_names_the_supported_ones(tmp_path):
    with pytest.raises(muser.SpecError, match="no head rule.*muse-glimmer"):
        _spec(tmp_path, arch="mamba", logit_scale=None)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(extra_metadata={"muse-glimmer.logit_scale_bad": 1}, logit_scale=None), "muse-glimmer.logit_scale"),
        (dict(softcap=-3.0), "final_logit_softcapping.*non-negative"),
        (dict(softcap=float("inf")), "final_logit_softcapping.*finite"),
        (dict(eps=float("nan")), "layer_norm_rms_epsilon.*finite"),
        (dict(eps=-1e-5), "layer_norm_rms_epsilon.*non-negative"),
    ],
)
def test_bad_metadata_names_the_key(tmp_path, kw, match):
    with pytest.raises(muser.SpecError, match=match):
        _spec(tmp_path, **kw)


def _write_file(path, arch, tensors, metadata=()):
    """A hand-made GGUF: embedding length 256, an rms eps, the given extra
    metadata (key, kind, value) and tensors (name, array[, raw_dtype])."""
    import gguf
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.embedding_length", 256)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    for key, kind, value in metadata:
        getattr(w, f"add_{kind}")(key, value)
    for name, array, *raw in tensors:
        w.add_tensor(name, array, raw_dtype=raw[0] if raw else None)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return str(path)


NORM = ("output_norm.weight", np.ones(256, dtype=np.float32))
HEAD = ("output.weight", np.zeros((8, 256), dtype=np.float32))


def test_key_of_the_wrong_type_is_named(tmp_path):
    path = _write_file(tmp_path / "a.gguf", "muse-glimmer", [NORM, HEAD],
                       [("muse-glimmer.logit_scale", "string", "0.196116")])
    with pytest.raises(muser.SpecError, match="muse-glimmer.logit_scale.*number"):
        muser.Head.load(path)


def test_norm_length_must_equal_hidden_size(tmp_path):
    path = _write_file(tmp_path / "n.gguf", "llama", [("output_norm.weight", np.ones(128, dtype=np.float32)), HEAD])
    with pytest.raises(muser.SpecError, match="output_norm.weight.*128.*256"):
        muser.Head.load(path)


def test_missing_tensor_and_unsupported_head_type_are_named(tmp_path):
    import gguf
    with pytest.raises(muser.SpecError, match="missing tensor 'token_embd.weight'"):
        muser.Head.load(_write_file(tmp_path / "m.gguf", "llama", [NORM]))
    q4_0 = ("output.weight", np.zeros((8, 8 * 18), dtype=np.uint8), gguf.GGMLQuantizationType.Q4_0)
    with pytest.raises(muser.SpecError, match="Q4_0"):
        muser.Head.load(_write_file(tmp_path / "q.gguf", "llama", [NORM, q4_0]))


def test_f16_norm_weight_is_accepted(tmp_path, rng):
    _, path = _spec(tmp_path, norm_type="F16")
    head = muser.Head.load(path)
    assert np.isfinite(head(rng.standard_normal(256).astype(np.float32))).all()
