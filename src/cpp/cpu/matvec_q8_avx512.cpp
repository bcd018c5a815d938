// The q8 matvec (acts="q8") on AVX-512 with VNNI. Bit-equal to
// matvec_q8_scalar: the integer part of every block is exact whatever the
// instruction order, and the float part is computed in the scalar twin's
// order (docs/numerics.md, "q8 activations").
//
// Algorithm. Rows go in tiles of 16, tokens in groups of up to 8; the tile
// is walked block by block, each block across its 16 rows (16 sequential
// weight streams, software-prefetched).
//  1. Integer pass, row by row: a weight block is unpacked once into 64-byte
//     vectors of unsigned quants (unpack_avx512.h) and, for each token,
//       Q4_K/Q5_K/Q6_K: p = maddubs(q, x) (16-bit pair sums, no saturation:
//                       2*63*127 < 2^15), acc = dpwssd(acc, p, sub-block scales)
//       Q8_0:           acc = dpbusd(x + 128, w) - 128 * dpbusd(1, w)
//     leaving one zmm of 16 int32 partial sums per (row, token) of the block.
//  2. Reduction, per (block, token): reduce16 transposes-and-adds the 16
//     rows' zmm into one zmm whose lane i is row i's exact block sum; the
//     Q4_K/Q5_K mins sum (sum_j m_j * sum32_j) is reduced the same way from
//     vpmaddwd products, and Q6_K's "-32" correction is one dpwssd of the
//     scales with ggml's bsums.
//  3. Float pass, 16 rows per zmm, blocks in order: the f16 block scales of
//     the 16 rows are widened together and the per-block fma of the scalar
//     twin runs lane-wise, so the order per row is exactly the scalar one.
// Lane mapping: in steps 1-2 a lane holds part of an integer sum (order
// free); in step 3 lane i is row i of the tile.
//
// Q4_K/Q5_K quants come out of a 64-byte nibble load in sub-block order
// 0,2,1,3,4,6,5,7; ActsQ8::qs_nibble_order holds the activations in that
// order so no shuffle is needed. Fuses: quantized dot + block scales.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "cpu/kernels.h"
#include "cpu/unpack_avx512.h"
#include "cpu/x86_f32_ops.h"
#include "muser/q8_step.h"

namespace muser::cpu {

namespace {

// muser/q8_step.h's float chain on 16 rows at once (lane i: row i of the tile).
struct V512 {
  MUSER_X86_F32_OPS(__m512, _mm512, 16)
  using I = __m512i;
  static F cvt(I i) { return _mm512_cvtepi32_ps(i); }
};

constexpr int kTileRows = 16;
constexpr int kTokenGroup = 8;

// Lane i of the result = sum of the 16 dword lanes of v[i].
inline __m512i reduce16(const __m512i* v) {
  __m512i t[8], u[4];
  for (int k = 0; k < 8; ++k)  // per 128-bit lane: [row 2k, row 2k+1, row 2k, row 2k+1]
    t[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]),
                            _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k)  // per 128-bit lane: rows 4k .. 4k+3
    u[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * k], t[2 * k + 1]),
                            _mm512_unpackhi_epi64(t[2 * k], t[2 * k + 1]));
  // 128-bit lanes: [rows 0-3, rows 0-3, rows 4-7, rows 4-7] and the same for 8-15
  const __m512i z0 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
  const __m512i z1 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(z0, z1, 0x88), _mm512_shuffle_i32x4(z0, z1, 0xDD));
}

// Two blocks per zmm (lanes 0-7 block A, 8-15 block B): lane i of a / b =
// row i's sum of block A / B.
inline void reduce16_pairs(const __m512i* v, __m512i* a, __m512i* b) {
  __m512i t[8], u[4];
  for (int k = 0; k < 8; ++k)
    t[k] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * k], v[2 * k + 1]),
                            _mm512_unpackhi_epi32(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k)
    u[k] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * k], t[2 * k + 1]),
                            _mm512_unpackhi_epi64(t[2 * k], t[2 * k + 1]));
  // 128-bit lanes: [rows 0-3 A, rows 0-3 B, rows 4-7 A, rows 4-7 B]
  const __m512i z0 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[0], u[1], 0x88), _mm512_shuffle_i32x4(u[0], u[1], 0xDD));
  const __m512i z1 = _mm512_add_epi32(_mm512_shuffle_i32x4(u[2], u[3], 0x88), _mm512_shuffle_i32x4(u[2], u[3], 0xDD));
  *a = _mm512_shuffle_i32x4(z0, z1, 0x88);
  *b = _mm512_shuffle_i32x4(z0, z1, 0xDD);
}

// Word slot of row i's eight mins in a block's 128-word mins tile, chosen so
// that mins_sum's vpmaddwd + two unpack levels leave row i in lane i.
inline int mins_slot(int i) { return ((i % 4) * 4 + i / 4) * 8; }

// Lane i = sum_j mins[row i][j] * x_sum32[j] for the 16 rows of a tile.
inline __m512i mins_sum(const int16_t* tile_mins, const int16_t* x_sum32) {
  const __m512i xs = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x_sum32)));
  __m512i p[4];
  for (int k = 0; k < 4; ++k) p[k] = _mm512_madd_epi16(_mm512_load_si512(tile_mins + 32 * k), xs);
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[0], p[1]), _mm512_unpackhi_epi32(p[0], p[1]));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(p[2], p[3]), _mm512_unpackhi_epi32(p[2], p[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

// One block's integer partial sums and scales for the 16 rows of a tile, on
// the stack: the block is reduced as soon as its 16 rows are done, so this
// stays in L1 whatever the row length.
struct alignas(64) BlockScratch {
  __m512i acc[kTokenGroup][kTileRows];  // [token][row]: partial sums of the block (two blocks for Q8_0)
  int16_t mins[128];                    // Q4_K/Q5_K: row i's mins at mins_slot(i)
  uint16_t d[2][kTileRows];             // f16 block scales [block of the pair][row]
  uint16_t dmin[kTileRows];             // Q4_K/Q5_K f16 min scales
};

// Software prefetch of a row's block some blocks on (past the row's end: the
// same place in the next tile's row), into L2 (T1). The integer pass walks
// the tile block by block, each block across its 16 rows: 16 sequential
// streams, each prefetched about 1.5 KiB (at least two blocks) ahead whatever
// the tokens. Against the earlier T0 (into L1) at 1.5 KiB / t ahead, tuned on
// an Intel Xeon VM (where hardware prefetch alone left a fifth of the read
// bandwidth unused), bench/experiments/cpu_kernel_ab.sh on the AMD EPYC
// (Zen 4) VM of 2026-12-04, seed-shaped heads, two threads, gave new / old at
// t = 1: Q5_K 0.81 (0.70 on one core), Q4_K 0.75, Q6_K 0.69, Q8_0 0.83 and
// 0.63 on the Gemma-3 shape; at t = 8 0.86 (Q5_K) to 1.05 (Q8_0). Not
// measured on an Intel machine since. The hint must be a constant where the
// prefetch is issued: choosing it per call (T1 for few tokens, T0 for many)
// made GCC drop every prefetch.
constexpr int64_t kPrefetchBytes = 1536;
inline void prefetch_ahead(const uint8_t* row, int64_t row_bytes, int64_t b, int64_t nb, int64_t block_bytes) {
  int64_t later = b + std::max<int64_t>(2, kPrefetchBytes / block_bytes);
  const uint8_t* p = row;
  if (later >= nb) later -= nb, p += kTileRows * row_bytes;
  p += later * block_bytes;
  for (int64_t o = 0; o < block_bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
}

inline __m512 widen_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

inline void store_rows(float* y, int nr, __m512 v) {
  _mm512_mask_storeu_ps(y, (__mmask16)((1u << nr) - 1), v);
}

// ---- Q4_K / Q5_K ----
template <bool kQ5>
void tile_kquant45(const WeightView& w, const ActsQ8& a, int64_t r, int nr, int k0, int nt, float* y, int64_t ldy) {
  constexpr int64_t kBlockBytes = kQ5 ? sizeof(BlockQ5_K) : sizeof(BlockQ4_K);
  const int64_t nb = a.blocks;
  BlockScratch s;
  __m512 sum_q[kTokenGroup], sum_m[kTokenGroup];
  for (int k = 0; k < nt; ++k) sum_q[k] = sum_m[k] = _mm512_setzero_ps();
  // sub-block scale words for z[0..3]: (sc0|sc2), (sc1|sc3), (sc4|sc6), (sc5|sc7), 16 words each
  const __m512i sc_idx[4] = {
      _mm512_set_epi16(2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
      _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
      _mm512_set_epi16(6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4),
      _mm512_set_epi16(7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5)};
  for (int i = nr; i < kTileRows; ++i) {  // rows past the end of the matrix contribute zeros
    for (int k = 0; k < nt; ++k) s.acc[k][i] = _mm512_setzero_si512();
    s.d[0][i] = s.dmin[i] = 0;
    memset(&s.mins[mins_slot(i)], 0, 16);
  }
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* xq = a.qs_nibble_order.data() + (size_t)k0 * a.cols + b * kQK_K;
    for (int i = 0; i < nr; ++i) {
      const uint8_t* row = w.data + (r + i) * w.row_bytes;
      prefetch_ahead(row, w.row_bytes, b, nb, kBlockBytes);
      const uint8_t* blk = row + b * kBlockBytes;
      __m512i z[4];
      alignas(16) uint8_t sm[16];
      if (kQ5) {
        const BlockQ5_K& q = *reinterpret_cast<const BlockQ5_K*>(blk);
        kquant_unpack<true>(q.qs, q.qh, z);
        kquant_scale_bytes(q.scales, sm);
        s.d[0][i] = q.d, s.dmin[i] = q.dmin;
      } else {
        const BlockQ4_K& q = *reinterpret_cast<const BlockQ4_K*>(blk);
        kquant_unpack<false>(q.qs, nullptr, z);
        kquant_scale_bytes(q.scales, sm);
        s.d[0][i] = q.d, s.dmin[i] = q.dmin;
      }
      const __m128i sm_bytes = _mm_load_si128(reinterpret_cast<const __m128i*>(sm));
      _mm_store_si128(reinterpret_cast<__m128i*>(&s.mins[mins_slot(i)]), _mm_cvtepu8_epi16(_mm_srli_si128(sm_bytes, 8)));
      const __m512i scw = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sm_bytes));
      __m512i sc[4];
      for (int c = 0; c < 4; ++c) sc[c] = _mm512_permutexvar_epi16(sc_idx[c], scw);
      for (int k = 0; k < nt; ++k) {
        const int8_t* xk = xq + (size_t)k * a.cols;
        __m512i acc = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c)
          acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(z[c], _mm512_loadu_si512(xk + 64 * c)), sc[c]);
        s.acc[k][i] = acc;
      }
    }
    const __m512 d16 = widen_f16x16(s.d[0]), dmin16 = widen_f16x16(s.dmin);
    for (int k = 0; k < nt; ++k) {
      const __m512i isum = reduce16(s.acc[k]);
      const __m512i msum = mins_sum(s.mins, a.sum32.data() + (size_t)(k0 + k) * (a.cols / 32) + b * 8);
      const __m512 dxb = _mm512_set1_ps(a.d[(size_t)(k0 + k) * nb + b]);
      sum_q[k] = q8_block_step<V512>(sum_q[k], dxb, d16, isum);
      sum_m[k] = q8_block_step<V512>(sum_m[k], dxb, dmin16, msum);
    }
  }
  for (int k = 0; k < nt; ++k) store_rows(y + (k0 + k) * ldy + r, nr, q8_kquant45_result<V512>(sum_q[k], sum_m[k]));
}

// ---- Q6_K ----
void tile_q6k(const WeightView& w, const ActsQ8& a, int64_t r, int nr, int k0, int nt, float* y, int64_t ldy) {
  constexpr int64_t kBlockBytes = sizeof(BlockQ6_K);
  const int64_t nb = a.blocks;
  BlockScratch s;
  __m512 sum_q[kTokenGroup];
  for (int k = 0; k < nt; ++k) sum_q[k] = _mm512_setzero_ps();
  // z[c] holds sub-blocks 4c..4c+3 (16 elements each = 8 words of maddubs output)
  __m512i sc_idx[4];
  for (int c = 0; c < 4; ++c) {
    alignas(64) int16_t idx[32];
    for (int wd = 0; wd < 32; ++wd) idx[wd] = (int16_t)(4 * c + wd / 8);
    sc_idx[c] = _mm512_load_si512(idx);
  }
  for (int i = nr; i < kTileRows; ++i) {
    for (int k = 0; k < nt; ++k) s.acc[k][i] = _mm512_setzero_si512();
    s.d[0][i] = 0;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const int8_t* xq = a.qs.data() + (size_t)k0 * a.cols + b * kQK_K;
    const int16_t* xs16 = a.sum16.data() + (size_t)k0 * (a.cols / 16) + b * 16;
    for (int i = 0; i < nr; ++i) {
      const uint8_t* row = w.data + (r + i) * w.row_bytes;
      prefetch_ahead(row, w.row_bytes, b, nb, kBlockBytes);
      const BlockQ6_K& q = *reinterpret_cast<const BlockQ6_K*>(row + b * kBlockBytes);
      __m512i z[4];
      q6k_unpack(q, z, false);
      s.d[0][i] = q.d;
      const __m512i scw = _mm512_cvtepi8_epi16(_mm256_zextsi128_si256(_mm_loadu_si128((const __m128i*)q.scales)));
      __m512i sc[4];
      for (int c = 0; c < 4; ++c) sc[c] = _mm512_permutexvar_epi16(sc_idx[c], scw);
      // -32 * sc_j as words in the low 256 bits: one dpwssd with ggml's
      // bsums removes the +32 offset of the unsigned quants
      const __m512i neg32sc = _mm512_zextsi256_si512(
          _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), _mm512_castsi512_si256(scw)), 5));
      for (int k = 0; k < nt; ++k) {
        const int8_t* xk = xq + (size_t)k * a.cols;
        const int16_t* sk = xs16 + (size_t)k * (a.cols / 16);
        __m512i acc = _mm512_dpwssd_epi32(_mm512_setzero_si512(), neg32sc,
                                          _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sk))));
        for (int c = 0; c < 4; ++c)
          acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(z[c], _mm512_loadu_si512(xk + 64 * c)), sc[c]);
        s.acc[k][i] = acc;
      }
    }
    const __m512 d16 = widen_f16x16(s.d[0]);
    for (int k = 0; k < nt; ++k) {
      const __m512i isum = reduce16(s.acc[k]);
      sum_q[k] = q8_block_step<V512>(sum_q[k], _mm512_set1_ps(a.d[(size_t)(k0 + k) * nb + b]), d16, isum);
    }
  }
  for (int k = 0; k < nt; ++k) store_rows(y + (k0 + k) * ldy + r, nr, sum_q[k]);
}

// ---- Q8_0: two 32-element blocks per zmm ----
void tile_q80(const WeightView& w, const ActsQ8& a, int64_t r, int nr, int k0, int nt, float* y, int64_t ldy) {
  constexpr int64_t kPairBytes = 2 * sizeof(BlockQ8_0);
  const int64_t nb = a.blocks, npairs = (nb + 1) / 2;
  BlockScratch s;
  __m512 sum_q[kTokenGroup];
  for (int k = 0; k < nt; ++k) sum_q[k] = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi8(1);
  for (int i = nr; i < kTileRows; ++i) {
    for (int k = 0; k < nt; ++k) s.acc[k][i] = _mm512_setzero_si512();
    s.d[0][i] = s.d[1][i] = 0;
  }
  for (int64_t p = 0; p < npairs; ++p) {
    const int64_t b = 2 * p;  // first block of the pair
    const bool two = b + 1 < nb;
    const uint8_t* xu = a.qs_biased.data() + (size_t)k0 * a.cols + b * kQK8_0;
    for (int i = 0; i < nr; ++i) {
      const uint8_t* row = w.data + (r + i) * w.row_bytes;
      prefetch_ahead(row, w.row_bytes, p, npairs, kPairBytes);
      const BlockQ8_0* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[0].qs));
      const __m512i wq = two ? _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[1].qs)), 1)
                             : _mm512_zextsi256_si512(lo);
      s.d[0][i] = blk[0].d;
      s.d[1][i] = two ? blk[1].d : 0;
      // (x + 128) . w counts 128 * sum(w) too much
      const __m512i excess = _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, wq), 7);
      for (int k = 0; k < nt; ++k) {
        const uint8_t* xk = xu + (size_t)k * a.cols;
        const __m512i xv = two ? _mm512_loadu_si512(xk)
                               : _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xk)));
        s.acc[k][i] = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), xv, wq), excess);
      }
    }
    const __m512 da16 = widen_f16x16(s.d[0]), db16 = widen_f16x16(s.d[1]);
    for (int k = 0; k < nt; ++k) {
      const float* dx = a.d.data() + (size_t)(k0 + k) * nb + b;
      __m512i isum_a, isum_b;
      reduce16_pairs(s.acc[k], &isum_a, &isum_b);
      sum_q[k] = q8_0_block_step<V512>(sum_q[k], isum_a, da16, _mm512_set1_ps(dx[0]));
      if (two) sum_q[k] = q8_0_block_step<V512>(sum_q[k], isum_b, db16, _mm512_set1_ps(dx[1]));
    }
  }
  for (int k = 0; k < nt; ++k) store_rows(y + (k0 + k) * ldy + r, nr, sum_q[k]);
}

}  // namespace

void matvec_q8_avx512(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  // token groups inside the row tile: a tile's weights (16 rows) are still
  // in L2 when the next group of tokens reads them
  for (int64_t r = r0; r < r1; r += kTileRows) {
    const int nr = (int)std::min<int64_t>(kTileRows, r1 - r);
    for (int k0 = 0; k0 < a.tokens; k0 += kTokenGroup) {
      const int nt = std::min(kTokenGroup, a.tokens - k0);
      switch ((GgmlType)w.type) {
        case GgmlType::Q5_K: tile_kquant45<true>(w, a, r, nr, k0, nt, y, ldy); break;
        case GgmlType::Q4_K: tile_kquant45<false>(w, a, r, nr, k0, nt, y, ldy); break;
        case GgmlType::Q6_K: tile_q6k(w, a, r, nr, k0, nt, y, ldy); break;
        case GgmlType::Q8_0: tile_q80(w, a, r, nr, k0, nt, y, ldy); break;
        default: matvec_q8_scalar(w, a, r, r + nr, y, ldy); break;
      }
    }
  }
}

}  // namespace muser::cpu

#endif  // MUSER_X86
