// What every muser .metal file shares: the shared kernel headers and the one
// cross-lane step, the butterfly tree over a 32-wide SIMD group. The tree is
// written with simd_shuffle_xor and canon_join (muser/lanes.h), never
// simd_sum, whose order Metal leaves unspecified: for offsets 16, 8, 4, 2, 1
// each lane adds its partner's partial with the lower lane's value on the
// left, so every lane ends with canon_tree32's bits (docs/numerics.md).
#pragma once
#include <metal_stdlib>

#include "muser/kernel_args.h"
#include "muser/lanes.h"

// Kernels declare themselves with kernel_abi.h's MUSER_KERNEL: the MSL
// signature on Metal, a registered C++ function on the emulator. A kernel's
// name is its pipeline name (op_weight_activation, e.g. matvec_q5_K_f32);
// variants are stamped out by a macro per file over one templated body.
#include "kernel_abi.h"

namespace muser {

inline float simd_canon_tree(float v, ushort lane) {
  for (ushort off = 16; off >= 1; off >>= 1) v = canon_join(v, metal::simd_shuffle_xor(v, off), lane, off);
  return v;
}

}  // namespace muser
