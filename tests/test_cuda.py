"""The CUDA backend against the CPU backend (run on a GPU; skipped elsewhere).

canonical: CUDA logits == CPU logits bit for bit (t = 1, 3, 8, 64, every
weight type); graph/fused/reference: the pre-epilogue logits bit for bit
(softcap and logit scale switched off), the full route within the platforms'
tanhf difference; batch rows == single steps; zero-copy device logits through
DLPack and __cuda_array_interface__ (PyTorch, CuPy) and their lifetime;
device hidden states; top-k on the device; errors as muser.Error.
acts="q8": CUDA logits == the CPU's q8 logits bit for bit (every supported
weight type, t = 1 .. 256, chunked columns, seed- and Gemma-shaped rows), batch invariance, the distance
to the f32 route, a clear error for float weights.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest

import muser
from muser import _core

pytest.importorskip("gguf", reason="the gguf package writes the test heads")
from muser.fixtures import write_head_gguf  # noqa: E402

from conftest import assert_bitwise, bits, cuda_skip_reason  # noqa: E402

_skip = cuda_skip_reason()
pytestmark = [pytest.mark.cuda, pytest.mark.skipif(bool(_skip), reason=_skip or "-")]

# hidden sizes chosen to hit the awkward cases: an odd number of K-quant
# blocks, Q8_0 rows that end mid-unit (33 blocks), float rows not a multiple of 32
SHAPES = {"Q5_K": 1280, "Q4_K": 1280, "Q6_K": 1280, "Q8_0": 1056, "F16": 1000, "BF16": 1000, "F32": 1000}
VOCAB = 5003
ROUTES = ("graph", "fused", "canonical", "reference")


@pytest.fixture(scope="module")
def heads_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cuda-heads")


@pytest.fixture(scope="module")
def head_file(heads_dir):
    cache = {}

    def get(weight_type: str) -> str:
        if weight_type not in cache:
            cache[weight_type] = write_head_gguf(heads_dir / f"{weight_type}.gguf", hidden=SHAPES[weight_type],
                                                 vocab=VOCAB, weight_type=weight_type, seed=7)
        return cache[weight_type]
    return get


def hidden_states(H: int, t: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((t, H), dtype=np.float32) * np.float32(1.5)


@pytest.mark.parametrize("weight_type", list(SHAPES))
def test_canonical_bitwise_equal_to_cpu(head_file, weight_type):
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    for t in (1, 3, 8, 64):
        x = hidden_states(SHAPES[weight_type], t, seed=t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} canonical t={t}", "cuda")


@pytest.mark.parametrize("route", ("graph", "fused", "reference"))
@pytest.mark.parametrize("weight_type", list(SHAPES))
def test_pre_epilogue_logits_bitwise_equal_to_cpu(head_file, weight_type, route):
    # softcap and logit scale off: what is left is norm + matvec, which the
    # CUDA kernels compute in the CPU's order
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route=route, softcap=None, logit_scale=None)
    gpu = muser.Head.load(path, device="cuda", route=route, softcap=None, logit_scale=None)
    x = hidden_states(SHAPES[weight_type], 5, seed=11)
    assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} {route} without epilogue", "cuda")


@pytest.mark.parametrize("route", ("graph", "fused", "reference"))
def test_full_route_close_to_cpu(head_file, route):
    # only the platform's tanhf differs (CUDA's vs glibc's: a few ulp of tanh, times cap)
    path = head_file("Q5_K")
    cpu = muser.Head.load(path, device="cpu", route=route)
    gpu = muser.Head.load(path, device="cuda", route=route)
    x = hidden_states(SHAPES["Q5_K"], 8, seed=3)
    got, want = gpu(x), cpu(x).copy()
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    assert np.abs(got).max() < 20.0


@pytest.mark.parametrize("route", ROUTES)
def test_batch_rows_equal_single_steps(head_file, route):
    path = head_file("Q5_K")
    gpu = muser.Head.load(path, device="cuda", route=route)
    x = hidden_states(SHAPES["Q5_K"], 9, seed=5)
    batch = gpu(x).copy()
    for r in range(x.shape[0]):
        assert_bitwise(gpu(x[r]), batch[r], f"{route} row {r} alone vs in a batch of 9", "cuda")


def test_host_logits_are_a_pinned_zero_copy_view(head_file):
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="canonical")
    x = hidden_states(SHAPES["Q5_K"], 2)
    a = gpu(x)
    assert not a.flags.owndata  # a view of the head's buffer
    first = a.copy()
    del gpu
    gc.collect()
    assert_bitwise(a, first, "host view after the head is gone", "cuda")


def test_on_device_logits_zero_copy_torch(head_file):
    torch = pytest.importorskip("torch")
    path = head_file("Q5_K")
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    x = hidden_states(SHAPES["Q5_K"], 4)
    host = gpu(x).copy()
    dev = gpu(x, on_device=True)
    assert dev.shape == (4, VOCAB) and "cuda" in repr(dev)
    t_dl = torch.from_dlpack(dev)
    t_cai = torch.as_tensor(dev, device="cuda")
    assert t_dl.is_cuda and t_dl.data_ptr() == dev.data_ptr == t_cai.data_ptr()  # no copy
    assert_bitwise(t_dl.cpu().numpy(), host, "torch.from_dlpack(device logits)", "cuda")
    del gpu, dev, t_cai
    gc.collect()
    torch.cuda.synchronize()
    # the tensor owns the head's device buffer: still valid without the head
    assert_bitwise(t_dl.cpu().numpy(), host, "device logits after the head is gone", "cuda")


def test_on_device_logits_zero_copy_cupy(head_file):
    cp = pytest.importorskip("cupy")
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="canonical")
    x = hidden_states(SHAPES["Q5_K"], 1)[0]
    host = gpu(x).copy()
    dev = gpu(x, on_device=True)
    assert dev.shape == (VOCAB,)
    a = cp.asarray(dev)
    b = cp.from_dlpack(dev)
    assert a.data.ptr == b.data.ptr == dev.data_ptr
    assert_bitwise(cp.asnumpy(a), host, "cupy.asarray(device logits)", "cuda")
    assert_bitwise(dev.get(), host, "DeviceArray.get()", "cuda")
    del gpu, dev
    gc.collect()
    assert_bitwise(cp.asnumpy(b), host, "cupy view after the head is gone", "cuda")


def test_device_hidden_states(head_file):
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("cupy")
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="canonical")
    x = hidden_states(SHAPES["Q5_K"], 3)
    want = gpu(x).copy()
    assert_bitwise(gpu(torch.from_numpy(x).cuda()), want, "torch hidden -> host logits", "cuda")
    assert_bitwise(gpu(cp.asarray(x)), want, "cupy hidden -> host logits", "cuda")
    dev = gpu(torch.from_numpy(x).cuda(), on_device=True)
    assert_bitwise(dev.get(), want, "torch hidden -> device logits", "cuda")
    assert_bitwise(gpu(torch.from_numpy(x[1]).cuda()), want[1], "one device hidden state", "cuda")
    with pytest.raises(TypeError):
        gpu(torch.zeros((1, SHAPES["Q5_K"]), dtype=torch.float16, device="cuda"))
    with pytest.raises(ValueError):
        gpu(torch.zeros((1, 7), device="cuda"))
    with pytest.raises(ValueError):
        gpu(torch.from_numpy(x).cuda().t())  # not C-contiguous


def test_nonfinite_device_hidden_is_named(head_file):
    torch = pytest.importorskip("torch")
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="graph")
    x = hidden_states(SHAPES["Q5_K"], 3)
    x[2, 17] = np.nan
    with pytest.raises(muser.NonFiniteError, match="row 2, column 17"):
        gpu(torch.from_numpy(x).cuda())
    with pytest.raises(muser.NonFiniteError, match="row 2, column 17"):
        gpu(x)
    out = gpu(torch.from_numpy(x).cuda(), check_finite=False)
    assert np.isnan(out[2]).all() and np.isfinite(out[:2]).all()


@pytest.mark.parametrize("route", ("graph", "canonical"))
def test_topk_and_argmax_on_device(head_file, route):
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route=route)
    x = hidden_states(SHAPES["Q5_K"], 6, seed=9)
    logits = gpu(x).copy()
    for k in (1, 5, 64, 1024, 2000):
        vals, ids, _ = gpu.topk(x, k)
        want_ids, want_vals = _core.topk_rows(logits, k)
        assert np.array_equal(ids, np.asarray(want_ids).reshape(6, k)), f"k={k}"
        assert_bitwise(vals, np.asarray(want_vals, dtype=np.float32).reshape(6, k), f"top-{k} values", "cuda")
    assert np.array_equal(gpu.argmax(x), np.argmax(logits, axis=1))
    assert gpu.argmax(x[4]) == int(np.argmax(logits[4]))
    vals, ids, _ = gpu.topk(x[0], 3)
    assert ids.shape == (3,) and vals.shape == (3,)


def test_topk_ties_go_to_the_lowest_id(heads_dir):
    H, V = 512, 3000
    w = np.random.default_rng(4).standard_normal((V, H), dtype=np.float32) * np.float32(0.02)
    w[7] = w[10] = w[1700] = w[2500] = w[7] * 3  # four identical rows, the best by far
    path = write_head_gguf(heads_dir / "ties.gguf", hidden=H, vocab=V, weight_type="Q8_0", weight=w, seed=4)
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    x = np.ascontiguousarray(w[7][None, :] * 50.0, dtype=np.float32)
    vals, ids, _ = gpu.topk(x, 4)
    assert ids.tolist() == [[7, 10, 1700, 2500]] and len(set(bits(vals[0]).tolist())) == 1
    assert gpu.argmax(x[0]) == 7


def test_profile_books_the_lm_head_under_its_own_label(heads_dir):
    path = write_head_gguf(heads_dir / "profile.gguf", hidden=1024, vocab=32771, weight_type="Q5_K", seed=2)
    gpu = muser.Head.load(path, device="cuda", route="graph", fuse=False)  # every node its own kernel
    x = hidden_states(1024, 1)
    gpu(x)
    prof = gpu.profile(x)
    assert [p.label for p in prof] == [label for label, _ in gpu.nodes]
    by_label = {p.label: p for p in prof}
    head_time = by_label["lm_head"].seconds
    assert head_time > 0 and all(p.seconds >= 0 for p in prof)
    assert head_time == max(p.seconds for p in prof)
    assert head_time > sum(by_label[k].seconds for k in ("softcap_scale_in", "softcap_tanh", "softcap_scale_out"))


def test_bad_ordinal_is_a_device_error(head_file):
    with pytest.raises(muser.DeviceError, match="cuda:99"):
        muser.Head.load(head_file("Q5_K"), device="cuda:99")


def test_out_of_memory_is_a_device_error_naming_bytes():
    with pytest.raises(muser.DeviceError, match=r"out of device memory .* 1,125,899,906,842,624 bytes"):
        _core.cuda_read_bandwidth(1 << 50, 1)
    # the device is still usable afterwards
    assert len(_core.cuda_read_bandwidth(1 << 20, 2)) == 2


# ---- acts="q8": int8 activations, integer dot products on the tensor cores ----

Q8_TYPES = ("Q5_K", "Q4_K", "Q6_K", "Q8_0")


@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_q8_bitwise_equal_to_cpu(head_file, weight_type):
    # the same quantizer and the same float chain as the CPU's q8 mode (docs/numerics.md, "CUDA q8"):
    # t = 9 and 17 use token tiles of 16 and 32 with rows left over, 70 two launches
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route="canonical", acts="q8")
    gpu = muser.Head.load(path, device="cuda", route="canonical", acts="q8")
    for t in (1, 3, 8, 9, 17, 64, 70):
        x = hidden_states(SHAPES[weight_type], t, seed=100 + t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} q8 t={t}", "cuda")


@pytest.mark.parametrize("weight_type", ("Q5_K", "Q8_0", "Q6_K"))
def test_q8_bitwise_equal_to_cpu_when_columns_are_staged_in_chunks(heads_dir, weight_type):
    # 64 tokens of 4096 columns do not fit one CTA's shared memory: the kernel stages column chunks
    path = write_head_gguf(heads_dir / f"q8-wide-{weight_type}.gguf", hidden=4096, vocab=777, weight_type=weight_type,
                           seed=12)
    cpu = muser.Head.load(path, device="cpu", route="graph", acts="q8", softcap=None, logit_scale=None)
    gpu = muser.Head.load(path, device="cuda", route="graph", acts="q8", softcap=None, logit_scale=None)
    for t in (64, 20):
        x = hidden_states(4096, t, seed=t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} q8 wide t={t}", "cuda")


@pytest.mark.parametrize("weight_type,hidden,t", [("Q5_K", 16384, 8), ("Q8_0", 16384, 7), ("Q5_K", 98304, 1),
                                                  ("Q6_K", 16384, 8), ("Q6_K", 98304, 1)])
def test_q8_staged_kernel_bitwise_equal_to_cpu_with_column_chunks(heads_dir, weight_type, hidden, t):
    # t <= 8 runs the staged kernel; these widths overflow its 100 KB of staged quants and
    # records, so it stages column chunks (the records at their padded pitch, from a chunk's
    # first block on); t = 1 is its one-token variant
    path = write_head_gguf(heads_dir / f"q8-staged-{weight_type}-{hidden}.gguf", hidden=hidden, vocab=300,
                           weight_type=weight_type, seed=14, random_quants=True)
    cpu = muser.Head.load(path, device="cpu", route="graph", acts="q8", softcap=None, logit_scale=None)
    gpu = muser.Head.load(path, device="cuda", route="graph", acts="q8", softcap=None, logit_scale=None)
    x = hidden_states(hidden, t, seed=hidden + t)
    assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} q8 staged H={hidden} t={t}", "cuda")


@pytest.mark.parametrize("route", ("graph", "fused", "reference"))
def test_q8_pre_epilogue_logits_bitwise_equal_to_cpu(head_file, route):
    path = head_file("Q5_K")
    cpu = muser.Head.load(path, device="cpu", route=route, acts="q8", softcap=None, logit_scale=None)
    gpu = muser.Head.load(path, device="cuda", route=route, acts="q8", softcap=None, logit_scale=None)
    x = hidden_states(SHAPES["Q5_K"], 5, seed=13)
    assert_bitwise(gpu(x), cpu(x).copy(), f"Q5_K q8 {route} without epilogue", "cuda")


@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_q8_batch_rows_equal_single_steps(head_file, weight_type):
    gpu = muser.Head.load(head_file(weight_type), device="cuda", route="graph", acts="q8")
    x = hidden_states(SHAPES[weight_type], 11, seed=6)
    batch = gpu(x).copy()
    for r in range(x.shape[0]):
        assert_bitwise(gpu(x[r]), batch[r], f"{weight_type} q8 row {r} alone vs in a batch of 11", "cuda")
    again = gpu(x).copy()
    assert_bitwise(again, batch, f"{weight_type} q8 run twice", "cuda")


# max |q8 - f32| of the canonical logits on these heads and inputs (|logit| <= 0.64), measured
# with the CPU's q8 mode, which CUDA equals bit for bit: Q5_K 0.0041, Q4_K 0.0042, Q6_K 0.0041,
# Q8_0 0.0031 (Q8_K's one scale per 256 against Q8_0's per 32); asserted with a 2.5x margin
Q8_VS_F32_BOUND = {"Q5_K": 0.01, "Q4_K": 0.01, "Q6_K": 0.01, "Q8_0": 0.008}


@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_q8_close_to_the_f32_route(head_file, weight_type):
    path = head_file(weight_type)
    x = hidden_states(SHAPES[weight_type], 8, seed=21)
    f32 = muser.Head.load(path, device="cuda", route="canonical")(x).astype(np.float64)
    q8 = muser.Head.load(path, device="cuda", route="canonical", acts="q8")(x).astype(np.float64)
    delta = np.abs(q8 - f32).max()
    assert 0 < delta < Q8_VS_F32_BOUND[weight_type], delta
    top2 = -np.partition(-f32, 1, axis=1)[:, :2]
    clear = top2[:, 0] - top2[:, 1] > 2 * delta
    assert np.array_equal(q8.argmax(1)[clear], f32.argmax(1)[clear])


@pytest.mark.parametrize("weight_type", ("F16", "BF16", "F32"))
def test_q8_refuses_float_weights_clearly(head_file, weight_type):
    # as on the CPU (ggml has no int8 activation mode for float weights): refused at load, and
    # the CUDA device refuses too should a head reach it
    with pytest.raises(ValueError, match=rf"acts='q8'.*{weight_type}.*acts='f32'"):
        gpu = muser.Head.load(head_file(weight_type), device="cuda", acts="q8")
        gpu(hidden_states(SHAPES[weight_type], 1))


def test_on_device_needs_a_cuda_head(head_file):
    cpu = muser.Head.load(head_file("Q5_K"), device="cpu")
    with pytest.raises(ValueError, match="memory of its own"):
        cpu(hidden_states(SHAPES["Q5_K"], 1), on_device=True)


@pytest.mark.parametrize("acts", ("q8", "f32"))
@pytest.mark.parametrize("route", ("graph", "canonical", "fused"))
def test_cuda_plans_only_the_fusions_it_has_kernels_for(head_file, route, acts):
    # the route allows norm+γ (and on fused/canonical matvec+epilogue); CUDA has two fused kernels:
    # RMSNorm + γ + the activation quantizer where a q8 matvec follows, and the q8 matvec storing
    # through the fused route's soft cap. Every other step is one node, the profile says which,
    # and fusing changes no byte -- neither where the matvec applies the cap (t <= 16) nor where
    # its larger token tiles leave the cap to a kernel of its own (t = 20; on an sm_90 device
    # t = 100, 200 and 300 through the wgmma kernels, 300's last 44 tokens through mma.sync)
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route=route, acts=acts)
    labels = [label for label, _ in gpu.nodes]
    kinds = [kind for _, kind in gpu.nodes]
    fused = route == "fused" and acts == "q8"
    expected = [(label,) for label in labels]
    if fused:
        at = labels.index("lm_head")
        assert at == len(labels) - 2, labels  # the fused route's one soft-cap node follows the matvec
        expected[at:] = [tuple(labels[at:])]
    if acts == "q8":
        assert kinds[:2] == [("rms_norm" if route != "canonical" else "rms_norm_canonical"), "mul"], kinds
        expected[:2] = [tuple(labels[:2])]
    assert gpu.steps == expected
    x = hidden_states(SHAPES["Q5_K"], 3, seed=61)
    assert [p.label for p in gpu.profile(x)] == ["+".join(step) for step in expected]
    apart = muser.Head.load(head_file("Q5_K"), device="cuda", route=route, acts=acts, fuse=False)
    assert apart.steps == [(label,) for label in labels]
    for t in (1, 3, 20, 100, 200, 300):
        x = hidden_states(SHAPES["Q5_K"], t, seed=61 + t)
        assert_bitwise(gpu(x), apart(x), f"{route}/{acts} t={t}", "cuda")


# ---- how a call runs: the route as one cached CUDA graph with programmatic dependent launches ----

def _run_logits(gpu, x, profile: bool) -> np.ndarray:
    """The device logits of one run: profile=False is a call's path (the cached graph,
    kernels overlapping through PDL), profile=True runs each node between its own events."""
    nd, addr, _ = _core.device_run(gpu._core, x, 0, x.shape[0], False, profile, True)
    return _core.cuda_copy_to_host(addr, x.shape[0] * gpu.spec.vocab_size).reshape(x.shape[0], -1)


@pytest.mark.parametrize("acts", ("f32", "q8"))
@pytest.mark.parametrize("route", ("graph", "fused", "canonical"))
def test_call_graph_equals_node_by_node_run(head_file, route, acts):
    # t changes between calls (the cached graph is captured anew), then repeats (replayed)
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route=route, acts=acts)
    for t in (1, 3, 1, 8, 8, 3):
        x = hidden_states(SHAPES["Q5_K"], t, seed=40 + t)
        assert_bitwise(_run_logits(gpu, x, False), _run_logits(gpu, x, True), f"{route} {acts} t={t}", "cuda")


def test_route_seconds_times_the_call_graph(head_file):
    from muser import _cuda

    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="fused", acts="q8")
    x = hidden_states(SHAPES["Q5_K"], 2, seed=3)
    before = gpu(x).copy()
    seconds = _cuda.route_seconds(gpu, x, 4)
    assert len(seconds) == 4 and all(0 < s < 1 for s in seconds)
    assert_bitwise(gpu(x), before, "a call after route_seconds", "cuda")
    with pytest.raises(ValueError, match="reps"):
        _cuda.route_seconds(gpu, x, 0)


def test_held_timing_excludes_the_hold(head_file):
    # held: each run waits behind a kernel that keeps the stream busy for 200 us;
    # the timed span must start after it (a small head's route takes ~20 us)
    from muser import _cuda

    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="graph", acts="q8")
    x = hidden_states(SHAPES["Q5_K"], 1, seed=4)
    held = _cuda.route_seconds(gpu, x, 5, held=True)
    assert len(held) == 5 and all(0 < s < 150e-6 for s in held), held
    reads = _cuda.read_bandwidth(1 << 20, 5, held=True)
    assert len(reads) == 5 and all(0 < s < 150e-6 for s in reads), reads


def test_weight_larger_than_the_upload_staging_buffer(heads_dir):
    # 70 MB of Q4_K rows go through the 64 MB staging buffer in two pieces; the tiles of the
    # second piece, and the padded last tile (30,011 rows), must land where the kernels look
    path = write_head_gguf(heads_dir / "big.gguf", hidden=4096, vocab=30011, weight_type="Q4_K", seed=21,
                           random_quants=True)
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    x = hidden_states(4096, 2, seed=22)
    assert_bitwise(gpu(x), cpu(x).copy(), "Q4_K 30,011 x 4,096 canonical", "cuda")


@pytest.mark.parametrize("acts", ("f32", "q8"))
def test_device_hidden_states_at_changing_addresses(head_file, acts):
    # each new address updates the cached graph (cudaGraphExecUpdate) instead of reusing a stale pointer
    torch = pytest.importorskip("torch")
    cpu = muser.Head.load(head_file("Q5_K"), device="cpu", route="canonical", acts=acts)
    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="canonical", acts=acts)
    xs = [hidden_states(SHAPES["Q5_K"], 2, seed=60 + i) for i in range(3)]
    held = [torch.from_numpy(x).cuda() for x in xs]  # three live buffers: three addresses
    for i in (0, 1, 2, 1, 0, 2):
        assert_bitwise(gpu(held[i]), cpu(xs[i]).copy(), f"{acts} device buffer {i}", "cuda")
    for i in range(3):  # a fresh tensor per call, as a model loop might hand over
        assert_bitwise(gpu(torch.from_numpy(xs[i]).cuda()[:1]), cpu(xs[i][:1]).copy(), f"{acts} fresh tensor {i}",
                       "cuda")


@pytest.mark.parametrize("route", ("canonical", "graph"))
def test_layer_norm_head_bitwise_equal_to_cpu(heads_dir, route):
    # command-r: LayerNorm (ggml order on graph, canonical order on canonical), gamma, a logit scale
    path = write_head_gguf(heads_dir / "command-r.gguf", arch="command-r", hidden=1280, vocab=777, weight_type="Q5_K",
                           logit_scale=0.0625, softcap=None, tied=True, norm_bias=True, seed=31)
    cpu = muser.Head.load(path, device="cpu", route=route)
    gpu = muser.Head.load(path, device="cuda", route=route)
    assert gpu.spec.norm == "layer"
    for t in (1, 3):
        x = hidden_states(1280, t, seed=70 + t) + np.float32(0.75)  # a mean away from zero
        assert_bitwise(gpu(x), cpu(x).copy(), f"command-r {route} t={t}", "cuda")


# RMSNorm + γ + the activation quantizer are one kernel on q8 routes (rms_norm_gamma_q8): a token's
# row split over CTAs of 2,048 columns, each with the whole row's statistic; the row and the CTA's γ
# staged in shared memory up to 22,528 columns, read in place beyond that or where the hidden state is
# not 16-byte aligned -- the same bytes as the CPU (canonical) and as the nodes apart
@pytest.mark.parametrize("route", ("canonical", "fused", "graph"))
@pytest.mark.parametrize("hidden", (12544, 22784))  # 49 Q8_K blocks: 7 CTAs a token; 89: past the 96 KB staged
def test_norm_gamma_quantizer_kernel_on_long_rows(heads_dir, route, hidden):
    path = write_head_gguf(heads_dir / f"q8-long-rows-{hidden}.gguf", hidden=hidden, vocab=517, weight_type="Q5_K",
                           seed=41, random_quants=True)
    gpu = muser.Head.load(path, device="cuda", route=route, acts="q8")
    apart = muser.Head.load(path, device="cuda", route=route, acts="q8", fuse=False)
    assert gpu.steps[0] == ("final_norm", "final_norm_gamma") and len(apart.steps[0]) == 1
    cpu = muser.Head.load(path, device="cpu", route=route, acts="q8") if route == "canonical" else None
    for t in (1, 3):
        x = hidden_states(hidden, t, seed=90 + t)
        got = gpu(x).copy()
        assert_bitwise(got, apart(x).copy(), f"{route} t={t}: fused prologue against the nodes apart", "cuda")
        if cpu is not None:
            assert_bitwise(got, cpu(x).copy(), f"{route} t={t}", "cuda")


@pytest.mark.parametrize("weight_type", ("Q8_0", "Q6_K"))
def test_norm_gamma_quantizer_kernel_reads_an_unaligned_hidden_state_in_place(head_file, weight_type):
    torch = pytest.importorskip("torch")
    H = SHAPES[weight_type]
    cpu = muser.Head.load(head_file(weight_type), device="cpu", route="canonical", acts="q8")
    gpu = muser.Head.load(head_file(weight_type), device="cuda", route="canonical", acts="q8")
    x = hidden_states(H, 1, seed=17)[0]
    buf = torch.zeros(H + 1, dtype=torch.float32, device="cuda")
    buf[1:] = torch.from_numpy(x).cuda()
    view = buf[1:]  # 4 bytes past a 16-byte boundary
    assert view.data_ptr() % 16 == 4
    assert_bitwise(gpu(view), cpu(x).copy(), f"{weight_type} unaligned device hidden state", "cuda")


# ---------------------------------------------------------------- reliability on the GPU

def test_held_device_and_host_results_are_never_overwritten(head_file):
    gpu = muser.Head.load(head_file("Q8_0"), device="cuda", route="canonical")
    x = hidden_states(SHAPES["Q8_0"], 2, seed=3)
    want = [gpu(x[i]).copy() for i in range(2)]
    dev0 = gpu(x[0], on_device=True)
    host0 = gpu(x[0])
    held = [gpu(x[1], on_device=True) for _ in range(6)]  # more than the pool: one-off buffers too
    assert len({d.data_ptr for d in held + [dev0]}) == 7
    assert_bitwise(dev0.get(), want[0], "device view after later calls", "cuda")
    assert_bitwise(host0, want[0], "host view after later calls", "cuda")
    for d in held:
        assert_bitwise(d.get(), want[1], "each held device result", "cuda")
    addresses = {gpu(x[0], on_device=True).data_ptr for _ in range(10)}  # dropped at once: reused
    assert len(addresses) == 1


def test_eight_threads_share_a_cuda_head(head_file):
    import threading

    gpu = muser.Head.load(head_file("Q5_K"), device="cuda", route="canonical", acts="q8")
    xs = [hidden_states(SHAPES["Q5_K"], 3, seed=s) for s in range(6)]
    serial = [gpu(x).copy() for x in xs]
    ids = np.array([[3, 70], [5, 5], [4999, 0]])
    serial_score = [gpu.score(x, ids) for x in xs]
    serial_lsm = [np.array(gpu.log_softmax(x)) for x in xs]
    wrong = []

    def worker(seed):
        try:
            work(seed)
        except Exception as e:  # noqa: BLE001 -- an exception in a thread is a wrong result, not a warning
            wrong.append((seed, "raised", repr(e)))

    def work(seed):
        r = np.random.default_rng(seed)
        for c in range(150):
            i, kind = int(r.integers(len(xs))), int(r.integers(6))
            if kind == 0:
                ok = np.array_equal(gpu(xs[i]), serial[i])
            elif kind == 1:
                d = gpu(xs[i], on_device=True)
                ok = np.array_equal(d.get(), serial[i])
            elif kind == 2:
                ok = np.array_equal(gpu.argmax(xs[i]), np.argmax(serial[i], axis=1))
            elif kind == 3:
                _, top, _ = gpu.topk(xs[i], 4)
                ok = np.array_equal(top, np.argsort(-serial[i], axis=1, kind="stable")[:, :4])
            elif kind == 4:  # the score graph, its pinned transfers and scratch under the shared head
                got = gpu.score(xs[i], ids)
                ok = np.array_equal(got.logprobs, serial_score[i].logprobs) and \
                    np.array_equal(got.ranks, serial_score[i].ranks)
            else:
                ok = np.array_equal(gpu.log_softmax(xs[i]), serial_lsm[i])
            if not ok:
                wrong.append((seed, c, kind))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} wrong results: {wrong[:5]}"


def test_fifty_load_step_del_cycles_return_device_memory_to_its_baseline(head_file):
    path = head_file("Q5_K")
    x = hidden_states(SHAPES["Q5_K"], 8)
    head = muser.Head.load(path, device="cuda", route="fused", acts="q8")  # the CUDA context and caches
    head(x)
    del head
    gc.collect()
    baseline = _core.cuda_memory_info(0)[0]
    for i in range(50):
        head = muser.Head.load(path, device="cuda", route="canonical" if i % 2 else "fused", acts="q8")
        head(x)
        head.argmax(x)
        kept = head(x, on_device=True)  # outlives the head until it is dropped
        del head
        del kept
        if i % 10 == 9:
            gc.collect()
    gc.collect()
    free_after = _core.cuda_memory_info(0)[0]
    # the weight alone is 5003 rows x 880 bytes; a leak of it per cycle is > 200 MB over 50
    assert baseline - free_after <= 4 << 20, f"{(baseline - free_after) / 1e6:.1f} MB of device memory not returned"


# ---- batches (issue 14): every kernel tier of t, on every weight type, bit for bit ----
# t = 2..8: the staged q8 kernel; 9..32: its batch tiers (2, 4 token tiles per warp; the
# streamed kernel where a tier's activations do not fit whole: WIDE_HEADS below);
# from 49 on the Q4_K/Q5_K batches of an sm_90 device take the wgmma kernels (a launch of
# 49..80 on the warp-specialized kernel, computed as 64 or 80, one of 81..128 on the
# two-warpgroup kernel, computed as a multiple of 16, one of 129..256 on the shared-decode
# kernel, computed as two groups of 80..128; a last part of fewer than 49 on the kernels
# above: 50, 64, 65, 90, 100, 128, 129, 192, 200 and 256 end a launch in every way), and
# from 33 on the Q6_K ones (33, 41, 50 and 64 are computed as 64; 129..256 on the
# shared-decode kernel with two decoders; MUSER_Q8_SHARED=65 puts 65..128 on it, as
# groups of 64, for a run that tests those),
# the other types and devices launches of 32; the canonical route: its 1..64
# tiles, and on the seed's hidden size tiles of 8 (x of more tokens does not fit shared
# memory whole)

BATCH_TOKENS = (1, 2, 3, 8, 12, 15, 16, 17, 24, 33, 41, 50, 64, 65, 90, 100, 128, 129, 192, 200, 256)


@pytest.mark.parametrize("weight_type", Q8_TYPES)
def test_q8_bitwise_equal_to_cpu_at_every_batch_size(head_file, weight_type):
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route="canonical", acts="q8")
    gpu = muser.Head.load(path, device="cuda", route="canonical", acts="q8")
    for t in BATCH_TOKENS:
        x = hidden_states(SHAPES[weight_type], t, seed=300 + t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} q8 t={t}", "cuda")


@pytest.mark.parametrize("weight_type", list(SHAPES))
def test_canonical_bitwise_equal_to_cpu_at_every_batch_size(head_file, weight_type):
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    for t in BATCH_TOKENS:
        x = hidden_states(SHAPES[weight_type], t, seed=400 + t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} canonical t={t}", "cuda")


# the wide kernel (Q4_K/Q5_K: 8 rows x 8 token slots per warp): t = 6, 7 leave slots
# empty (t = 5 stays on the 4-row kernel); tiles of 9..16 tokens run the stream kernel;
# from 25 tokens the shared-decode kernel (32 rows x 32 tokens a CTA) runs tiles of 32,
# the last one computed as 32 when it holds 25..31 tokens, else as tiles of 16 and 8
# (t = 17, 31, 32, 48, 63, 65, 130 end a tile in each way); 5,003 rows end inside a
# warp's 8 rows, a CTA's 32 and a wide CTA's 96
@pytest.mark.parametrize("weight_type", ("Q5_K", "Q4_K"))
def test_canonical_wide_and_shared_decode_kernels_bitwise_equal_to_cpu(head_file, weight_type):
    path = head_file(weight_type)
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    for t in (5, 6, 7, 9, 13, 17, 31, 32, 48, 63, 65, 130):
        x = hidden_states(SHAPES[weight_type], t, seed=700 + t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} canonical t={t}", "cuda")


# the large-tile kernels (Q4_K/Q5_K: wide tiles of 8, stream 16, shared-decode 32 tokens)
# with more row groups than an H200 has SMs, so that a persistent CTA walks several, and
# with one unit a row (256 columns: the double buffers swap at every unit); 40,003 rows end
# inside a CTA's rows; t = 9 .. 130 end a tile in each way
@pytest.mark.parametrize("hidden", (256, 512))
@pytest.mark.parametrize("weight_type", ("Q5_K", "Q4_K"))
def test_canonical_large_tiles_over_several_row_groups_bitwise_equal_to_cpu(heads_dir, weight_type, hidden):
    path = write_head_gguf(heads_dir / f"row-groups-{weight_type}-{hidden}.gguf", hidden=hidden, vocab=40003,
                           weight_type=weight_type, seed=41, random_quants=True)
    cpu = muser.Head.load(path, device="cpu", route="canonical")
    gpu = muser.Head.load(path, device="cuda", route="canonical")
    for t in (9, 16, 17, 32, 33, 64, 77, 130):
        x = hidden_states(hidden, t, seed=900 + t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} canonical t={t} over 40,003 rows of {hidden}", "cuda")


# the seed's hidden size (6,656: q8 batches of 17..32 tokens of Q4_K/Q5_K/Q8_0 do not fit in
# shared memory whole and stream their activations unit by unit, matvec_q8_stream_kernel; the
# canonical route tiles by 8) and the Gemma-3 one (640 x Q8_0: everything staged whole), with
# fewer rows
WIDE_HEADS = {"seed-Q5_K": (6656, 2053, "Q5_K"), "seed-Q4_K": (6656, 1031, "Q4_K"), "seed-Q6_K": (6656, 1031, "Q6_K"),
              "seed-Q8_0": (6656, 1031, "Q8_0"), "gemma-Q8_0": (640, 4099, "Q8_0")}


@pytest.fixture(scope="module")
def wide_head(heads_dir):
    cache = {}

    def get(name: str) -> str:
        if name not in cache:
            hidden, vocab, weight_type = WIDE_HEADS[name]
            cache[name] = write_head_gguf(heads_dir / f"wide-{name}.gguf", hidden=hidden, vocab=vocab,
                                          weight_type=weight_type, seed=31, random_quants=True)
        return cache[name]
    return get


@pytest.mark.parametrize("acts", ("q8", "f32"))
@pytest.mark.parametrize("name", list(WIDE_HEADS))
def test_wide_heads_bitwise_equal_to_cpu_and_rows_equal_single_steps(wide_head, name, acts):
    hidden = WIDE_HEADS[name][0]
    path = wide_head(name)
    cpu = muser.Head.load(path, device="cpu", route="canonical", acts=acts)
    gpu = muser.Head.load(path, device="cuda", route="canonical", acts=acts)
    for t in (2, 16, 17, 64, 100, 256) if acts == "q8" else (2, 9, 33, 100):
        x = hidden_states(hidden, t, seed=500 + t)
        batch = gpu(x).copy()
        assert_bitwise(batch, cpu(x).copy(), f"{name} {acts} t={t}", "cuda")
        for r in sorted({0, 7, 8, 15, 16, 63, t - 1} & set(range(t))):
            assert_bitwise(gpu(x[r]), batch[r], f"{name} {acts} row {r} alone vs in a batch of {t}", "cuda")


# more row groups than an H200 has SMs (40,003 rows: 313 groups of 128 over 132 CTAs, 626
# of 64), so the persistent wgmma kernels walk several groups a CTA and their rings run on
# across groups: every wgmma launch shape (49..80 decoder warpgroups, 81..128 two,
# 129..256 shared decode, a last part on the mma.sync kernels; Q6_K: 33..128 on two) bit
# for bit
@pytest.mark.parametrize("weight_type", ("Q5_K", "Q4_K", "Q6_K"))
def test_q8_batches_of_several_row_groups_per_cta_bitwise_equal_to_cpu(heads_dir, weight_type):
    hidden = 512
    path = write_head_gguf(heads_dir / f"groups-{weight_type}.gguf", hidden=hidden, vocab=40003,
                           weight_type=weight_type, seed=37, random_quants=True)
    cpu = muser.Head.load(path, device="cpu", route="canonical", acts="q8")
    gpu = muser.Head.load(path, device="cuda", route="canonical", acts="q8")
    for t in (33, 49, 80, 81, 128, 177, 208):
        x = hidden_states(hidden, t, seed=800 + t)
        assert_bitwise(gpu(x), cpu(x).copy(), f"{weight_type} q8 t={t} over 40,003 rows", "cuda")


@pytest.mark.parametrize("weight_type", ("Q5_K", "Q4_K", "Q6_K", "Q8_0"))
def test_selection_inside_the_q8_matvec_ranks_as_the_logits_do(heads_dir, weight_type):
    # On the fused q8 route, calls of up to 16 tokens select inside the matvec: argmax
    # entirely (the logits are never written; the launch's last CTA writes the ids), and for
    # up to 2 tokens top-k's chunk bests (k <= 40, the 40,003 rows' chunks; Q5_K/Q4_K/Q8_0),
    # which the launch's last CTA ranks (MUSER_SELECT_IN_MATVEC=0 or =argmax: the separate
    # kernels). Both must rank as that route's own logits do -- ties to the lowest id, NaN
    # last -- over several row groups a CTA, call after call as t, k and the calls in between
    # change (t = 17 for argmax, t = 3, 8, 9, 16, 17 and k = 41 for top-k take the kernels
    # after the matvec).
    import gguf

    hidden, vocab = SHAPES[weight_type], 40003
    w = np.random.default_rng(41).standard_normal((vocab, hidden), dtype=np.float32) * np.float32(0.02)
    w[[9, 31000, 39999]] = w[20000] = w[9] * 2  # four identical rows: token 0 (below) points at them
    path = write_head_gguf(heads_dir / f"argmax-{weight_type}.gguf", hidden=hidden, vocab=vocab,
                           weight_type=weight_type, weight=w, seed=41)
    if weight_type == "Q8_0":  # row 9's block scales NaN: its logits are NaN, ranked last
        t = next(t for t in gguf.GGUFReader(path).tensors if t.name == "output.weight")
        row_bytes = hidden // 32 * 34
        with open(path, "r+b") as f:
            for b in range(hidden // 32):
                f.seek(int(t.data_offset) + 9 * row_bytes + 34 * b)
                f.write(np.float16(np.nan).tobytes())
    gpu = muser.Head.load(path, device="cuda", route="fused", acts="q8")
    toward = np.ascontiguousarray(w[9] * 40.0, dtype=np.float32)
    held = []
    for i, t in enumerate((1, 3, 8, 16, 17, 2, 1, 9)):
        x = hidden_states(hidden, t, seed=900 + t)
        x[0] = toward  # token 0 points at the tied rows
        logits = gpu(x, check_finite=False).copy()
        if weight_type == "Q8_0":
            assert np.isnan(logits[:, 9]).all()
        want = np.asarray(_core.argmax_rows(logits), dtype=np.int64)
        assert want[0] == (20000 if weight_type == "Q8_0" else 9)
        got = gpu.argmax(x)
        assert np.array_equal(got, want), f"{weight_type} t={t}: {got} against {want}"
        assert gpu.argmax(x[0]) == want[0]
        for k in (1, 4, 40, 41):
            vals, ids, _ = gpu.topk(x, k)
            want_ids, want_vals = _core.topk_rows(logits, k)
            assert np.array_equal(ids, np.asarray(want_ids).reshape(t, k)), f"{weight_type} t={t} top-{k}"
            assert_bitwise(vals, np.asarray(want_vals, dtype=np.float32).reshape(t, k), f"t={t} top-{k} values", "cuda")
        if i % 2:
            held.append(gpu(x, on_device=True))  # the next calls take other pooled buffers


def test_the_cuda_bench_runs_every_route_on_a_small_head(capsys):
    # bench/cuda_head.py on a small shape: it must find each route's matvec in the profile
    # ("lm_head", or "lm_head+softcap" where the fused q8 matvec stores through the cap)
    pytest.importorskip("torch", reason="the bench makes its device hidden states with torch")
    from muser._cuda_bench import main

    assert main(["--hidden", "256", "--vocab", "5003", "--weight-type", "Q8_0", "--tokens", "1,3", "--reps", "2",
                 "--warmup", "1", "--no-torch"]) == 0
    out = capsys.readouterr().out
    for route in ("graph", "fused", "canonical"):
        for acts in ("f32", "q8"):
            assert any(line.split()[:3] == [route, acts, "3"] for line in out.splitlines()), (route, acts)
