"""The fuzzer's seed corpus (tests/fuzz/): the GGUF files the test suite
builds -- small valid heads of every weight type and architecture rule, and
the malformed files of test_gguf_malformed.py -- each checked here for the
outcome the suite expects. With MUSER_FUZZ_CORPUS_DIR set, the files are also
written there (CI's fuzz smoke run and tests/fuzz/run.sh seed from it).

The heads are small (hidden 256 or less, 5 rows) so each fuzzer input runs every
route in well under a millisecond and mutations stay near valid files.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import muser
from muser.fixtures import write_head_gguf
from test_gguf_malformed import CASES, VALID, nested

TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]

# name -> write_head_gguf keywords
HEADS = {f"head_{t.lower()}": dict(weight_type=t) for t in TYPES}
HEADS.update({
    "head_q8_0_tied_f16_norm": dict(weight_type="Q8_0", tied=True, norm_type="F16"),
    "head_q5_k_no_cap": dict(weight_type="Q5_K", softcap=None),
    "head_gemma2": dict(arch="gemma2", weight_type="Q4_K", logit_scale=None, tied=True, softcap=None),
    "head_gemma3": dict(arch="gemma3", weight_type="Q8_0", logit_scale=None, softcap=None, tied=True),
    "head_llama": dict(arch="llama", weight_type="Q6_K", logit_scale=None, softcap=None),
    "head_command_r": dict(arch="command-r", weight_type="Q8_0", logit_scale=0.0625, softcap=None, tied=True,
                           norm_bias=True),
    "head_granite": dict(arch="granite", weight_type="F16", logit_scale=8.0, softcap=None),
    "head_grok": dict(arch="grok", weight_type="BF16", logit_scale=0.5, softcap=30.0),
    # float rows whose length is not a multiple of the 32 SIMD lanes (masked tails)
    "head_f32_hidden_100": dict(weight_type="F32", hidden=100),
    "head_f16_hidden_67": dict(weight_type="F16", hidden=67),
    "head_bf16_hidden_33": dict(weight_type="BF16", hidden=33, tied=True),
    "head_with_tokenizer": dict(weight_type="Q8_0", extra_metadata={
        "general.name": "fuzz seed", "tokenizer.ggml.tokens": ["<pad>", "a", "\u00e9t\u00e9", ""],
        "tokenizer.ggml.scores": [0.0, -1.5, -2.25, 3.0], "general.file_type": 7, "flag": True}),
})
VOCAB = 5  # rows of every head


def _write(directory, name, data):
    path = os.path.join(directory, name + ".gguf")
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_seed_corpus(tmp_path):
    out = os.environ.get("MUSER_FUZZ_CORPUS_DIR")
    if out:
        os.makedirs(out, exist_ok=True)
    files = {}
    for name, kw in HEADS.items():
        kw = dict(hidden=256, **kw) if "hidden" not in kw else kw
        path = write_head_gguf(tmp_path / f"{name}.gguf", vocab=VOCAB, seed=len(files), **kw)
        with open(path, "rb") as f:
            files[name] = f.read()
        # a valid seed must load and run on every route (q8 where the type allows)
        x = np.linspace(-2, 2, kw["hidden"], dtype=np.float32)[None, :]
        for route in ("reference", "fused", "graph", "canonical"):
            logits = np.asarray(muser.Head.load(path, route=route)(x))
            assert logits.shape == (1, VOCAB) and np.isfinite(logits).all(), (name, route)
    files["gguf_valid_base"] = VALID
    files["gguf_nested_8_levels"] = nested(7)
    for name, (data, _) in CASES.items():
        files[f"malformed_{name}"] = data
        with pytest.raises(muser.GGUFError):
            muser.GGUFFile(_write(tmp_path, f"malformed_{name}", data))
    assert len(files) == len(HEADS) + 2 + len(CASES)
    if out:
        for name, data in files.items():
            _write(out, name, data)
        assert len(os.listdir(out)) >= len(files)
