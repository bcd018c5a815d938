#!/usr/bin/env bash
# muser's test command: the C++ unit tests (GoogleTest, through ctest), then
# the Python tests (pytest) against the installed package.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc 2>/dev/null || echo 2)
cmake -S . -B build/cpp-tests -DMUSER_BUILD_TESTS=ON -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF \
      -DCMAKE_BUILD_TYPE=Release > build-cpp-tests.log 2>&1 || { cat build-cpp-tests.log; exit 1; }
cmake --build build/cpp-tests -j "$jobs" >> build-cpp-tests.log 2>&1 || { cat build-cpp-tests.log; exit 1; }
rm -f build-cpp-tests.log
ctest --test-dir build/cpp-tests --output-on-failure -j "$jobs"
python3 -m pytest -q tests "$@"
