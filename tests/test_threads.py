"""threads=: a documented maximum (build_info()["max_threads"]) that every
Python-facing entry point enforces with a ValueError naming the argument and
the maximum, and heads used from several Python threads at once staying
correct on the shared CPU pool, whose extra workers retire when idle."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

import muser
from muser import _core
from conftest import hidden_states

MAX = muser.build_info()["max_threads"]


def test_the_maximum_is_reported_with_the_threading():
    info = muser.build_info()
    assert MAX == 256
    assert info["cpu_threading"] in ("pool", "gcd")
    assert 1 <= info["default_threads"] <= MAX


@pytest.mark.parametrize("threads", [MAX + 1, 3000, -1])
def test_head_load_refuses_threads_outside_the_range(head_file, threads):
    path = head_file(weight_type="Q8_0", hidden=256, vocab=300)
    with pytest.raises(ValueError, match=rf"threads must be between 0 .* and {MAX} .*got {threads}$"):
        muser.Head.load(path, threads=threads)


@pytest.mark.parametrize("arg,value,says", [
    ("threads", True, "threads must be an int or None, got bool"),   # would run on 1 thread
    ("threads", 2.0, "threads must be an int or None, got float"),   # would be truncated
    ("threads", "4", "threads must be an int or None, got str"),
    ("device", None, "device must be a str, got NoneType"),
    ("acts", None, "acts must be a str, got NoneType"),
])
def test_head_load_refuses_arguments_of_the_wrong_type(head_file, arg, value, says):
    path = head_file(weight_type="Q8_0", hidden=256, vocab=300)
    with pytest.raises(TypeError, match=says):
        muser.Head.load(path, **{arg: value})
    assert muser.Head.load(path, threads=np.int64(2)).spec.vocab_size == 300  # numpy ints are ints


def test_ops_matvec_refuses_threads_of_the_wrong_type():
    w = muser.quantize(np.ones((4, 256), np.float32), "Q8_0")
    x = np.ones((1, 256), np.float32)
    for threads in (True, 2.0):
        with pytest.raises(TypeError, match="threads must be an int or None"):
            muser.ops.matvec(w, "Q8_0", x, threads=threads)
    np.testing.assert_array_equal(muser.ops.matvec(w, "Q8_0", x, threads=np.int32(1)), muser.ops.matvec(w, "Q8_0", x))


def _thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def test_head_at_the_maximum_equals_one_thread(head_file, rng):
    # vocab 8192: 128 row chunks (64 rows, matvec_row_grain), so 127 pool workers start:
    # far more than the cores, which must not change a bit
    path = head_file(weight_type="Q8_0", hidden=256, vocab=8192)
    x = hidden_states(rng, 3, 256)
    counts_threads = os.path.isdir("/proc/self/task")
    before = _thread_count() if counts_threads else 0  # the first test here to use MAX threads
    one = muser.Head.load(path, route="canonical", threads=1)(x).copy()
    for threads in (MAX, None, 0):
        np.testing.assert_array_equal(muser.Head.load(path, route="canonical", threads=threads)(x), one)
    if not counts_threads:
        pytest.skip("results checked; the thread count needs /proc/self/task (Linux)")
    # Idle for about a second, the workers beyond the default count's
    # (default_threads - 1, which the pool keeps) exit: a process that once
    # ran MAX threads must not keep them sleeping until it exits.
    bound = before + muser.build_info()["default_threads"]
    deadline = time.monotonic() + 10  # a hang guard: the wait ends when the count drops
    while _thread_count() > bound and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _thread_count() <= bound, f"{_thread_count()} threads, {before} before the heads at threads={MAX}"


def test_ops_and_bandwidth_refuse_threads_outside_the_range(head_file, rng):
    w = np.zeros((64, 34), dtype=np.uint8)  # 64 rows of one Q8_0 block
    x = np.ones((1, 32), dtype=np.float32)
    for acts in ("f32", "q8"):
        assert muser.ops.matvec(w, "Q8_0", x, acts=acts, threads=MAX).shape == (1, 64)
        with pytest.raises(ValueError, match=rf"threads must be between 0 .* and {MAX}"):
            muser.ops.matvec(w, "Q8_0", x, acts=acts, threads=MAX + 1)
        with pytest.raises(ValueError, match="got -2"):
            muser.ops.matvec(w, "Q8_0", x, acts=acts, threads=-2)
    with pytest.raises(ValueError, match=rf"threads must be between 0 .* and {MAX}"):
        _core.read_bandwidth(1 << 20, MAX + 1, 1)


def test_bench_cli_refuses_threads_outside_the_range(head_file, capsys):
    from muser.__main__ import main

    path = head_file(weight_type="Q8_0", hidden=256, vocab=300)
    assert main(["bench", "--file", path, "--threads", f"1,{MAX + 1}", "--no-ggml", "--quiet"]) == 2
    assert f"1 to {MAX}" in capsys.readouterr().err


def test_heads_used_from_several_python_threads_at_once(head_file, rng):
    """Each head's calls are serialized by its own lock, but different heads run
    at the same time on the one CPU pool: one caller holds the pool, the others
    run inline. Every result must still be exact."""
    paths = [head_file(weight_type=wt, hidden=512, vocab=4096) for wt in ("Q5_K", "Q8_0", "Q6_K")]
    heads = [muser.Head.load(p, route="canonical", threads=2) for p in paths]
    xs = [hidden_states(rng, t, 512) for t in (1, 5)]
    want = [[h(x).copy() for x in xs] for h in heads]
    errors: list[str] = []

    def work(k: int) -> None:
        h = heads[k % len(heads)]
        out = [np.empty((len(x), 4096), dtype=np.float32) for x in xs]
        for _ in range(10):
            for i, x in enumerate(xs):
                h(x, out=out[i])
                if not np.array_equal(out[i], want[k % len(heads)][i]):
                    errors.append(f"thread {k}, input {i}")

    workers = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not any(w.is_alive() for w in workers), "a head call hung"
    assert errors == []
