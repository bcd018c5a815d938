"""The consumer's reductions on CUDA (run on a GPU; skipped elsewhere): score, logsumexp
and log_softmax computed on the device, bit-equal to the CPU on the canonical route and
in q8 mode, in one chunk and in many (the vocabulary in chunks of kVocabScratchBytes),
with no [t, V] logits allocated for a large batch."""
from __future__ import annotations

import numpy as np
import pytest

import muser
from muser import _core

pytest.importorskip("gguf", reason="the gguf package writes the test heads")
from muser.fixtures import write_head_gguf  # noqa: E402

from conftest import cuda_skip_reason  # noqa: E402

_skip = cuda_skip_reason()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(_skip), reason=_skip or "-")]

SCRATCH = 32 << 20  # kVocabScratchBytes (device.h)


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def hidden_states(H: int, t: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((t, H), dtype=np.float32) * np.float32(1.5)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda-consumer")
    cache = {}

    def get(weight_type: str, vocab: int, hidden: int = 256) -> str:
        key = (weight_type, vocab, hidden)
        if key not in cache:
            cache[key] = write_head_gguf(d / f"{weight_type}-{vocab}-{hidden}.gguf", hidden=hidden, vocab=vocab,
                                         weight_type=weight_type, softcap=30.0, seed=3)
        return cache[key]
    return get


CASES = [("canonical", "f32", "Q5_K"), ("canonical", "f32", "Q8_0"), ("canonical", "f32", "F16"),
         ("canonical", "q8", "Q5_K"), ("fused", "q8", "Q6_K"), ("fused", "q8", "Q8_0"), ("canonical", "q8", "Q4_K")]


@pytest.mark.parametrize("route,acts,weight_type", CASES)
@pytest.mark.parametrize("t,vocab", [(3, 5003), (150, 60000)])  # one chunk; 150 x 60,000 floats: three chunks
def test_score_on_the_gpu_equals_the_cpu(files, route, acts, weight_type, t, vocab):
    # the chunked device reduction equals reducing the device's own full logits, bit for bit;
    # on the canonical route those logits (and so the scores) are the CPU's too
    path = files(weight_type, vocab)
    cpu = muser.Head.load(path, route=route, acts=acts)
    gpu = muser.Head.load(path, device="cuda", route=route, acts=acts)
    assert (t * vocab * 4 > SCRATCH) == (vocab == 60000)
    x = hidden_states(256, t, seed=t)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, vocab, size=(t, 4))
    ids[:, 0] = gpu.argmax(x)
    ids[:, 1] = ids[0, 0]  # the same id in many rows, and repeated
    got = gpu.score(x, ids)
    lp, vals, ranks, lse = (np.asarray(a) for a in _core.score_rows(np.array(gpu(x)), ids, 0))
    np.testing.assert_array_equal(bits(got.logits), bits(vals.reshape(ids.shape)))
    np.testing.assert_array_equal(bits(got.logprobs), bits(lp.reshape(ids.shape)))
    np.testing.assert_array_equal(bits(got.logsumexp), bits(lse))
    np.testing.assert_array_equal(got.ranks, ranks.reshape(ids.shape))
    assert (got.ranks[:, 0] == 1).all()
    np.testing.assert_array_equal(bits(gpu.logsumexp(x)), bits(lse))
    if route == "canonical":
        want = cpu.score(x, ids)
        for field in ("logprobs", "logits", "logsumexp"):
            np.testing.assert_array_equal(bits(getattr(got, field)), bits(getattr(want, field)), err_msg=field)
        np.testing.assert_array_equal(got.ranks, want.ranks)
    # a row alone == the same row in the batch
    one = gpu.score(x[t - 1], ids[t - 1])
    np.testing.assert_array_equal(bits(one.logprobs), bits(got.logprobs[t - 1]))
    np.testing.assert_array_equal(one.ranks, got.ranks[t - 1])


def test_score_takes_device_hidden_states_and_bounded_memory(files):
    torch = pytest.importorskip("torch", reason="torch makes the device hidden state")
    path = files("Q8_0", 60000)
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    t = 256
    x = hidden_states(256, t, seed=9)
    ids = np.arange(t) * 7
    xd = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()
    free0 = _core.cuda_memory_info(0)[0]
    dev = gpu.score(xd, ids)  # the first call: every scratch the score needs is allocated now
    free1 = _core.cuda_memory_info(0)[0]
    logits_bytes = t * 60000 * 4  # 61 MB, above the 32 MiB scratch
    assert free0 - free1 < 0.75 * logits_bytes, f"score took {free0 - free1} bytes of device memory"
    host = gpu.score(x, ids)
    np.testing.assert_array_equal(bits(dev.logprobs), bits(host.logprobs))
    np.testing.assert_array_equal(dev.ranks, host.ranks)


@pytest.mark.parametrize("route,acts", [("canonical", "f32"), ("canonical", "q8")])
def test_log_softmax_on_the_gpu_equals_the_cpu(files, route, acts):
    path = files("Q5_K", 5003)
    cpu = muser.Head.load(path, route=route, acts=acts)
    gpu = muser.Head.load(path, device="cuda", route=route, acts=acts)
    x = hidden_states(256, 5, seed=2)
    want = np.array(cpu.log_softmax(x))
    np.testing.assert_array_equal(bits(gpu.log_softmax(x)), bits(want))
    d = gpu.log_softmax(x, on_device=True)
    assert isinstance(d, muser.DeviceArray) and d.shape == (5, 5003)
    np.testing.assert_array_equal(bits(d.get()), bits(want))
    np.testing.assert_array_equal(bits(gpu.log_softmax(x[2])), bits(want[2]))
    top = gpu.topk(x, 3, logprobs=True)
    np.testing.assert_array_equal(bits(top.logprobs), bits(np.take_along_axis(want, top.indices, 1)))


def test_sample_on_the_canonical_route_draws_the_cpus_tokens(files):
    path = files("Q5_K", 5003)
    cpu = muser.Head.load(path, route="canonical")
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    x = hidden_states(256, 6, seed=4)
    pos = np.arange(100, 106)
    for kw in ({}, {"temperature": 0.7, "top_p": 0.9}, {"top_k": 20, "min_p": 0.05}):
        want, got = cpu.sample(x, seed=7, positions=pos, **kw), gpu.sample(x, seed=7, positions=pos, **kw)
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(bits(got.logprobs), bits(want.logprobs))
