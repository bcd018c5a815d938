"""muser.quantize / muser.dequantize: rung 1 of the parity ladder (dequantization
bit-equal to gguf.quants.dequantize for every supported type), Q8_0 bytes equal
to gguf's (documented bit-exact with ggml's reference), golden digests of
ggml's own bytes for the K-quants, error bounds, and the API's errors."""
from __future__ import annotations

import hashlib
import warnings

import numpy as np
import pytest

import muser

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as GT  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

from conftest import bits  # noqa: E402

# type -> (elements per block, bytes per block, byte offsets of f16 scale fields)
BLOCKS = {
    "Q8_0": (32, 34, (0,)),
    "Q4_K": (256, 144, (0, 2)),
    "Q5_K": (256, 176, (0, 2)),
    "Q6_K": (256, 210, (208,)),
    "F32": (1, 4, ()),
    "F16": (1, 2, ()),
    "BF16": (1, 2, ()),
}
BLOCK_COUNTS = (1, 2, 3, 7, 26)


def random_scales(rng: np.random.Generator, n: int) -> np.ndarray:
    """f16 bit patterns for block scales: random finite halves of either sign,
    with zero, the smallest subnormal and other subnormals mixed in."""
    h = rng.integers(0, 0x7C00, n, dtype=np.uint16)  # finite, positive
    h[rng.random(n) < 0.3] &= 0x03FF  # subnormal
    h[rng.random(n) < 0.1] = 0
    h[rng.random(n) < 0.05] = 1
    h[rng.random(n) < 0.2] |= 0x8000  # negative (never written by ggml, still decoded)
    return h


def random_blocks(rng: np.random.Generator, type_name: str, rows: int, blocks_per_row: int) -> np.ndarray:
    _, block_bytes, scale_offsets = BLOCKS[type_name]
    data = rng.integers(0, 256, (rows * blocks_per_row, block_bytes), dtype=np.uint8)
    for off in scale_offsets:
        data[:, off : off + 2] = random_scales(rng, data.shape[0]).view(np.uint8).reshape(-1, 2)
    return data.reshape(rows, blocks_per_row * block_bytes)


# ---- rung 1: dequantization bit-equal to gguf.quants.dequantize ----


@pytest.mark.parametrize("type_name", ["Q5_K", "Q6_K", "Q4_K", "Q8_0"])
@pytest.mark.parametrize("blocks_per_row", BLOCK_COUNTS)
def test_dequantize_block_types_bit_equal_to_gguf(type_name, blocks_per_row):
    rng = np.random.default_rng(blocks_per_row * 1000 + len(type_name))
    block_elems = BLOCKS[type_name][0]
    rows = 5
    data = random_blocks(rng, type_name, rows, blocks_per_row)
    ours = muser.dequantize(data, type_name, (rows, blocks_per_row * block_elems))
    ref = gguf_dequantize(data, GT[type_name])
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert np.array_equal(bits(ours), bits(ref))


@pytest.mark.parametrize("cols", [1, 31, 256, 6656])
def test_dequantize_f16_every_pattern_class_bit_equal(cols):
    rng = np.random.default_rng(cols)
    h = rng.integers(0, 1 << 16, (3, cols), dtype=np.uint16)
    h.flat[:8] = [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00][: h.size]
    ours = muser.dequantize(h.view(np.uint8), "F16", h.shape)
    ref = gguf_dequantize(h.view(np.uint8), GT.F16)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)  # NaN stays NaN; payloads are not promised
    assert np.array_equal(bits(ours)[~nan], bits(ref)[~nan])


def test_dequantize_f16_all_65536_halves():
    h = np.arange(1 << 16, dtype=np.uint16)
    ours = muser.dequantize(h.view(np.uint8), "F16", h.shape)
    ref = h.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    assert np.array_equal(np.isnan(ours), nan)
    assert np.array_equal(bits(ours)[~nan], bits(ref)[~nan])


@pytest.mark.parametrize("type_name", ["BF16", "F32"])
@pytest.mark.parametrize("cols", [1, 33, 256, 6656])
def test_dequantize_bf16_f32_bit_equal_including_nan_payloads(type_name, cols):
    rng = np.random.default_rng(cols + 7)
    nbytes = BLOCKS[type_name][1]
    data = rng.integers(0, 256, (4, cols * nbytes), dtype=np.uint8)
    ours = muser.dequantize(data, type_name, (4, cols))
    ref = gguf_dequantize(data, GT[type_name]).reshape(4, cols)
    assert np.array_equal(bits(ours), bits(ref))


def test_dequantize_accepts_flat_data_and_1d_shape():
    rng = np.random.default_rng(1)
    data = random_blocks(rng, "Q5_K", 1, 2)
    two_d = muser.dequantize(data, "Q5_K", (1, 512))
    flat = muser.dequantize(data.ravel(), "q5_k", 512)
    assert flat.shape == (512,)
    assert np.array_equal(bits(flat), bits(two_d[0]))


def test_dequantize_accepts_gguf_enum_and_empty():
    data = np.zeros((0, 176), np.uint8)
    out = muser.dequantize(data, GT.Q5_K, (0, 256))
    assert out.shape == (0, 256) and out.dtype == np.float32


# ---- quantizers ----


def q8_0_cases() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(80)
    gauss = rng.standard_normal((16, 256)).astype(np.float32)
    outliers = gauss.copy()
    outliers[:, ::37] *= 1e4
    denormal_mix = (rng.standard_normal((4, 64)) * 1e-40).astype(np.float32)
    denormal_mix[:, ::32] = 1.0  # one normal value per block: the rest quantize against it
    ties = (np.arange(64, dtype=np.float32) - 32) / 2  # x * id lands on .5 exactly for some
    ties[31] = 127 / 2
    return {
        "gaussian": gauss,
        "zeros": np.zeros((3, 96), np.float32),
        "negative_zeros": np.full((1, 32), -0.0, np.float32),
        "constant": np.full((2, 64), 0.3, np.float32),
        "constant_negative": np.full((2, 64), -1e3, np.float32),
        "outliers": outliers,
        "denormal_mix": denormal_mix,
        "half_ties": ties.reshape(1, 64),
        "tiny_normal": (rng.standard_normal((4, 64)) * 1e-30).astype(np.float32),
        "wide_range": (rng.standard_normal((8, 128)) * np.exp2(rng.integers(-60, 20, (8, 128)))).astype(np.float32),
    }


@pytest.mark.parametrize("case", sorted(q8_0_cases()))
def test_q8_0_bytes_equal_gguf(case):
    x = q8_0_cases()[case]
    ours = muser.quantize(x, "Q8_0")
    ref = gguf_quantize(x, GT.Q8_0)
    assert ours.shape == ref.shape == (x.shape[0], x.shape[1] // 32 * 34)
    assert np.array_equal(ours, ref)


def test_q8_0_all_denormal_block_stores_zero():
    # amax / 127 is so small that 1 / d overflows: ggml (x86) writes q = 0, d = 0.
    x = (np.random.default_rng(3).standard_normal((2, 64)) * 1e-39).astype(np.float32)
    q = muser.quantize(x, "Q8_0")
    assert not q.any()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # gguf's numpy casts inf to int8
        assert np.array_equal(q, gguf_quantize(x, GT.Q8_0))


def q8_0_error_bound(x: np.ndarray) -> np.ndarray:
    """Per-element bound: half a step, plus what the f16 rounding of d moves
    the largest quant (127 * |d16 - d|), plus float rounding of x * (1/d)."""
    blocks = x.reshape(-1, 32).astype(np.float64)
    d = np.abs(blocks).max(axis=1, keepdims=True) / 127
    d16 = d.astype(np.float16).astype(np.float64)
    return (d / 2 + 127 * np.abs(d16 - d) + 1e-6 * d).repeat(32, axis=1).reshape(x.shape)


def test_q8_0_round_trip_within_half_step():
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((64, 512)) * np.exp2(rng.integers(-8, 8, (64, 1)))).astype(np.float32)
    y = muser.dequantize(muser.quantize(x, "Q8_0"), "Q8_0", x.shape)
    assert np.all(np.abs(y.astype(np.float64) - x) <= q8_0_error_bound(x))


def golden_input(rows: int = 16, cols: int = 512) -> np.ndarray:
    """A fixed input built from integer hashing and exact float64 operations
    only, so it is the same array on every platform and numpy version."""
    i = np.arange(rows * cols, dtype=np.uint64)
    u = ((i * np.uint64(2654435761) + np.uint64(12345)) % np.uint64(2**32)).astype(np.float64) / 2.0**32
    w = 2.0 * u - 1.0
    v = w * w * w
    k = ((i // 32) * 7 % 11).astype(np.float64) - 5.0  # sub-block scales 2^-5 .. 2^5
    x = v * np.exp2(k)
    x[::97] = 0.0
    return x.astype(np.float32).reshape(rows, cols)


# SHA-256 of ggml_quantize_chunk's output (no importance matrix, i.e. the
# quantize_row_*_ref functions) on golden_input(), from libggml-base of the
# llama.cpp that llama-cpp-python 0.3.16 vendors, built for x86-64 (-O3, no
# -mfma). muser matched ggml byte for byte on these and on ~50 more random
# inputs per type (Gaussian, heavy-tailed, one-signed, constant, zero,
# subnormal, 1e-6 and 1e4 scales, per-row and per-sub-block scale sweeps).
GOLDEN_INPUT_SHA256 = "8005a0108a4c192fbd1edcd032d9165f2bfb061ae064f43afb42ef7d5ec14226"
GGML_GOLDEN_SHA256 = {
    "Q8_0": "38f2a4752a5b1203b678065193224315ca9f4de5d95954ae6c4da1bf118a57e2",
    "Q4_K": "b3700df1a41d1be503d33c474781a2785998de01d6b7df505ae094ce229df332",
    "Q5_K": "3409dd2b66037328cfbfce11706a6784ab6058bd58e164d8670e090f19d51ac6",
    "Q6_K": "27ed1cbcf83c8d84e24ee7d9c9fcb6505756dbbf5370451045a9c9fa333d0e40",
}


def test_golden_input_is_stable():
    assert hashlib.sha256(golden_input().tobytes()).hexdigest() == GOLDEN_INPUT_SHA256


@pytest.mark.parametrize("type_name", sorted(GGML_GOLDEN_SHA256))
def test_quantizer_bytes_equal_ggml_golden(type_name):
    q = muser.quantize(golden_input(), type_name)
    assert hashlib.sha256(q.tobytes()).hexdigest() == GGML_GOLDEN_SHA256[type_name]


def k_quant_sub_scales(q: np.ndarray, type_name: str):
    """(d * sc, dmin * m) per 32-element sub-block of Q4_K/Q5_K rows, via gguf's unpacker."""
    blocks = q.reshape(-1, BLOCKS[type_name][1])
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, m = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
    return (d * sc.astype(np.float32)).ravel(), (dmin * m.astype(np.float32)).ravel()


@pytest.mark.parametrize("type_name,nmax", [("Q5_K", 31), ("Q4_K", 15)])
def test_k_quant_round_trip_within_half_step_per_sub_block(type_name, nmax):
    rng = np.random.default_rng(nmax)
    x = (rng.standard_normal((32, 1024)) * np.exp2(rng.integers(-6, 6, (32, 1)))).astype(np.float32)
    q = muser.quantize(x, type_name)
    y = muser.dequantize(q, type_name, x.shape)
    d1, m1 = k_quant_sub_scales(q, type_name)
    xs = x.reshape(-1, 32).astype(np.float64)
    err = np.abs(y.reshape(-1, 32) - xs)
    # The grid is -m1 + d1 * {0..nmax}: inside it the nearest step is <= d1/2 away
    # (the quant is recomputed from the stored d1, m1); outside it values clamp.
    lo = -m1[:, None].astype(np.float64)
    hi = lo + nmax * d1[:, None]
    outside = np.maximum(0, np.maximum(lo - xs, xs - hi))
    slack = 1e-6 * np.abs(xs).max(axis=1, keepdims=True)
    assert np.all(err <= d1[:, None] / 2 + outside + slack)
    # Clamping is rare and small: the grid nearly spans each sub-block.
    assert outside.max() <= 0.5 * d1.max()


# Measured relative RMS error (sqrt(sum err^2 / sum x^2)) on N(0, 1) rows of
# 1024, 256 rows: Q8_0 0.0054, Q6_K 0.0177, Q5_K 0.0361, Q4_K 0.0712, BF16 0.0017,
# F16 0.00021. Worst single row: Q5_K 0.042. Bounds keep ~5 % headroom.
REL_RMS_BOUND = {"Q8_0": 0.0057, "Q6_K": 0.0186, "Q5_K": 0.038, "Q4_K": 0.075, "BF16": 0.0018, "F16": 0.00023}


@pytest.mark.parametrize("type_name", sorted(REL_RMS_BOUND))
def test_relative_rms_error_on_gaussian_rows(type_name):
    x = np.random.default_rng(2024).standard_normal((256, 1024)).astype(np.float32)
    y = muser.dequantize(muser.quantize(x, type_name), type_name, x.shape)
    rel = np.sqrt(np.sum((y.astype(np.float64) - x) ** 2) / np.sum(x.astype(np.float64) ** 2))
    assert rel < REL_RMS_BOUND[type_name], f"{type_name}: relative RMS error {rel:.5f}"
    if type_name == "Q5_K":
        per_row = np.sqrt(np.sum((y - x) ** 2, axis=1) / np.sum(x**2, axis=1))
        assert per_row.max() < 0.05


@pytest.mark.parametrize("type_name", ["Q8_0", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("value", [0.0, -0.0, 0.37, -2.5, 1e-3, -1e-3, 100.0])
def test_zero_and_constant_rows(type_name, value):
    x = np.full((2, 512), value, np.float32)
    y = muser.dequantize(muser.quantize(x, type_name), type_name, x.shape)
    if value == 0:
        assert not y.any()
        return
    # A constant sits on a grid point; only the f16 rounding of the scales is
    # left (2^-11 relative). For 1e-3 the scales are f16 subnormals (Q5_K's
    # d = 1e-3/31/63, Q6_K's 1e-3/32/128, Q8_0's 1e-3/127; spacing 6e-8), so
    # the grid is coarse relative to the value: measured up to 2.3 % (Q6_K).
    tol = 3e-2 if abs(value) < 0.01 else 1e-3
    np.testing.assert_allclose(y, x, rtol=tol)
    assert np.all(y == y[0, 0])  # every element decodes the same


@pytest.mark.parametrize("type_name", ["F32", "F16", "BF16"])
def test_plain_conversions_round_to_nearest_even(type_name):
    rng = np.random.default_rng(16)
    x = (rng.standard_normal((4, 100)) * np.exp2(rng.integers(-30, 17, (4, 100)))).astype(np.float32)
    x[0, :4] = [1 + 2.0**-11, 1 + 3 * 2.0**-11, 2.0**-25, 65520.0]  # f16 ties
    q = muser.quantize(x, type_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # 65520 overflows f16 to inf, as it should
        if type_name == "F32":
            expected = x.view(np.uint8)
        elif type_name == "F16":
            expected = x.astype(np.float16).view(np.uint8)  # numpy rounds to nearest even
        else:
            expected = gguf_quantize(x, GT.BF16).view(np.uint8)  # ggml_compute_fp32_to_bf16
    assert np.array_equal(q, expected.reshape(q.shape))


def test_quantize_accepts_1d_and_returns_one_row():
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    q = muser.quantize(x, "Q5_K")
    assert q.shape == (1, 176) and q.dtype == np.uint8
    assert np.array_equal(q, muser.quantize(x[None, :], GT.Q5_K))


def test_quantize_output_is_an_independent_writable_array():
    x = np.ones((2, 32), np.float32)
    q = muser.quantize(x, "Q8_0")
    q[:] = 0  # owned by the caller
    assert muser.quantize(x, "Q8_0").any()


def test_quantize_read_only_input():
    x = np.ones((1, 256), np.float32)
    x.setflags(write=False)
    assert muser.quantize(x, "Q4_K").shape == (1, 144)


def test_quantize_empty_rows():
    assert muser.quantize(np.zeros((0, 256), np.float32), "Q5_K").shape == (0, 176)


# ---- API errors ----


def test_quantize_wrong_dtype_is_type_error():
    with pytest.raises(TypeError, match=r"float32.*float64"):
        muser.quantize(np.zeros((2, 256)), "Q5_K")


def test_quantize_not_an_array_is_type_error():
    with pytest.raises(TypeError, match="numpy.ndarray"):
        muser.quantize([[0.0] * 256], "Q5_K")


def test_quantize_3d_is_value_error():
    with pytest.raises(ValueError, match=r"1-D .* 2-D.*\(2, 2, 256\)"):
        muser.quantize(np.zeros((2, 2, 256), np.float32), "Q5_K")


def test_quantize_non_contiguous_is_value_error():
    x = np.zeros((256, 4), np.float32).T
    with pytest.raises(ValueError, match="C-contiguous"):
        muser.quantize(x, "Q5_K")
    with pytest.raises(ValueError, match="C-contiguous"):
        muser.quantize(np.zeros((2, 512), np.float32)[:, ::2], "Q5_K")


@pytest.mark.parametrize("name", ["Q9_K", "", "float32"])
def test_unknown_type_name_is_value_error(name):
    with pytest.raises(ValueError, match="unknown quantization type"):
        muser.quantize(np.zeros(256, np.float32), name)


def test_known_but_unsupported_type_is_value_error():
    with pytest.raises(ValueError, match=r"cannot quantize to Q4_0.*supported"):
        muser.quantize(np.zeros(32, np.float32), "Q4_0")
    with pytest.raises(ValueError, match=r"cannot dequantize IQ2_XXS"):
        muser.dequantize(np.zeros(66, np.uint8), "IQ2_XXS", (256,))


def test_type_argument_of_wrong_kind_is_type_error():
    with pytest.raises(TypeError, match="type name"):
        muser.quantize(np.zeros(256, np.float32), 13)


def test_cols_not_multiple_of_block_is_value_error():
    with pytest.raises(ValueError, match=r"Q5_K.*multiple of 256.*got 300"):
        muser.quantize(np.zeros((2, 300), np.float32), "Q5_K")
    with pytest.raises(ValueError, match=r"Q8_0.*multiple of 32.*got 48"):
        muser.quantize(np.zeros((2, 48), np.float32), "Q8_0")
    with pytest.raises(ValueError, match=r"multiple of 256.*got 100"):
        muser.dequantize(np.zeros(176, np.uint8), "Q5_K", (100,))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_is_value_error(bad):
    x = np.zeros((3, 256), np.float32)
    x[2, 17] = bad
    with pytest.raises(ValueError, match=r"non-finite.*\[2, 17\]"):
        muser.quantize(x, "Q5_K")


def test_scale_overflow_is_value_error():
    x = np.zeros((2, 32), np.float32)
    x[1, 0] = 1e9  # finite, but 1e9 / 127 is past the largest f16
    with pytest.raises(ValueError, match=r"too large for Q8_0.*row 1"):
        muser.quantize(x, "Q8_0")


def test_dequantize_wrong_dtype_is_type_error():
    with pytest.raises(TypeError, match=r"uint8.*int8"):
        muser.dequantize(np.zeros(176, np.int8), "Q5_K", (256,))


def test_dequantize_wrong_byte_count_is_value_error():
    with pytest.raises(ValueError, match=r"175 bytes.*need 176"):
        muser.dequantize(np.zeros(175, np.uint8), "Q5_K", (1, 256))
    with pytest.raises(ValueError, match=r"352 bytes.*need 176"):
        muser.dequantize(np.zeros((2, 176), np.uint8), "Q5_K", (1, 256))


def test_dequantize_bad_shape_is_value_error():
    with pytest.raises(ValueError, match="shape must be"):
        muser.dequantize(np.zeros(176, np.uint8), "Q5_K", (1, 1, 256))
    with pytest.raises(ValueError, match="negative"):
        muser.dequantize(np.zeros(176, np.uint8), "Q5_K", (-1, 256))
    with pytest.raises(TypeError, match="tuple of ints"):
        muser.dequantize(np.zeros(176, np.uint8), "Q5_K", None)


def test_dequantize_non_contiguous_is_value_error():
    data = np.zeros((2, 352), np.uint8)[:, ::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        muser.dequantize(data, "Q5_K", (2, 256))
