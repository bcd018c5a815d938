// Element decode of every supported block format: the one piece of arithmetic
// that turns stored bytes into f32 weights. The reference kernels, the CPU
// SIMD kernels (as their scalar twin), the CUDA kernels and the tests all use
// these functions, so a weight has exactly one value everywhere.
//
// Every K-quant weight is d1*q - m1 with d1 = d*sc and m1 = dmin*m. d is an
// f16 (11 significant bits) and sc, m < 64, so d1 and m1 are exact in f32;
// d1*q (q < 32) is exact too, so the single rounding is the subtraction and
// fmaf(d1, q, -m1) gives the same bits as d1*q - m1. Backends may use either.
//
// Every function takes its blocks and outputs as pointer template arguments,
// so one body serves host memory, CUDA device memory and each Metal address
// space (as ggml's dequantize_* take `device const block_q*`). The row loop
// over a whole tensor is host-only: src/cpp/quant_types.h (dequant_row).
#pragma once
#include "quant_blocks.h"

namespace muser {

// Sub-block parameters of a K-quant block (Q4_K/Q5_K): 8 sub-blocks of 32.
template <class P, class O>
MUSER_HD void kquant_sub_scales(P scales, uint16_t d16, uint16_t dmin16, O d1, O m1) {
  const float d = f16_to_f32(d16);
  const float dmin = f16_to_f32(dmin16);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, scales, &sc, &m);
    d1[j] = d * (float)sc;
    m1[j] = dmin * (float)m;
  }
}

// 5-bit quant of element i (0..255) of the Q5_K block at b.
template <class B>
MUSER_HD int q5k_quant(B b, int i) {
  const int chunk = i >> 6;         // 64-element chunk shares a qs byte range
  const int within = i & 63;
  const int l = within & 31;
  const int hi_nibble = within >> 5;
  const int lo = (b->qs[32 * chunk + l] >> (4 * hi_nibble)) & 0xF;
  const int hb = (b->qh[l] >> (i >> 5)) & 1;
  return lo | (hb << 4);
}

template <class B>
MUSER_HD int q4k_quant(B b, int i) {
  const int chunk = i >> 6;
  const int within = i & 63;
  return (b->qs[32 * chunk + (within & 31)] >> (4 * (within >> 5))) & 0xF;
}

// Signed 6-bit quant (q - 32) of element i of the Q6_K block at b.
template <class B>
MUSER_HD int q6k_quant(B b, int i) {
  const int half = i >> 7;  // two halves of 128 elements
  const int w = i & 127;
  const int quarter = w >> 5;  // 0..3
  const int l = w & 31;
  const auto ql = b->ql + 64 * half;
  const auto qh = b->qh + 32 * half;
  // quarters 0,1 take the low nibbles of ql[l], ql[l+32]; quarters 2,3 the high ones
  const int low = (ql[l + 32 * (quarter & 1)] >> (4 * (quarter >> 1))) & 0xF;
  const int high = (qh[l] >> (2 * quarter)) & 3;
  return (low | (high << 4)) - 32;
}

// The block decoders walk the layout in its natural order (a qs byte feeds
// elements 64c+l and 64c+32+l) so that compilers vectorize them; their values
// are exactly q5k_quant/q4k_quant/q6k_quant's, element by element (tested).
// The fifth bit of a K-quant element, placed at bit 4: Q5_K's from qh (bit
// `shift` of qh[l]), none for Q4_K. A struct, not `if constexpr`: MSL is C++14.
template <bool kHigh>
struct KQuantFifthBit {
  template <class B>
  static MUSER_HD int of(B, int, int) { return 0; }
};
template <>
struct KQuantFifthBit<true> {
  template <class B>
  static MUSER_HD int of(B b, int l, int shift) { return ((b->qh[l] >> shift) & 1) << 4; }
};

// Q5_K (kHigh) and Q4_K: element 64c+l from the low nibble of qs[32c+l],
// 64c+32+l from its high nibble, each with its sub-block's (d1, m1).
template <bool kHigh, class B, class O>
MUSER_HD void dequant_block_kquant(B b, O out /*256*/) {
  float d1[8], m1[8];
  kquant_sub_scales(b->scales, b->d, b->dmin, d1, m1);
  for (int c = 0; c < 4; ++c) {
    const auto qs = b->qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      const int lo = (qs[l] & 0xF) | KQuantFifthBit<kHigh>::of(b, l, 2 * c);
      const int hi = (qs[l] >> 4) | KQuantFifthBit<kHigh>::of(b, l, 2 * c + 1);
      out[64 * c + l] = d1[2 * c] * (float)lo - m1[2 * c];
      out[64 * c + 32 + l] = d1[2 * c + 1] * (float)hi - m1[2 * c + 1];
    }
  }
}

template <class B, class O>
MUSER_HD void dequant_block_q5_k(B b, O out /*256*/) {
  dequant_block_kquant<true>(b, out);
}
template <class B, class O>
MUSER_HD void dequant_block_q4_k(B b, O out /*256*/) {
  dequant_block_kquant<false>(b, out);
}

template <class B, class O>
MUSER_HD void dequant_block_q6_k(B b, O out /*256*/) {
  const float d = f16_to_f32(b->d);
  for (int half = 0; half < 2; ++half) {
    const auto ql = b->ql + 64 * half;
    const auto qh = b->qh + 32 * half;
    const auto sc = b->scales + 8 * half;
    const auto y = out + 128 * half;
    for (int l = 0; l < 32; ++l) {
      const int s = l >> 4;
      y[l] = (d * (float)sc[s]) * (float)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
      y[l + 32] = (d * (float)sc[s + 2]) * (float)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      y[l + 64] = (d * (float)sc[s + 4]) * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      y[l + 96] = (d * (float)sc[s + 6]) * (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

template <class B, class O>
MUSER_HD void dequant_block_q8_0(B b, O out /*32*/) {
  const float d = f16_to_f32(b->d);
  for (int i = 0; i < kQK8_0; ++i) out[i] = (float)b->qs[i] * d;
}

}  // namespace muser
