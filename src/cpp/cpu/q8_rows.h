// The q8 row loop (docs/numerics.md, "q8 activations") for the twins that
// compute one (row, block) at a time: the scalar definition
// (matvec_scalar.cpp), AVX2 (matvec_q8_avx2.cpp) and NEON (matvec_neon.cpp).
// Each twin supplies block "dot" types computing the exact integer sums its
// own way; the float chain is muser/q8_step.h's, which the AVX-512 twin and
// CUDA use too, so no backend can drift from the others.
//
// A dot type D has:  void load(const uint8_t* block)   unpack one weight block
//                    int32_t isum(const int8_t* xq, const int16_t* xsum) const
//                    int32_t msum(const int16_t* xsum) const      (mins; 0 if none)
//                    float d, dmin                                 (f32 of the f16s)
// where xq points at the token's quants of the block and xsum at its
// ActsQ8::sum32 (Q4_K/Q5_K) or sum16 (Q6_K) entries.
//
// Everything here has internal linkage: each including file is compiled
// with its own ISA flags and must not share inline code with the others.
#pragma once
#include <cmath>

#include "cpu/kernels.h"
#include "muser/q8_step.h"

namespace muser::cpu {
namespace {

constexpr int kQ8TokenTile = 16;

// What a dot type without mins (Q6_K, Q8_0) shares: no min scale, no mins sum.
struct Q8DotNoMins {
  float d = 0, dmin = 0;
  int32_t msum(const int16_t*) const { return 0; }
};

enum class Q8Kind { KQuant45, Q6K, Q80 };

template <class D, Q8Kind kKind>
void q8_rows(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  const int block = kKind == Q8Kind::Q80 ? kQK8_0 : kQK_K;
  const int64_t block_bytes = w.row_bytes / a.blocks;
  const int64_t sums_per_block = kKind == Q8Kind::Q6K ? 16 : 8;
  const int16_t* sums = kKind == Q8Kind::Q6K ? a.sum16.data() : a.sum32.data();
  D dot;
  float sum_q[kQ8TokenTile], sum_m[kQ8TokenTile];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int k0 = 0; k0 < a.tokens; k0 += kQ8TokenTile) {
      const int nt = a.tokens - k0 < kQ8TokenTile ? a.tokens - k0 : kQ8TokenTile;
      for (int k = 0; k < nt; ++k) sum_q[k] = sum_m[k] = 0.0f;
      for (int64_t b = 0; b < a.blocks; ++b) {
        dot.load(row + b * block_bytes);
        for (int k = 0; k < nt; ++k) {
          const int64_t tok = k0 + k;
          const int8_t* xq = a.qs.data() + tok * a.cols + b * block;
          const float dx = a.d[(size_t)(tok * a.blocks + b)];
          if (kKind == Q8Kind::Q80) {
            sum_q[k] = q8_0_block_step(sum_q[k], dot.isum(xq, nullptr), dot.d, dx);
          } else {
            const int16_t* xs = sums + tok * a.blocks * sums_per_block + b * sums_per_block;
            sum_q[k] = q8_block_step(sum_q[k], dx, dot.d, dot.isum(xq, xs));
            if (kKind == Q8Kind::KQuant45) sum_m[k] = q8_block_step(sum_m[k], dx, dot.dmin, dot.msum(xs));
          }
        }
      }
      for (int k = 0; k < nt; ++k)
        y[(k0 + k) * ldy + r] = kKind == Q8Kind::KQuant45 ? q8_kquant45_result(sum_q[k], sum_m[k]) : sum_q[k];
    }
  }
}

// The weight-type switch of a twin whose dot types are DotKQuant45<kQ5>
// (Q5_K when true, Q4_K when false), DotQ6K and DotQ80.
template <template <bool> class DotKQuant45, class DotQ6K, class DotQ80>
void q8_rows_by_type(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch ((GgmlType)w.type) {
    case GgmlType::Q5_K: return q8_rows<DotKQuant45<true>, Q8Kind::KQuant45>(w, a, r0, r1, y, ldy);
    case GgmlType::Q4_K: return q8_rows<DotKQuant45<false>, Q8Kind::KQuant45>(w, a, r0, r1, y, ldy);
    case GgmlType::Q6_K: return q8_rows<DotQ6K, Q8Kind::Q6K>(w, a, r0, r1, y, ldy);
    case GgmlType::Q8_0: return q8_rows<DotQ80, Q8Kind::Q80>(w, a, r0, r1, y, ldy);
    default: return;  // quantize_acts_q8 rejects every other type
  }
}

}  // namespace
}  // namespace muser::cpu
