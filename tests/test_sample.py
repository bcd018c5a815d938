"""Seeded sampling (Head.sample, docs/numerics.md "Sampling"): the Philox4x32-10
generator against Random123's known answers and an independent numpy twin, the
processed distribution against a float64 numpy oracle (frequencies of 10^5 draws
by a chi-squared test, kept mass, processed log-probabilities), reproducibility
across calls and batch sizes, greedy = argmax, logprobs = score's bit for bit,
and every bad argument refused."""
from __future__ import annotations

import math

import numpy as np
import pytest

import muser
from muser import _core

from conftest import bits, hidden_states

M32 = np.uint64(0xFFFFFFFF)
# Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter, key, output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def philox_np(c, k):
    """Philox4x32-10 in numpy, written from the paper: c four uint64 arrays of 32-bit words, k two."""
    c0, c1, c2, c3 = (np.asarray(v, np.uint64) for v in c)
    k0, k1 = (np.asarray(v, np.uint64) for v in k)
    for r in range(10):
        if r:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
        p0, p1 = np.uint64(0xD2511F53) * c0, np.uint64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> np.uint64(32)) ^ c1 ^ k0), p1 & M32, ((p0 >> np.uint64(32)) ^ c3 ^ k1), p0 & M32
    return c0, c1, c2, c3


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_philox_known_answers(ctr, key, want):
    assert tuple(_core.philox4x32_10(list(ctr), list(key))) == want
    assert tuple(int(w) for w in philox_np(ctr, key)) == want  # the twin the layout test trusts


def test_the_draw_layout_and_the_uniform(rng):
    """u(seed, position, token) = Philox(counter = (pos lo, pos hi, token, 0), key = (seed lo, seed hi)).x0,
    top 23 bits b, u = (2b + 1) / 2^24; the clock E = -log u within 2 ulp of float64."""
    n = 100_000
    seed = (1 << 63) + 0x1234_5678_9ABC  # both key words nonzero
    pos = rng.integers(0, 1 << 62, size=n, dtype=np.uint64) * np.uint64(3)
    tok = rng.integers(0, 262_144, size=n).astype(np.int64)
    u, e = (np.asarray(a) for a in _core.sample_uniforms(seed, pos, tok))
    x0 = philox_np((pos & M32, pos >> np.uint64(32), tok.astype(np.uint64), np.zeros(n, np.uint64)),
                   (np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)))[0]
    want = (((x0 >> np.uint64(9)) * np.uint64(2) + np.uint64(1)).astype(np.float64) * 2.0 ** -24)
    np.testing.assert_array_equal(u.astype(np.float64), want)
    assert u.min() > 0 and u.max() < 1
    e_true = -np.log(u.astype(np.float64))
    np.testing.assert_allclose(e.astype(np.float64), e_true, rtol=2 * 2.0 ** -23, atol=0)
    assert (e > 0).all()


# ---- the float64 oracle of the processed distribution ----
def oracle(x, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, bias=None, allowed=None):
    """(q [V] the processed distribution, kept_mass, raw p [V]) in float64. Asserts that no
    top_p / min_p boundary is within 1e-6 of its threshold (float32 rounding could move it)."""
    x64 = x.astype(np.float64)
    V = x.shape[0]
    b = x64 + (0.0 if bias is None else bias.astype(np.float64))
    cand = np.isfinite(b) if allowed is None else (allowed & np.isfinite(b))
    z = b / temperature
    ids = np.flatnonzero(cand)
    kept = ids[np.lexsort((ids, -z[ids]))]  # descending z, ties to the lower id
    if top_k:
        kept = kept[:top_k]
    if top_p < 1.0:
        w = np.exp(z[kept] - z[kept].max())
        c = np.cumsum(w / w.sum())
        n = int(np.searchsorted(c, top_p)) + 1  # the first prefix with c >= top_p
        n = min(n, len(kept))
        assert c[n - 1] - top_p > 1e-6 or n == len(kept), "top_p boundary too close to call"
        assert n == 1 or top_p - c[n - 2] > 1e-6, "top_p boundary too close to call"
        kept = kept[:n]
    if min_p > 0.0:
        w = np.exp(z[kept] - z[kept].max())
        assert np.abs(w - min_p).min() > 1e-6, "min_p boundary too close to call"
        kept = kept[w >= min_p]
    q = np.zeros(V)
    w = np.exp(z[kept] - z[kept].max())
    q[kept] = w / w.sum()
    p = np.exp(x64 - x64.max())
    p /= p.sum()
    return q, p[kept].sum(), p


def chi2_pvalue(stat: float, df: int) -> float:
    """Upper tail of chi-squared by the Wilson-Hilferty cube-root normal approximation."""
    zz = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(zz / math.sqrt(2))


def synthetic_row(V=96, spread=1.6, seed=7):
    r = np.random.default_rng(seed)
    return (r.standard_normal(V) * spread).astype(np.float32)


V_SYN = 96
_r = np.random.default_rng(99)
BIAS = np.zeros(V_SYN, np.float32)
BIAS[[3, 40, 77]] = [2.5, -3.0, 4.0]
ALLOWED = _r.random(V_SYN) < 0.5
SETTINGS = {
    "plain": dict(),
    "temperature 0.7": dict(temperature=0.7),
    "temperature 1.9": dict(temperature=1.9),
    "top_k": dict(top_k=12),
    "top_p": dict(top_p=0.8),
    "min_p": dict(min_p=0.05),
    "logit_bias": dict(bias=BIAS),
    "allowed": dict(allowed=ALLOWED),
    "all of them": dict(temperature=1.3, top_k=40, top_p=0.9, min_p=0.02, bias=BIAS, allowed=ALLOWED),
}


def draw_many(x, positions, seed, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, bias=None, allowed=None):
    return _core.sample_positions(x, positions, seed, temperature, top_k, top_p, min_p, bias, allowed, 2)


@pytest.mark.parametrize("name", list(SETTINGS))
def test_frequencies_of_1e5_draws_match_the_processed_distribution(name):
    kw = SETTINGS[name]
    x = synthetic_row(V_SYN)
    q, kept_mass, p = oracle(x, **kw)
    n = 100_000
    positions = np.arange(n, dtype=np.uint64) + np.uint64(1 << 33)
    tokens, lp, plp, mass = draw_many(x, positions, 2024, **kw)
    tokens = np.asarray(tokens)
    counts = np.bincount(tokens, minlength=V_SYN)
    assert counts[q == 0].sum() == 0, "a token outside the kept set was drawn"
    expect = n * q
    big = expect >= 5
    obs = np.append(counts[big], counts[(~big) & (q > 0)].sum())
    exp = np.append(expect[big], expect[(~big) & (q > 0)].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    stat = float(((obs - exp) ** 2 / exp).sum())
    pval = chi2_pvalue(stat, len(exp) - 1)
    assert pval > 1e-4, f"{name}: chi2 {stat:.1f} on {len(exp) - 1} df, p = {pval:.2e}"
    # the first draw's probabilities against the oracle
    t0 = int(tokens[0])
    np.testing.assert_allclose(mass, kept_mass, rtol=2e-6)
    np.testing.assert_allclose(plp, np.log(q[t0]), atol=3e-6)
    np.testing.assert_allclose(lp, np.log(p[t0]), atol=3e-6)


def test_the_many_positions_entry_draws_what_the_batch_entry_draws():
    """sample_positions (the frequency tests' path) equals sample_rows (Head.sample's) row by row."""
    x = synthetic_row(V_SYN)
    positions = np.arange(0, 3000, 7, dtype=np.uint64)
    kw = SETTINGS["all of them"]
    many = np.asarray(draw_many(x, positions, 5, **kw)[0])
    rows = np.ascontiguousarray(np.broadcast_to(x, (len(positions), V_SYN)))
    batch = np.asarray(_core.sample_rows(rows, positions, 5, 1.3, 40, np.float32(0.9), np.float32(0.02),
                                         BIAS, ALLOWED, 2)[0])
    np.testing.assert_array_equal(many, batch)


def test_threads_and_batch_never_change_a_draw_on_a_large_vocabulary(rng):
    """One row splits its tiles and its race over the threads; a batch runs rows apart: the same bits."""
    V = 70_001  # several race chunks and logsumexp tiles
    x = (rng.standard_normal((3, V)) * 3).astype(np.float32)
    pos = np.array([5, 2**40 + 3, 77], np.uint64)
    for kw in (dict(), dict(temperature=0.6, top_p=0.9), dict(top_k=1000, min_p=0.01)):
        a = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
        a.update(kw)
        args = (a["temperature"], a["top_k"], np.float32(a["top_p"]), np.float32(a["min_p"]), None, None)
        batch = _core.sample_rows(x, pos, 9, *args, 2)
        for r in range(3):
            for threads in (1, 2):
                one = _core.sample_rows(x[r:r + 1].copy(), pos[r:r + 1], 9, *args, threads)
                for f_one, f_batch in zip(one, batch):
                    assert np.asarray(f_one)[0].tobytes() == np.asarray(f_batch)[r].tobytes(), (kw, r, threads)


def test_untouched_distribution_is_the_raw_one(small_head_path, rng):
    """temperature 1 and no filter: the processed log-probabilities are the raw ones, bit for bit, mass 1."""
    head = muser.Head.load(small_head_path, route="canonical")
    x = hidden_states(rng, 4, 256)
    for kw in (dict(), dict(top_k=3001), dict(allowed=np.ones(3001, bool)), dict(logit_bias={5: 0.0})):
        s = head.sample(x, seed=3, positions=np.arange(4), **kw)
        np.testing.assert_array_equal(bits(s.processed_logprobs), bits(s.logprobs))
        np.testing.assert_array_equal(s.kept_mass, 1.0)


def test_ties_go_to_the_lower_id_in_top_k_top_p_and_greedy():
    x = np.array([0.0, 1.0, 1.0, 1.0, -2.0], np.float32)
    pos = np.arange(2000, dtype=np.uint64)
    assert set(np.asarray(draw_many(x, pos, 1, top_k=2)[0]).tolist()) == {1, 2}
    # tokens 1, 2, 3 hold 0.293 each: 0.5 is reached by the second of them
    assert set(np.asarray(draw_many(x, pos, 1, top_p=0.5)[0]).tolist()) == {1, 2}
    assert np.asarray(draw_many(x, pos[:3], 1, temperature=0.0)[0]).tolist() == [1, 1, 1]


def test_minus_inf_logits_are_never_drawn_and_nan_is_refused():
    x = synthetic_row(16)
    x[[2, 5]] = -np.inf
    tokens = np.asarray(draw_many(x, np.arange(5000, dtype=np.uint64), 3)[0])
    assert not np.isin(tokens, [2, 5]).any()
    x[7] = np.nan
    with pytest.raises(muser.NonFiniteError, match="token 7"):
        draw_many(x, np.arange(3, dtype=np.uint64), 3)
    big = np.full(8, 30.0, np.float32)
    with pytest.raises(muser.NonFiniteError, match="temperature"):  # 30 / 1e-38 overflows float32
        draw_many(big, np.arange(3, dtype=np.uint64), 3, temperature=1e-38)


# ---- through Head.sample ----
@pytest.fixture(scope="module")
def small_head_path(tmp_path_factory):
    from muser.fixtures import write_head_gguf

    path = tmp_path_factory.mktemp("sample") / "head.gguf"
    return write_head_gguf(str(path), weight_type="Q8_0", hidden=256, vocab=3001, softcap=30.0)


@pytest.mark.parametrize("route", ["reference", "fused", "graph", "canonical"])
def test_same_seed_and_positions_same_tokens_across_calls_and_batch_sizes(small_head_path, rng, route):
    head = muser.Head.load(small_head_path, route=route)
    x = hidden_states(rng, 7, 256) * 4
    kw = dict(temperature=0.8, top_p=0.95, min_p=0.001)
    for positions in (np.arange(7), np.arange(7) * 1000 + 17, np.array([2**40, 0, 5, 5, 2**63 - 1, 9, 12])):
        batch = head.sample(x, seed=42, positions=positions, **kw)
        again = head.sample(x, seed=42, positions=positions, **kw)
        for a, b in zip(batch, again):
            np.testing.assert_array_equal(a, b)
        for r in range(7):
            alone = head.sample(x[r], seed=42, positions=int(positions[r]), **kw)
            assert isinstance(alone.tokens, int)
            assert alone.tokens == batch.tokens[r]
            assert bits(alone.logprobs) == bits(batch.logprobs[r])
            assert bits(alone.processed_logprobs) == bits(batch.processed_logprobs[r])
            assert bits(alone.kept_mass) == bits(batch.kept_mass[r])


def test_different_positions_and_seeds_draw_differently(small_head_path, rng):
    head = muser.Head.load(small_head_path, route="canonical")
    x = hidden_states(rng, 1, 256)[0]
    rows = np.ascontiguousarray(np.broadcast_to(x, (64, 256)))
    by_pos = head.sample(rows, seed=1, positions=np.arange(64)).tokens
    assert len(set(by_pos.tolist())) > 48  # 64 draws from ~3,000 near-equal tokens
    by_seed = [head.sample(x, seed=s, positions=0).tokens for s in range(64)]
    assert len(set(by_seed)) > 48
    np.testing.assert_array_equal(by_pos, head.sample(rows, seed=1, positions=np.arange(64)).tokens)


def test_greedy_is_argmax_and_needs_no_seed(small_head_path, rng):
    head = muser.Head.load(small_head_path, route="canonical")
    x = hidden_states(rng, 5, 256)
    s = head.sample(x, temperature=0)
    np.testing.assert_array_equal(s.tokens, head.argmax(x))
    np.testing.assert_array_equal(s.processed_logprobs, 0.0)
    np.testing.assert_allclose(s.kept_mass, np.exp(s.logprobs.astype(np.float64)), rtol=2e-6)
    # with a bias and a mask: the argmax of the biased, allowed logits
    logits = np.array(head(x))
    V = logits.shape[1]
    allowed = np.zeros(V, bool)
    allowed[::3] = True
    bias = {10: 0.5, 3000: -1.0}
    dense = np.zeros(V, np.float32)
    dense[10], dense[3000] = 0.5, -1.0
    want = np.where(allowed, logits + dense, -np.inf).argmax(axis=1)
    got = head.sample(x, temperature=0.0, logit_bias=bias, allowed=allowed, seed=9, positions=np.arange(5))
    np.testing.assert_array_equal(got.tokens, want)


@pytest.mark.parametrize("route", ["fused", "canonical"])
def test_logprobs_equal_score_bitwise(small_head_path, rng, route):
    head = muser.Head.load(small_head_path, route=route)
    x = hidden_states(rng, 6, 256)
    s = head.sample(x, seed=7, positions=np.arange(6) + 100, temperature=0.9, top_k=50)
    sc = head.score(x, s.tokens)
    np.testing.assert_array_equal(bits(s.logprobs), bits(sc.logprobs))
    one = head.sample(x[2], seed=7, positions=102, temperature=0.9, top_k=50)
    assert bits(one.logprobs) == bits(head.score(x[2], one.tokens).logprobs)
    # and the processed side against the oracle on the head's own logits
    logits = np.array(head(x))
    for r in range(6):
        q, kept, _ = oracle(logits[r], temperature=np.float32(0.9), top_k=50)
        np.testing.assert_allclose(s.kept_mass[r], kept, rtol=2e-6)
        np.testing.assert_allclose(s.processed_logprobs[r], np.log(q[s.tokens[r]]), atol=3e-6)


def test_one_row_and_batch_shapes(small_head_path, rng):
    head = muser.Head.load(small_head_path, route="canonical")
    x = hidden_states(rng, 3, 256)
    one = head.sample(x[0], seed=1, positions=np.int64(4))
    assert isinstance(one, muser.Sample)
    assert type(one.tokens) is int and all(type(v) is float for v in one[1:])
    batch = head.sample(x, seed=1, positions=[4, 5, 2**64 - 1])
    assert batch.tokens.dtype == np.int64 and batch.tokens.shape == (3,)
    assert all(a.dtype == np.float32 and a.shape == (3,) for a in batch[1:])
    assert batch.tokens[0] == one.tokens


BAD = [
    (dict(temperature=-0.1), ValueError, "temperature must be"),
    (dict(temperature=float("nan")), ValueError, "temperature must be"),
    (dict(temperature="1"), TypeError, "temperature must be a real"),
    (dict(temperature=1e-60), ValueError, "rounds to 0"),
    (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), ValueError, r"top_p must be in \(0, 1\]"),
    (dict(min_p=-0.1), ValueError, r"min_p must be in \[0, 1\]"),
    (dict(min_p=1.01), ValueError, r"min_p must be in \[0, 1\]"),
    (dict(top_k=-1), ValueError, r"top_k must be in \[0, 3001\]"),
    (dict(top_k=3002), ValueError, r"top_k must be in \[0, 3001\]"),
    (dict(top_k=2.0), TypeError, "top_k must be an int"),
    (dict(seed=None), ValueError, "missing: seed"),
    (dict(positions=None), ValueError, "missing: positions"),
    (dict(seed=None, positions=None), ValueError, "missing: seed, positions"),
    (dict(seed=-1), ValueError, r"seed must be in \[0, 2\^64\)"),
    (dict(seed=2**64), ValueError, r"seed must be in \[0, 2\^64\)"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
    (dict(allowed=np.ones(3000, bool)), ValueError, r"allowed must have shape \(3001,\)"),
    (dict(allowed=np.ones(3001, np.int8)), TypeError, "allowed must be a bool array"),
    (dict(allowed=np.zeros(3001, bool)), ValueError, "all False"),
    (dict(logit_bias={3001: 1.0}), ValueError, r"logit_bias token ids must lie in \[0, 3001\)"),
    (dict(logit_bias={-1: 1.0}), ValueError, "logit_bias token ids"),
    (dict(logit_bias={5: float("inf")}), ValueError, "finite"),
    (dict(logit_bias={5: 1e39}), ValueError, "finite"),  # overflows float32
    (dict(logit_bias={"a": 1.0}), TypeError, "logit_bias key"),
    (dict(logit_bias=np.zeros(3000)), ValueError, r"logit_bias must have shape \(3001,\)"),
    (dict(logit_bias=np.zeros(3001, np.int32)), TypeError, "logit_bias must be"),
]


@pytest.mark.parametrize("kw,exc,match", BAD)
def test_bad_arguments_raise(small_head_path, rng, kw, exc, match):
    head = muser.Head.load(small_head_path, route="canonical")
    x = hidden_states(rng, 2, 256)
    args = dict(seed=1, positions=np.arange(2))
    args.update(kw)
    with pytest.raises(exc, match=match):
        head.sample(x, **args)


@pytest.mark.parametrize("positions,exc,match", [
    (np.arange(3), ValueError, r"shape \(2,\)"),
    (5, ValueError, "got a single int"),
    (np.array([1.0, 2.0]), TypeError, "positions must be integers"),
    (np.array([1, -2]), ValueError, r"positions must be in \[0, 2\^64\)"),
    (np.arange(4).reshape(2, 2), ValueError, r"shape \(2,\)"),
])
def test_bad_positions_raise(small_head_path, rng, positions, exc, match):
    head = muser.Head.load(small_head_path, route="canonical")
    x = hidden_states(rng, 2, 256)
    with pytest.raises(exc, match=match):
        head.sample(x, seed=1, positions=positions)
    with pytest.raises((TypeError, ValueError)):
        head.sample(x[0], seed=1, positions=np.arange(2))  # one row: an int
    with pytest.raises(muser.NonFiniteError):
        bad = x.copy()
        bad[1, 3] = np.nan
        head.sample(bad, seed=1, positions=np.arange(2))


def test_top_p_refuses_vocabularies_its_fixed_point_mass_cannot_hold():
    from muser import _sampling
    kw = dict(seed=1, positions=0, temperature=1.0, top_k=0, min_p=0.0, logit_bias=None, allowed=None)
    _sampling.check_params(1 << 24, top_p=0.9, **kw)  # the largest it holds
    with pytest.raises(ValueError, match="top_p's fixed-point mass"):
        _sampling.check_params((1 << 24) + 1, top_p=0.9, **kw)
    _sampling.check_params((1 << 24) + 1, top_p=1.0, **kw)  # off: no mass to hold
