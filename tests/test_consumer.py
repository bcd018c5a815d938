"""What users compute from the logits: logsumexp, log-softmax and the scores
of chosen tokens, in the canonical vocabulary reduction (docs/numerics.md):
against a float64 oracle on every weight type, bit-exact identities between
them, ranks against a full sort, invariance to batch size and thread count,
and bad arguments refused."""
from __future__ import annotations

import numpy as np
import pytest

import muser
from muser import _core

from conftest import bits, hidden_states

TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]


def lse_f64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=1, keepdims=True)))[:, 0]


@pytest.mark.parametrize("weight_type", TYPES)
def test_logsumexp_and_log_softmax_against_float64(head_file, rng, weight_type):
    head = muser.Head.load(head_file(weight_type=weight_type, hidden=512, vocab=4099, random_quants=True),
                           route="canonical")
    x = hidden_states(rng, 3, 512)
    logits = np.array(head(x))
    want = lse_f64(logits)
    got = head.logsumexp(x)
    assert got.dtype == np.float32 and got.shape == (3,)
    np.testing.assert_allclose(got, want, rtol=4 * 2.0 ** -23, atol=0)
    ls = head.log_softmax(x)
    np.testing.assert_array_equal(bits(ls), bits(logits - got[:, None]))  # one subtraction per logit
    p = np.exp(ls.astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(p, 1.0, rtol=2e-6)


@pytest.mark.parametrize("n", [1, 31, 2047, 2048, 2049, 6000, 262144])
def test_the_reduction_on_awkward_lengths_and_values(rng, n):
    v = (rng.standard_normal((2, n)) * rng.choice([1.0, 30.0, 300.0])).astype(np.float32)
    got = np.asarray(_core.logsumexp_rows(v, 2), np.float32)
    np.testing.assert_allclose(got, lse_f64(v), rtol=4 * 2.0 ** -23)
    # threads never change a bit
    np.testing.assert_array_equal(bits(got), bits(np.asarray(_core.logsumexp_rows(v, 1))))
    # rows are independent: row 1 alone equals row 1 of the pair
    np.testing.assert_array_equal(bits(got[1:]), bits(np.asarray(_core.logsumexp_rows(v[1:].copy(), 2))))


def test_minus_inf_adds_nothing_and_nan_propagates():
    v = np.full((3, 5000), -np.inf, np.float32)
    v[1, 4321] = 2.5
    v[2, :] = 0.0
    v[2, 17] = np.nan
    got = np.asarray(_core.logsumexp_rows(v, 2))
    assert got[0] == -np.inf
    assert got[1] == np.float32(2.5)  # one finite logit: log(1) = 0 exactly
    assert np.isnan(got[2])


def test_score_equals_log_softmax_gathered_and_ranks_a_full_sort(head_file, rng):
    head = muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=3001), route="canonical")
    x = hidden_states(rng, 4, 256)
    logits = np.array(head(x))
    logits[2, 10] = logits[2, 11]  # a tie: the lower id ranks first
    ids = np.array([[10, 11, 0], [5, 6, 7], [10, 11, 3000], [1, 2, 3]])
    lse = np.asarray(_core.logsumexp_rows(logits, 0), np.float32)
    lp, vals, ranks, lse2 = (np.asarray(a) for a in _core.score_rows(logits, ids, 0))
    np.testing.assert_array_equal(bits(lse2), bits(lse))
    np.testing.assert_array_equal(bits(lp.reshape(ids.shape)),
                                  bits(np.take_along_axis(logits, ids, 1) - lse[:, None]))
    order = np.argsort(-logits, axis=1, kind="stable")  # ties by id
    rank_of = np.empty_like(order)
    np.put_along_axis(rank_of, order, np.arange(1, logits.shape[1] + 1)[None, :].repeat(4, 0), 1)
    np.testing.assert_array_equal(ranks.reshape(ids.shape), np.take_along_axis(rank_of, ids, 1))
    # through the head, from hidden states: the same, and batch rows equal single steps
    s = head.score(x[:2], ids[:2])
    np.testing.assert_array_equal(bits(s.logprobs), bits(head.log_softmax(x[:2])[np.arange(2)[:, None], ids[:2]]))
    one = head.score(x[1], ids[1])
    np.testing.assert_array_equal(bits(one.logprobs), bits(s.logprobs[1]))
    np.testing.assert_array_equal(one.ranks, s.ranks[1])


def test_score_shapes(head_file, rng):
    head = muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=3001))
    x = hidden_states(rng, 3, 256)
    s = head.score(x[0], 5)
    assert isinstance(s.logprobs, float) and isinstance(s.ranks, int) and isinstance(s.logsumexp, float)
    assert head.score(x[0], [5, 6]).logprobs.shape == (2,)
    s = head.score(x, [1, 2, 3])  # one target per row
    assert s.logprobs.shape == (3,) and s.logsumexp.shape == (3,) and s.ranks.dtype == np.int64
    assert head.score(x, np.zeros((3, 4), np.int64)).logits.shape == (3, 4)


@pytest.mark.parametrize("ids,err,says", [
    (-1, ValueError, "-1 is outside"), (3001, ValueError, "3001 is outside"), (1.5, TypeError, "float64"),
    ([[1, 2]], ValueError, "shape"), (True, TypeError, "bool"),
    # unsigned ids of 2^63 and more would wrap to negative int64 ids (a valid numpy index)
    (2**63, ValueError, "got 9223372036854775808"),
    (np.array([3, 2**64 - 1], np.uint64), ValueError, r"got 18446744073709551615 at index \(1,\)"),
])
def test_score_refuses_bad_ids(head_file, rng, ids, err, says):
    head = muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=3001))
    with pytest.raises(err, match=says):
        head.score(hidden_states(rng, 1, 256)[0], ids)


def test_log_softmax_is_a_view_or_writes_out(head_file, rng):
    head = muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=3001))
    x = hidden_states(rng, 2, 256)
    view = head.log_softmax(x)
    assert not view.flags.owndata
    out = np.empty((2, 3001), np.float32)
    assert head.log_softmax(x, out=out) is out
    np.testing.assert_array_equal(out, view)
    single = np.empty(3001, np.float32)
    head.log_softmax(x[1], out=single)
    np.testing.assert_array_equal(single, view[1])


def test_topk_is_torch_ordered_with_optional_logprobs(head_file, rng):
    head = muser.Head.load(head_file(hidden=256, vocab=700, weight_type="Q5_K", seed=5))
    x = hidden_states(rng, 3, 256)
    plain = head.topk(x, 7)
    assert isinstance(plain, muser.TopK) and plain.logprobs is None
    assert plain.values.dtype == np.float32 and plain.indices.dtype == np.int64
    both = head.topk(x, 7, logprobs=True)
    assert np.array_equal(both.values, plain.values) and np.array_equal(both.indices, plain.indices)
    # the logprobs are log_softmax gathered, bit for bit
    lsm = head.log_softmax(x).copy()
    assert np.array_equal(bits(both.logprobs), bits(np.take_along_axis(lsm, both.indices, axis=1)))
    one = head.topk(x[1], 7, logprobs=True)
    assert one.values.shape == (7,) and np.array_equal(one.logprobs, both.logprobs[1])
    with pytest.raises(TypeError, match="logprobs must be a bool"):
        head.topk(x, 3, logprobs=1)


ROUTE_ACTS = [("graph", "f32"), ("fused", "f32"), ("canonical", "f32"), ("reference", "f32"),
              ("fused", "q8"), ("canonical", "q8"), ("graph", "q8")]


# acts="q8" exists for quantized weights only (ggml multiplies F16 weights in float)
@pytest.mark.parametrize("route,acts,weight_type", [(r, a, w) for r, a in ROUTE_ACTS for w in ("Q5_K", "Q6_K", "Q8_0", "F16")
                                                    if not (a == "q8" and w == "F16")])
def test_tiled_score_equals_the_reduction_of_the_whole_logits(head_file, rng, route, acts, weight_type):
    # score and logsumexp run the route tile by tile (no [t, V] logits): the chosen ids'
    # logits come from their rows alone, each tile's logits are reduced while in cache.
    # Everything must equal reducing the full call's logits, bit for bit, on every route.
    V = 2 * 2048 + 37  # three tiles, the last one short
    head = muser.Head.load(head_file(weight_type=weight_type, hidden=256, vocab=V, softcap=15.0, seed=11),
                           route=route, acts=acts, threads=2)
    x = hidden_states(rng, 5, 256)
    logits = np.array(head(x))
    ids = rng.integers(0, V, size=(5, 6))
    ids[:, 0] = np.argmax(logits, axis=1)     # rank 1
    ids[:, 1] = ids[:, 0]                     # a repeated id
    ids[:, 2] = np.argmin(logits, axis=1)     # rank V, unless ties
    lp, vals, ranks, lse = (np.asarray(a) for a in _core.score_rows(logits, ids, 0))
    s = head.score(x, ids)
    np.testing.assert_array_equal(bits(s.logits), bits(vals.reshape(ids.shape)))
    np.testing.assert_array_equal(bits(s.logprobs), bits(lp.reshape(ids.shape)))
    np.testing.assert_array_equal(s.ranks, ranks.reshape(ids.shape))
    np.testing.assert_array_equal(bits(s.logsumexp), bits(lse))
    np.testing.assert_array_equal(bits(head.logsumexp(x)), bits(lse))
    assert (s.ranks[:, 0] == 1).all()
    # batch rows equal single steps (the tiles do not depend on t)
    for r in (0, 4):
        one = head.score(x[r], ids[r])
        np.testing.assert_array_equal(bits(one.logprobs), bits(s.logprobs[r]))
        np.testing.assert_array_equal(one.ranks, s.ranks[r])
        assert head.logsumexp(x[r]) == s.logsumexp[r]


def test_tiled_score_ranks_ties_across_tiles(head_file, rng):
    # identical weight rows in different tiles give equal logits: the lower id ranks first
    V, H = 3 * 2048, 256
    w = (rng.standard_normal((V, H)) * 0.02).astype(np.float32)
    w[4100] = w[7] = w[2049]
    head = muser.Head.load(head_file(hidden=H, vocab=V, weight=w, weight_type="F32", seed=4), route="canonical")
    x = hidden_states(rng, 2, H)
    s = head.score(x, np.array([[7, 2049, 4100]] * 2))
    logits = np.array(head(x))
    order = np.argsort(-logits, axis=1, kind="stable")
    for r in range(2):
        rank_of = np.empty(V, np.int64)
        rank_of[order[r]] = np.arange(1, V + 1)
        assert list(s.ranks[r]) == [rank_of[7], rank_of[2049], rank_of[4100]]
        assert s.ranks[r, 1] == s.ranks[r, 0] + 1 and s.ranks[r, 2] == s.ranks[r, 0] + 2


def test_on_device_results_need_a_device_with_memory_of_its_own(head_file, rng):
    head = muser.Head.load(head_file(weight_type="Q8_0", hidden=256, vocab=3001))
    x = rng.standard_normal(256, dtype=np.float32)
    for call in (lambda: head.score(x, 3, on_device=True), lambda: head.logsumexp(x, on_device=True),
                 lambda: head.sample(x, temperature=0.0, on_device=True)):
        with pytest.raises(ValueError, match="memory of its own"):
            call()
