"""Vocabulary-parallel heads (muser.shard; docs/numerics.md, "Sharded heads"): a shard loads only
its rows, its logits are the same columns of the unsharded head's bit for bit, and every
cross-shard reduction (argmax, topk, logsumexp, log_softmax, score, sample) equals the unsharded
head's bit for bit -- shards in one process (LocalGroup), across processes (torch.distributed
gloo, when torch is installed) and on a GPU (world = 1 through the same code path, and several
shards on one GPU). Independent oracles: numpy's sort and counts over the full float32 logits."""
from __future__ import annotations

import os

import numpy as np
import pytest

import muser
from muser import _core, shard
from muser.shard import LocalGroup

from conftest import bits, cuda_skip_reason, hidden_states

TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]
ROUTES = ["reference", "fused", "graph", "canonical"]
SAMPLINGS = [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=40),
    dict(temperature=1.0, top_p=0.9),
    dict(temperature=1.3, top_k=300, top_p=0.8, min_p=0.02),
    dict(temperature=1.0, min_p=0.05),
]


def same(a, b) -> bool:
    """Bit-equal results: floats by their bits (NaN included), ints and tuples elementwise."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if a is None or b is None:
        return a is b
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "f":
        return np.array_equal(bits(a), bits(b))
    return np.array_equal(a, b)


def load_shards(path, world, **kw):
    group = LocalGroup(world)
    return group, [muser.Head.load(path, shard=(r, world), group=group, **kw) for r in range(world)]


def oracle_topk(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids best first: larger logit, ties to the lower id, NaN last (numpy's sort of the full row)."""
    ids = np.arange(logits.shape[1])
    return np.stack([np.lexsort((ids, np.isnan(r), -np.nan_to_num(r, nan=0)))[:k] for r in logits])


def test_shard_rows_cover_the_vocabulary_once():
    for V in (1, 2, 7, 100, 2048, 4099, 202048):
        for world in range(1, min(V, 9) + 1):
            rows = [_core.shard_rows(V, r, world) for r in range(world)]
            assert rows == [(r * V // world, (r + 1) * V // world) for r in range(world)]
            assert rows[0][0] == 0 and rows[-1][1] == V
            assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))
            sizes = [b - a for a, b in rows]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("route", ROUTES)
def test_local_logits_are_the_unsharded_columns(head_file, rng, weight_type, route):
    path = head_file(weight_type=weight_type, hidden=256, vocab=4099, random_quants=True)
    full = muser.Head.load(path, route=route)
    x = hidden_states(rng, 3, 256)
    want = np.array(full(x))
    quantized = weight_type in ("Q5_K", "Q6_K", "Q4_K", "Q8_0")  # acts="q8" multiplies these alone
    for acts in ("f32", "q8") if route != "reference" and quantized else ("f32",):
        want_a = want if acts == "f32" else np.array(muser.Head.load(path, route=route, acts="q8")(x))
        for world in (2, 3):
            _, heads = load_shards(path, world, route=route, acts=acts)
            for r, h in enumerate(heads):
                s, e = h.shard_rows
                assert (s, e) == (r * 4099 // world, (r + 1) * 4099 // world) and h.shard == (r, world)
                assert h.spec.vocab_size == 4099
                assert h.weight_bytes * 4099 == full.weight_bytes * (e - s)  # only its rows
                got = h(x)
                assert got.shape == (3, e - s)
                assert same(got, want_a[:, s:e]), (acts, world, r)
                assert same(h(x[1]), want_a[1, s:e])
                out = np.empty((3, e - s), np.float32)
                assert h(x, out=out) is out and same(out, want_a[:, s:e])


@pytest.mark.parametrize("weight_type", ["Q5_K", "Q8_0", "BF16"])
@pytest.mark.parametrize("route", ["graph", "canonical", "reference"])
@pytest.mark.parametrize("vocab", [4099, 1000, 6144])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_reductions_equal_the_unsharded_head(head_file, rng, weight_type, route, vocab, world):
    path = head_file(weight_type=weight_type, hidden=256, vocab=vocab, random_quants=True)
    full = muser.Head.load(path, route=route)
    x = hidden_states(rng, 4, 256)
    logits = np.array(full(x))
    group, heads = load_shards(path, world, route=route)
    ids = rng.integers(0, vocab, (4, 6))

    for got in group.run(heads, lambda h: h.argmax(x)):
        assert same(got, full.argmax(x)) and np.array_equal(got, oracle_topk(logits, 1)[:, 0])
    assert group.run(heads, lambda h: h.argmax(x[2])) == [full.argmax(x[2])] * world
    for k in (1, 5, min(vocab, 300)):  # 300 > a shard's rows when V = 1000, world = 5
        want = full.topk(x, k, logprobs=True)
        assert np.array_equal(want.indices, oracle_topk(logits, k))
        for got in group.run(heads, lambda h: h.topk(x, k, logprobs=True)):
            assert same(tuple(got), tuple(want))
        for got in group.run(heads, lambda h: h.topk(x, k)):
            assert same(got.values, want.values) and same(got.indices, want.indices) and got.logprobs is None
    for got in group.run(heads, lambda h: h.logsumexp(x)):
        assert same(got, full.logsumexp(x))
    assert group.run(heads, lambda h: h.logsumexp(x[0])) == [full.logsumexp(x[0])] * world
    want = full.score(x, ids)
    # the ranks' oracle: numpy's counts over the full row
    oracle = np.array([[1 + int((logits[r] > logits[r, i]).sum() + ((logits[r] == logits[r, i]) &
                                                                   (np.arange(vocab) < i)).sum())
                        for i in ids[r]] for r in range(4)])
    assert np.array_equal(want.ranks, oracle)
    for got in group.run(heads, lambda h: h.score(x, ids)):
        assert same(tuple(got), tuple(want))
    for got in group.run(heads, lambda h: h.score(x, ids[:, 0])):
        assert same(tuple(got), tuple(full.score(x, ids[:, 0])))
    for got in group.run(heads, lambda h: h.score(x[1], int(ids[1, 0]))):
        assert got == full.score(x[1], int(ids[1, 0]))
    ls = np.array(full.log_softmax(x))
    for h, got in zip(heads, group.run(heads, lambda h: h.log_softmax(x))):
        s, e = h.shard_rows
        assert same(got, ls[:, s:e])
    for kw in SAMPLINGS:
        kw = dict(kw, seed=11, positions=np.arange(4) + 3)
        want = full.sample(x, **kw)
        for got in group.run(heads, lambda h: h.sample(x, **kw)):
            assert same(tuple(got), tuple(want)), kw
    one = dict(temperature=0.8, top_k=20, seed=5, positions=9)
    assert group.run(heads, lambda h: h.sample(x[3], **one)) == [full.sample(x[3], **one)] * world


def tied_head(tmp_path, vocab: int, world: int, tied_ids: list) -> str:
    """A head whose rows tied_ids are one row (equal logits for any input, the row's best),
    the others small random ones: ties at and across the shard boundaries."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((vocab, 64)) * 0.02).astype(np.float32)
    w[tied_ids] = np.abs(rng.standard_normal(64)).astype(np.float32) * 0.5
    return muser.fixtures.write_head_gguf(str(tmp_path / f"tied{vocab}_{world}.gguf"), hidden=64, vocab=vocab,
                                          weight_type="F32", weight=w, softcap=None)


@pytest.mark.parametrize("vocab,world", [(10, 3), (5000, 2), (4099, 5)])
def test_ties_across_shard_boundaries_go_to_the_lowest_id(tmp_path, vocab, world):
    bounds = [r * vocab // world for r in range(1, world)]
    tied = sorted({b - 1 for b in bounds} | set(bounds) | {vocab - 1})
    path = tied_head(tmp_path, vocab, world, tied)
    full = muser.Head.load(path, route="canonical")
    x = np.abs(np.random.default_rng(4).standard_normal((2, 64))).astype(np.float32)
    logits = np.array(full(x))
    assert (logits[:, tied] == logits[:, tied[:1]]).all() and (logits[:, tied[0]] == logits.max(axis=1)).all()
    group, heads = load_shards(path, world, route="canonical")
    k = len(tied) + 2
    for got in group.run(heads, lambda h: h.topk(x, k, logprobs=True)):
        assert np.array_equal(got.indices[:, :len(tied)], [tied, tied])  # ties: the lowest id first
        assert same(tuple(got), tuple(full.topk(x, k, logprobs=True)))
    assert all(np.array_equal(a, [tied[0]] * 2) for a in group.run(heads, lambda h: h.argmax(x)))
    grid = np.array([tied, tied])
    for got in group.run(heads, lambda h: h.score(x, grid)):
        assert np.array_equal(got.ranks, [list(range(1, len(tied) + 1))] * 2)
        assert same(tuple(got), tuple(full.score(x, grid)))
    # top_k's cut inside the tie, the greedy draw of a tie
    for kw in (dict(temperature=1.0, top_k=2), dict(temperature=0.0), dict(temperature=1.0, top_p=0.3)):
        kw = dict(kw, seed=2, positions=np.array([0, 1]))
        want = full.sample(x, **kw)
        for got in group.run(heads, lambda h: h.sample(x, **kw)):
            assert same(tuple(got), tuple(want)), kw


def test_top_p_over_a_flat_distribution_gathers_more_candidates(tmp_path, monkeypatch):
    """Equal logits: top_p = 0.5 keeps half the vocabulary, beyond the first rounds' candidates.
    Past MAX_TOP_P_CANDIDATES the sharded head refuses (top_k bounds it) instead of guessing."""
    vocab = 5000
    path = tied_head(tmp_path, vocab, 2, list(range(vocab)))
    full = muser.Head.load(path)
    x = np.ones((2, 64), np.float32)
    group, heads = load_shards(path, 2)
    kw = dict(temperature=1.0, top_p=0.5, seed=1, positions=np.array([4, 5]))
    want = full.sample(x, **kw)
    for got in group.run(heads, lambda h: h.sample(x, **kw)):
        assert same(tuple(got), tuple(want))
    assert 0.49 < float(want.kept_mass[0]) < 0.51
    monkeypatch.setattr(shard, "MAX_TOP_P_CANDIDATES", 256)
    with pytest.raises(ValueError, match="top_p.*top_k"):
        group.run(heads, lambda h: h.sample(x, **kw))
    kw_k = dict(kw, top_k=200)
    want = full.sample(x, **kw_k)
    for got in group.run(heads, lambda h: h.sample(x, **kw_k)):
        assert same(tuple(got), tuple(want))


def test_logit_bias_and_allowed_across_shards(head_file, rng):
    vocab = 4099
    path = head_file(weight_type="Q8_0", hidden=256, vocab=vocab, random_quants=True)
    full = muser.Head.load(path)
    x = hidden_states(rng, 3, 256)
    group, heads = load_shards(path, 3)
    allowed = np.zeros(vocab, bool)
    allowed[[5, 1366, 1367, 4000]] = True  # rank 1 and 2 hold some, rank 0 one
    only_last = np.zeros(vocab, bool)
    only_last[3000:3100] = True  # the other shards keep nothing
    bias = {1365: 3.0, 1366: -2.0, 2732: 50.0}
    cases = [dict(allowed=allowed), dict(allowed=only_last, top_k=5), dict(logit_bias=bias),
             dict(logit_bias=bias, allowed=allowed, top_p=0.7),
             dict(logit_bias=rng.standard_normal(vocab).astype(np.float32), min_p=0.1)]
    for kw in cases:
        for temperature in (0.0, 0.9):
            kw2 = dict(kw, temperature=temperature, seed=3, positions=np.arange(3))
            want = full.sample(x, **kw2)
            for got in group.run(heads, lambda h: h.sample(x, **kw2)):
                assert same(tuple(got), tuple(want)), kw2


def test_non_finite_rows_raise_on_every_shard(head_file, rng):
    path = head_file(weight_type="Q8_0", hidden=256, vocab=3000, random_quants=True)
    full = muser.Head.load(path)
    x = hidden_states(rng, 2, 256)
    group, heads = load_shards(path, 3)
    logits = np.array(full(x))
    tok = 2500 + int(np.argmax(logits[1, 2500:]))  # positive logit in rank 2's rows
    bias = {tok: 3.4e38}  # finite bias; divided by 0.1: infinite
    with pytest.raises(muser.NonFiniteError) as want:
        full.sample(x, temperature=0.1, logit_bias=bias, seed=1, positions=np.arange(2))
    with pytest.raises(muser.NonFiniteError) as got:
        group.run(heads, lambda h: h.sample(x, temperature=0.1, logit_bias=bias, seed=1, positions=np.arange(2)))
    assert str(got.value) == str(want.value)
    xn = x.copy()
    xn[0, 3] = np.nan
    with pytest.raises(muser.NonFiniteError):
        group.run(heads, lambda h: h.argmax(xn))
    # and the heads still work afterwards (the group's barrier was reset)
    assert all(np.array_equal(a, full.argmax(x)) for a in group.run(heads, lambda h: h.argmax(x)))


class CountingCollective:
    """A Collective that counts the bytes one rank sends."""

    def __init__(self, inner):
        self.inner, self.rank, self.world, self.sent = inner, inner.rank, inner.world, 0

    def all_gather(self, array):
        self.sent += array.nbytes
        return self.inner.all_gather(array)


def test_only_small_summaries_cross_between_shards(head_file, rng):
    vocab, t = 200000, 4
    path = head_file(weight_type="Q8_0", hidden=64, vocab=vocab, random_quants=True)
    group = LocalGroup(2)
    colls = [CountingCollective(group.member(r)) for r in range(2)]
    heads = [muser.Head.load(path, shard=(r, 2), group=colls[r]) for r in range(2)]
    full = muser.Head.load(path)
    x = hidden_states(rng, t, 64)
    ids = rng.integers(0, vocab, (t, 3))
    local_logit_bytes = t * vocab // 2 * 4
    calls = [lambda h: h.argmax(x), lambda h: h.topk(x, 50, logprobs=True), lambda h: h.score(x, ids),
             lambda h: h.sample(x, temperature=1.0, top_k=100, top_p=0.9, seed=1, positions=np.arange(t))]
    want = [full.argmax(x), full.topk(x, 50, logprobs=True), full.score(x, ids),
            full.sample(x, temperature=1.0, top_k=100, top_p=0.9, seed=1, positions=np.arange(t))]
    for fn, w in zip(calls, want):
        for c in colls:
            c.sent = 0
        got = group.run(heads, fn)
        assert all(same(tuple(g) if isinstance(g, tuple) else g, tuple(w) if isinstance(w, tuple) else w)
                   for g in got)
        # per exchange at most the canonical lse's tile pairs and its < 2 * 2048 cut-tile logits
        # per row, plus candidates (k <= 100 per row) and counts: far below the logits
        lse_round = t * 4 * (2 * -(-vocab // shard.TILE) + 2 * shard.TILE)
        assert max(c.sent for c in colls) <= 5 * lse_round + 20 * t * 100 * 12, [c.sent for c in colls]
        assert max(c.sent for c in colls) < local_logit_bytes / 10, [c.sent for c in colls]


def test_bad_shard_arguments_are_refused(head_file):
    path = head_file(weight_type="Q8_0", hidden=64, vocab=100)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        muser.Head.load(path, shard=(2, 2))
    with pytest.raises(ValueError, match="rank must be in"):
        muser.Head.load(path, shard=(-1, 2))
    with pytest.raises(ValueError, match="world must be >= 1"):
        muser.Head.load(path, shard=(0, 0))
    with pytest.raises(ValueError, match="exceeds the vocabulary"):
        muser.Head.load(path, shard=(0, 101))
    with pytest.raises(TypeError, match="rank, world"):
        muser.Head.load(path, shard=3)
    with pytest.raises(TypeError, match="world must be an int"):
        muser.Head.load(path, shard=(0, 2.0))
    with pytest.raises(ValueError, match="world is 2 but the LocalGroup has 3"):
        muser.Head.load(path, shard=(0, 2), group=LocalGroup(3))
    with pytest.raises(ValueError, match="world is 2 but the group has 3"):
        muser.Head.load(path, shard=(0, 2), group=CountingCollective(LocalGroup(3).member(0)))
    with pytest.raises(ValueError, match="rank is 1 but this process is rank 0"):
        muser.Head.load(path, shard=(1, 2), group=CountingCollective(LocalGroup(2).member(0)))
    with pytest.raises(TypeError, match="group must be"):
        muser.Head.load(path, shard=(0, 2), group="nccl")
    with pytest.raises(ValueError, match="pass shard="):
        muser.Head.load(path, group=LocalGroup(1))
    with pytest.raises(ValueError, match="pinned"):
        muser.Head.load(path, route="pinned", shard=(0, 1))
    lone = muser.Head.load(path, shard=(1, 2))  # no group: its logits, not the reductions
    assert lone(np.ones(64, np.float32)).shape == (50,)
    with pytest.raises(ValueError, match="need the other shards"):
        lone.argmax(np.ones(64, np.float32))
    solo = muser.Head.load(path, shard=(0, 1))  # a world of one needs no group
    full = muser.Head.load(path)
    x = np.ones((2, 64), np.float32)
    assert same(solo.logsumexp(x), full.logsumexp(x)) and solo.shard_rows == (0, 100)
    group, heads = load_shards(path, 2)
    with pytest.raises(ValueError, match="outside"):
        group.run(heads, lambda h: h.score(x, np.array([[3], [100]])))
    with pytest.raises(ValueError, match="on_device"):
        heads[0].log_softmax(x, on_device=True)


# ---- across processes: torch.distributed with gloo ----
def _gloo_worker(rank: int, world: int, path: str, init: str, outdir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        h = muser.Head.load(path, route="canonical", shard=(rank, world), group=dist.group.WORLD)
        x = hidden_states(np.random.default_rng(8), 3, 256)
        ids = np.random.default_rng(9).integers(0, 4099, (3, 4))
        tk = h.topk(x, 9, logprobs=True)
        sc = h.score(x, ids)
        sm = h.sample(x, temperature=0.9, top_k=50, top_p=0.9, seed=4, positions=np.arange(3))
        np.savez(os.path.join(outdir, f"rank{rank}.npz"), logits=np.array(h(x)), argmax=h.argmax(x),
                 tk_v=tk.values, tk_i=tk.indices, tk_l=tk.logprobs, lse=h.logsumexp(x), sc_lp=sc.logprobs,
                 sc_v=sc.logits, sc_r=sc.ranks, sc_lse=sc.logsumexp, s_t=sm.tokens, s_lp=sm.logprobs,
                 s_plp=sm.processed_logprobs, s_m=sm.kept_mass)
    finally:
        dist.destroy_process_group()


def test_torch_distributed_gloo_across_processes(head_file, tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: the gloo test needs torch.distributed")
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this torch has no gloo backend")
    path = head_file(weight_type="Q5_K", hidden=256, vocab=4099, random_quants=True)
    world = 2
    mp.spawn(_gloo_worker, args=(world, path, f"file://{tmp_path}/rendezvous", str(tmp_path)), nprocs=world)
    full = muser.Head.load(path, route="canonical")
    x = hidden_states(np.random.default_rng(8), 3, 256)
    ids = np.random.default_rng(9).integers(0, 4099, (3, 4))
    tk, sc = full.topk(x, 9, logprobs=True), full.score(x, ids)
    sm = full.sample(x, temperature=0.9, top_k=50, top_p=0.9, seed=4, positions=np.arange(3))
    for rank in range(world):
        got = np.load(tmp_path / f"rank{rank}.npz")
        s, e = rank * 4099 // world, (rank + 1) * 4099 // world
        assert same(got["logits"], np.array(full(x))[:, s:e])
        assert same(got["argmax"], full.argmax(x))
        assert same(got["tk_v"], tk.values) and same(got["tk_i"], tk.indices) and same(got["tk_l"], tk.logprobs)
        assert same(got["lse"], full.logsumexp(x))
        assert all(same(got[k], v) for k, v in zip(("sc_lp", "sc_v", "sc_r", "sc_lse"), sc))
        assert all(same(got[k], v) for k, v in zip(("s_t", "s_lp", "s_plp", "s_m"), sm))
    del torch


# ---- on a GPU: world = 1 through the same code path, and shards sharing one GPU ----
_cuda_skip = cuda_skip_reason()


@pytest.mark.cuda
@pytest.mark.skipif(bool(_cuda_skip), reason=_cuda_skip or "-")
@pytest.mark.parametrize("route", ["graph", "canonical"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_cuda_shards_equal_the_unsharded_cuda_head(head_file, rng, route, world):
    path = head_file(weight_type="Q5_K", hidden=512, vocab=9001, random_quants=True)
    full = muser.Head.load(path, device="cuda", route=route)
    x = hidden_states(rng, 5, 512)
    logits = np.array(full(x))
    group, heads = load_shards(path, world, device="cuda", route=route)
    for h in heads:
        s, e = h.shard_rows
        assert same(h(x), logits[:, s:e])
        assert same(h(x, on_device=True).get(), logits[:, s:e])
    ids = rng.integers(0, 9001, (5, 3))
    calls = [(lambda h: h.argmax(x), full.argmax(x)),
             (lambda h: h.topk(x, 10, logprobs=True), full.topk(x, 10, logprobs=True)),
             (lambda h: h.topk(x, 10), full.topk(x, 10)),
             (lambda h: h.logsumexp(x), full.logsumexp(x)),
             (lambda h: h.score(x, ids), full.score(x, ids))]
    for kw in SAMPLINGS:
        kw = dict(kw, seed=6, positions=np.arange(5))
        calls.append(((lambda kw: lambda h: h.sample(x, **kw))(kw), full.sample(x, **kw)))
    for fn, want in calls:
        for got in group.run(heads, fn):
            assert same(tuple(got) if isinstance(got, tuple) else got,
                        tuple(want) if isinstance(want, tuple) else want)
