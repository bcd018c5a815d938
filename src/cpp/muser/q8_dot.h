// acts="q8" for kernels of one thread per block (docs/numerics.md, "q8
// activations"): the CPU's activation quantizer (cpu/acts_q8.cpp) for one
// block, and the exact integer sums of one weight block against one
// activation block, element by element through dequant.h's quant readers
// (the plainest order; integers are exact, so any order gives these values).
// The float chain over blocks is q8_step.h's. Pointers are template
// arguments (any address space).
#pragma once
#include "dequant.h"

namespace muser {

MUSER_HD float q8_abs(float x) { return bits_to_f32(f32_to_bits(x) & 0x7fffffffu); }

// Q8_K, one 256-block of x: qs[256] and the block scale d (returned); an
// all-zero block gives d = 0 and zero quants. quantize_row_q8_K_ref's rules:
// max = the signed value of largest magnitude (the first on ties),
// iscale = -127/max, q = min(127, nearest_int(iscale * x)), d = 1/iscale.
template <class X, class Q>
MUSER_HD float q8_quantize_block_q8_k(X x, Q qs) {
  float max = 0.0f, amax = 0.0f;
  for (int j = 0; j < kQK_K; ++j) {
    const float ax = q8_abs(x[j]);
    if (ax > amax) {
      amax = ax;
      max = x[j];
    }
  }
  if (!(amax != 0.0f)) {
    for (int j = 0; j < kQK_K; ++j) qs[j] = 0;
    return 0.0f;
  }
  const float iscale = -127.0f / max;
  for (int j = 0; j < kQK_K; ++j) {
    const float p = iscale * x[j];
    const int v = nearest_int(p);
    qs[j] = (int8_t)(v < 127 ? v : 127);
  }
  return 1.0f / iscale;
}

// x86's cvtps2dq after round-to-nearest-even, saturated to int8; NaN -> -128.
MUSER_HD int8_t q8_round_even_i8(float v) {
  if (!(v == v)) return -128;
  if (v >= 127.0f) return 127;
  if (v <= -128.0f) return -128;
  return (int8_t)nearest_int(v);  // |v| < 2^22: half to even
}

// Q8_0, one 32-block of x (the AVX2 quantize_row_q8_0): amax = max |x| (NaN
// ignored, as fmaxf does), d = f16(amax / 127), id = amax ? 127/amax : 0,
// q = round-half-even(x * id). Returns d as f16 bits.
template <class X, class Q>
MUSER_HD uint16_t q8_quantize_block_q8_0(X x, Q qs) {
  float amax = 0.0f;
  for (int j = 0; j < kQK8_0; ++j) {
    const float ax = q8_abs(x[j]);
    amax = ax > amax ? ax : amax;
  }
  const uint16_t d = f32_to_f16(amax / 127.0f);
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  for (int j = 0; j < kQK8_0; ++j) {
    const float p = x[j] * id;
    qs[j] = q8_round_even_i8(p);
  }
  return d;
}

// Q4_K/Q5_K: isum = sum_j sc_j * sum_{i in j} q_i x_i (8 sub-blocks of 32).
template <class B, class X>
MUSER_HD int32_t q8_isum_q5_k(B b, X xq) {
  int32_t s = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, b->scales, &sc, &m);
    int32_t dot = 0;
    for (int i = 32 * j; i < 32 * j + 32; ++i) dot += q5k_quant(b, i) * (int32_t)xq[i];
    s += (int32_t)sc * dot;
  }
  return s;
}
template <class B, class X>
MUSER_HD int32_t q8_isum_q4_k(B b, X xq) {
  int32_t s = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, b->scales, &sc, &m);
    int32_t dot = 0;
    for (int i = 32 * j; i < 32 * j + 32; ++i) dot += q4k_quant(b, i) * (int32_t)xq[i];
    s += (int32_t)sc * dot;
  }
  return s;
}
// msum = sum_j m_j * (sum of the 32 activation quants of sub-block j).
template <class B, class S>
MUSER_HD int32_t q8_msum_kquant(B b, S sum32) {
  int32_t s = 0;
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, b->scales, &sc, &m);
    s += (int32_t)m * (int32_t)sum32[j];
  }
  return s;
}
// Q6_K: isum = sum_j sc_j * sum_{i in j} (q_i - 32) x_i (16 sub-blocks of 16, sc signed).
template <class B, class X>
MUSER_HD int32_t q8_isum_q6_k(B b, X xq) {
  int32_t s = 0;
  for (int j = 0; j < 16; ++j) {
    int32_t dot = 0;
    for (int i = 16 * j; i < 16 * j + 16; ++i) dot += q6k_quant(b, i) * (int32_t)xq[i];
    s += (int32_t)b->scales[j] * dot;
  }
  return s;
}
// Q8_0: isum = sum_i w_i x_i.
template <class B, class X>
MUSER_HD int32_t q8_isum_q8_0(B b, X xq) {
  int32_t s = 0;
  for (int i = 0; i < kQK8_0; ++i) s += (int32_t)b->qs[i] * (int32_t)xq[i];
  return s;
}

}  // namespace muser
