// The canonical f32-activation matvec on AVX2 + FMA + F16C (compiled with the
// flags CMakeLists.txt gives *_avx2.cpp; chosen at run time by
// matvec_dispatch.cpp). Bit-equal to matvec_canon_scalar.
//
// Lane mapping. The canonical 32 lanes of one (row, token) live in four ymm
// accumulators a[0..3] holding lanes 0-7, 8-15, 16-23, 24-31; elements
// 32s + 8q .. 32s + 8q + 7 feed a[q] with one _mm256_fmadd_ps (= fmaf per
// lane) in increasing s. fold_canonical joins them with the butterfly tree:
// offset 16 is a[0]+a[2], a[1]+a[3]; offset 8 adds those two; then halves 4,
// 2, 1. A float row's short last group blends the fma result into the lanes
// it owns, so lanes past the end keep their value exactly.
//
// Algorithm. Rows in tiles of R rows x T tokens (R = 2 for one token, else 1;
// at most 3 tokens per pass: AVX2 has 16 registers and each (row, token)
// needs four). A 256-element block is decoded once per tile into the byte
// domain (K-quants: nibbles, high bits, 32 at a time), then widened,
// converted and scaled 8 at a time; every token of the tile multiplies it.
// When the tokens' activations outgrow L1, rows go in groups of 32 that
// share each column chunk of x.
//
// Fuses: decode + dot product. Only intrinsics and this file's own helpers
// are used: shared inline functions compiled here with AVX2 flags could be
// picked by the linker for baseline code.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

#include <immintrin.h>

#include <cstring>

#include "cpu/kernels.h"
#include "cpu/kquant_scales.h"

namespace muser::cpu {

namespace {

inline float f16_scalar(uint16_t h) { return _cvtsh_ss(h); }

inline float fold_canonical(const __m256 a[4]) {
  const __m256 v16a = _mm256_add_ps(a[0], a[2]);  // lanes 0-7:  a[l] + a[l+16]
  const __m256 v16b = _mm256_add_ps(a[1], a[3]);  // lanes 8-15
  const __m256 v8 = _mm256_add_ps(v16a, v16b);    // a[l] + a[l+8]
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  const __m128 v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1));
  return _mm_cvtss_f32(v1);
}

inline __m256 widen_u8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
inline __m256 widen_i8(const int8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Q4_K / Q5_K: w = fma(d*sc_j, q, -(dmin*m_j)), quants in element order.
template <bool kQ5>
struct DecodeKQuant {
  alignas(32) uint8_t q[256];
  alignas(32) float scale[8], negmin[8];
  void load(const uint8_t* blk) {
    const uint8_t* qs = blk + 16;  // after d, dmin, scales[12]
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    __m256i qh = _mm256_setzero_si256();
    if (kQ5) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    if (kQ5) qs = blk + 48;
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(raw, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if (kQ5) {  // bit s of qh[l] -> bit 4: word shifts by 4 - s never cross a byte at bit 4
        const int s = 2 * c;
        const __m256i h_lo = s <= 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(4 - s)) : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s - 4));
        const __m256i h_hi = s + 1 <= 4 ? _mm256_sll_epi16(qh, _mm_cvtsi32_si128(3 - s)) : _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s - 3));
        lo = _mm256_or_si256(lo, _mm256_and_si256(h_lo, bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(h_hi, bit4));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 64 * c), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 64 * c + 32), hi);
    }
    uint16_t d16, dmin16;
    memcpy(&d16, blk, 2);
    memcpy(&dmin16, blk + 2, 2);
    alignas(16) uint8_t sm[16];
    kquant_scale_bytes(blk + 4, sm);
    // d * sc and -(dmin * m) are exact: an 11-bit f16 times a 6-bit integer
    _mm256_store_ps(scale, _mm256_mul_ps(_mm256_set1_ps(f16_scalar(d16)), widen_u8(sm)));
    _mm256_store_ps(negmin, _mm256_mul_ps(_mm256_set1_ps(-f16_scalar(dmin16)), widen_u8(sm + 8)));
  }
  void group(int s, __m256 w[4]) const {
    const __m256 sc = _mm256_set1_ps(scale[s]), mn = _mm256_set1_ps(negmin[s]);
    for (int k = 0; k < 4; ++k) w[k] = _mm256_fmadd_ps(sc, widen_u8(q + 32 * s + 8 * k), mn);
  }
};

// Q6_K: w = (d * sc_j) * (q - 32), exact; quants (q - 32) in element order.
struct DecodeQ6K {
  alignas(32) int8_t q[256];
  alignas(32) float scale[16];
  void load(const uint8_t* blk) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(blk);
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30), m32 = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
      // quarter u of the half: nibble of ql0/ql1, bits 2u..2u+1 of qh moved to bits 4-5
      const __m256i v[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), _mm256_and_si256(qh, bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                          _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45))};
      for (int u = 0; u < 4; ++u)
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + 128 * h + 32 * u), _mm256_sub_epi8(v[u], m32));
    }
    const __m256 d = _mm256_set1_ps(f16_scalar(b.d));
    _mm256_store_ps(scale, _mm256_mul_ps(d, widen_i8(b.scales)));
    _mm256_store_ps(scale + 8, _mm256_mul_ps(d, widen_i8(b.scales + 8)));
  }
  void group(int s, __m256 w[4]) const {
    for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(_mm256_set1_ps(scale[2 * s + k / 2]), widen_i8(q + 32 * s + 8 * k));
  }
};

struct DecodeQ80 {
  const BlockQ8_0* b = nullptr;
  void load(const uint8_t* blk) { b = reinterpret_cast<const BlockQ8_0*>(blk); }
  void group(int s, __m256 w[4]) const {
    const __m256 d = _mm256_set1_ps(f16_scalar(b[s].d));
    for (int k = 0; k < 4; ++k) w[k] = _mm256_mul_ps(d, widen_i8(b[s].qs + 8 * k));
  }
};

// Float rows. group_partial decodes the first n < 32 elements of group s,
// zeros elsewhere (read through a padded copy: no access past the row).
struct DecodeF32 {
  static constexpr int kBytes = 4;
  const uint8_t* p = nullptr;
  void load(const uint8_t* blk) { p = blk; }
  static __m256 get(const uint8_t* q) { return _mm256_loadu_ps(reinterpret_cast<const float*>(q)); }
};
struct DecodeF16 {
  static constexpr int kBytes = 2;
  const uint8_t* p = nullptr;
  void load(const uint8_t* blk) { p = blk; }
  static __m256 get(const uint8_t* q) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))); }
};
struct DecodeBF16 {
  static constexpr int kBytes = 2;
  const uint8_t* p = nullptr;
  void load(const uint8_t* blk) { p = blk; }
  static __m256 get(const uint8_t* q) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
};
template <class F>
struct DecodeFloat : F {
  void group(int s, __m256 w[4]) const {
    for (int k = 0; k < 4; ++k) w[k] = F::get(this->p + (32 * s + 8 * k) * F::kBytes);
  }
  void group_partial(int s, int n, __m256 w[4]) const {
    alignas(32) uint8_t pad[32 * 4] = {};
    memcpy(pad, this->p + 32 * s * F::kBytes, (size_t)n * F::kBytes);
    for (int k = 0; k < 4; ++k) w[k] = F::get(pad + 8 * k * F::kBytes);
  }
};

template <class D>
struct IsFloatRow : std::false_type {};
template <class F>
struct IsFloatRow<DecodeFloat<F>> : std::true_type {};

struct Acc4 {
  __m256 a[4];
};

// Tile of R rows x T tokens over columns [c0, c1) (c0 a multiple of 256).
template <class D, int R, int T>
void tile(const WeightView& w, int64_t block_bytes, const float* x, int64_t ldx, int64_t r, int64_t c0, int64_t c1,
          Acc4* acc) {
  D dec[R];
  const int64_t full_end = c0 + (c1 - c0) / kQK_K * kQK_K;
  for (int64_t c = c0; c < c1; c += kQK_K) {
    for (int i = 0; i < R; ++i) dec[i].load(w.data + (r + i) * w.row_bytes + c / kQK_K * block_bytes);
    const int n = (int)(c < full_end ? kQK_K : c1 - c);
    for (int s = 0; 32 * s < n; ++s) {
      const int left = n - 32 * s;
      for (int i = 0; i < R; ++i) {
        __m256 wv[4];
        if (left >= 32) {
          dec[i].group(s, wv);
          for (int k = 0; k < T; ++k) {
            const float* xs = x + k * ldx + c + 32 * s;
            for (int q = 0; q < 4; ++q)
              acc[i * T + k].a[q] = _mm256_fmadd_ps(wv[q], _mm256_loadu_ps(xs + 8 * q), acc[i * T + k].a[q]);
          }
        } else if constexpr (IsFloatRow<D>::value) {
          dec[i].group_partial(s, left, wv);
          for (int k = 0; k < T; ++k) {
            alignas(32) float xpad[32] = {};
            memcpy(xpad, x + k * ldx + c + 32 * s, (size_t)left * 4);
            for (int q = 0; q < 4; ++q) {
              alignas(32) int32_t lane_mask[8];
              for (int l = 0; l < 8; ++l) lane_mask[l] = 8 * q + l < left ? -1 : 0;
              const __m256 m = _mm256_castsi256_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(lane_mask)));
              const __m256 f = _mm256_fmadd_ps(wv[q], _mm256_load_ps(xpad + 8 * q), acc[i * T + k].a[q]);
              acc[i * T + k].a[q] = _mm256_blendv_ps(acc[i * T + k].a[q], f, m);
            }
          }
        }
      }
    }
  }
}

// Rows [r0, r1) for T tokens. When the tokens' activations fit in L1 each row
// is done in one pass; otherwise rows go in groups of kGroupRows and every
// row of a group takes a column chunk before the next chunk, so the chunk of
// x is read from L1 by the whole group; accumulators wait in a parking buffer.
template <class D, int T>
void rows_for_tokens(const WeightView& w, int64_t block_bytes, const float* x, int64_t ldx, int64_t r0, int64_t r1,
                     float* y, int64_t ldy) {
  constexpr int R = T == 1 ? 2 : 1;
  constexpr int64_t kL1Floats = 6144;  // 24 KiB of activations per column chunk
  constexpr int kGroupRows = 32;
  const int64_t K = w.cols;
  int64_t chunk = T * K <= 2 * kL1Floats ? K : kL1Floats / T / kQK_K * kQK_K;
  if (chunk < kQK_K) chunk = kQK_K;
  Acc4 park[kGroupRows * T];
  for (int64_t g = r0; g < r1; g += kGroupRows) {
    const int64_t g1 = g + kGroupRows < r1 ? g + kGroupRows : r1;
    for (int64_t j = 0; j < (g1 - g) * T; ++j)
      for (int q = 0; q < 4; ++q) park[j].a[q] = _mm256_setzero_ps();
    for (int64_t c0 = 0; c0 < K; c0 += chunk) {
      const int64_t c1 = c0 + chunk < K ? c0 + chunk : K;
      int64_t r = g;
      for (; r + R <= g1; r += R) tile<D, R, T>(w, block_bytes, x, ldx, r, c0, c1, park + (r - g) * T);
      for (; r < g1; ++r) tile<D, 1, T>(w, block_bytes, x, ldx, r, c0, c1, park + (r - g) * T);
    }
    for (int64_t r = g; r < g1; ++r)
      for (int k = 0; k < T; ++k) y[k * ldy + r] = fold_canonical(park[(r - g) * T + k].a);
  }
}

template <class D>
void matvec_typed(const WeightView& w, int64_t block_bytes, const float* x, int64_t ldx, int t, int64_t r0,
                  int64_t r1, float* y, int64_t ldy) {
  for (int t0 = 0; t0 < t; t0 += 3) {
    const float* xs = x + t0 * ldx;
    float* ys = y + t0 * ldy;
    switch (t - t0 < 3 ? t - t0 : 3) {
      case 1: rows_for_tokens<D, 1>(w, block_bytes, xs, ldx, r0, r1, ys, ldy); break;
      case 2: rows_for_tokens<D, 2>(w, block_bytes, xs, ldx, r0, r1, ys, ldy); break;
      default: rows_for_tokens<D, 3>(w, block_bytes, xs, ldx, r0, r1, ys, ldy); break;
    }
  }
}

}  // namespace

void matvec_canon_avx2(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                       int64_t ldy) {
  // bytes of one 256-element stretch of a row
  switch ((GgmlType)w.type) {
    case GgmlType::Q5_K: return matvec_typed<DecodeKQuant<true>>(w, sizeof(BlockQ5_K), x, ldx, t, r0, r1, y, ldy);
    case GgmlType::Q4_K: return matvec_typed<DecodeKQuant<false>>(w, sizeof(BlockQ4_K), x, ldx, t, r0, r1, y, ldy);
    case GgmlType::Q6_K: return matvec_typed<DecodeQ6K>(w, sizeof(BlockQ6_K), x, ldx, t, r0, r1, y, ldy);
    case GgmlType::Q8_0: return matvec_typed<DecodeQ80>(w, 8 * sizeof(BlockQ8_0), x, ldx, t, r0, r1, y, ldy);
    case GgmlType::F16: return matvec_typed<DecodeFloat<DecodeF16>>(w, 512, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::BF16: return matvec_typed<DecodeFloat<DecodeBF16>>(w, 512, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::F32: return matvec_typed<DecodeFloat<DecodeF32>>(w, 1024, x, ldx, t, r0, r1, y, ldy);
    default: return matvec_canon_scalar(w, x, ldx, t, r0, r1, y, ldy);
  }
}

}  // namespace muser::cpu

#endif  // MUSER_X86
