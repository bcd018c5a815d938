// K-quant unpacking on AVX-512, shared by the f32 (matvec_avx512.cpp) and
// q8 (matvec_q8_avx512.cpp) kernels: a block's quants land in the byte domain,
// 64 per zmm, four or five instructions per zmm. Include only from files
// compiled with AVX-512 flags (*_avx512.cpp).
#pragma once
#include <immintrin.h>

#include "cpu/kquant_scales.h"
#include "muser/quant_blocks.h"

namespace muser::cpu {
namespace {  // internal linkage: one copy per including file

// 256 unsigned K-quant quants (Q4_K: 0..15, Q5_K: 0..31) of one block, 64
// per zmm in the order a 64-byte nibble load gives them: z[0] = sub-blocks
// (0 | 2), z[1] = (1 | 3), z[2] = (4 | 6), z[3] = (5 | 7) - 32 bytes each.
// The Q5_K high bit of element 32s + l is bit s of qh[l]; a dword rotate by
// 4 - s brings it to bit 4 of the same byte for every byte at once.
template <bool kHighBit>
inline void kquant_unpack(const uint8_t* qs, const uint8_t* qh, __m512i z[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i a = _mm512_loadu_si512(qs), b = _mm512_loadu_si512(qs + 64);
  z[0] = _mm512_and_si512(a, low4);
  z[1] = _mm512_and_si512(_mm512_srli_epi16(a, 4), low4);
  z[2] = _mm512_and_si512(b, low4);
  z[3] = _mm512_and_si512(_mm512_srli_epi16(b, 4), low4);
  if (kHighBit) {
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)));
    // rotate counts (4 - s) mod 32 for the sub-blocks (lower | upper half) of z[i]
    const __m512i rot02 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2);
    const __m512i rot13 = _mm512_setr_epi32(3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i rot46 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 30, 30, 30, 30, 30, 30, 30, 30);
    const __m512i rot57 = _mm512_setr_epi32(31, 31, 31, 31, 31, 31, 31, 31, 29, 29, 29, 29, 29, 29, 29, 29);
    // z | (rotated & 0x10): ternary-logic table A | (B & C)
    z[0] = _mm512_ternarylogic_epi32(z[0], _mm512_rolv_epi32(h, rot02), bit4, 0xF8);
    z[1] = _mm512_ternarylogic_epi32(z[1], _mm512_rolv_epi32(h, rot13), bit4, 0xF8);
    z[2] = _mm512_ternarylogic_epi32(z[2], _mm512_rolv_epi32(h, rot46), bit4, 0xF8);
    z[3] = _mm512_ternarylogic_epi32(z[3], _mm512_rolv_epi32(h, rot57), bit4, 0xF8);
  }
}

// 256 signed Q6_K quants (q - 32, as int8) of one block in element order:
// z[0] = elements 0..63, z[1] = 64..127, z[2] = 128..191, z[3] = 192..255.
// Element 128h + 32u + l takes the low (u < 2) or high (u >= 2) nibble of
// ql[64h + 32(u & 1) + l] and bits 2u, 2u+1 of qh[32h + l].
inline void q6k_unpack(const BlockQ6_K& blk, __m512i z[4], bool minus32) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i rot01 = _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2);
  const __m512i rot23 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 30, 30, 30, 30, 30, 30, 30, 30);
  const __m512i m32 = _mm512_set1_epi8(32);
  for (int h = 0; h < 2; ++h) {
    const __m512i ql = _mm512_loadu_si512(blk.ql + 64 * h);
    const __m512i qh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk.qh + 32 * h)));
    __m512i lo = _mm512_ternarylogic_epi32(_mm512_and_si512(ql, low4), _mm512_rolv_epi32(qh, rot01), bits45, 0xF8);
    __m512i hi = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                           _mm512_rolv_epi32(qh, rot23), bits45, 0xF8);
    if (minus32) {
      lo = _mm512_sub_epi8(lo, m32);
      hi = _mm512_sub_epi8(hi, m32);
    }
    z[2 * h] = lo;
    z[2 * h + 1] = hi;
  }
}

}  // namespace
}  // namespace muser::cpu
