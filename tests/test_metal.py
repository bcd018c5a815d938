"""The Metal backend against the CPU backend.

Runs wherever muser was built with Metal: on a Mac (no Apple GPU has run it
yet) or on Linux against the test-only emulator (MUSER_METAL_EMULATOR=ON,
tests/metal_emulator/: the real .mm on GNUstep, the .metal kernels compiled as
C++ on CPU fibers, barriers checked). Skipped with the reason elsewhere.

canonical: Metal logits == CPU logits bit for bit (t = 1, 3, 8, 64, all seven
weight types, f32 and q8 activations); the other routes within the f32-norm
and platform-tanh difference (Apple GPUs have no double: docs/numerics.md);
batch rows == single steps; the logits view is the MTLBuffer's contents and
outlives the head; the weight split into views; top-k on the device; the
pipeline cache reused; score, logsumexp, log_softmax and sample on the device
(sample: every field the host's bits over the device's logits); errors as
muser.DeviceError; one barrier removed is
reported as a hazard; the profile books the matvec under lm_head only.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import muser
from muser import _core

pytest.importorskip("gguf", reason="the gguf package writes the test heads")
from muser.fixtures import write_head_gguf  # noqa: E402

from conftest import assert_bitwise, bits  # noqa: E402

_info = muser.build_info()
if not _info["metal"]:
    _skip = "this build of muser has no Metal backend (Apple only, or MUSER_METAL_EMULATOR=ON on Linux)"
else:
    _skip = ""
EMULATED = hasattr(_core, "_metal_emu_reset")
pytestmark = pytest.mark.skipif(bool(_skip), reason=_skip or "-")

# small (the emulator runs one fiber per GPU thread) but awkward: an odd number
# of K-quant blocks, Q8_0 rows of 11 blocks, float rows not a multiple of 32
SHAPES = {"Q5_K": 768, "Q4_K": 768, "Q6_K": 768, "Q8_0": 352, "F16": 333, "BF16": 333, "F32": 333}
Q8_TYPES = ("Q5_K", "Q4_K", "Q6_K", "Q8_0")
VOCAB = 517
ROUTES = ("graph", "fused", "canonical", "reference")


@pytest.fixture(scope="module")
def head_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("metal-heads")
    cache = {}

    def get(weight_type: str) -> str:
        if weight_type not in cache:
            cache[weight_type] = write_head_gguf(d / f"{weight_type}.gguf", hidden=SHAPES[weight_type], vocab=VOCAB,
                                                 weight_type=weight_type, seed=7)
        return cache[weight_type]
    return get


@pytest.fixture(autouse=True)
def _clean_hooks():
    yield
    if _info["metal"]:
        _core._metal_test_drop_barrier(-1)
        _core._metal_test_max_buffer_length(0)
    if EMULATED:
        _core._metal_emu_reset()


def hidden_states(H: int, t: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((t, H), dtype=np.float32) * np.float32(1.5)


@pytest.mark.parametrize("weight_type", list(SHAPES))
def test_canonical_bitwise_equal_to_cpu(head_file, weight_type):
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="metal", route="canonical")
    for t in (1, 3, 8, 64):
        x = hidden_states(SHAPES[weight_type], t, seed=t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} canonical t={t}", "metal")


@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_canonical_q8_bitwise_equal_to_cpu(head_file, weight_type):
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route="canonical", acts="q8")
    gpu = muser.Head.load(path, device="metal", route="canonical", acts="q8")
    for t in (1, 3, 8, 64):
        x = hidden_states(SHAPES[weight_type], t, seed=t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} canonical q8 t={t}", "metal")


@pytest.mark.parametrize("acts", ("f32", "q8"))
@pytest.mark.parametrize("route", ("graph", "fused", "reference"))
@pytest.mark.parametrize("weight_type", list(SHAPES))
def test_every_route_close_to_cpu(head_file, weight_type, route, acts):
    if acts == "q8" and weight_type not in Q8_TYPES:
        pytest.skip("acts='q8' is for quantized weights")
    # the ggml-order norm sums in f32 on Metal (no double) and tanh is the
    # platform's: a few ulp of the normed vector and of tanh, times cap
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route=route, acts=acts)
    gpu = muser.Head.load(path, device="metal", route=route, acts=acts)
    x = hidden_states(SHAPES[weight_type], 3, seed=11)
    got, want = gpu(x), cpu(x).copy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 if acts == "q8" else 5e-5)
    assert np.abs(got).max() < 20.0


@pytest.mark.parametrize("route", ROUTES)
def test_batch_rows_equal_single_steps(head_file, route):
    gpu = muser.Head.load(head_file("Q5_K"), device="metal", route=route)
    x = hidden_states(SHAPES["Q5_K"], 5, seed=5)
    batch = gpu(x).copy()
    for r in range(x.shape[0]):
        assert_bitwise(gpu(x[r]), batch[r], f"{route} row {r} alone vs in a batch of 5", "metal")


def test_unfused_route_equals_fused(head_file):
    # norm + gamma in one kernel computes exactly the two nodes' bytes
    path = head_file("Q6_K")
    a = muser.Head.load(path, device="metal", route="canonical")
    b = muser.Head.load(path, device="metal", route="canonical", fuse=False)
    x = hidden_states(SHAPES["Q6_K"], 3)
    assert_bitwise(a(x), b(x), "fused norm+gamma vs separate nodes", "metal")


def test_logits_view_is_the_buffer_contents_and_outlives_the_head(head_file):
    gpu = muser.Head.load(head_file("Q5_K"), device="metal", route="canonical")
    x = hidden_states(SHAPES["Q5_K"], 2)
    a = gpu(x)
    assert not a.flags.owndata  # a view of the head's buffer
    address = a.__array_interface__["data"][0]
    assert _core._metal_test_buffer_length_at(address) >= a.nbytes  # an MTLBuffer's contents, not a copy
    first = a.copy()
    del gpu
    gc.collect()
    assert _core._metal_test_buffer_length_at(address) >= a.nbytes  # the view keeps the buffer
    assert_bitwise(a, first, "host view after the head is gone", "metal")
    del a
    gc.collect()
    assert _core._metal_test_buffer_length_at(address) == 0  # released with its last owner


def test_weight_split_into_views(head_file):
    path = head_file("Q4_K")
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    _core._metal_test_max_buffer_length(64 * 1024)  # a few hundred rows per view
    gpu = muser.Head.load(path, device="metal", route="canonical")
    assert _core._metal_test_stats()["weight_views"] > 1
    x = hidden_states(SHAPES["Q4_K"], 3)
    assert_bitwise(gpu(x), cpu(x).copy(), "weight in several views", "metal")


@pytest.mark.skipif(not EMULATED, reason="sets the emulated device's page size")
@pytest.mark.parametrize("mmap", (True, False))
def test_weights_wrapped_without_a_copy(head_file, mmap):
    # the emulator demands 16 KiB pages by default (Apple silicon's); Linux maps
    # files on 4 KiB pages, so the test device takes the host's page
    import mmap as _mmap
    _core._metal_emu_set_page_size(_mmap.PAGESIZE)
    path = head_file("Q6_K")
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="metal", route="canonical", mmap=mmap)
    assert _core._metal_test_stats()["weights_no_copy"]  # newBufferWithBytesNoCopy on the GGUF's pages
    x = hidden_states(SHAPES["Q6_K"], 3)
    assert_bitwise(gpu(x), cpu(x).copy(), "weights read in place", "metal")


@pytest.mark.parametrize("k", (1, 5, 600))
def test_topk_on_device_equals_cpu(head_file, k):
    path = head_file("Q8_0")
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="metal", route="canonical")
    assert gpu.caps["ranks_on_device"]
    x = hidden_states(SHAPES["Q8_0"], 3)
    vals, ids, _ = gpu.topk(x, min(k, VOCAB))
    want_vals, want_ids, _ = cpu.topk(x, min(k, VOCAB))
    np.testing.assert_array_equal(ids, want_ids)
    assert_bitwise(vals, want_vals, f"top-{k} values", "metal")
    np.testing.assert_array_equal(gpu.argmax(x), cpu.argmax(x))


@pytest.mark.parametrize("acts", ["f32", "q8"])
def test_consumer_reductions_on_metal_equal_cpu_on_the_canonical_route(head_file, acts):
    # score/logsumexp/log_softmax of Metal's logits: the canonical bits of the CPU
    path = head_file("Q5_K")
    cpu = muser.Head.load(path, device="cpu", route="canonical", acts=acts)
    gpu = muser.Head.load(path, device="metal", route="canonical", acts=acts)
    x = hidden_states(SHAPES["Q5_K"], 4, seed=3)
    ids = np.array([[0, 5, VOCAB - 1]] * 4)
    want, got = cpu.score(x, ids), gpu.score(x, ids)
    assert_bitwise(got.logprobs, want.logprobs, "score logprobs", "metal")
    assert_bitwise(got.logsumexp, want.logsumexp, "logsumexp", "metal")
    np.testing.assert_array_equal(got.ranks, want.ranks)
    assert_bitwise(gpu.logsumexp(x), want.logsumexp, "logsumexp", "metal")
    assert_bitwise(gpu.log_softmax(x), cpu.log_softmax(x), "log_softmax", "metal")


def test_score_and_log_softmax_reduce_on_metal_over_several_tiles_with_ties(tmp_path):
    # score, logsumexp and log_softmax run on the device (vocab_reduce.metal: the first score builds its
    # pipelines, which the plain call never needs): the lanes, the butterfly and the tile
    # tree over 3 tiles of 2,048 (an odd one carried up), ranks among tied logits by id;
    # every field the CPU's bits, for one row and a batch
    hidden, vocab = 256, 4099
    w = np.random.default_rng(5).standard_normal((vocab, hidden), dtype=np.float32) * np.float32(0.05)
    w[[7, 2100, 4098]] = w[3000]  # four equal logits in three tiles
    path = write_head_gguf(tmp_path / "tiles.gguf", hidden=hidden, vocab=vocab, weight_type="Q8_0", weight=w,
                           seed=5)
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="metal", route="canonical")
    x = hidden_states(hidden, 48, seed=6) * np.float32(0.2)  # logits near 0: the sums' bits reach the results
    gpu(x)
    built = _core._metal_test_stats()["pipelines_built"]
    ids = np.array([[7, 2100, 3000, 4098, 0, 2047, 2048]] * 48)
    want, got = cpu.score(x, ids), gpu.score(x, ids)
    assert _core._metal_test_stats()["pipelines_built"] > built  # the reductions' kernels ran
    for field in ("logprobs", "logits", "logsumexp"):
        assert_bitwise(getattr(got, field), getattr(want, field), field, "metal")
    np.testing.assert_array_equal(got.ranks, want.ranks)
    assert len(set(got.ranks[0, :4].tolist())) == 4  # tied, ranked by id
    assert_bitwise(gpu.logsumexp(x[1]), want.logsumexp[1], "one row", "metal")
    assert_bitwise(gpu.score(x[2], 2100).logprobs, want.logprobs[2, 1], "one row, one id", "metal")
    # log_softmax subtracts on the device in the head's own buffer (one more pipeline), and
    # on the host in a caller's out= array: the same bits either way
    built = _core._metal_test_stats()["pipelines_built"]
    want_lsm = cpu.log_softmax(x)
    assert_bitwise(gpu.log_softmax(x), want_lsm, "log_softmax", "metal")
    assert _core._metal_test_stats()["pipelines_built"] == built + 1
    out = np.empty((48, vocab), np.float32)
    assert gpu.log_softmax(x, out=out) is out
    assert_bitwise(out, want_lsm, "log_softmax into out=", "metal")
    assert_bitwise(gpu.log_softmax(x[5]), want_lsm[5], "log_softmax of one row", "metal")


# every path of sample.metal (greedy; the race over every finite z; top_k's cut from the k
# best, with top_p among them; min_p, logit_bias, allowed; top_p alone, whose cut the device
# finds among each row's 256 best and leaves to the host where it lies further down)
METAL_SAMPLE_SETTINGS = [
    {"temperature": 0.0},
    {"temperature": 0.0, "logit_bias": {5: 40.0, 17: -1e30}},
    {},
    {"temperature": 0.6},
    {"temperature": 1.7, "min_p": 0.05},
    {"top_k": 1},
    {"top_k": 50},
    {"top_k": 4, "temperature": 0.5, "min_p": 0.1},
    {"top_k": 1024, "temperature": 3.0},
    {"top_k": 100, "top_p": 0.3},
    {"temperature": 1.3, "top_k": 200, "top_p": 0.8, "min_p": 0.02},
    {"top_k": 20, "logit_bias": {3: 2.5, 4000: -3.0, 2049: 1.0}},
    {"top_k": 20, "top_p": 0.9, "allowed": "few"},  # fewer allowed tokens than top_k: no cut by it
    {"allowed": "many", "temperature": 0.8},
    {"top_p": 0.9},  # flat rows: the cut lies past the 256 best, the host's
    {"top_p": 0.9, "temperature": 0.01},  # peaked rows: the device's
    {"top_p": 0.7, "temperature": 0.02, "min_p": 0.001, "logit_bias": {11: 0.05}},  # the device's
]
METAL_TOP_P_RANKED = 256  # metal_device.cpp's kTopPAloneRanked


def _top_p_cuts(logits, kw):
    # each row's top_p cut (tokens kept) in float64: the precondition of which side draws
    z = logits.astype(np.float64)
    for token, v in (kw.get("logit_bias") or {}).items():
        z[:, token] += v
    z = z / kw.get("temperature", 1.0)
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p = -np.sort(-p, axis=1)
    c = np.cumsum(p, axis=1)
    return (c < kw["top_p"] * c[:, -1:]).sum(axis=1) + 1


@pytest.fixture(scope="module")
def tiles_head(tmp_path_factory):
    # three tiles of 2,048 ids (an odd one carried up), four tied rows across them
    hidden, vocab = 256, 4099
    w = np.random.default_rng(5).standard_normal((vocab, hidden), dtype=np.float32) * np.float32(0.05)
    w[[7, 2100, 4098]] = w[3000]
    path = write_head_gguf(tmp_path_factory.mktemp("metal-tiles") / "tiles.gguf", hidden=hidden, vocab=vocab,
                           weight_type="Q8_0", weight=w, seed=5)
    return path, hidden, vocab


@pytest.mark.parametrize("setting", range(len(METAL_SAMPLE_SETTINGS)))
def test_sample_on_metal_equals_host_sampling_of_its_logits(tiles_head, setting):
    # the device draw against muser/sample.h on the host over the same logits, bit for bit
    # in every field, for a batch and one row; the canonical route also against the CPU head
    from muser import _sampling
    path, hidden, vocab = tiles_head
    kw = dict(METAL_SAMPLE_SETTINGS[setting])
    if "allowed" in kw:
        mask = np.zeros(vocab, bool)
        mask[np.arange(10) * 409 if kw["allowed"] == "few" else np.random.default_rng(11).random(vocab) < 0.3] = True
        mask[0] = True
        kw["allowed"] = mask
    gpu = muser.Head.load(path, device="metal", route="canonical")
    assert gpu.caps["sample_on_device"]
    x = hidden_states(hidden, 6, seed=20 + setting)
    pos = np.arange(40, 46)
    expect_device = True
    if kw.get("top_p", 1.0) < 1.0 and not kw.get("top_k"):
        cuts = _top_p_cuts(np.array(gpu(x)), kw)
        # far from the boundary, so float64 and the device's fixed point agree on the side
        assert np.all(cuts <= METAL_TOP_P_RANKED * 0.8) or np.any(cuts >= METAL_TOP_P_RANKED * 1.25), cuts
        expect_device = bool(np.all(cuts <= METAL_TOP_P_RANKED))
    drawn = _core._metal_test_stats()["device_draws"]
    got = gpu.sample(x, seed=99, positions=pos, **kw)
    on_device = _core._metal_test_stats()["device_draws"] == drawn + 1
    assert on_device == expect_device, "a top_p cut past the 256 best is the host's, the rest the device's"
    params = _sampling.check_params(vocab, seed=99, positions=pos, **{
        "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "logit_bias": None, "allowed": None, **kw})
    want = _sampling.sample_logits(np.array(gpu(x)), False, params, pos.astype(np.uint64))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    for field in ("logprobs", "processed_logprobs", "kept_mass"):
        assert_bitwise(getattr(got, field), getattr(want, field), field, "metal")
    one = gpu.sample(x[2], seed=99, positions=42, **kw)
    assert one.tokens == got.tokens[2] and isinstance(one.tokens, int)
    cpu = muser.Head.load(path, device="cpu", route="canonical").sample(x, seed=99, positions=pos, **kw)
    np.testing.assert_array_equal(got.tokens, cpu.tokens)
    assert_bitwise(got.processed_logprobs, cpu.processed_logprobs, "processed_logprobs against the CPU head", "metal")


def test_sample_on_metal_names_a_non_finite_row_as_the_host_does(tiles_head):
    # z = (logit + bias) / temperature overflows at token 9 (and 2,050, a later tile): the
    # device leaves the draw to the host, which names the first
    path, hidden, vocab = tiles_head
    gpu = muser.Head.load(path, device="metal", route="canonical")
    x = hidden_states(hidden, 3, seed=4)
    with pytest.raises(muser.NonFiniteError, match="row 0, token 9: .* is not finite after logit_bias and temperature"):
        gpu.sample(x, seed=1, positions=np.arange(3), temperature=0.5, logit_bias={2050: 3e38, 9: 3e38})
    assert gpu.sample(x, seed=1, positions=np.arange(3)).tokens.shape == (3,)  # the head is still usable


def test_eight_threads_sharing_a_metal_head_get_the_serial_results(head_file):
    # score, log_softmax and sample run on the device's shared scratch under the head's lock,
    # and log_softmax subtracts in the caller's own pooled buffer: every thread gets the bits
    # of a serial run
    import threading
    gpu = muser.Head.load(head_file("Q5_K"), device="metal", route="canonical")
    inputs = [hidden_states(SHAPES["Q5_K"], 2, seed=30 + i) for i in range(4)]
    ids = np.array([[0, 5], [VOCAB - 1, 3]])
    draw = dict(seed=5, positions=np.arange(2), top_k=20, top_p=0.8)
    serial = [(gpu.score(x, ids).logprobs, np.array(gpu.log_softmax(x)), gpu.sample(x, **draw).tokens) for x in inputs]
    wrong: list[str] = []

    def work(seed: int) -> None:
        r = np.random.default_rng(seed)
        try:
            for c in range(25):
                i, kind = int(r.integers(len(inputs))), int(r.integers(3))
                x = inputs[i]
                got = (gpu.score(x, ids).logprobs if kind == 0 else np.array(gpu.log_softmax(x)) if kind == 1
                       else gpu.sample(x, **draw).tokens)
                if not np.array_equal(bits(got) if kind < 2 else got, bits(serial[i][kind]) if kind < 2
                                      else serial[i][kind]):
                    wrong.append(f"thread {seed} call {c} kind {kind}")
        except Exception as e:  # noqa: BLE001 -- an exception in a thread is a wrong result
            wrong.append(f"thread {seed} raised {e!r}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong[:5]


def test_sample_on_metal_draws_the_cpus_tokens_on_the_canonical_route(head_file):
    path = head_file("Q5_K")
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="metal", route="canonical")
    x = hidden_states(SHAPES["Q5_K"], 5, seed=8)
    for kw in ({}, {"temperature": 0.7, "top_p": 0.9}):
        want = cpu.sample(x, seed=11, positions=np.arange(5), **kw)
        got = gpu.sample(x, seed=11, positions=np.arange(5), **kw)
        np.testing.assert_array_equal(got.tokens, want.tokens)


def test_pipeline_cache_reused_across_calls(head_file):
    gpu = muser.Head.load(head_file("Q5_K"), device="metal", route="graph")
    x = hidden_states(SHAPES["Q5_K"], 2)
    gpu(x)
    built = _core._metal_test_stats()["pipelines_built"]
    assert built > 0
    for _ in range(3):
        gpu(x)
    assert _core._metal_test_stats()["pipelines_built"] == built


def test_profile_books_the_matvec_under_lm_head_only(head_file):
    gpu = muser.Head.load(head_file("Q5_K"), device="metal", route="graph")
    prof = gpu.profile(hidden_states(SHAPES["Q5_K"], 2))
    labels = [p.label for p in prof]
    assert labels.count("lm_head") == 1
    assert [lab for lab in labels if "lm_head" in lab] == ["lm_head"]  # never fused into a softcap step
    assert "softcap_tanh" in labels and all(p.seconds >= 0 for p in prof)


def test_barrier_removed_is_reported_as_a_hazard(head_file):
    gpu = muser.Head.load(head_file("Q5_K"), device="metal", route="graph")
    x = hidden_states(SHAPES["Q5_K"], 2)
    gpu(x)  # clean with every barrier
    # dispatches: norm+gamma, lm_head, logit_scale, softcap_scale_in, tanh, ...: drop the one before tanh
    _core._metal_test_drop_barrier(4)
    with pytest.raises(muser.DeviceError, match="(?i)hazard|overlap|barrier"):
        gpu(x)
    _core._metal_test_drop_barrier(-1)
    gpu(x)


@pytest.mark.skipif(not EMULATED, reason="needs the emulator's fault injection")
def test_failed_command_buffer_is_a_device_error(head_file):
    gpu = muser.Head.load(head_file("Q5_K"), device="metal", route="canonical")
    _core._metal_emu_fail_next_command_buffer("injected: GPU page fault")
    with pytest.raises(muser.DeviceError, match="injected: GPU page fault"):
        gpu(hidden_states(SHAPES["Q5_K"], 1))


@pytest.mark.skipif(not EMULATED, reason="needs the emulator's fault injection")
def test_no_device_is_a_device_error(head_file):
    _core._metal_emu_set_no_device(True)
    with pytest.raises(muser.DeviceError, match="no Metal device"):
        muser.Head.load(head_file("Q5_K"), device="metal")


@pytest.mark.skipif(not _info["metal"], reason=_skip or "-")
def test_library_that_does_not_compile_is_a_device_error_with_its_log(head_file):
    _core._metal_test_library_source("kernel void broken(")
    with pytest.raises(muser.DeviceError, match="does not compile") as e:
        muser.Head.load(head_file("Q5_K"), device="metal")
    assert "error" in str(e.value)  # the compiler's log


@pytest.mark.skipif(not EMULATED, reason="the emulator claims the OS version a test sets")
def test_before_macos_15_safe_math_through_fast_math_off(head_file):
    _core._metal_emu_set_os_version(14, 0)
    path = head_file("Q5_K")
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="metal", route="canonical")
    x = hidden_states(SHAPES["Q5_K"], 3)
    assert_bitwise(gpu(x), cpu(x).copy(), "canonical on the pre-macOS-15 path", "metal")


# ---- route="pinned" on Metal: ggml-metal's own kernels through libggml ----

def _ggml_metal_reason():
    from muser import _ggml

    if not _ggml.available():
        return _ggml.unavailable_reason()
    return _ggml.lib().backend_unavailable_reason("Metal")


# ggml-metal's mul_mat takes f32 activations against the dequantized weight
# while ggml-cpu quantizes the activations first (Q8_K / Q8_0): the two differ
# by that quantization, a few parts in a thousand of a logit; the bound leaves
# room (unverified: no Apple GPU has run it).
PINNED_METAL_BOUND = 2e-2  # of the largest |logit| of the CPU pinned route


@pytest.mark.parametrize("weight_type", ["Q5_K", "Q8_0", "F16"])
def test_pinned_on_metal_is_ggml_metal_close_to_cpu_pinned(head_file, weight_type):
    reason = _ggml_metal_reason()
    if reason:
        pytest.skip(f"no ggml Metal backend (needs an Apple GPU and llama-cpp-python built with Metal): {reason}")
    path = head_file(weight_type)
    gpu = muser.Head.load(path, device="metal", route="pinned")
    cpu = muser.Head.load(path, device="cpu", route="pinned")
    assert gpu._pinned.backend and "metal" in gpu._pinned.backend.lower()
    assert cpu._pinned.backend is None
    assert gpu._pinned.graph_ops() == cpu._pinned.graph_ops() == ["RMS_NORM", "MUL", "MUL_MAT", "SCALE", "SCALE",
                                                                  "UNARY", "SCALE"]
    for t in (1, 8):
        x = hidden_states(SHAPES[weight_type], t)
        g, c = np.asarray(gpu(x)), np.asarray(cpu(x))
        assert g.shape == c.shape == (t, VOCAB)
        assert np.isfinite(g).all()
        err = float(np.abs(g - c).max())
        assert err <= PINNED_METAL_BOUND * float(np.abs(c).max()), f"t={t}: max |metal - cpu| = {err}"
        assert (g.argmax(axis=1) == c.argmax(axis=1)).mean() >= 0.75


def test_pinned_on_metal_without_ggml_metal_is_a_clear_error(head_file):
    from muser import _ggml

    if not _ggml.available():
        pytest.skip(_ggml.unavailable_reason())
    if _ggml_metal_reason() is None:
        pytest.skip("this libggml has Metal: the route runs (test above)")
    with pytest.raises(muser.Error, match="no Metal backend"):
        muser.Head.load(head_file("Q8_0"), device="metal", route="pinned")


def test_metal_bench_runs_and_writes_its_json(tmp_path, capsys):
    import json

    from muser import _metal_bench

    out = tmp_path / "bench.json"
    rc = _metal_bench.main(["--hidden", "256", "--vocab", "2048", "--reps", "1", "--warmup", "0",
                            "--json", str(out)])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["device"] == "metal" and r["emulated"] == EMULATED
    assert r["shape"] == [2048, 256] and r["weight_bytes"] > 0
    assert r["read_limit_s"] > 0 and r["read_limit_after_s"] > 0
    got = {(e["route"], e["acts"], e["t"]) for e in r["routes"]}
    assert got == {(ro, a, t) for ro in ("graph", "fused", "canonical") for a in ("f32", "q8") for t in (1, 8)}
    for e in r["routes"]:
        for k in ("lm_head_s", "nodes_sum_s", "call_s", "lm_head_x_limit", "nodes_x_limit", "call_x_limit"):
            assert e[k] > 0, (e, k)
        assert e["lm_head_x_limit"] == pytest.approx(e["lm_head_s"] / r["read_limit_s"])
    text = capsys.readouterr().out
    assert "read limit" in text
    if EMULATED:
        assert "mean nothing" in text and "mean nothing" in r["note"]


def test_metal_read_bandwidth_times_each_read():
    s = _core.metal_read_bandwidth(1 << 16, 3)
    assert len(s) == 3 and all(v > 0 for v in s)
    with pytest.raises(ValueError):
        _core.metal_read_bandwidth(0, 1)
