"""`python -m muser demo --plot` and `bench --plot` write PNGs of the promised
size (muser._plot.DEMO_PX, BENCH_PX). Skipped, with the reason, without
matplotlib (the `plot` extra; .ci/run installs it through the test extra)."""
from __future__ import annotations

import math
import struct
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install 'muser[plot]')")

from muser import _plot  # noqa: E402


def png_size(path) -> tuple[int, int]:
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND", "truncated PNG"
    return struct.unpack(">II", data[16:24])


def run(*args):
    return subprocess.run([sys.executable, "-m", "muser", *args], capture_output=True, text=True, check=True)


def test_demo_plot_is_a_png_of_the_promised_size(tmp_path):
    out = tmp_path / "demo.png"
    r = run("demo", "--hidden", "256", "--vocab", "700", "--plot", str(out))
    assert f"wrote {out}" in r.stdout and "targets recovered: True" in r.stdout
    assert png_size(out) == _plot.DEMO_PX


def test_the_worked_examples_are_the_seeds():
    # §20.7 at the cap 20: 12 / 6 -> 10.741 / 5.826, 40 / 20 -> 19.281 / 15.232
    got = [(round(20 * math.tanh(a / 20), 3), round(20 * math.tanh(b / 20), 3)) for a, b in _plot.WORKED_EXAMPLES]
    assert got == [(10.741, 5.826), (19.281, 15.232)]


def test_bench_plot_is_a_png_of_the_promised_size(tmp_path, head_file):
    path = head_file(hidden=256, vocab=1024, weight_type="Q5_K")
    out = tmp_path / "bench.png"
    r = run("bench", "--file", path, "--threads", "1", "--tokens", "1,2", "--routes", "graph,canonical",
            "--acts", "q8", "--reps", "1", "--no-ggml", "--bandwidth-bytes", str(1 << 24), "--quiet",
            "--plot", str(out))
    assert "graph" in r.stdout and f"wrote {out}" in r.stderr
    assert png_size(out) == _plot.BENCH_PX


def test_bench_plot_draws_the_read_limit_and_the_peer(tmp_path):
    # the figure from a results dict: the peer's line and the read limit are in the legend
    import matplotlib

    matplotlib.use("Agg", force=True)
    rows = [dict(route=r, acts=a, t=t, seconds=s * t) for r, a, s in
            (("pinned (ggml)", "ggml", 0.01), ("graph", "q8", 0.004)) for t in (1, 8)]
    res = dict(cpu_isa="avx2", runs=[dict(threads=2, rows=rows, weight_bytes=10 ** 8, ggml="ggml x",
                                          bandwidth_before=dict(gbps=20.0), bandwidth_after=dict(gbps=25.0))])
    seen = {}
    orig = _plot._save

    def capture(fig, p):
        seen["labels"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        orig(fig, p)

    _plot._save = capture
    try:
        _plot.bench_plot(res, str(tmp_path / "b.png"))
    finally:
        _plot._save = orig
    assert "pinned (ggml)" in seen["labels"] and "graph q8" in seen["labels"]
    assert any(label.startswith("read limit 4.0 ms (25.0 GB/s") for label in seen["labels"])
    assert png_size(tmp_path / "b.png") == _plot.BENCH_PX
