// The scalar twins of the CPU matvecs: the definitions every SIMD path
// (matvec_avx512.cpp, matvec_q8_avx512.cpp, matvec_avx2.cpp,
// matvec_q8_avx2.cpp, matvec_neon.cpp) is tested bit-equal against. Plain
// C++, no intrinsics, written in exactly the order docs/numerics.md states.
//
// canonical (f32 activations): per (row, token), 32 lanes; lane l owns the
//   elements j = l mod 32 and accumulates acc = fmaf(w[j], x[j], acc) in
//   increasing j from +0; canon_tree32 joins the lanes. Weights come from
//   muser/dequant.h, one block at a time, shared by every token.
// q8 (int8 activations, ActsQ8): the float order of q8_rows.h over the
//   plainest exact integer block sums, element by element through
//   muser/dequant.h's quant readers.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "cpu/kernels.h"
#include "cpu/q8_rows.h"
#include "muser/canonical.h"
#include "muser/dequant.h"

namespace muser::cpu {

namespace {

constexpr int kTokenTile = 16;  // tokens sharing one decoded block

// Decode elements [k0, k0 + n) of a row into out (n <= 256, aligned to blocks).
void decode_chunk(const WeightView& w, const uint8_t* row, int64_t k0, int n, float* out) {
  switch ((GgmlType)w.type) {
    case GgmlType::Q5_K:
      dequant_block_q5_k(reinterpret_cast<const BlockQ5_K*>(row) + k0 / kQK_K, out);
      return;
    case GgmlType::Q4_K:
      dequant_block_q4_k(reinterpret_cast<const BlockQ4_K*>(row) + k0 / kQK_K, out);
      return;
    case GgmlType::Q6_K:
      dequant_block_q6_k(reinterpret_cast<const BlockQ6_K*>(row) + k0 / kQK_K, out);
      return;
    default:
      dequant_row(w.type, row + k0 / type_traits(w.type).block_elems * type_traits(w.type).block_bytes, n, out);
      return;
  }
}

// Exact integer sums of one weight block against one activation block, the
// plainest way: element by element through muser/dequant.h's quant readers.
template <bool kQ5>
struct DotKQuant45 {
  using Block = typename std::conditional<kQ5, BlockQ5_K, BlockQ4_K>::type;
  static int quant(const Block& blk, int i) {
    if constexpr (kQ5) return q5k_quant(&blk, i);
    else return q4k_quant(&blk, i);
  }
  const Block* b = nullptr;
  uint8_t sc[8], m[8];
  float d = 0, dmin = 0;
  void load(const uint8_t* blk) {
    b = reinterpret_cast<const Block*>(blk);
    for (int j = 0; j < 8; ++j) k_scale_min(j, b->scales, &sc[j], &m[j]);
    d = f16_to_f32(b->d);
    dmin = f16_to_f32(b->dmin);
  }
  int32_t isum(const int8_t* xq, const int16_t*) const {  // sum_j sc_j * sum_{i in j} q_i x_i
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) {
      int32_t dot = 0;
      for (int i = 32 * j; i < 32 * j + 32; ++i) dot += quant(*b, i) * xq[i];
      s += sc[j] * dot;
    }
    return s;
  }
  int32_t msum(const int16_t* sum32) const {  // sum_j m_j * sum_{i in j} x_i
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) s += m[j] * sum32[j];
    return s;
  }
};

struct DotQ6K : Q8DotNoMins {
  const BlockQ6_K* b = nullptr;
  void load(const uint8_t* blk) {
    b = reinterpret_cast<const BlockQ6_K*>(blk);
    d = f16_to_f32(b->d);
  }
  int32_t isum(const int8_t* xq, const int16_t*) const {  // sum_j sc_j * sum_{i in j} (q_i - 32) x_i
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      int32_t dot = 0;
      for (int i = 16 * j; i < 16 * j + 16; ++i) dot += q6k_quant(b, i) * xq[i];
      s += b->scales[j] * dot;
    }
    return s;
  }
};

struct DotQ80 : Q8DotNoMins {
  const BlockQ8_0* b = nullptr;
  void load(const uint8_t* blk) {
    b = reinterpret_cast<const BlockQ8_0*>(blk);
    d = f16_to_f32(b->d);
  }
  int32_t isum(const int8_t* xq, const int16_t*) const {
    int32_t s = 0;
    for (int i = 0; i < kQK8_0; ++i) s += b->qs[i] * xq[i];
    return s;
  }
};

}  // namespace

void matvec_canon_scalar(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                         int64_t ldy) {
  const int64_t K = w.cols;
  float wbuf[kQK_K];
  float acc[kTokenTile][kCanonLanes];
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
          // n and k0 are multiples of 32 except in a float row's last chunk,
          // so element k0 + i belongs to lane i % 32
          for (int i = 0; i < n; ++i) acc[k][i % kCanonLanes] = fmaf(wbuf[i], xs[i], acc[k][i % kCanonLanes]);
        }
      }
      for (int k = 0; k < nt; ++k) y[(int64_t)(t0 + k) * ldy + r] = canon_tree32(acc[k]);
    }
  }
}

void matvec_q8_scalar(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  q8_rows_by_type<DotKQuant45, DotQ6K, DotQ80>(w, a, r0, r1, y, ldy);
}

}  // namespace muser::cpu
