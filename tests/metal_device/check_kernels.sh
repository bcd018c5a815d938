#!/bin/sh
# Every src/metal/kernels/*.metal compiled as the Metal shim sees it
# (tests/metal_shim/metal_shim.h, no host standard library), twice: with
# kernel_abi.h's MSL signatures (attributes ignored by the host compiler) and
# as the emulator builds them (MUSER_METAL_EMULATOR); then the embedded
# library source as one unit. A kernel body that
# leaves the shared headers' Metal subset fails here, in the default CI,
# before a Mac. C++14: the language MSL is built on. Run by ctest
# (muser_metal_kernels_shim).
set -eu
cd "$(dirname "$0")/../.."
cxx=${CXX_SHIM:-clang++}
flags="-std=c++14 -Werror=c++17-extensions -fsyntax-only -nostdinc -nostdinc++ -Wno-unknown-attributes -x c++"
inc="-isystem tests/metal_shim -isystem tests/metal_emulator/include -I src/cpp -I src/metal/kernels"
rc=0
for f in src/metal/kernels/*.metal; do
  for mode in msl emulator; do
    def=""
    [ "$mode" = emulator ] && def="-DMUSER_METAL_EMULATOR"
    if $cxx $flags $def $inc "$f"; then echo "ok   $f ($mode)"; else echo "FAIL $f ($mode)"; rc=1; fi
  done
done
# the embedded library (what newLibraryWithSource compiles): every kernel file
# and header in one translation unit, as the build generates it
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kernels=""
# the library's kernel files, in the build's order: src/metal/CMakeLists.txt's one list
stems=$(sed -n 's/^set(MUSER_METAL_KERNEL_STEMS \(.*\))$/\1/p' src/metal/CMakeLists.txt)
[ -n "$stems" ] || { echo "FAIL no MUSER_METAL_KERNEL_STEMS in src/metal/CMakeLists.txt"; exit 1; }
for k in $stems; do kernels="$kernels|$PWD/src/metal/kernels/$k.metal"; done
for f in src/metal/kernels/*.metal; do  # a kernel file outside the list would never reach the library
  case " $stems " in *" $(basename "$f" .metal) "*) ;; *) echo "FAIL $f is not in MUSER_METAL_KERNEL_STEMS"; rc=1 ;; esac
done
cmake -DOUT="$tmp/lib.cpp" "-DINCLUDE_DIRS=$PWD/src/cpp|$PWD/src/metal/kernels" "-DKERNELS=${kernels#|}" \
  -P src/metal/embed_library.cmake
if grep -q '#include "' "$tmp/lib.cpp.metal" && grep '#include "' "$tmp/lib.cpp.metal" | grep -vq muser_metal_emu_kernel.h; then
  echo "FAIL embedded source: a project include was not inlined"; rc=1
fi
if $cxx $flags -isystem tests/metal_shim "$tmp/lib.cpp.metal"; then echo "ok   embedded library source (one unit)"; else
  echo "FAIL embedded library source (one unit)"; rc=1
fi
exit $rc
