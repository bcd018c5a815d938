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
