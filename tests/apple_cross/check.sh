#!/usr/bin/env bash
# CI, no Mac needed: compile the Apple build's sources for aarch64-macos with
# zig's clang (the `ziglang` wheel from PyPI), to objects only -- zig ships
# macOS's libc headers but no frameworks, so nothing is linked. What it proves:
#   - the C++ core as macOS builds it: the NEON twins (src/cpp/cpu/*_neon.cpp),
#     parallel_for on Grand Central Dispatch (src/cpp/cpu/parallel.h), the
#     x86 files compiled to their empty aarch64 form;
#   - the Metal backend: metal_device.cpp, and metal_device.mm (Objective-C++,
#     ARC off) against the project's Metal declarations (src/metal/metal_api/)
#     and Foundation declarations (tests/apple_cross/include/), with macOS 14
#     as the deployment target and unguarded-availability an error.
# Every file gets the project's warning set as errors. Prints ok/FAIL per file
# and exits non-zero when any fails. Usage: bash tests/apple_cross/check.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if ! "$PY" -m ziglang version > /dev/null 2>&1; then
  "$PY" -m pip install -q "ziglang==0.17.1" || { echo "FAIL: cannot install ziglang"; exit 1; }
fi
echo "== apple_cross: zig $("$PY" -m ziglang version), target aarch64-macos.14.0"
out=${MUSER_APPLE_CROSS_OUT:-build/apple_cross}
mkdir -p "$out"

# -target's version is the deployment target (zig would otherwise pick its own
# newest, which hides unguarded-availability); -mmacosx-version-min says the same
target=(-target aarch64-macos.14.0 -mmacosx-version-min=14.0)
common=(-std=c++17 -O2 -Wall -Wextra -Werror -Werror=switch -ffp-contract=off
        -Isrc/cpp -DMUSER_VERSION=\"apple-cross\" -DMUSER_HAVE_METAL=1)
objcxx=(-x objective-c++ -fno-objc-arc -Werror=unguarded-availability -Werror=unguarded-availability-new
        -Werror=deprecated-declarations -Itests/apple_cross/include -Isrc/metal/metal_api -Isrc/metal
        -DMUSER_METAL_OWN_API=1)

fail=0
compile() {  # compile FILE [extra flags...]
  local f=$1; shift
  local o="$out/$(echo "$f" | tr / _).o" log="$out/$(echo "$f" | tr / _).log"
  if "$PY" -m ziglang c++ "${target[@]}" "${common[@]}" "$@" -c "$f" -o "$o" > "$log" 2>&1; then
    echo "ok   $f"
  else
    echo "FAIL $f"; sed 's/^/     /' "$log" | head -40; fail=1
  fi
}

# the engine exactly as CMake globs it on Apple (the CUDA stub; Metal built)
for f in src/cpp/*.cpp src/cpp/cpu/*.cpp src/cpp/stubs/no_cuda.cpp; do compile "$f"; done
compile src/metal/metal_device.cpp -Isrc/metal
compile src/metal/metal_device.mm "${objcxx[@]}"

if [ "$fail" -ne 0 ]; then echo "== apple_cross: FAILED"; exit 1; fi
echo "== apple_cross: all compiled"
