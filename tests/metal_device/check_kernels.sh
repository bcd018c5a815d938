#!/bin/sh
# Every src/metal/kernels/*.metal compiled as the Metal shim sees it
# (tests/metal_shim/metal_shim.h, no host standard library): a kernel body
# that leaves the shared headers' subset fails here, before a Mac.
set -eu
cd "$(dirname "$0")/../.."
cxx=${CXX_SHIM:-clang++}
rc=0
for f in src/metal/kernels/*.metal; do
  if "$cxx" -std=c++17 -fsyntax-only -nostdinc -nostdinc++ -Wno-unknown-attributes -x c++ \
      -include tests/metal_device/kernel_check.h -I tests/metal_shim ${KABI_DIR:+-I $KABI_DIR} -I src/cpp -I src/metal/kernels "$f"; then
    echo "ok   $f"
  else
    echo "FAIL $f"; rc=1
  fi
done
exit $rc
