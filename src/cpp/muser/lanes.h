// The canonical dot product (docs/numerics.md) seen from one of its 32 lanes,
// for kernels that give each lane its own thread (a Metal simdgroup, a CUDA
// warp): lane l owns the elements j = l + 32 s, s = 0, 1, ..., and runs
// acc = fmaf(w[j], x[j], acc) in increasing s from +0; the lanes are then
// joined by the butterfly tree of canon_tree32.
//
// The weights a lane reads are exactly dequant.h's values (the same products
// and the one rounding, in the same expression), element by element:
//   K-quants: a 256-element block gives lane l the 8 elements 32 s + l, one
//             in each 32-element sub-block of Q4_K/Q5_K (scale s), in the
//             16-element sub-block 2 s + l/16 of Q6_K;
//   Q8_0:     a 32-element block gives lane l its element l;
//   F16, BF16, F32: element j of the row, widened exactly.
// Blocks and rows are pointer template arguments (any address space).
#pragma once
#include "dequant.h"

namespace muser {

// Lane `lane`'s 8 weights of a Q5_K block: w[s] = element 32 s + lane.
template <class B, class O>
MUSER_HD void q5k_lane_weights(B b, int lane, O w) {
  float d1[8], m1[8];
  kquant_sub_scales(b->scales, b->d, b->dmin, d1, m1);
  for (int s = 0; s < 8; ++s) {
    const int c = s >> 1;  // 64-element chunk: qs bytes 32 c .. 32 c + 31
    const int q = ((b->qs[32 * c + lane] >> (4 * (s & 1))) & 0xF) | (((b->qh[lane] >> s) & 1) << 4);
    w[s] = d1[s] * (float)q - m1[s];
  }
}

template <class B, class O>
MUSER_HD void q4k_lane_weights(B b, int lane, O w) {
  float d1[8], m1[8];
  kquant_sub_scales(b->scales, b->d, b->dmin, d1, m1);
  for (int s = 0; s < 8; ++s) {
    const int q = (b->qs[32 * (s >> 1) + lane] >> (4 * (s & 1))) & 0xF;
    w[s] = d1[s] * (float)q - m1[s];
  }
}

template <class B, class O>
MUSER_HD void q6k_lane_weights(B b, int lane, O w) {
  const float d = f16_to_f32(b->d);
  for (int s = 0; s < 8; ++s) {
    const int i = 32 * s + lane;
    w[s] = (d * (float)b->scales[i >> 4]) * (float)q6k_quant(b, i);
  }
}

template <class B>
MUSER_HD float q8_0_lane_weight(B b, int lane) {
  return (float)b->qs[lane] * f16_to_f32(b->d);
}

// One join of the butterfly tree as a lane of a 32-wide SIMD group sees it:
// `mine` is this lane's partial, `other` the partial of lane ^ off (a
// shuffle-xor). The lower lane's value is always the left operand, so both
// lanes of a pair compute the same bits (a[l] + a[l + off] of canon_tree32,
// NaN payloads included) and after offsets 16, 8, 4, 2, 1 every lane holds
// canon_tree32's result.
MUSER_HD float canon_join(float mine, float other, int lane, int off) {
  return (lane & off) ? other + mine : mine + other;
}

// ---- one lane's share of a row, for nt tokens at once ----
// acc[k] += lane's products of the row with token k's activations x + k * ldx
// (k < nt), each one fmaf, in increasing element order. Starting every acc
// at +0 and joining the lanes by canon_join gives the canonical dot product.

struct LaneQ5K {
  template <class B, class O>
  static MUSER_HD void weights(B b, int lane, O w) { q5k_lane_weights(b, lane, w); }
};
struct LaneQ4K {
  template <class B, class O>
  static MUSER_HD void weights(B b, int lane, O w) { q4k_lane_weights(b, lane, w); }
};
struct LaneQ6K {
  template <class B, class O>
  static MUSER_HD void weights(B b, int lane, O w) { q6k_lane_weights(b, lane, w); }
};

// A K-quant row of nblocks 256-element blocks.
template <class L, class B, class X, class A>
MUSER_HD void canon_lane_kquant(B blocks, int64_t nblocks, int lane, X x, int64_t ldx, int nt, A acc) {
  for (int64_t b = 0; b < nblocks; ++b) {
    float w[8];
    L::weights(blocks + b, lane, w);
    for (int s = 0; s < 8; ++s) {
      const int64_t j = b * kQK_K + 32 * s + lane;
      for (int k = 0; k < nt; ++k) acc[k] = fmaf(w[s], x[k * ldx + j], acc[k]);
    }
  }
}

// A Q8_0 row of nblocks 32-element blocks.
template <class B, class X, class A>
MUSER_HD void canon_lane_q8_0(B blocks, int64_t nblocks, int lane, X x, int64_t ldx, int nt, A acc) {
  for (int64_t b = 0; b < nblocks; ++b) {
    const float w = q8_0_lane_weight(blocks + b, lane);
    const int64_t j = b * kQK8_0 + lane;
    for (int k = 0; k < nt; ++k) acc[k] = fmaf(w, x[k * ldx + j], acc[k]);
  }
}

// Exact widenings of the float weight types.
struct WidenF32 {
  static MUSER_HD float at(float v) { return v; }
};
struct WidenF16 {
  static MUSER_HD float at(uint16_t h) { return f16_to_f32(h); }
};
struct WidenBF16 {
  static MUSER_HD float at(uint16_t h) { return bf16_to_f32(h); }
};

// A float row of n elements (n need not be a multiple of 32: the lanes past
// the end are left untouched, never given a +0).
template <class E, class R, class X, class A>
MUSER_HD void canon_lane_float(R row, int64_t n, int lane, X x, int64_t ldx, int nt, A acc) {
  for (int64_t j = lane; j < n; j += 32) {
    const float w = E::at(row[j]);
    for (int k = 0; k < nt; ++k) acc[k] = fmaf(w, x[k * ldx + j], acc[k]);
  }
}

}  // namespace muser
