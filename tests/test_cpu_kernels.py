"""The CPU kernels one at a time: every ISA twin equals the scalar twin bit
for bit (canonical f32 matvec, q8 matvec, canonical soft cap) on awkward
sizes; acts="q8" quantizes exactly as ggml's CPU does and its error against
a float64 oracle stays inside the quantization bound; the profile books each
node under its own label."""
from __future__ import annotations

import numpy as np
import pytest

import muser
from muser import _core
from muser.fixtures import random_blocks

ISAS = [i for i in muser.build_info()["cpu_isas"] if i != "scalar"]
TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]
Q8_TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0"]
BLOCK = {"Q5_K": 256, "Q6_K": 256, "Q4_K": 256, "Q8_0": 32, "F16": 1, "BF16": 1, "F32": 1}
ROWS = [1, 3, 31, 33, 257]
TOKENS = [1, 3, 8, 17]


def _cols(weight_type: str) -> list[int]:
    """Row lengths: whole blocks for quantized types; 77 and 33 (not multiples of 32) for float rows."""
    return {256: [256, 768], 32: [96, 640], 1: [77, 33, 512, 1000]}[BLOCK[weight_type]]


def _weight(weight_type: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if BLOCK[weight_type] > 1:
        return random_blocks(weight_type, rows, cols, rng)
    f = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    if weight_type == "F16":
        return f.astype(np.float16).view(np.uint8).reshape(rows, -1)
    if weight_type == "BF16":
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
    return f.view(np.uint8).reshape(rows, -1)


def _bits_equal(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def test_this_machine_has_a_simd_twin():
    # on x86-64 the build always compiles avx2/avx512 and any machine since 2013 runs avx2
    assert ISAS, f"no SIMD twin available: {muser.build_info()}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("weight_type", TYPES)
def test_canonical_twin_bit_equal_to_scalar(rng, weight_type, isa):
    for rows in ROWS:
        for cols in _cols(weight_type):
            w = _weight(weight_type, rows, cols, rng)
            x = rng.standard_normal((max(TOKENS), cols)).astype(np.float32)
            for t in TOKENS:
                ref = muser.ops.matvec(w, weight_type, x[:t], isa="scalar", threads=1)
                got = muser.ops.matvec(w, weight_type, x[:t], isa=isa, threads=2)
                assert _bits_equal(ref, got), f"{weight_type} {isa} rows={rows} cols={cols} t={t}"


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_q8_twin_bit_equal_to_scalar(rng, weight_type, isa):
    for rows in ROWS:
        for cols in _cols(weight_type):
            w = _weight(weight_type, rows, cols, rng)
            x = (rng.standard_normal((max(TOKENS), cols)) * rng.uniform(0.1, 10)).astype(np.float32)
            for t in TOKENS:
                ref = _core.ops_matvec_q8(w, weight_type, x[:t], "scalar", 1)
                got = _core.ops_matvec_q8(w, weight_type, x[:t], isa, 2)
                assert _bits_equal(ref, got), f"{weight_type} {isa} rows={rows} cols={cols} t={t}"


@pytest.mark.parametrize("isa", ISAS)
def test_canonical_softcap_twin_bit_equal_to_scalar(isa):
    # one float in every 389 bit patterns: both tanh branches, the clamp, zeros, inf, NaN payloads
    x = np.arange(0, 2**32, 389, dtype=np.uint64).astype(np.uint32).view(np.float32).reshape(1, -1)
    for scale, cap in [(0.196116, 20.0), (1.0, 30.0), (0.5, 0.0)]:
        ref = _core.ops_softcap_canon(x, scale, cap, "scalar")
        got = _core.ops_softcap_canon(x, scale, cap, isa)
        assert _bits_equal(ref, got), f"{isa} scale={scale} cap={cap}"


# ---- acts="q8": ggml's activation quantization, in numpy ----

def _nearest_even(v: np.ndarray) -> np.ndarray:
    return np.rint(v)  # numpy rounds half to even, like ggml's magic-number add and cvtps2dq


def _quantize_q8k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's quantize_row_q8_K for rows of x: (int8 quants [t, K], f32 scales [t, K/256])."""
    b = x.reshape(x.shape[0], -1, 256)
    first_max = np.take_along_axis(b, np.abs(b).argmax(axis=2)[..., None], axis=2)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(first_max != 0, np.float32(-127) / first_max, 0).astype(np.float32)
    q = np.minimum(127, _nearest_even((iscale[..., None] * b).astype(np.float32))).astype(np.int8)
    with np.errstate(divide="ignore"):
        d = np.where(iscale != 0, np.float32(1) / iscale, 0).astype(np.float32)
    return q.reshape(x.shape), d


def _quantize_q80(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's x86 quantize_row_q8_0: d = f16(amax/127), q = rint(x * 127/amax)."""
    b = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(axis=2)
    d = (amax / np.float32(127)).astype(np.float32).astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        iscale = np.where(amax != 0, np.float32(127) / amax, 0).astype(np.float32)
    q = _nearest_even((b * iscale[..., None]).astype(np.float32)).astype(np.int8)
    return q.reshape(x.shape), d


@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_q8_quantization_bytes_equal_numpy_model(rng, weight_type):
    x = (rng.standard_normal((4, 512)) * rng.uniform(0.01, 10, (4, 1))).astype(np.float32)
    x[0] = np.float32(0.5) * rng.integers(-300, 300, 512)  # ties after scaling
    x[0, 3] = 127
    x[1, :256] = 0  # an all-zero Q8_K block (and sixteen Q8_0 blocks)
    got = _core.ops_quantize_acts(x, weight_type)
    if weight_type == "Q8_0":
        q, d = _quantize_q80(x)
        blocks = got.reshape(4, -1, 34)
        assert np.array_equal(blocks[..., 2:].view(np.int8).reshape(4, -1), q)
        assert np.array_equal(blocks[..., :2].copy().view(np.float16)[..., 0].astype(np.float32), d)
    else:
        q, d = _quantize_q8k(x)
        blocks = got.reshape(4, -1, 292)
        assert np.array_equal(blocks[..., 4:260].view(np.int8).reshape(4, -1), q)
        assert np.array_equal(blocks[..., :4].copy().view(np.float32)[..., 0], d)
        bsums = blocks[..., 260:].copy().view(np.int16)
        assert np.array_equal(bsums, q.reshape(4, -1, 16, 16).astype(np.int32).sum(-1).reshape(bsums.shape))


def test_q8_quantization_bytes_equal_ggml_from_float(rng):
    """The installed ggml's CPU quantizer is the authority (skipped without llama-cpp-python)."""
    from muser import _ggml

    if not _ggml.available():
        pytest.skip(f"ggml not available: {_ggml.unavailable_reason()}")
    g = _ggml.lib()
    x = (rng.standard_normal((6, 512)) * rng.uniform(0.01, 10, (6, 1))).astype(np.float32)
    x[0] = np.float32(0.5) * rng.integers(-300, 300, 512)
    x[0, 3] = 127
    x[1, :256] = 0
    for weight_type, vec_dot in [("Q5_K", "Q8_K"), ("Q6_K", "Q8_K"), ("Q4_K", "Q8_K"), ("Q8_0", "Q8_0")]:
        assert np.array_equal(_core.ops_quantize_acts(x, weight_type), g.cpu_from_float(x, vec_dot)), weight_type


def _weights_f64(w: np.ndarray, weight_type: str, cols: int) -> np.ndarray:
    return muser.dequantize(w, weight_type, (w.shape[0], cols)).astype(np.float64)


@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_q8_error_against_float64(rng, weight_type):
    """Two claims. (1) The float side of the q8 dot product is accurate: against
    the float64 dot of the same int8 activations the error is f32 rounding
    (measured <= 1e-7 of sum |w x|; asserted < 1e-6). (2) Against the exact f32
    activations the error is the quantization's, inside its bound sum_j |w_j| *
    |d_j| / 2 (measured at most 0.12 of it: rounding errors partly cancel;
    asserted < 0.3)."""
    rows, cols, t = 257, 1024, 5
    w = _weight(weight_type, rows, cols, rng)
    x = rng.standard_normal((t, cols)).astype(np.float32)
    x[:, rng.integers(0, cols, 16)] *= 20  # a trained model's few large features
    got = _core.ops_matvec_q8(w, weight_type, x, None, 2).astype(np.float64)
    wf = _weights_f64(w, weight_type, cols)
    q, d = (_quantize_q80 if weight_type == "Q8_0" else _quantize_q8k)(x)
    block = 32 if weight_type == "Q8_0" else 256
    xq = q.astype(np.float64) * np.repeat(d.astype(np.float64), block, axis=1)
    scale = np.abs(xq) @ np.abs(wf).T
    rel_float = np.abs(got - xq @ wf.T) / scale
    assert rel_float.max() < 1e-6, rel_float.max()
    bound = (np.repeat(np.abs(d.astype(np.float64)), block, axis=1) / 2) @ np.abs(wf).T  # Q8_K's d is signed
    ratio = np.abs(got - x.astype(np.float64) @ wf.T) / bound
    assert ratio.max() < 0.3, ratio.max()


def test_q8_head_close_to_f32_head(head_file, rng):
    """acts="q8" against the canonical f32 route on a whole head: the logits move
    by the activation quantization only (|delta| well under 1e-2 here) and the
    winner stays where it is clear."""
    path = head_file(weight_type="Q5_K", hidden=1024, vocab=1003)
    x = rng.standard_normal((4, 1024)).astype(np.float32)
    f32 = muser.Head.load(path, route="canonical")(x).copy()
    q8 = muser.Head.load(path, route="canonical", acts="q8")(x).copy()
    delta = np.abs(q8.astype(np.float64) - f32)
    assert 0 < delta.max() < 1e-2, delta.max()
    top2 = -np.partition(-f32, 1, axis=1)[:, :2]
    clear = top2[:, 0] - top2[:, 1] > 2 * delta.max()
    assert np.array_equal(q8.argmax(1)[clear], f32.argmax(1)[clear])


@pytest.mark.parametrize("weight_type", ["F16", "BF16", "F32"])
def test_q8_rejects_float_weights_with_a_clear_error(head_file, weight_type):
    path = head_file(weight_type=weight_type, hidden=256, vocab=64)
    with pytest.raises(ValueError, match=rf"acts='q8'.*{weight_type}.*acts='f32'"):
        muser.Head.load(path, acts="q8")  # refused at load, before any call


def test_read_bandwidth_streams_the_buffer():
    r = _core.read_bandwidth(8 << 20, 2, 2)
    assert r["bytes"] == 8 << 20 and r["threads"] == 2 and len(r["seconds"]) == 2
    assert all(s > 0 for s in r["seconds"])
    # the buffer holds 0, 1, 2, ... as 64-bit words: the sum proves every word was read
    n = (8 << 20) // 8
    assert r["checksum"] == (n * (n - 1) // 2) % 2**64
    with pytest.raises(ValueError, match="1 MiB"):
        _core.read_bandwidth(1000, 1, 1)


# ---- the labelled profile ----

def test_profile_books_the_matvec_under_lm_head_and_never_under_the_soft_cap(head_file, rng):
    """A big, slow matvec (the scalar reference) and a cheap cap: if the
    matvec's time leaked into a soft-cap label, that label would carry it."""
    path = head_file(weight_type="Q5_K", hidden=2048, vocab=6000)
    x = rng.standard_normal((2, 2048)).astype(np.float32)
    for route in ("reference", "graph", "fused", "canonical"):
        head = muser.Head.load(path, route=route, threads=1, fuse=False)  # every node its own kernel
        # each label's best of three: a preemption (other processes share the
        # machine) can stretch any one node of any one run
        runs = [head.profile(x) for _ in range(3)]
        secs = {p.label: min(r[i].seconds for r in runs) for i, p in enumerate(runs[0])}
        head_time = secs["lm_head"]
        caps = [s for label, s in secs.items() if label.startswith("softcap") or label == "logit_scale"]
        assert caps, route
        assert head_time > 0.7 * sum(secs.values()), (route, secs)
        # the cap touches 12,000 logits; the matvec multiplies 12 M weights
        assert max(caps) < 0.2 * head_time, (route, secs)
        # fused, the kernel that does the matvec is named for every node it holds: never the cap's alone
        fused = muser.Head.load(path, route=route, threads=1).profile(x)
        matvec_kernel = max(fused, key=lambda p: p.seconds)
        assert "lm_head" in matvec_kernel.nodes, (route, [p.label for p in fused])
        if route in ("fused", "canonical"):
            assert matvec_kernel.label == "lm_head+softcap"


@pytest.mark.parametrize("acts", ["f32", "q8"])
@pytest.mark.parametrize("route", ["reference", "graph", "fused", "canonical"])
def test_profile_lists_each_node_once_under_its_own_label(head_file, rng, route, acts):
    path = head_file(weight_type="Q8_0", hidden=256, vocab=300)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    head = muser.Head.load(path, route=route, acts=acts, fuse=False)
    prof = head.profile(x)
    assert [(p.label, p.kind) for p in prof] == head.nodes
    labels = [p.label for p in prof]
    assert len(labels) == len(set(labels)), labels
    lm = next(p for p in prof if p.label == "lm_head")
    assert lm.bytes >= 300 * 256 // 32 * 34 and lm.seconds > 0
    # fused: each kernel names its nodes; together they are the route's nodes, once each, in order
    fused = muser.Head.load(path, route=route, acts=acts)
    prof = fused.profile(x)
    assert [n for p in prof for n in p.nodes] == [label for label, _ in fused.nodes]
    assert [tuple(p.nodes) for p in prof] == fused.steps
    assert "+".join(p.kind for p in prof) == "+".join(kind for _, kind in fused.nodes)


def test_bench_cli_reports_every_route_against_the_bandwidth(head_file, tmp_path):
    """``python -m muser bench`` on a small head: one row per route and mode and
    token count, each with its stream rate and share of the measured bandwidth."""
    import json

    from muser.__main__ import main

    path = head_file(weight_type="Q5_K", hidden=512, vocab=2000)
    out = tmp_path / "bench.json"
    rc = main(["bench", "--file", path, "--threads", "1", "--tokens", "1,3", "--routes", "graph,canonical",
               "--acts", "f32,q8", "--reps", "1", "--no-ggml", "--quiet", "--bandwidth-bytes", str(16 << 20),
               "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    (run,) = res["runs"]
    assert run["threads"] == 1 and run["bandwidth_before"]["gbps"] > 0
    got = {(r["route"], r["acts"], r["t"]) for r in run["rows"]}
    assert got == {(r, a, t) for r in ("graph", "canonical") for a in ("f32", "q8") for t in (1, 3)}
    for r in run["rows"]:
        assert r["seconds"] > 0 and r["lm_head"] > 0 and r["weight_gbps"] > 0 and 0 <= r["tail_share"] < 1
