"""The shipped types are real: mypy, against the *installed* package (py.typed,
the generated _core.pyi), accepts a typed user (tests/typing/good.py, whose
assert_types pin what the overloads return) and rejects misuse
(tests/typing/bad.py: exactly the lines marked `# bad`). tests/run.sh
installs mypy when it is absent."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

import muser

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "typing")
# .ci/reliability.sh runs this suite against a sanitizer build, which cannot
# import itself at build time, so it has no _core.pyi (CMakeLists.txt: MUSER_STUBS)
SANITIZER_RUN = any(s in os.environ.get("LD_PRELOAD", "") for s in ("libasan", "libtsan", "libclang_rt"))
static = pytest.mark.skipif(SANITIZER_RUN, reason="a sanitizer build ships no _core.pyi (MUSER_STUBS is off)")


def need_mypy() -> None:
    pytest.importorskip("mypy", reason="mypy is not installed (tests/run.sh installs it)")


def mypy(tmp_path, name: str) -> subprocess.CompletedProcess:
    # run from a directory holding only the example, so the source tree's python/ is not on the path
    shutil.copy(os.path.join(HERE, name), tmp_path / name)
    cache = os.path.join(os.path.dirname(str(tmp_path)), "mypy-cache")  # shared by this session's runs
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", cache, "--no-error-summary",
                           "--hide-error-context", "--show-column-numbers", name],
                          cwd=tmp_path, capture_output=True, text=True, env=env)


@static
def test_the_stub_and_marker_ship_next_to_the_extension():
    pkg = os.path.dirname(muser.__file__)
    assert os.path.isfile(os.path.join(pkg, "py.typed"))
    stub = os.path.join(pkg, "_core.pyi")
    assert os.path.isfile(stub), f"{stub} missing: the build generates it (CMakeLists.txt, MUSER_STUBS)"
    text = open(stub).read()
    public = [n for n in dir(muser._core) if not n.startswith("_")]
    missing = [n for n in public if not re.search(rf"^(class|def) {n}\b|^{n}\b", text, re.M)]
    assert public and not missing, f"_core.pyi lacks {missing}"


@static
def test_mypy_accepts_a_typed_user(tmp_path):
    need_mypy()
    r = mypy(tmp_path, "good.py")
    assert r.returncode == 0, r.stdout + r.stderr


@static
def test_mypy_rejects_exactly_the_misuse(tmp_path):
    need_mypy()
    r = mypy(tmp_path, "bad.py")
    assert r.returncode == 1, r.stdout + r.stderr
    src = open(os.path.join(HERE, "bad.py")).read().splitlines()
    expected = {i + 1 for i, line in enumerate(src) if line.rstrip().endswith("# bad") or "# bad:" in line}
    reported = {int(m.group(1)) for m in re.finditer(r"^bad\.py:(\d+):\d+: error:", r.stdout, re.M)}
    assert len(expected) >= 5
    assert reported == expected, r.stdout


def test_the_typed_user_runs(head_file):
    # what mypy accepted is also what happens: the same code on a real head
    spec = importlib.util.spec_from_file_location("typed_user", os.path.join(HERE, "good.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.use(head_file(hidden=256, vocab=700, weight_type="Q8_0"))
