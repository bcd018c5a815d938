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
#include "muser/logsumexp.h"

// Kernels declare themselves with kernel_abi.h's MUSER_KERNEL: the MSL
// signature on Metal, a registered C++ function on the emulator. A kernel's
// name is its pipeline name (op_weight_activation, e.g. matvec_q5_K_f32);
// variants are stamped out by a macro per file over one templated body.
#include "kernel_abi.h"

namespace muser {

// Rows of canonical (max, sum) tile pairs in device memory as (m, s) floats,
// indexed as lse_tree and lse_join_lanes index their arrays (an element reads
// as an LsePair and takes one): MSL copies no struct between address spaces
// through a C++ assignment.
struct DevicePairs {
  struct Ref {
    device float* q;
    operator LsePair() const { return LsePair{q[0], q[1]}; }
    Ref& operator=(LsePair v) {
      q[0] = v.m;
      q[1] = v.s;
      return *this;
    }
    Ref& operator=(const Ref& r) { return *this = (LsePair)r; }
  };
  device float* p;
  Ref operator[](int k) const { return Ref{p + 2 * k}; }
};

// The pair's lanes joined over the SIMD group by the butterfly (lse_join_lanes:
// lane l < off merges lane l + off = l ^ off, for off = 16 .. 1); lane 0's is the tile's.
inline LsePair simd_lse_join(LsePair p, ushort lane) {
  for (ushort off = 16; off >= 1; off >>= 1) {
    LsePair o;
    o.m = metal::simd_shuffle_xor(p.m, off);
    o.s = metal::simd_shuffle_xor(p.s, off);
    if (lane < off) p = lse_merge(p, o);
  }
  return p;
}

// The largest 64-bit key over the SIMD group (every lane gets it; max is order-free).
// simd_shuffle_xor of a 64-bit word, as two 32-bit halves.
inline ulong simd_shuffle_xor_u64(ulong v, ushort off) {
  const uint hi = metal::simd_shuffle_xor((uint)(v >> 32), off);
  const uint lo = metal::simd_shuffle_xor((uint)(v & 0xFFFFFFFFu), off);
  return ((ulong)hi << 32) | (ulong)lo;
}

inline ulong simd_max_key(ulong v) {
  for (ushort off = 16; off >= 1; off >>= 1) {
    const ulong o = simd_shuffle_xor_u64(v, off);
    v = o > v ? o : v;
  }
  return v;
}

// The sum of a 64-bit integer over the SIMD group (every lane gets it; integer
// sums are order-free).
inline ulong simd_sum_u64(ulong v) {
  for (ushort off = 16; off >= 1; off >>= 1) v += simd_shuffle_xor_u64(v, off);
  return v;
}

inline float simd_canon_tree(float v, ushort lane) {
  for (ushort off = 16; off >= 1; off >>= 1) v = canon_join(v, metal::simd_shuffle_xor(v, off), lane, off);
  return v;
}

}  // namespace muser
