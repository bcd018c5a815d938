// The q8 matvec (acts="q8") on AVX2: exact integer block sums with 256-bit
// integer multiplies, the float order of q8_rows.h (shared with the scalar
// definition), so it is bit-equal to matvec_q8_scalar.
//
// Per (row, block) the weight block is unpacked once into unsigned bytes in
// element order, one ymm per 32 elements; per token:
//   Q4_K/Q5_K: a 32-element sub-block j is p = maddubs(q, x) (16-bit pair
//     sums; 2*31*127 < 2^15, no saturation), then madd(p, sc_j) into eight
//     int32 lanes; the mins sum is eight scalar products with ggml's bsums.
//   Q6_K: two 16-element sub-blocks per ymm, scales as words per 128-bit
//     half; the +32 offset of the unsigned quants is removed with the bsums.
//   Q8_0: signed x signed as ggml does on AVX2: maddubs(|w|, sign(x, w)).
// The eight lanes are summed horizontally (exact), and the per-block float
// step is q8_rows'. Lane mapping: lanes hold parts of integer sums only.
//
// Only intrinsics and this file's helpers: shared inline code compiled here
// with AVX2 flags could be picked by the linker for baseline code.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

#include <immintrin.h>

#include <cstring>

#include "cpu/kernels.h"
#include "cpu/kquant_scales.h"
#include "cpu/q8_rows.h"

namespace muser::cpu {

namespace {

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

template <bool kQ5>
struct DotKQuant45 {
  __m256i q[8];  // sub-block j's 32 quants
  uint8_t sm[16];  // scales, then mins
  float d = 0, dmin = 0;
  void load(const uint8_t* blk) {
    const uint8_t* qs = blk + (kQ5 ? 48 : 16);
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    const __m256i qh = kQ5 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16)) : _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      q[2 * c] = _mm256_and_si256(raw, low4);
      q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if (kQ5) {  // bit s of qh[l] -> bit 4 (word shifts never cross a byte at bit 4)
        for (int h = 0; h < 2; ++h) {
          const int s = 2 * c + h;
          const __m256i moved =
              s <= 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - s)) : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s - 4));
          q[s] = _mm256_or_si256(q[s], _mm256_and_si256(moved, bit4));
        }
      }
    }
    kquant_scale_bytes(blk + 4, sm);
    uint16_t h;
    memcpy(&h, blk, 2);
    d = _cvtsh_ss(h);
    memcpy(&h, blk + 2, 2);
    dmin = _cvtsh_ss(h);
  }
  int32_t isum(const int8_t* xq, const int16_t*) const {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const __m256i p = _mm256_maddubs_epi16(q[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * j)));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(sm[j])));
    }
    return hsum_epi32(acc);
  }
  int32_t msum(const int16_t* sum32) const {
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) s += sm[8 + j] * sum32[j];
    return s;
  }
};

struct DotQ6K : Q8DotNoMins {
  __m256i q[8];  // elements 32s..32s+31, unsigned 0..63
  __m256i sc[8];  // words: sub-block 2s in the low 128 bits, 2s+1 in the high
  int8_t scales[16];
  void load(const uint8_t* blk) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(blk);
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45));
      q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45));
      q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45));
      q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                                     _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45));
    }
    memcpy(scales, b.scales, 16);
    for (int s = 0; s < 8; ++s)
      sc[s] = _mm256_setr_m128i(_mm_set1_epi16(scales[2 * s]), _mm_set1_epi16(scales[2 * s + 1]));
    d = _cvtsh_ss(b.d);
  }
  int32_t isum(const int8_t* xq, const int16_t* sum16) const {
    __m256i acc = _mm256_setzero_si256();
    for (int s = 0; s < 8; ++s) {
      const __m256i p = _mm256_maddubs_epi16(q[s], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * s)));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc[s]));
    }
    int32_t offset = 0;  // the quants above are q + 32
    for (int j = 0; j < 16; ++j) offset += scales[j] * sum16[j];
    return hsum_epi32(acc) - 32 * offset;
  }
};

struct DotQ80 : Q8DotNoMins {
  const BlockQ8_0* b = nullptr;
  void load(const uint8_t* blk) {
    b = reinterpret_cast<const BlockQ8_0*>(blk);
    d = _cvtsh_ss(b->d);
  }
  int32_t isum(const int8_t* xq, const int16_t*) const {
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
    // |w| (<= 128 as u8) times x with w's sign (|x| <= 127): pair sums < 2^15
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
    return hsum_epi32(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }
};

}  // namespace

void matvec_q8_avx2(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  q8_rows_by_type<DotKQuant45, DotQ6K, DotQ80>(w, a, r0, r1, y, ldy);
}

}  // namespace muser::cpu

#endif  // MUSER_X86
