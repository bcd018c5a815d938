// The canonical f32-activation matvec on AVX-512 (compiled with the flags
// CMakeLists.txt gives *_avx512.cpp; chosen at run time by
// matvec_dispatch.cpp). Bit-equal to matvec_canon_scalar.
//
// Lane mapping. The canonical 32 lanes of one (row, token) live in two zmm
// accumulators: `lo` holds lanes 0-15, `hi` lanes 16-31. Elements 32s..32s+15
// of a row feed `lo` and 32s+16..32s+31 feed `hi`, each with one
// _mm512_fmadd_ps (= fmaf per lane) in increasing s. The lanes are joined by
// fold_canonical: lo+hi (offset 16), then halves 8, 4, 2, 1 - the butterfly
// tree of canon_tree32, a[l] = a[l] + a[l + offset]. A float row whose length
// is not a multiple of 32 ends with masked loads and masked fmas, so lanes
// past the end keep their value exactly (no +0 added to a -0).
//
// Algorithm. Up to 8 tokens per pass; two rows side by side for one token
// (their fma chains interleave), one row otherwise. A 256-element block is
// decoded once and every token multiplies it, so a batch reads the weight
// once and t tokens cost t fmas per weight, not t decodes. K-quants are
// unpacked 64 quants per zmm in the byte domain (unpack_avx512.h); each
// group of 16 is then spread to dword lanes by one masked byte permute,
// converted and scaled with one fma (d1*q - m1, the dequant.h value) and
// multiplied in: 4 vector instructions per 16 weights at one token. The
// next blocks are prefetched. When the tokens' activations outgrow L1, rows
// go in groups of 32 and the columns in chunks, every row of the group
// taking a chunk before the next one, the accumulators parked between
// chunks - an exact copy, so the order is unchanged.
//
// Fuses: decode + dot product. Epilogues are separate nodes. Only
// intrinsics and this file's helpers run here: shared inline code compiled
// with AVX-512 flags could be picked by the linker for baseline code.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

// VBMI (the byte permute) is added to this file's flags alone in
// CMakeLists.txt (a per-file flag, not a pragma: clang has no
// `#pragma GCC target`); isa.cpp only selects this path on CPUs that have it
// (Ice Lake, Zen 4 and later).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "cpu/kernels.h"
#include "cpu/unpack_avx512.h"

namespace muser::cpu {

namespace {

// The canonical tree over lanes lo[0..15], hi[0..15] (= lanes 16..31).
inline float fold_canonical(__m512 lo, __m512 hi) {
  const __m512 v16 = _mm512_add_ps(lo, hi);  // a[l] + a[l+16]
  const __m256 v8 = _mm256_add_ps(_mm512_castps512_ps256(v16), _mm512_extractf32x8_ps(v16, 1));
  const __m128 v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps(v8, 1));
  const __m128 v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
  const __m128 v1 = _mm_add_ss(v2, _mm_shuffle_ps(v2, v2, 1));
  return _mm_cvtss_f32(v1);
}

// ---- block decoders: load(block) once, then group(s) gives elements
// 32s..32s+15 (w0) and 32s+16..32s+31 (w1) of the block as f32 ----

// Per-group scales are stored once per block and broadcast from memory
// (a load-port operation). Without this barrier the compiler keeps them in a
// register and broadcasts each with a lane permute, which competes with the
// byte permutes for the one shuffle port.
inline void reload_barrier() { __asm__ volatile("" ::: "memory"); }

// Spread 16 bytes of z (from byte `first`) to the 16 dword lanes, zero-extended.
inline __m512i bytes_to_dwords(__m512i z, int first) {
  const __m512i idx = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                       _mm512_set1_epi32(first));
  return _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, idx, z);
}

// Q4_K / Q5_K: w = fma(d*sc_j, q, -(dmin*m_j)) = d1*q - m1 with one rounding.
template <bool kQ5>
struct DecodeKQuant {
  static constexpr int64_t kBlockBytes = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  __m512i z[4];                // quants in kquant_unpack's order
  alignas(64) float sm[16];    // d * sc_j (j < 8), then -(dmin * m_j)
  void load(const uint8_t* blk) {
    const uint8_t *qs, *qh = nullptr, *scales;
    uint16_t d, dmin;
    if (kQ5) {
      const BlockQ5_K& b = *reinterpret_cast<const BlockQ5_K*>(blk);
      qs = b.qs, qh = b.qh, scales = b.scales, d = b.d, dmin = b.dmin;
    } else {
      const BlockQ4_K& b = *reinterpret_cast<const BlockQ4_K*>(blk);
      qs = b.qs, scales = b.scales, d = b.d, dmin = b.dmin;
    }
    kquant_unpack<kQ5>(qs, qh, z);
    alignas(16) uint8_t bytes[16];
    kquant_scale_bytes(scales, bytes);
    // d and dmin widened together; the scales and mins times them (exact: an
    // 11-bit f16 times a 6-bit integer), each factor broadcast from memory so
    // the shuffle port stays free for the byte permutes
    alignas(16) float dm[4];
    _mm_store_ps(dm, _mm_cvtph_ps(_mm_cvtsi32_si128((int)d | ((int)dmin << 16))));
    reload_barrier();
    const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(bytes))));
    const __m512 scaled = _mm512_mul_ps(f, _mm512_set1_ps(dm[0]));
    _mm512_store_ps(sm, _mm512_mask_mul_ps(scaled, 0xFF00, f, _mm512_set1_ps(-dm[1])));
    reload_barrier();
  }
  // sub-block s sits in z[kZ[s]] from byte kByte[s] (kquant_unpack's order 0,2,1,3,4,6,5,7)
  void group(int s, __m512& w0, __m512& w1) const {
    static constexpr int kZ[8] = {0, 1, 0, 1, 2, 3, 2, 3}, kByte[8] = {0, 0, 32, 32, 0, 0, 32, 32};
    const __m512 sc = _mm512_set1_ps(sm[s]), mn = _mm512_set1_ps(sm[8 + s]);
    w0 = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(bytes_to_dwords(z[kZ[s]], kByte[s])), mn);
    w1 = _mm512_fmadd_ps(sc, _mm512_cvtepi32_ps(bytes_to_dwords(z[kZ[s]], kByte[s] + 16)), mn);
  }
};

// Q6_K: w = (d * sc_j) * (q - 32), exact; sub-blocks of 16 (one per w0/w1).
struct DecodeQ6K {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ6_K);
  __m512i z[4];                 // q - 32, element order, 64 per zmm
  alignas(64) float scale[16];  // d * sc_j
  void load(const uint8_t* blk) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(blk);
    q6k_unpack(b, z, true);
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales))));
    _mm512_store_ps(scale, _mm512_mul_ps(_mm512_set1_ps(_cvtsh_ss(b.d)), sc));
    reload_barrier();
  }
  // 16 signed bytes of z from byte `first`, sign-extended into dword lanes:
  // the byte lands in the top byte of its lane and an arithmetic shift brings it down
  static __m512i signed_dwords(__m512i z, int first) {
    const __m512i idx = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(first)),
        24);
    return _mm512_srai_epi32(_mm512_maskz_permutexvar_epi8(0x8888888888888888ull, idx, z), 24);
  }
  void group(int s, __m512& w0, __m512& w1) const {
    const __m512i zz = z[s / 2];
    const int first = 32 * (s % 2);
    w0 = _mm512_mul_ps(_mm512_set1_ps(scale[2 * s]), _mm512_cvtepi32_ps(signed_dwords(zz, first)));
    w1 = _mm512_mul_ps(_mm512_set1_ps(scale[2 * s + 1]), _mm512_cvtepi32_ps(signed_dwords(zz, first + 16)));
  }
};

// Q8_0: eight 34-byte blocks per 256 elements; w = q * d, exact.
struct DecodeQ80 {
  static constexpr int64_t kBlockBytes = 8 * sizeof(BlockQ8_0);
  const BlockQ8_0* b = nullptr;
  void load(const uint8_t* blk) { b = reinterpret_cast<const BlockQ8_0*>(blk); }
  void group(int s, __m512& w0, __m512& w1) const {
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b[s].d));
    w0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)b[s].qs))));
    w1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(b[s].qs + 16)))));
  }
};

// Float rows: 256 elements per "block"; group_masked serves a short last group.
struct DecodeF32 {
  static constexpr int64_t kBlockBytes = 1024;
  const float* p = nullptr;
  void load(const uint8_t* blk) { p = reinterpret_cast<const float*>(blk); }
  void group(int s, __m512& w0, __m512& w1) const {
    w0 = _mm512_loadu_ps(p + 32 * s);
    w1 = _mm512_loadu_ps(p + 32 * s + 16);
  }
  void group_masked(int s, __mmask16 m0, __mmask16 m1, __m512& w0, __m512& w1) const {
    w0 = _mm512_maskz_loadu_ps(m0, p + 32 * s);
    w1 = _mm512_maskz_loadu_ps(m1, p + 32 * s + 16);
  }
};

struct DecodeF16 {
  static constexpr int64_t kBlockBytes = 512;
  const uint16_t* p = nullptr;
  void load(const uint8_t* blk) { p = reinterpret_cast<const uint16_t*>(blk); }
  void group(int s, __m512& w0, __m512& w1) const {
    w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 32 * s)));
    w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 32 * s + 16)));
  }
  void group_masked(int s, __mmask16 m0, __mmask16 m1, __m512& w0, __m512& w1) const {
    w0 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m0, p + 32 * s));
    w1 = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m1, p + 32 * s + 16));
  }
};

struct DecodeBF16 {
  static constexpr int64_t kBlockBytes = 512;
  const uint16_t* p = nullptr;
  void load(const uint8_t* blk) { p = reinterpret_cast<const uint16_t*>(blk); }
  static __m512 widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  void group(int s, __m512& w0, __m512& w1) const {
    w0 = widen(_mm256_loadu_si256((const __m256i*)(p + 32 * s)));
    w1 = widen(_mm256_loadu_si256((const __m256i*)(p + 32 * s + 16)));
  }
  void group_masked(int s, __mmask16 m0, __mmask16 m1, __m512& w0, __m512& w1) const {
    w0 = widen(_mm256_maskz_loadu_epi16(m0, p + 32 * s));
    w1 = widen(_mm256_maskz_loadu_epi16(m1, p + 32 * s + 16));
  }
};

template <class D>
constexpr bool kIsFloatRow = std::is_same<D, DecodeF32>::value || std::is_same<D, DecodeF16>::value ||
                             std::is_same<D, DecodeBF16>::value;

// Accumulators of one (row, token), parked between column chunks.
struct AccPair {
  __m512 lo, hi;
};

// R rows from r, T tokens (x rows at x + k*ldx), columns [c0, c1): c0 a
// multiple of 256, c1 = K or a multiple of 256. acc: R*T pairs, in and out.
template <class D, int R, int T>
void rows_chunk(const WeightView& w, const float* x, int64_t ldx, int64_t r, int64_t c0, int64_t c1, AccPair* acc) {
  __m512 lo[R][T], hi[R][T];
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < T; ++k) lo[i][k] = acc[i * T + k].lo, hi[i][k] = acc[i * T + k].hi;
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = w.data + (r + i) * w.row_bytes;
  D dec[R];
  const int64_t full_end = c0 + (c1 - c0) / kQK_K * kQK_K;
  for (int64_t c = c0; c < full_end; c += kQK_K) {
    // prefetch ~1.5 KiB on in this row, or the start of the next rows' chunk
    const int64_t ahead = c + std::max<int64_t>(1, 1536 / D::kBlockBytes) * kQK_K;
    for (int i = 0; i < R; ++i) {
      const uint8_t* p = ahead < c1 ? rows[i] + ahead / kQK_K * D::kBlockBytes
                                    : rows[i] + R * w.row_bytes + (c0 + ahead - c1) / kQK_K * D::kBlockBytes;
      for (int64_t o = 0; o < D::kBlockBytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
      dec[i].load(rows[i] + c / kQK_K * D::kBlockBytes);
    }
#pragma GCC unroll 8  // constant sub-block positions: the permute indices fold to constants
    for (int s = 0; s < 8; ++s) {
      for (int i = 0; i < R; ++i) {
        __m512 w0, w1;
        dec[i].group(s, w0, w1);
        for (int k = 0; k < T; ++k) {
          const float* xs = x + k * ldx + c + 32 * s;
          lo[i][k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xs), lo[i][k]);
          hi[i][k] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xs + 16), hi[i][k]);
        }
      }
    }
  }
  if (full_end < c1) {  // the row's last, partial block: whole groups, then one short one
    const int64_t c = full_end;
    const int n = (int)(c1 - c);
    for (int i = 0; i < R; ++i) dec[i].load(rows[i] + c / kQK_K * D::kBlockBytes);
    for (int s = 0; 32 * s < n; ++s) {
      const int left = n - 32 * s;
      for (int i = 0; i < R; ++i) {
        __m512 w0, w1;
        __mmask16 m0 = 0xFFFF, m1 = 0xFFFF;
        if (left >= 32) {
          dec[i].group(s, w0, w1);
        } else if constexpr (kIsFloatRow<D>) {
          m0 = (__mmask16)(left >= 16 ? 0xFFFF : (1u << left) - 1);
          m1 = (__mmask16)(left > 16 ? (1u << (left - 16)) - 1 : 0);
          dec[i].group_masked(s, m0, m1, w0, w1);
        } else {
          dec[i].group(s, w0, w1);  // unreachable: block types end on a whole group
        }
        for (int k = 0; k < T; ++k) {
          const float* xs = x + k * ldx + c + 32 * s;
          lo[i][k] = _mm512_mask3_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, xs), lo[i][k], m0);
          hi[i][k] = _mm512_mask3_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, xs + 16), hi[i][k], m1);
        }
      }
    }
  }
  for (int i = 0; i < R; ++i)
    for (int k = 0; k < T; ++k) acc[i * T + k].lo = lo[i][k], acc[i * T + k].hi = hi[i][k];
}

// Rows [r0, r1) for T tokens at x, two rows at a time for one token (each
// canonical lane is one chain of dependent fmas, 4 cycles apiece: a second
// row's chains fill the gaps). When the tokens' activations fit in L1 each
// row is done in one pass. Otherwise rows go in groups of kGroupRows, the
// columns in chunks of ~24 KiB of activations, and every row of the group
// takes a chunk before the next chunk, so a chunk of x is read from L1 by
// the whole group (reading it from L2 for each row cost 3x at t = 8); the
// accumulators wait between chunks in a parking buffer, an exact copy.
template <class D, int T>
void rows_for_tokens(const WeightView& w, const float* x, int64_t ldx, int64_t r0, int64_t r1, float* y,
                     int64_t ldy) {
  constexpr int R = T == 1 ? 2 : 1;
  constexpr int64_t kL1Floats = 6144;  // 24 KiB of activations per column chunk
  constexpr int kGroupRows = 32;
  const int64_t K = w.cols;
  const int64_t chunk = T * K <= 2 * kL1Floats ? K : std::max<int64_t>(kQK_K, kL1Floats / T / kQK_K * kQK_K);
  AccPair park[kGroupRows * T];
  for (int64_t g = r0; g < r1; g += kGroupRows) {
    const int64_t g1 = std::min(r1, g + kGroupRows);
    for (int64_t j = 0; j < (g1 - g) * T; ++j) park[j].lo = park[j].hi = _mm512_setzero_ps();
    for (int64_t c0 = 0; c0 < K; c0 += chunk) {
      const int64_t c1 = std::min(K, c0 + chunk);
      int64_t r = g;
      for (; r + R <= g1; r += R) rows_chunk<D, R, T>(w, x, ldx, r, c0, c1, park + (r - g) * T);
      for (; r < g1; ++r) rows_chunk<D, 1, T>(w, x, ldx, r, c0, c1, park + (r - g) * T);
    }
    for (int64_t r = g; r < g1; ++r)
      for (int k = 0; k < T; ++k) y[k * ldy + r] = fold_canonical(park[(r - g) * T + k].lo, park[(r - g) * T + k].hi);
  }
}

template <class D>
void matvec_typed(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                  int64_t ldy) {
  for (int t0 = 0; t0 < t; t0 += 8) {
    const float* xs = x + t0 * ldx;
    float* ys = y + t0 * ldy;
    switch (std::min(8, t - t0)) {
      case 1: rows_for_tokens<D, 1>(w, xs, ldx, r0, r1, ys, ldy); break;
      case 2: rows_for_tokens<D, 2>(w, xs, ldx, r0, r1, ys, ldy); break;
      case 3: rows_for_tokens<D, 3>(w, xs, ldx, r0, r1, ys, ldy); break;
      case 4: rows_for_tokens<D, 4>(w, xs, ldx, r0, r1, ys, ldy); break;
      case 5: rows_for_tokens<D, 5>(w, xs, ldx, r0, r1, ys, ldy); break;
      case 6: rows_for_tokens<D, 6>(w, xs, ldx, r0, r1, ys, ldy); break;
      case 7: rows_for_tokens<D, 7>(w, xs, ldx, r0, r1, ys, ldy); break;
      default: rows_for_tokens<D, 8>(w, xs, ldx, r0, r1, ys, ldy); break;
    }
  }
}

}  // namespace

void matvec_canon_avx512(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                         int64_t ldy) {
  switch ((GgmlType)w.type) {
    case GgmlType::Q5_K: return matvec_typed<DecodeKQuant<true>>(w, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::Q4_K: return matvec_typed<DecodeKQuant<false>>(w, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::Q6_K: return matvec_typed<DecodeQ6K>(w, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::Q8_0: return matvec_typed<DecodeQ80>(w, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::F16: return matvec_typed<DecodeF16>(w, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::BF16: return matvec_typed<DecodeBF16>(w, x, ldx, t, r0, r1, y, ldy);
    case GgmlType::F32: return matvec_typed<DecodeF32>(w, x, ldx, t, r0, r1, y, ldy);
    default: return matvec_canon_scalar(w, x, ldx, t, r0, r1, y, ldy);
  }
}

}  // namespace muser::cpu

#endif  // MUSER_X86
