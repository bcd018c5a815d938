"""What a hurried caller or a changing file must never do to a Head: threads
that share it get their own results; a read-only ``out=`` is refused and left
untouched; a file changed after load is a GGUFError, never SIGBUS or silently
different logits; odd alignments are refused (files) or copied (arrays);
metadata a float32 head cannot compute with is a SpecError naming the key;
paths that are not regular files never block; nothing leaks over many loads.

Probes that could kill the interpreter (SIGBUS, SIGSEGV) run in a subprocess
so a regression fails the test instead of the test run."""
from __future__ import annotations

import gc
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import muser
from muser.fixtures import write_head_gguf

from conftest import hidden_states

H, V = 256, 3000


@pytest.fixture
def small_head(head_file):
    return head_file(hidden=H, vocab=V, weight_type="Q8_0")


# ---------------------------------------------------------------- threads

# Symbols every ELF shared object defines for the dynamic linker itself.
_LINKER_SYMBOLS = {"_init", "_fini", "__bss_start", "_edata", "_end"}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the ELF symbol-table check is for Linux")
def test_the_extension_exports_its_init_function_alone():
    # Anything else exported can interpose on another library in the process:
    # a statically linked libstdc++'s locale ids crashed a later `import torch`.
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm (binutils) is not installed")
    from muser import _core

    listing = subprocess.run([nm, "-D", "--defined-only", _core.__file__], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in listing.stdout.splitlines() if line.strip()}
    assert exported - _LINKER_SYMBOLS == {"PyInit__core"}


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_torch_imported_after_muser_runs():
    code = "import muser, torch; assert float(torch.ones(3).sum()) == 3.0; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])


def test_eight_threads_mixed_calls_equal_a_serial_run(small_head, rng):
    head = muser.Head.load(small_head, route="canonical", threads=2)
    inputs = [hidden_states(rng, 3, H) for _ in range(12)]
    serial = [np.array(head(x)) for x in inputs]  # row r of a batch equals its single step (bitwise)
    serial_ids = [np.argmax(s, axis=1) for s in serial]
    serial_topk = [np.argsort(-s, axis=1, kind="stable")[:, :5] for s in serial]
    # the consumer's reductions: each call's own scratch and results under the shared head
    score_ids = [rng.integers(0, V, size=(3, 2)) for _ in inputs]
    serial_score = [head.score(x, ids) for x, ids in zip(inputs, score_ids)]
    serial_lsm = [np.array(head.log_softmax(x)) for x in inputs]
    serial_draw = [head.sample(x, seed=3, positions=np.arange(3), temperature=0.8, top_p=0.9).tokens for x in inputs]
    wrong: list[str] = []

    def worker(seed: int) -> None:
        try:
            work(seed)
        except Exception as e:  # noqa: BLE001 -- an exception in a thread is a wrong result, not a warning
            wrong.append(f"thread {seed} raised {e!r}")

    def work(seed: int) -> None:
        r = np.random.default_rng(seed)
        held = []  # results kept across later calls: none may be overwritten
        for c in range(1000):
            i, kind = int(r.integers(len(inputs))), int(r.integers(8))
            x = inputs[i]
            row = int(r.integers(3))
            if kind == 0:
                got = head(x[row])
                if not np.array_equal(got, serial[i][row]):
                    wrong.append(f"head(row) call {c}")
                if r.random() < 0.3:
                    held.append((got, serial[i][row]))
            elif kind == 1:
                got = head(x)
                if not np.array_equal(got, serial[i]):
                    wrong.append(f"head(batch) call {c}")
                if r.random() < 0.3:
                    held.append((got, serial[i]))
            elif kind == 2:
                if head.argmax(x[row]) != serial_ids[i][row] or not np.array_equal(head.argmax(x), serial_ids[i]):
                    wrong.append(f"argmax call {c}")
            elif kind == 3:
                vals, ids, _ = head.topk(x, 5)
                if not np.array_equal(ids, serial_topk[i]) or \
                        not np.array_equal(vals, np.take_along_axis(serial[i], serial_topk[i], 1)):
                    wrong.append(f"topk call {c}")
            elif kind == 4:
                out = np.empty((3, V), np.float32)
                if head(x, out=out) is not out or not np.array_equal(out, serial[i]):
                    wrong.append(f"out= call {c}")
            elif kind == 5:
                got, want = head.score(x, score_ids[i]), serial_score[i]
                if not (np.array_equal(got.logprobs, want.logprobs) and np.array_equal(got.ranks, want.ranks)
                        and np.array_equal(got.logsumexp, want.logsumexp)):
                    wrong.append(f"score call {c}")
            elif kind == 6:
                if not np.array_equal(head.log_softmax(x), serial_lsm[i]):
                    wrong.append(f"log_softmax call {c}")
            else:
                draw = head.sample(x, seed=3, positions=np.arange(3), temperature=0.8, top_p=0.9).tokens
                if not np.array_equal(draw, serial_draw[i]):
                    wrong.append(f"sample call {c}")
            if len(held) > 6:
                held.pop(0)
            for got, want in held:
                if not np.array_equal(got, want):
                    wrong.append(f"a held result changed by call {c}")
                    break

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, f"{len(wrong)} wrong results, first: {wrong[:5]}"


def test_a_result_is_never_overwritten_by_a_later_call(small_head, rng):
    head = muser.Head.load(small_head)
    x, y = hidden_states(rng, 2, H)
    a = head(x)
    a_copy = a.copy()
    b = head(y)
    assert np.array_equal(a, a_copy), "the second call wrote the first call's view"
    assert a.ctypes.data != b.ctypes.data


def test_a_loop_that_drops_its_results_reuses_the_pool(small_head, rng):
    head = muser.Head.load(small_head)
    x = hidden_states(rng, 1, H)[0]
    addresses = set()
    for _ in range(20):
        addresses.add(head(x).ctypes.data)
    assert len(addresses) == 1
    kept = [head(x) for _ in range(head.POOL_SIZE + 3)]  # held results: each its own memory
    assert len({k.ctypes.data for k in kept}) == len(kept)
    assert head.buffer is not None and head.buffer.ndim == 1


# ---------------------------------------------------------------- out=

def _read_only_outs(tmp_path):
    a = np.zeros((1, V), np.float32)
    a.flags.writeable = False
    yield "writeable=False", a
    yield "over bytes", np.frombuffer(bytes(4 * V), dtype=np.float32).reshape(1, V)
    path = tmp_path / "ro.bin"
    path.write_bytes(bytes(4 * V))
    yield "read-only memmap", np.memmap(path, dtype=np.float32, mode="r", shape=(1, V))


def test_log_softmax_in_place_refuses_what_is_not_a_heads_logits(small_head):
    # the binding under head.log_softmax: a clear ValueError for another shape, dtype or
    # layout; on the CPU, whose logits are reduced by the host, False and the array untouched
    head = muser.Head.load(small_head)
    core = head._core
    for bad in (np.zeros((2, V + 1), np.float32), np.zeros((2, V), np.float64), np.zeros((V, 2), np.float32).T,
                np.zeros(V, np.float32), np.zeros((0, V), np.float32)):
        with pytest.raises((ValueError, TypeError)):
            core.log_softmax_in_place(bad)
    logits = np.arange(2 * V, dtype=np.float32).reshape(2, V)
    assert core.log_softmax_in_place(logits) is False
    assert np.array_equal(logits, np.arange(2 * V, dtype=np.float32).reshape(2, V))


def test_read_only_out_is_refused_and_left_untouched(small_head, tmp_path, rng):
    head = muser.Head.load(small_head)
    x = hidden_states(rng, 1, H)
    for what, out in _read_only_outs(tmp_path):
        before = np.array(out)
        with pytest.raises(ValueError, match="writable"):
            head(x, out=out)
        assert np.array_equal(np.asarray(out), before), what
        with pytest.raises(TypeError):  # the engine's own guard, below the Python check
            head._core.run(x, out, False, True)


def test_out_of_the_wrong_dtype_or_alignment_is_refused(small_head, rng):
    head = muser.Head.load(small_head)
    x = hidden_states(rng, 1, H)
    with pytest.raises(TypeError, match="float32"):
        head(x, out=np.zeros((1, V), np.float64))
    raw = np.zeros(4 * V + 1, np.uint8)
    misaligned = raw[1:].view(np.float32).reshape(1, V)
    assert not misaligned.flags.aligned
    with pytest.raises(ValueError, match="aligned"):
        head(x, out=misaligned)


def test_a_misaligned_hidden_state_is_copied_not_misread(small_head, rng):
    head = muser.Head.load(small_head)
    x = hidden_states(rng, 2, H)
    raw = np.zeros(x.nbytes + 1, np.uint8)
    odd = raw[1:].view(np.float32).reshape(x.shape)
    odd[...] = x
    assert not odd.flags.aligned
    assert np.array_equal(head(odd), head(x))


# ---------------------------------------------------------------- files that change

def _probe(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("change", ["truncate", "rewrite"])
def test_a_file_changed_after_load_is_a_gguf_error_not_a_signal(tmp_path, change):
    path = write_head_gguf(tmp_path / "h.gguf", hidden=H, vocab=V, weight_type="Q5_K")
    r = _probe(f"""
        import os, numpy as np, muser
        path = {str(path)!r}
        head = muser.Head.load(path)
        x = np.ones({H}, np.float32)
        before = head(x).copy()
        size = os.path.getsize(path)
        if {change!r} == "truncate":
            os.truncate(path, size // 2)
        else:
            with open(path, "r+b") as f:
                f.seek(size - 100)
                f.write(bytes(100))
        try:
            head(x)
        except muser.GGUFError as e:
            print("GGUFError", e)
        else:
            print("NO ERROR")
    """)
    assert r.returncode == 0, f"the process died (rc {r.returncode}): {r.stderr[-2000:]}"
    assert "GGUFError" in r.stdout and "changed after it was loaded" in r.stdout, r.stdout


def test_a_file_replaced_by_rename_is_reported_too(tmp_path, rng):
    # the mapping still holds the old bytes, but the head is no longer the file at
    # its path: the unlink changes the old inode's ctime, and the head says so
    path = write_head_gguf(tmp_path / "h.gguf", hidden=H, vocab=V, weight_type="Q8_0", seed=1)
    head = muser.Head.load(path)
    x = hidden_states(rng, 1, H)
    head(x)
    other = write_head_gguf(tmp_path / "other.gguf", hidden=H, vocab=V, weight_type="Q8_0", seed=2)
    os.replace(other, path)
    with pytest.raises(muser.GGUFError, match="changed after it was loaded"):
        head(x)


def test_mmap_false_is_a_private_copy(tmp_path, rng):
    path = write_head_gguf(tmp_path / "h.gguf", hidden=H, vocab=V, weight_type="Q4_K")
    mapped = muser.Head.load(path)
    private = muser.Head.load(path, mmap=False)
    x = hidden_states(rng, 3, H)
    want = np.array(mapped(x))
    assert np.array_equal(private(x), want)
    with open(path, "r+b") as f:
        f.truncate(100)
    assert np.array_equal(private(x), want)  # nothing done to the file reaches it
    with pytest.raises(muser.GGUFError, match="changed after it was loaded"):
        mapped(x)
    with pytest.raises(TypeError):
        muser.Head.load(path, mmap="no")


# ---------------------------------------------------------------- paths

def _open_in_thread(fn, timeout=20.0):
    result: list = []

    def run():
        try:
            fn()
            result.append(None)
        except BaseException as e:  # noqa: BLE001 -- reported to the test
            result.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "opening the path blocked"
    return result[0]


def test_fifo_socket_directory_and_device_paths_are_gguf_errors_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock_path = tmp_path / "sock"
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(sock_path))
    try:
        for path, kind in [(fifo, "FIFO"), (sock_path, None), (tmp_path, "directory"), ("/dev/null", "device")]:
            for opener in (lambda: muser.Head.load(path), lambda: muser.GGUFFile(path)):
                err = _open_in_thread(opener)
                assert isinstance(err, muser.GGUFError), f"{path}: {err!r}"
                if kind:
                    assert kind in str(err), str(err)
    finally:
        sock.close()


def test_a_missing_file_is_a_gguf_error_and_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        muser.Head.load(tmp_path / "absent.gguf")
    with pytest.raises(muser.GGUFError, match="No such file"):
        muser.GGUFFile(tmp_path / "absent.gguf")


def test_a_nul_byte_in_the_path_is_refused(small_head):
    with pytest.raises((muser.GGUFError, ValueError)):
        muser.Head.load(small_head + "\0.ignored")


# ---------------------------------------------------------------- alignment

TYPES = ["Q5_K", "Q6_K", "Q4_K", "Q8_0", "F16", "BF16", "F32"]
ISAS = muser.build_info()["cpu_isas"]


@pytest.mark.parametrize("weight_type", TYPES)
@pytest.mark.parametrize("alignment", [1, 2, 4])
def test_alignments_below_eight_are_refused_for_every_type(tmp_path, weight_type, alignment):
    path = write_head_gguf(tmp_path / "a.gguf", hidden=256, vocab=33, weight_type=weight_type,
                           alignment=alignment, random_quants=True)
    with pytest.raises(muser.GGUFError, match="general.alignment is"):
        muser.Head.load(path)


@pytest.mark.parametrize("weight_type", TYPES)
def test_weight_bytes_at_an_odd_address_equal_aligned_ones_on_every_isa(rng, weight_type):
    from test_cpu_kernels import _weight

    w = _weight(weight_type, 33, 256, rng)
    raw = np.empty(w.size + 1, np.uint8)
    odd = raw[1:].reshape(w.shape)
    odd[...] = w
    assert odd.ctypes.data % 2 == 1
    x = rng.standard_normal((3, 256)).astype(np.float32)
    for isa in ISAS:
        want = muser.ops.matvec(w, weight_type, x, isa=isa, threads=1)
        assert np.array_equal(muser.ops.matvec(odd, weight_type, x, isa=isa, threads=1), want), isa
        if weight_type in ("Q5_K", "Q6_K", "Q4_K", "Q8_0"):
            want = muser.ops.matvec(w, weight_type, x, acts="q8", isa=isa, threads=1)
            assert np.array_equal(muser.ops.matvec(odd, weight_type, x, acts="q8", isa=isa, threads=1), want), isa
    assert np.array_equal(muser.dequantize(odd, weight_type, (33, 256)), muser.dequantize(w, weight_type, (33, 256)))


# ---------------------------------------------------------------- metadata

ARCH_CASES = [
    # (arch, key suffix, value, what the message says)
    ("muse-glimmer", "final_logit_softcapping", 1e300, "beyond float32's range"),
    ("muse-glimmer", "final_logit_softcapping", float("inf"), "finite"),
    ("muse-glimmer", "final_logit_softcapping", -5.0, "non-negative"),
    ("muse-glimmer", "logit_scale", 1e300, "beyond float32's range"),
    ("muse-glimmer", "logit_scale", -0.196116, "positive"),
    ("muse-glimmer", "logit_scale", 0.0, "positive"),
    ("muse-glimmer", "attention.layer_norm_rms_epsilon", 1e300, "beyond float32's range"),
    ("muse-glimmer", "attention.layer_norm_rms_epsilon", -1e-5, "non-negative"),
    ("granite", "logit_scale", 1e-300, "below float32's normal range"),
    ("granite", "logit_scale", -8.0, "non-negative"),
    ("grok", "logit_scale", float("nan"), "finite"),
]


@pytest.mark.parametrize("arch,suffix,value,message", ARCH_CASES)
def test_metadata_a_float32_head_cannot_use_is_a_spec_error_naming_the_key(tmp_path, arch, suffix, value, message):
    key = f"{arch}.{suffix}"
    path = write_head_gguf(tmp_path / "m.gguf", arch=arch, hidden=256, vocab=64, weight_type="Q8_0",
                           extra_metadata={key: np.float64(value)})
    with pytest.raises(muser.SpecError, match=message) as e:
        muser.Head.load(path)
    assert key in str(e.value)


def test_granite_zero_scale_means_none_and_a_normal_one_loads(tmp_path):
    for value, mode in [(0.0, "none"), (8.0, "divide")]:
        path = write_head_gguf(tmp_path / f"g{value}.gguf", arch="granite", hidden=256, vocab=64, weight_type="Q8_0",
                               extra_metadata={"granite.logit_scale": np.float64(value)})
        assert muser.Head.load(path).spec.logit_scale_mode == mode


@pytest.mark.parametrize("override,value", [("softcap", 1e300), ("logit_scale", -1.0), ("eps", 1e300),
                                            ("logit_scale", 1e-300), ("eps", float("nan"))])
def test_overrides_out_of_float32_range_are_spec_errors(small_head, override, value):
    with pytest.raises(muser.SpecError, match=f"{override} override"):
        muser.Head.load(small_head, **{override: value})


def test_an_override_that_is_not_a_number_is_a_type_error(small_head):
    with pytest.raises(TypeError, match="softcap"):
        muser.Head.load(small_head, softcap="20")
    assert muser.Head.load(small_head, softcap=np.float32(20.0)).spec.softcap == 20.0


# ---------------------------------------------------------------- leaks

def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


_UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux) to read the RSS")
def test_a_thousand_load_step_unload_cycles_do_not_grow_memory(small_head, rng):
    # Under AddressSanitizer freed memory sits in its quarantine, so the RSS grows
    # by design; there the cycles run and LeakSanitizer checks them at exit instead.
    x = hidden_states(rng, 2, H)
    for _ in range(50):  # warm the allocator and the caches
        muser.Head.load(small_head)(x)
    gc.collect()
    before = _rss_bytes()
    for _ in range(1000):
        head = muser.Head.load(small_head)
        head(x)
        head.argmax(x)
        del head
    gc.collect()
    if _UNDER_ASAN:
        return
    grown = _rss_bytes() - before
    # one head holds ~2 x 12 KB of logits and its mapping; a leak of either per cycle is > 20 MB here
    assert grown < 8 << 20, f"RSS grew {grown / 1e6:.1f} MB over 1,000 cycles"
