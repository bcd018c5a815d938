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

// A named instantiation of a kernel template: the pipeline name the host
// asks for (op_weight_activation). The emulator's kernel ABI, when built
// against it, spells the same thing its own way.
#if defined(MUSER_METAL_EMULATOR)
#include "kernel_abi.h"
#endif
#ifndef MUSER_KERNEL_INSTANCE
#define MUSER_KERNEL_INSTANCE(name, type, ...) template [[host_name(name)]] kernel type __VA_ARGS__;
#endif

namespace muser {

inline float simd_canon_tree(float v, ushort lane) {
  for (ushort off = 16; off >= 1; off >>= 1) v = canon_join(v, metal::simd_shuffle_xor(v, off), lane, off);
  return v;
}

}  // namespace muser
