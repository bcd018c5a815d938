#!/bin/sh
# The Metal backend's tests on Linux, against the test-only emulator: builds
# muser with clang and MUSER_METAL_EMULATOR=ON into the current Python
# environment (use a virtual environment of its own: this build is for tests,
# never a product), then runs the C++ shim checks and tests/test_metal.py.
#   python3 -m venv --system-site-packages .venv-metal && . .venv-metal/bin/activate
#   tests/metal_device/run_emulated.sh [pytest args]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
"$root/tests/metal_emulator/ci_deps.sh"
sh "$root/tests/metal_device/check_kernels.sh"
CC=clang CXX=clang++ python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/metal-emu-py \
  -C cmake.define.MUSER_BUILD_CUDA=OFF -C cmake.define.MUSER_METAL_EMULATOR=ON \
  -C cmake.define.CMAKE_OBJC_COMPILER=clang -C cmake.define.CMAKE_OBJCXX_COMPILER=clang++ "$root"
cd "$root"
python3 -m pytest -q tests/test_metal.py "$@"
