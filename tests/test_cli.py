"""The command line: the README's demo and inspect."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args, check=True):
    return subprocess.run([sys.executable, "-m", "muser", *args], capture_output=True, text=True, check=check)


@pytest.mark.parametrize("route", ["graph", "canonical"])
def test_demo_recovers_the_tokens_it_aims_at(route):
    out = run("demo", "--route", route, "--hidden", "512", "--vocab", "3000").stdout
    assert f"route {route}:" in out and "targets recovered: True" in out
    assert "soft cap       20 * tanh(x / 20)" in out and "multiply by 0.196116" in out


def test_inspect_json_of_a_demo_file(tmp_path):
    path = tmp_path / "d.gguf"
    run("demo", "--hidden", "256", "--vocab", "500", "--keep", str(path))
    js = json.loads(run("inspect", "--json", str(path)).stdout)
    assert js["spec"]["arch"] == "muse-glimmer" and js["spec"]["softcap"] == 20.0
    assert [t["name"] for t in js["tensors"]] == ["output_norm.weight", "output.weight"]
    assert js["tensors"][1]["type"] == "Q5_K" and js["tensors"][1]["shape"] == [256, 500]


def test_inspect_of_a_malformed_file_is_a_clean_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 10)
    r = run("inspect", str(bad), check=False)
    assert r.returncode == 2 and r.stderr.startswith("muser: GGUFError:") and "bad.gguf" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("args,says", [
    (["demo", "--tokens", "0"], "--tokens: expected integers >= 1, got '0'"),
    (["demo", "--repeats", "0"], "--repeats: expected integers >= 1"),  # was a median of nothing: nan ms
    (["demo", "--vocab", "x"], "--vocab: expected comma-separated integers, got 'x'"),
    (["demo", "--hidden", "100"], "muser: ValueError: hidden=100 is not a multiple"),
    (["bench", "--tokens", "1,abc"], "--tokens: expected comma-separated integers, got '1,abc'"),
    (["bench", "--tokens", "0"], "--tokens: expected integers >= 1"),
    (["bench", "--reps", "0"], "--reps: expected integers >= 1"),
    (["bench", "--threads", "2,-1"], "--threads: expected integers >= 1"),
])
def test_bad_counts_are_a_usage_error_not_a_traceback(args, says):
    r = run(*args, check=False)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr


def _subcommands():
    import argparse

    from muser.__main__ import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def test_every_option_of_every_subcommand_has_help():
    import argparse

    subs = _subcommands()
    assert {"demo", "inspect", "bench", "compare", "cache"} <= set(subs)
    missing = [f"{name} {a.option_strings or a.dest}" for name, p in subs.items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and (not a.help or a.help == argparse.SUPPRESS)]
    assert not missing, f"options without --help text: {missing}"


def test_json_everywhere_output_is_tabular():
    # every sub-command that prints a table can print JSON instead
    for name in ("demo", "inspect", "bench", "compare", "cache"):
        assert "--json" in _subcommands()[name].format_help(), name


def test_demo_json_is_parseable_and_recovers_the_targets():
    r = run("demo", "--json", "--hidden", "256", "--vocab", "700", "--tokens", "2")
    js = json.loads(r.stdout)  # stdout holds the JSON alone; the text went to stderr
    assert js["targets_recovered"] is True and len(js["tokens"]) == 2
    assert all(tok["top"][0]["id"] == tok["target"] for tok in js["tokens"])
    assert js["spec"]["softcap"] == 20.0 and js["nodes"][2] == "lm_head"
    assert "soft cap" in r.stderr


def _closed_stdout(*args):
    """Run the CLI with a stdout pipe whose reader is already gone (as in `... | head -0`)."""
    import os

    r, w = os.pipe()
    os.close(r)  # every write to w now fails with EPIPE
    try:
        p = subprocess.run([sys.executable, "-m", "muser", *args], stdout=w, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(w)
    return p


@pytest.mark.parametrize("args", [["inspect"], ["inspect", "--json"], ["demo", "--hidden", "256", "--vocab", "500"],
                                  ["cache"]])
def test_a_closed_pipe_exits_quietly(tmp_path, args):
    path = tmp_path / "d.gguf"
    run("demo", "--hidden", "256", "--vocab", "500", "--keep", str(path))
    argv = args + ([str(path)] if args[0] == "inspect" else []) + \
        (["--cache-dir", str(tmp_path)] if args[0] == "cache" else [])
    p = _closed_stdout(*argv)
    assert p.returncode == 0 and p.stderr.count("BrokenPipe") == 0 and "Traceback" not in p.stderr, p.stderr


def test_head_of_inspect_in_a_shell_pipe(tmp_path):
    import shutil

    if not shutil.which("sh") or not shutil.which("head"):
        pytest.skip("needs sh and head")
    path = tmp_path / "d.gguf"
    run("demo", "--hidden", "256", "--vocab", "500", "--keep", str(path))
    p = subprocess.run(["sh", "-c", f'"{sys.executable}" -m muser inspect "{path}" | head -1; '
                                    f'"{sys.executable}" -m muser inspect --json "{path}" | head -c 1 > /dev/null'],
                       capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith(str(path)) and p.stdout.count("\n") == 1
    assert p.stderr == "", p.stderr


def test_cache_folder_is_named_listed_and_cleared(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir()
    kept = folder / "notes.txt"  # not muser's: --clear leaves it
    kept.write_text("mine")
    (folder / "bench-q5_k-256x500.gguf").write_bytes(b"x" * 1000)
    (folder / "bench-q5_k-256x500.gguf.part").write_bytes(b"x" * 10)
    js = json.loads(run("cache", "--json", "--cache-dir", str(folder)).stdout)
    assert js["cache_dir"] == str(folder) and js["total_bytes"] == 1010 and len(js["files"]) == 2
    env = dict(__import__("os").environ, MUSER_CACHE_DIR=str(folder))
    out = subprocess.run([sys.executable, "-m", "muser", "cache"], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert out.startswith(f"{folder} holds 2 file(s)") and "cache --clear" in out
    run("cache", "--clear", "--cache-dir", str(folder))
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_bench_writes_its_head_into_the_named_cache_and_says_so(tmp_path):
    # a small head instead of the seed's: --file absent, so the cache path is the one printed
    folder = tmp_path / "c"
    import muser._bench_cpu as b

    path = b.default_path(256, 512, "Q5_K", cache_dir=str(folder))
    assert path == str(folder / "bench-q5_k-256x512.gguf")
    b.ensure_file(path, 256, 512, "Q5_K", quiet=True)
    assert (folder / "bench-q5_k-256x512.gguf").exists() and not (folder / "bench-q5_k-256x512.gguf.part").exists()
    r = run("bench", "--file", path, "--threads", "1", "--tokens", "1", "--routes", "graph", "--acts", "q8",
            "--reps", "1", "--no-ggml", "--bandwidth-bytes", str(1 << 24), "--json", "--quiet")
    js = json.loads(r.stdout)  # --json alone: JSON on stdout, the table on stderr
    assert js["file"] == path and js["runs"][0]["rows"][0]["route"] == "graph"
    assert "route" in r.stderr and r.stderr.count("\n") >= 2
