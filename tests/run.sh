#!/usr/bin/env bash
# muser's test command: the C++ unit tests (GoogleTest, through ctest), then
# the Python tests (pytest) against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)

# What the tests need, installed when absent (a fresh machine after `pip install .`):
# pytest, gguf (the tests write their heads with it), ml_dtypes and mypy (it
# checks the shipped types) from PyPI;
# GoogleTest from Debian (it is not on PyPI). llama-cpp-python and the Gemma
# package stay optional: their parity tests skip, saying so, without them
# (.ci/run installs them, with the portable build flags docs/parity.md explains).
if ! python3 -c "import pytest, gguf, ml_dtypes, mypy" 2> /dev/null; then
  echo "tests/run.sh: installing pytest, gguf, ml_dtypes and mypy (pip)"
  python3 -m pip install -q pytest "gguf>=0.10" ml_dtypes mypy
fi
# (cmake --find-package writes a CMakeFiles/ folder where it runs: a scratch folder, not the tree)
if ! (cd "$(mktemp -d)" && cmake --find-package -DNAME=GTest -DCOMPILER_ID=GNU -DLANGUAGE=CXX -DMODE=EXIST) > /dev/null 2>&1 &&
   [ ! -e /usr/include/gtest/gtest.h ]; then
  if command -v apt-get > /dev/null && [ "$(id -u)" = 0 ]; then
    echo "tests/run.sh: installing GoogleTest (apt-get install libgtest-dev)"
    apt-get install -y -qq libgtest-dev > /dev/null || { apt-get update -qq && apt-get install -y -qq libgtest-dev > /dev/null; }
  else
    echo "tests/run.sh: GoogleTest is missing (Debian: apt-get install libgtest-dev); the C++ tests need it" >&2
    exit 1
  fi
fi

cmake -S . -B build/cpp-tests -DMUSER_BUILD_TESTS=ON -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF \
      -DCMAKE_BUILD_TYPE=Release > build-cpp-tests.log 2>&1 || { cat build-cpp-tests.log; exit 1; }
cmake --build build/cpp-tests -j "$jobs" >> build-cpp-tests.log 2>&1 || { cat build-cpp-tests.log; exit 1; }
rm -f build-cpp-tests.log
ctest --test-dir build/cpp-tests --output-on-failure -j "$jobs"
python3 -m pytest -q tests "$@"
