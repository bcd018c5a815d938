// The canonical-order matvec written once in portable C++. It is compiled
// three times (matvec_scalar.cpp, matvec_avx2.cpp, matvec_avx512.cpp), each
// with its ISA's flags, into a namespace of its own; the compiler vectorizes
// the 32-lane loops. Hand-written SIMD kernels may replace a twin, and every
// twin is tested bit-equal to the scalar one.
//
// Per row: a block of weights is decoded once into 256 floats, then every
// token's 32 lane accumulators take one fmaf per element (lane = j % 32).
#pragma once
#include <cmath>

#include "cpu/kernels.h"
#include "muser/canonical.h"
#include "muser/dequant.h"

#ifndef MUSER_MATVEC_NS
#error "define MUSER_MATVEC_NS before including matvec_generic.h"
#endif

namespace muser::cpu::MUSER_MATVEC_NS {

namespace {

constexpr int kTokenTile = 16;  // tokens sharing one decoded block

// Decode elements [k0, k0 + n) of a row into out (n <= 256, aligned to blocks).
inline void decode_chunk(const WeightView& w, const uint8_t* row, int64_t k0, int n, float* out) {
  switch (w.type) {
    case (uint32_t)GgmlType::Q5_K:
      dequant_block_q5_k(reinterpret_cast<const BlockQ5_K*>(row)[k0 / kQK_K], out);
      return;
    case (uint32_t)GgmlType::Q4_K:
      dequant_block_q4_k(reinterpret_cast<const BlockQ4_K*>(row)[k0 / kQK_K], out);
      return;
    case (uint32_t)GgmlType::Q6_K:
      dequant_block_q6_k(reinterpret_cast<const BlockQ6_K*>(row)[k0 / kQK_K], out);
      return;
    case (uint32_t)GgmlType::Q8_0:
      for (int b = 0; b < n / kQK8_0; ++b)
        dequant_block_q8_0(reinterpret_cast<const BlockQ8_0*>(row)[k0 / kQK8_0 + b], out + b * kQK8_0);
      return;
    case (uint32_t)GgmlType::F32:
      memcpy(out, row + k0 * 4, (size_t)n * 4);
      return;
    case (uint32_t)GgmlType::F16:
      for (int i = 0; i < n; ++i) {
        uint16_t h;
        memcpy(&h, row + (k0 + i) * 2, 2);
        out[i] = f16_to_f32(h);
      }
      return;
    case (uint32_t)GgmlType::BF16:
      for (int i = 0; i < n; ++i) {
        uint16_t h;
        memcpy(&h, row + (k0 + i) * 2, 2);
        out[i] = bf16_to_f32(h);
      }
      return;
  }
}

}  // namespace

inline void matvec(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                   int64_t ldy) {
  const int64_t K = w.cols;
  alignas(64) float wbuf[kQK_K];
  alignas(64) float acc[kTokenTile][kCanonLanes];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int t0 = 0; t0 < t; t0 += kTokenTile) {
      const int nt = t - t0 < kTokenTile ? t - t0 : kTokenTile;
      for (int k = 0; k < nt; ++k)
        for (int l = 0; l < kCanonLanes; ++l) acc[k][l] = 0.0f;
      for (int64_t k0 = 0; k0 < K; k0 += kQK_K) {
        const int n = K - k0 < kQK_K ? (int)(K - k0) : kQK_K;
        decode_chunk(w, row, k0, n, wbuf);
        for (int k = 0; k < nt; ++k) {
          const float* xs = x + (int64_t)(t0 + k) * ldx + k0;
          float* a = acc[k];
          const int full = n & ~(kCanonLanes - 1);
          for (int s = 0; s < full; s += kCanonLanes)
            for (int l = 0; l < kCanonLanes; ++l) a[l] = fmaf(wbuf[s + l], xs[s + l], a[l]);
          for (int l = 0; l < n - full; ++l) a[l] = fmaf(wbuf[full + l], xs[full + l], a[l]);
        }
      }
      for (int k = 0; k < nt; ++k) y[(int64_t)(t0 + k) * ldy + r] = canon_tree32(acc[k]);
    }
  }
}

}  // namespace muser::cpu::MUSER_MATVEC_NS
