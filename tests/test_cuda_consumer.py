"""The consumer's reductions on CUDA (run on a GPU; skipped elsewhere): score, logsumexp
and log_softmax computed on the device, bit-equal to the CPU on the canonical route and
in q8 mode, in one launch and in many (groups of tokens, the vocabulary in slices: what
kVocabScratchBytes holds), with no [t, V] logits allocated for a large batch."""
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

SCRATCH = 128 << 20  # kVocabScratchBytes (device.h)


def score_plan(t: int, m: int, vocab: int) -> tuple[int, int]:
    """(tokens per group, vocabulary ids per slice) of the CUDA score (cuda_device.cpp, score_plan)."""
    fit = SCRATCH // (4 * vocab)
    if t <= fit:
        return t, vocab
    g = min(t, 256)  # kScoreSliceTokens
    per_slice = SCRATCH // (4 * g) // 2048 * 2048  # whole tiles of kLseTile ids
    if per_slice >= vocab:
        return g, vocab
    if per_slice > 0 and g * g * m * 4 <= 16 << 20:  # kScoreChosenBytes
        return g, per_slice
    return (fit // 64 * 64 if fit >= 64 else fit // 8 * 8 if fit >= 8 else max(fit, 1)), vocab


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


# one launch; one group in two slices of the vocabulary (165,888 and 34,112 ids); groups of 256
# and 44 tokens in slices of 131,072 and 68,928 (on an sm_90 device the 256 through the q8
# kernel's shared decode); and once per activation mode, groups of 128 and 72 over whole rows
# (too many chosen ids to gather)
SIZES = [(3, 5003, 6, (3, 5003)), (200, 200000, 6, (200, 165888)), (300, 200000, 6, (256, 131072))]
WHOLE_ROWS = (200, 200000, 120, (128, 200000))
SCORE_CASES = [c + s for c in CASES for s in SIZES] + [c + WHOLE_ROWS for c in CASES
                                                       if c in {("canonical", "f32", "Q5_K"), ("fused", "q8", "Q6_K")}]


@pytest.mark.parametrize("route,acts,weight_type,t,vocab,m,plan", SCORE_CASES)
def test_score_on_the_gpu_equals_the_cpu(files, route, acts, weight_type, t, vocab, m, plan):
    # the device reduction in groups and slices equals reducing the device's own full logits, bit
    # for bit; on the canonical route those logits (and so the scores) are the CPU's too
    path = files(weight_type, vocab)
    cpu = muser.Head.load(path, route=route, acts=acts)
    gpu = muser.Head.load(path, device="cuda", route=route, acts=acts)
    assert score_plan(t, m, vocab) == plan
    x = hidden_states(256, t, seed=t)
    rng = np.random.default_rng(5)
    ids = rng.integers(0, vocab, size=(t, m))  # 4 ids counted in registers, the others in passes of their own
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
    path = files("Q8_0", 150000)
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    t = 1024
    x = hidden_states(256, t, seed=9)
    ids = np.arange(t) * 7
    xd = torch.from_numpy(x).cuda()
    torch.cuda.synchronize()
    free0 = _core.cuda_memory_info(0)[0]
    dev = gpu.score(xd, ids)  # the first call: every scratch the score needs is allocated now
    free1 = _core.cuda_memory_info(0)[0]
    logits_bytes = t * 150000 * 4  # 614 MB; the score's groups of 256 rows over slices of 131,072 ids take 134 MB
    assert free0 - free1 < 0.4 * logits_bytes, f"score took {free0 - free1} bytes of device memory"
    host = gpu.score(x, ids)
    np.testing.assert_array_equal(bits(dev.logprobs), bits(host.logprobs))
    np.testing.assert_array_equal(dev.ranks, host.ranks)


@pytest.mark.parametrize("route,acts", [("canonical", "f32"), ("fused", "q8")])
def test_long_consumer_grids_give_the_short_grids_results(files, route, acts):
    # a reduction or sampling grid of more than kShortGridCtas (1,024) CTAs launches plainly and
    # reads its ids / parameters / positions from an upload in device memory; a short one launches
    # with PDL and reads them from mapped host memory: the same results either way, and on the
    # canonical route the CPU's
    path = files("Q8_0", 150000)  # 74 tiles of 2,048 ids
    gpu = muser.Head.load(path, device="cuda", route=route, acts=acts)
    t = 16  # 16 rows x 74 tiles = 1,184 CTAs: long; one row: 74, short
    x = hidden_states(256, t, seed=31)
    ids = (np.arange(t) * 9173) % 150000
    pos = np.arange(t) + 40
    long = gpu.score(x, ids)
    for r in (0, 5, t - 1):
        short = gpu.score(x[r], int(ids[r]))
        assert bits(short.logprobs) == bits(long.logprobs[r]) and short.ranks == long.ranks[r]
    samplings = ({"temperature": 0.0}, {}, {"top_k": 20}, {"temperature": 0.8, "top_p": 0.9})
    drawn = [gpu.sample(x, seed=3, positions=pos, **kw) for kw in samplings]
    for kw, got in zip(samplings, drawn):
        for r in (0, 5, t - 1):
            one = gpu.sample(x[r], seed=3, positions=int(pos[r]), **kw)
            assert one.tokens == got.tokens[r] and bits(one.logprobs) == bits(got.logprobs[r]), (kw, r)
    if route == "canonical":
        cpu = muser.Head.load(path, route=route, acts=acts)
        np.testing.assert_array_equal(bits(long.logprobs), bits(cpu.score(x, ids).logprobs))
        for kw, got in zip(samplings, drawn):
            np.testing.assert_array_equal(got.tokens, cpu.sample(x, seed=3, positions=pos, **kw).tokens)


def test_interleaved_calls_each_give_their_first_answer(files):
    # score, logsumexp and draws of several settings and batch sizes, interleaved: each kind of
    # call keeps its last few graphs (five settings here: more than it keeps, so some are made
    # again), and every repeat must give the answer of its first call
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route="fused", acts="q8")
    x = hidden_states(256, 3, seed=51)
    pos = np.arange(3) + 11
    calls = [lambda: gpu.score(x, np.array([1, 2, 3])).logprobs,
             lambda: gpu.logsumexp(x),
             lambda: gpu.score(x[1], 9).logprobs]
    for kw in ({"temperature": 0.0}, {"top_k": 3}, {"top_p": 0.8}, {}, {"top_k": 40, "min_p": 0.02}):
        calls.append(lambda kw=kw: gpu.sample(x, seed=4, positions=pos, **kw).processed_logprobs)
        calls.append(lambda kw=kw: np.asarray(gpu.sample(x[:2], seed=4, positions=pos[:2], **kw).tokens))
    first = [np.asarray(c()).tobytes() for c in calls]
    for _ in range(3):
        assert [np.asarray(c()).tobytes() for c in calls] == first  # bit for bit


@pytest.mark.parametrize("route,acts", [("canonical", "f32"), ("fused", "q8")])
def test_top_k_cut_by_selection_equals_the_host_sampling(files, route, acts):
    # top_k takes topk_threshold's k best of each group of 16 rows where it can (k <= the
    # row's chunks of 1,024 ids: 147 here), and top_p, min_p, the kept set's pairs (its tokens
    # spread over the row's 74 tiles) and the race run over those k alone; the sorted order
    # elsewhere (k = 148): every field equals muser/sample.h over the device's own logits, at
    # t = 20 (groups of 16 and 4) and 10
    from muser import _sampling
    path = files("Q8_0", 150000)
    gpu = muser.Head.load(path, device="cuda", route=route, acts=acts)
    x = hidden_states(256, 20, seed=41)
    pos = np.arange(20) + 7
    logits = np.array(gpu(x))
    few = np.zeros(150000, bool)
    few[np.arange(10) * 15001] = True  # fewer allowed tokens than top_k: no cut at all
    for kw in ({"top_k": 1}, {"top_k": 20}, {"top_k": 147}, {"top_k": 148},
               {"top_k": 20, "temperature": 0.7, "min_p": 0.01}, {"top_k": 20, "allowed": few},
               {"top_k": 20, "top_p": 0.5}, {"top_k": 147, "top_p": 0.9, "temperature": 1.5},
               {"top_k": 147, "top_p": 0.95, "temperature": 3.0, "min_p": 0.3, "logit_bias": {7: 0.5, 149999: 9.0}},
               {"top_k": 20, "top_p": 0.7, "allowed": few}):
        params = _sampling.check_params(150000, seed=5, positions=pos, **{
            "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "logit_bias": None, "allowed": None, **kw})
        want = _sampling.sample_logits(logits, False, params, pos.astype(np.uint64))
        halves = [gpu.sample(x[r:r + 10], seed=5, positions=pos[r:r + 10], **kw) for r in (0, 10)]
        for got in (gpu.sample(x, seed=5, positions=pos, **kw),
                    muser.Sample(*(np.concatenate([getattr(h, f) for h in halves]) for f in muser.Sample._fields))):
            np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=str(kw["top_k"]))
            for field in ("logprobs", "processed_logprobs", "kept_mass"):
                np.testing.assert_array_equal(bits(getattr(got, field)), bits(getattr(want, field)),
                                              err_msg=f"{kw['top_k']} {field}")
        if "allowed" in kw:
            assert set(want.tokens.tolist()) <= set(np.flatnonzero(few).tolist())


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
    assert gpu.caps["sample_on_device"]


# Settings that take every path of the device sampler: greedy (sample_prep alone), the
# race alone, top_k's order cut, top_p within 64 ranked ids and past them (the second
# order of kTopkMax ids, or the host), min_p, logit_bias and allowed, all combined.
SAMPLE_SETTINGS = [
    {"temperature": 0.0},
    {"temperature": 0.0, "logit_bias": {5: 40.0, 17: -1e30}},
    {},
    {"temperature": 0.6},
    {"temperature": 1.7},
    {"top_k": 1},
    {"top_k": 5},  # top_k alone, k <= the row's 5 chunks of 1,024 ids: topk_threshold's cut, no sort
    {"top_k": 4, "temperature": 0.5, "min_p": 0.1},
    {"top_k": 50},
    {"top_k": 5003},
    {"top_p": 0.9},
    {"top_p": 0.999},
    {"top_p": 0.3, "top_k": 100},
    {"top_p": 0.6, "top_k": 5, "temperature": 0.8},  # top_k by selection, top_p over its 5
    {"min_p": 0.05},
    {"temperature": 1.3, "top_k": 200, "top_p": 0.8, "min_p": 0.02},
    {"temperature": 4.0, "top_p": 0.95},  # flat: the prefix runs past 64 ids
    {"temperature": 1e4, "top_p": 0.6},  # one bin of m - z holds every token: top_p refines on the key
    {"logit_bias": {3: 2.5, 4000: -3.0}, "top_p": 0.7},
]


def _allowed_mask(V: int) -> np.ndarray:
    mask = np.random.default_rng(11).random(V) < 0.3
    mask[0] = True
    return mask


def _assert_draw_equals_host_sampling(gpu: muser.Head, x: np.ndarray, seed: int, pos: np.ndarray, kw: dict):
    """The device draw against muser/sample.h on the CPU over the device's own logits, bit for
    bit in every field; returns the draw."""
    from muser import _sampling
    V = gpu.spec.vocab_size
    got = gpu.sample(x, seed=seed, positions=pos, **kw)
    params = _sampling.check_params(V, seed=seed, positions=pos, **{
        "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "logit_bias": None, "allowed": None, **kw})
    want = _sampling.sample_logits(np.array(gpu(x)), False, params, pos.astype(np.uint64))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    for field in ("logprobs", "processed_logprobs", "kept_mass"):
        np.testing.assert_array_equal(bits(getattr(got, field)), bits(getattr(want, field)), err_msg=field)
    return got


@pytest.mark.parametrize("route,acts", [("canonical", "f32"), ("fused", "q8")])
@pytest.mark.parametrize("setting", range(len(SAMPLE_SETTINGS) + 1))
def test_device_sample_equals_host_sampling_of_the_devices_logits(files, route, acts, setting):
    # the device draw (Device::sample) against muser/sample.h on the CPU over the same
    # logits, bit for bit in every field; on the canonical route also against the CPU head
    kw = dict(SAMPLE_SETTINGS[setting]) if setting < len(SAMPLE_SETTINGS) else {"allowed": _allowed_mask(5003)}
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route=route, acts=acts)
    x = hidden_states(256, 5, seed=12 + setting)
    pos = np.arange(40, 45)
    got = _assert_draw_equals_host_sampling(gpu, x, 99, pos, kw)
    one = gpu.sample(x[2], seed=99, positions=42, **kw)  # one row: the batch's row 2, the t axis dropped
    assert one.tokens == got.tokens[2] and isinstance(one.tokens, int)
    if route == "canonical":
        cpu = muser.Head.load(path, route=route, acts=acts).sample(x, seed=99, positions=pos, **kw)
        np.testing.assert_array_equal(got.tokens, cpu.tokens)
        np.testing.assert_array_equal(bits(got.processed_logprobs), bits(cpu.processed_logprobs))


_SPREAD_CHILD = """
import pickle, sys
import numpy as np
import muser
path, x, settings, out = pickle.load(open(sys.argv[1], "rb"))
gpu = muser.Head.load(path, device="cuda", route="fused", acts="q8")
draws = [gpu.sample(x, seed=5, positions=np.arange(len(x)) + 9, **kw) for kw in settings]
pickle.dump([tuple(np.asarray(f).tobytes() for f in d) for d in draws], open(out, "wb"))
"""


@pytest.mark.parametrize("spread", ["0", "1", "3"])
def test_spreading_sample_tiles_over_the_sms_changes_no_bit(files, tmp_path, spread):
    # MUSER_SAMPLE_SPREAD (sample.cu, spread_smem) sets only the shared memory a CTA-per-tile
    # sample launch asks for, so how many of its CTAs share a SM: every field of every
    # draw is the same bits as this process's (the default: one to a SM, a grid of one wave)
    import os
    import pickle
    import subprocess
    import sys
    path = files("Q5_K", 5003)
    x = hidden_states(256, 6, seed=31)
    settings = SAMPLE_SETTINGS
    gpu = muser.Head.load(path, device="cuda", route="fused", acts="q8")
    here = [tuple(np.asarray(f).tobytes() for f in gpu.sample(x, seed=5, positions=np.arange(6) + 9, **kw))
            for kw in settings]
    args = tmp_path / "args.pkl"
    pickle.dump((path, x, settings, str(tmp_path / "out.pkl")), open(args, "wb"))
    subprocess.run([sys.executable, "-c", _SPREAD_CHILD, str(args)], check=True,
                   env=dict(os.environ, MUSER_SAMPLE_SPREAD=spread))
    there = pickle.load(open(tmp_path / "out.pkl", "rb"))
    assert len(there) == len(here) > 10
    for kw, a, b in zip(settings, here, there):
        assert a == b, kw


CTA_TILE_MAX_TILES = 2048  # kCtaTileMaxTiles (sample.cu): sampling runs a CTA per tile up to this many tiles a launch


@pytest.mark.parametrize("setting", range(len(SAMPLE_SETTINGS)))
def test_device_sample_of_many_rows_equals_host_sampling(files, setting):
    # past kCtaTileMaxTiles tiles a launch, sample_prep and sample_kept run a warp per tile (a
    # lane's 64 steps in chunks) instead of a CTA per tile: the same bits in every field
    gpu = muser.Head.load(files("Q5_K", 5003), device="cuda", route="fused", acts="q8")
    t = 700
    assert t * 3 > CTA_TILE_MAX_TILES >= 16 * 3  # the batch takes warps; a group of 16 rows, CTAs
    _assert_draw_equals_host_sampling(gpu, hidden_states(256, t, seed=70 + setting), 17, np.arange(t) * 7 + 3,
                                      SAMPLE_SETTINGS[setting])


def test_device_top_p_cuts_within_tied_logits_by_id(files):
    # a zero hidden state gives 5,003 equal logits: top_p's select refines through every bit
    # of the order key down to the ids (the cut is the lowest ids, as the CPU's sort gives),
    # rows 1 and 33 of 40 (every row in one grid)
    from muser import _sampling
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    x = hidden_states(256, 40, seed=5)
    x[[1, 33]] = 0.0
    pos = np.arange(40)
    for top_p in (0.3, 0.999, 1e-6):
        got = gpu.sample(x, seed=1, positions=pos, top_p=top_p)
        params = _sampling.check_params(5003, seed=1, positions=pos, temperature=1.0, top_k=0, top_p=top_p,
                                        min_p=0.0, logit_bias=None, allowed=None)
        want = _sampling.sample_logits(np.array(gpu(x)), False, params, pos.astype(np.uint64))
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(bits(got.kept_mass), bits(want.kept_mass))
        np.testing.assert_array_equal(bits(got.processed_logprobs), bits(want.processed_logprobs))
        for r in (1, 33):  # ceil(top_p * 5003) tokens of 5003
            assert abs(float(got.kept_mass[r]) - max(top_p, 1 / 5003)) < 2e-4


@pytest.mark.parametrize("route,acts", [("canonical", "f32"), ("fused", "q8")])
@pytest.mark.parametrize("plateau", (100, 400, 1000))
def test_device_top_p_cuts_inside_a_plateau_of_equal_logits(tmp_path, route, acts, plateau):
    # `plateau` rows equal (so their logits are) and far above the rest: top_p's cut lies inside
    # the one bin of m - z that holds them, whose tokens the select collects and orders (a bitonic
    # sort of 128, 512 and 1,024 slots) to the cut at the lowest ids
    from muser import _sampling
    rng = np.random.default_rng(8)
    x = hidden_states(256, 2, seed=31)
    x[1] = x[0]
    w = rng.standard_normal((5003, 256), dtype=np.float32) * np.float32(0.01)
    w[:plateau] = x[0]
    kw = dict(hidden=256, vocab=5003, weight_type="Q8_0", softcap=30.0, seed=3)
    path = write_head_gguf(tmp_path / "plateau.gguf", weight=w, **kw)
    w[:plateau] *= np.float32(8.0 / float(muser.Head.load(path)(x[0])[0]))  # the plateau's logits near 8
    path = write_head_gguf(tmp_path / "plateau2.gguf", weight=w, **kw)
    gpu = muser.Head.load(path, device="cuda", route=route, acts=acts)
    pos = np.array([3, 4])
    logits = np.array(gpu(x))
    assert (logits[:, :plateau] == logits[0, 0]).all() and logits[0, 0] > logits[:, plateau:].max() + 5
    for top_p in (0.5, 0.93):
        got = gpu.sample(x, seed=7, positions=pos, top_p=top_p)
        params = _sampling.check_params(5003, seed=7, positions=pos, temperature=1.0, top_k=0, top_p=top_p,
                                        min_p=0.0, logit_bias=None, allowed=None)
        want = _sampling.sample_logits(logits, False, params, pos.astype(np.uint64))
        np.testing.assert_array_equal(got.tokens, want.tokens)
        for field in ("logprobs", "processed_logprobs", "kept_mass"):
            np.testing.assert_array_equal(bits(getattr(got, field)), bits(getattr(want, field)), err_msg=field)
        assert (got.tokens < plateau).all()
        assert abs(float(got.kept_mass[0]) - top_p) < 2.0 / plateau


@pytest.mark.parametrize("kw", [{"top_p": 0.8}, {"top_k": 100, "top_p": 0.8}, {"top_k": 30}])
def test_device_sample_of_40_rows_equals_host_sampling(files, kw):
    # top_k's cut in groups of 16 rows, then top_p over all 40 rows in one grid
    from muser import _sampling
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route="fused", acts="q8")
    x = hidden_states(256, 40, seed=77)
    pos = np.arange(1000, 1040)
    got = gpu.sample(x, seed=5, positions=pos, temperature=0.9, **kw)
    params = _sampling.check_params(5003, seed=5, positions=pos, **{
        "temperature": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "logit_bias": None, "allowed": None, **kw})
    want = _sampling.sample_logits(np.array(gpu(x)), False, params, pos.astype(np.uint64))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_array_equal(bits(got.kept_mass), bits(want.kept_mass))


def test_device_sample_from_device_hidden_states_checks_them(files):
    torch = pytest.importorskip("torch", reason="torch makes the device hidden state")
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route="fused")
    x = hidden_states(256, 4, seed=21)
    xd = torch.from_numpy(x).cuda()
    pos = np.arange(4)
    a, b = gpu.sample(xd, seed=3, positions=pos, top_p=0.9), gpu.sample(x, seed=3, positions=pos, top_p=0.9)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    xd[1, 7] = float("nan")
    with pytest.raises(muser.NonFiniteError, match="row 1"):
        gpu.sample(xd, seed=3, positions=pos)
    with pytest.raises(muser.NonFiniteError, match="row 1"):
        gpu.score(xd, np.zeros(4, np.int64))
    np.testing.assert_array_equal(gpu.sample(xd[[0, 2, 3]], seed=3, positions=pos[[0, 2, 3]], top_p=0.9).tokens,
                                  a.tokens[[0, 2, 3]])


def test_device_hidden_states_at_new_addresses_give_the_host_inputs_results(files):
    # score and sample copy a device hidden state into the head's own buffer, so their graphs
    # do not depend on its address: six buffers in turn (more than a graph cache holds), the
    # host input's results every time
    torch = pytest.importorskip("torch", reason="torch makes the device hidden states")
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route="fused")
    x = hidden_states(256, 3, seed=61)
    pos = np.arange(3)
    ids = np.array([4, 5, 4000])
    want_score = gpu.score(x, ids).logprobs
    want_draw = gpu.sample(x, seed=8, positions=pos, top_k=4).tokens
    buffers = [torch.from_numpy(x).cuda() for _ in range(6)]
    for _ in range(2):
        for xd in buffers:
            assert bits(gpu.score(xd, ids).logprobs).tolist() == bits(want_score).tolist()
            np.testing.assert_array_equal(gpu.sample(xd, seed=8, positions=pos, top_k=4).tokens, want_draw)


def test_device_sample_names_a_non_finite_row(files):
    # z = (logit + bias) / temperature overflows: the device leaves the row to the host, which names it
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route="fused")
    x = hidden_states(256, 3, seed=5)
    with pytest.raises(muser.NonFiniteError, match="row 0, token 9: .* is not finite after logit_bias and temperature"):
        gpu.sample(x, seed=1, positions=np.arange(3), temperature=0.5, logit_bias={9: 3e38})
    assert gpu.sample(x, seed=1, positions=np.arange(3)).tokens.shape == (3,)  # the head is still usable


def test_reductions_on_device_stay_in_device_memory_with_the_host_bits(files):
    # on_device=True: the same results, as DeviceArrays (float32 values, int64 ranks and tokens)
    torch = pytest.importorskip("torch", reason="torch reads the device arrays")
    path = files("Q5_K", 5003)
    gpu = muser.Head.load(path, device="cuda", route="fused")
    x = hidden_states(256, 4, seed=31)
    ids = np.random.default_rng(2).integers(0, 5003, size=(4, 3))
    host, dev = gpu.score(x, ids), gpu.score(x, ids, on_device=True)
    for field in ("logprobs", "logits", "ranks", "logsumexp"):
        d = getattr(dev, field)
        assert isinstance(d, muser.DeviceArray) and d.shape == np.shape(getattr(host, field)), field
        np.testing.assert_array_equal(d.get(), getattr(host, field), err_msg=field)
        shared = torch.from_dlpack(d)  # no copy: the framework sees the same shape and dtype
        assert shared.dtype == (torch.int64 if field == "ranks" else torch.float32) and tuple(shared.shape) == d.shape
        np.testing.assert_array_equal(shared.cpu().numpy(), getattr(host, field), err_msg=field)
    one = gpu.score(x[1], 7, on_device=True)
    assert one.ranks.shape == () and int(one.ranks.get()) == gpu.score(x[1], 7).ranks
    lse = gpu.logsumexp(x, on_device=True)
    np.testing.assert_array_equal(bits(lse.get()), bits(host.logsumexp))
    for kw in ({}, {"top_p": 0.9}, {"top_k": 2000}, {"temperature": 0.0}):
        want = gpu.sample(x, seed=5, positions=np.arange(4), **kw)
        got = gpu.sample(x, seed=5, positions=np.arange(4), on_device=True, **kw)
        np.testing.assert_array_equal(got.tokens.get(), want.tokens)
        assert got.tokens.dtype == np.int64
        for field in ("logprobs", "processed_logprobs", "kept_mass"):
            np.testing.assert_array_equal(bits(getattr(got, field).get()), bits(getattr(want, field)), err_msg=field)
