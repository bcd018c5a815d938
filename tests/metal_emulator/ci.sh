#!/bin/sh
# CI step of the test-only Metal emulator: its toolchain, a clang build with
# MUSER_METAL_EMULATOR=ON in build/metal-emulator, and its ctest. Run from
# anywhere; the default (GCC, pip install .) build is not touched.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
"$root/tests/metal_emulator/ci_deps.sh"
cmake -S "$root" -B "$root/build/metal-emulator" -DMUSER_METAL_EMULATOR=ON -DMUSER_BUILD_TESTS=ON \
  -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DCMAKE_OBJC_COMPILER=clang -DCMAKE_OBJCXX_COMPILER=clang++ >/dev/null
# the emulator's targets only: the engine's own C++ tests belong to the default CI
cmake --build "$root/build/metal-emulator" -j"${MUSER_JOBS:-2}" --target muser_emu_test muser_emu_toolchain_check
cd "$root/build/metal-emulator"
ctest -R '^muser_metal_emulator' --output-on-failure
