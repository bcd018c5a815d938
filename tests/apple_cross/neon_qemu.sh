#!/usr/bin/env bash
# CI, no ARM machine needed: the C++ tests (tests/cpp/) cross-built for
# aarch64 Linux with Debian's g++-aarch64-linux-gnu and run under qemu-user,
# so the NEON twins (src/cpp/cpu/*_neon.cpp) are checked bit for bit against
# the scalar twins (tests/cpp/test_cpu_twins.cpp, test_metal_bodies.cpp) on
# every change. GoogleTest is built for the target from Debian's googletest
# sources (/usr/src/googletest). ~3 minutes on 2 cores, most of it compiling.
# Left out under qemu (MUSER_QEMU_EXCLUDE), not muser's failures:
#   ThreadPool.Fork*: qemu-user asserts in its own TCG when a threaded guest forks;
#   HeadThreads.*: eight threads of whole heads take ~2 minutes emulated
#     (they test the engine's locking, the same code on every ISA; native ctest runs them).
# Usage: bash tests/apple_cross/neon_qemu.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
export DEBIAN_FRONTEND=noninteractive
if ! command -v aarch64-linux-gnu-g++ > /dev/null || ! command -v qemu-aarch64 > /dev/null ||
   [ ! -d /usr/src/googletest ]; then
  apt-get update -qq
  apt-get install -y -qq g++-aarch64-linux-gnu qemu-user googletest cmake ninja-build > /dev/null
fi
toolchain=$root/tests/apple_cross/aarch64-linux-gnu.cmake
gen=(); command -v ninja > /dev/null && gen=(-G Ninja)
jobs=$(nproc)

echo "== neon_qemu: GoogleTest for aarch64 (build/aarch64-gtest)"
gtest=$root/build/aarch64-gtest
if [ ! -f "$gtest/install/lib/cmake/GTest/GTestConfig.cmake" ]; then
  cmake -S /usr/src/googletest -B "$gtest" "${gen[@]}" -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
    -DCMAKE_BUILD_TYPE=Release -DBUILD_GMOCK=OFF -DCMAKE_INSTALL_PREFIX="$gtest/install" > /dev/null
  cmake --build "$gtest" -j "$jobs" > /dev/null
  cmake --install "$gtest" > /dev/null
fi

echo "== neon_qemu: muser's C++ tests for aarch64 (build/aarch64)"
# the toolchain file sets CMAKE_CROSSCOMPILING_EMULATOR (qemu-aarch64 -L /usr/aarch64-linux-gnu):
# gtest_discover_tests and ctest run the test binary through it
cmake -S . -B build/aarch64 "${gen[@]}" -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DCMAKE_BUILD_TYPE=Release \
  -DMUSER_BUILD_PYTHON=OFF -DMUSER_BUILD_CUDA=OFF -DMUSER_BUILD_TESTS=ON \
  -DGTest_DIR="$gtest/install/lib/cmake/GTest" > /dev/null
cmake --build build/aarch64 -j "$jobs"

echo "== neon_qemu: ctest under qemu-aarch64"
exclude=${MUSER_QEMU_EXCLUDE:-'^(ThreadPool\.Fork|HeadThreads\.)'}
ctest --test-dir build/aarch64 --output-on-failure -j "$jobs" -E "$exclude"
