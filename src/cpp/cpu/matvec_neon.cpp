// The CPU matvecs on ARM NEON (AArch64: Apple silicon, Graviton, ...): the
// canonical f32 matvec and the q8 matvec, bit-equal to their scalar twins.
// The whole file compiles to nothing elsewhere, so CMake's source glob may
// include it on every platform. NEON is part of the AArch64 baseline, so
// no per-file flags are needed (and shared inline code is safe to use here).
//
// canonical (f32 activations). Lane mapping: the 32 canonical lanes of one
// (row, token) are eight float32x4 accumulators a[q] holding lanes
// 4q..4q+3; elements 32s + 4q .. 32s + 4q + 3 feed a[q] with one vfmaq_f32
// (= fmaf per lane) in increasing s. fold_canonical is the butterfly tree:
// offset 16 = a[q] + a[q+4], offset 8 = [q] + [q+2], offset 4 = [0] + [1],
// then the halves of the last vector (offset 2) and its two lanes (offset 1).
// A 256-element block of a row is decoded once with muser/dequant.h's block
// decoders (written so compilers vectorize them) and every token of the
// batch multiplies it.
//
// q8 (int8 activations). The integer block sums use the dot-product
// instruction (SDOT, ARMv8.2 dotprod; Apple M1 and later) where the compiler
// targets it, else widening multiplies with pairwise accumulation - both
// exact; the float order is q8_rows.h's, shared with the scalar definition.
//
// Fuses: decode + dot product. Not run by this repository's CI (x86): it was
// checked bit-equal to the scalar twins for every type, awkward sizes and
// t = 1..17 under qemu-user (aarch64 cross build, with and without dotprod),
// and tests/test_cpu_kernels.py does the same on any ARM machine.
#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#include <cstring>

#include "cpu/kernels.h"
#include "cpu/kquant_scales.h"
#include "cpu/q8_rows.h"
#include "quant_types.h"

namespace muser::cpu {

namespace {

// ---- canonical f32 ----

inline float fold_canonical(const float32x4_t a[8]) {
  float32x4_t v[4];
  for (int q = 0; q < 4; ++q) v[q] = vaddq_f32(a[q], a[q + 4]);  // offset 16
  const float32x4_t u0 = vaddq_f32(v[0], v[2]), u1 = vaddq_f32(v[1], v[3]);  // offset 8
  const float32x4_t w = vaddq_f32(u0, u1);                                  // offset 4
  const float32x2_t h = vadd_f32(vget_low_f32(w), vget_high_f32(w));        // offset 2
  return vget_lane_f32(h, 0) + vget_lane_f32(h, 1);                         // offset 1
}

constexpr int kTokenTile = 8;

// Decode elements [c, c + n) of a row (c a multiple of 256, n <= 256) into out;
// a float row's short last chunk is zero-padded to a whole group of 32.
void decode_chunk(const WeightView& w, const uint8_t* row, int64_t c, int n, float* out) {
  switch ((GgmlType)w.type) {
    case GgmlType::Q5_K: dequant_block_q5_k(reinterpret_cast<const BlockQ5_K*>(row) + c / kQK_K, out); return;
    case GgmlType::Q4_K: dequant_block_q4_k(reinterpret_cast<const BlockQ4_K*>(row) + c / kQK_K, out); return;
    case GgmlType::Q6_K: dequant_block_q6_k(reinterpret_cast<const BlockQ6_K*>(row) + c / kQK_K, out); return;
    default: {
      const TypeTraits tt = type_traits(w.type);
      dequant_row(w.type, row + c / tt.block_elems * tt.block_bytes, n, out);
      return;
    }
  }
}

void matvec_canon_neon_impl(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1,
                            float* y, int64_t ldy) {
  const int64_t K = w.cols;
  alignas(16) float wbuf[kQK_K];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.data + r * w.row_bytes;
    for (int t0 = 0; t0 < t; t0 += kTokenTile) {
      const int nt = t - t0 < kTokenTile ? t - t0 : kTokenTile;
      float32x4_t acc[kTokenTile][8];
      for (int k = 0; k < nt; ++k)
        for (int q = 0; q < 8; ++q) acc[k][q] = vdupq_n_f32(0.0f);
      for (int64_t c = 0; c < K; c += kQK_K) {
        const int n = K - c < kQK_K ? (int)(K - c) : kQK_K;
        decode_chunk(w, row, c, n, wbuf);
        const int full = n & ~31;
        for (int k = 0; k < nt; ++k) {
          const float* xs = x + (int64_t)(t0 + k) * ldx + c;
          for (int s = 0; s < full; s += 32)
            for (int q = 0; q < 8; ++q)
              acc[k][q] = vfmaq_f32(acc[k][q], vld1q_f32(wbuf + s + 4 * q), vld1q_f32(xs + s + 4 * q));
          if (full < n) {  // a float row's last, short group: fma only into the lanes it owns
            alignas(16) float a[32], wl[32] = {}, xl[32] = {};
            for (int q = 0; q < 8; ++q) vst1q_f32(a + 4 * q, acc[k][q]);
            memcpy(wl, wbuf + full, (size_t)(n - full) * 4);
            memcpy(xl, xs + full, (size_t)(n - full) * 4);
            for (int l = 0; l < n - full; ++l) a[l] = fmaf(wl[l], xl[l], a[l]);
            for (int q = 0; q < 8; ++q) acc[k][q] = vld1q_f32(a + 4 * q);
          }
        }
      }
      for (int k = 0; k < nt; ++k) y[(int64_t)(t0 + k) * ldy + r] = fold_canonical(acc[k]);
    }
  }
}

// ---- q8: exact integer dot products of 16 int8 pairs ----

inline int32x4_t dot16(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
  const int16x8_t hi = vmull_s8(vget_high_s8(a), vget_high_s8(b));
  return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

template <bool kQ5>
struct DotKQuant45 {
  int8x16_t q[16];  // sub-block j: q[2j], q[2j+1]
  uint8_t sm[16];   // scales, then mins
  float d = 0, dmin = 0;
  void load(const uint8_t* blk) {
    const uint8_t* qs = blk + (kQ5 ? 48 : 16);
    const uint8x16_t low4 = vdupq_n_u8(0x0F);
    uint8x16_t qh[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
    if (kQ5) qh[0] = vld1q_u8(blk + 16), qh[1] = vld1q_u8(blk + 32);
    for (int c = 0; c < 4; ++c) {
      for (int h = 0; h < 2; ++h) {
        const uint8x16_t raw = vld1q_u8(qs + 32 * c + 16 * h);
        uint8x16_t lo = vandq_u8(raw, low4), hi = vshrq_n_u8(raw, 4);
        if (kQ5) {  // bit s of qh[l] becomes bit 4 of element 32s + l
          const uint8x16_t one = vdupq_n_u8(1);
          lo = vorrq_u8(lo, vshlq_n_u8(vandq_u8(vshlq_u8(qh[h], vdupq_n_s8((int8_t)(-2 * c))), one), 4));
          hi = vorrq_u8(hi, vshlq_n_u8(vandq_u8(vshlq_u8(qh[h], vdupq_n_s8((int8_t)(-2 * c - 1))), one), 4));
        }
        q[2 * (2 * c) + h] = vreinterpretq_s8_u8(lo);
        q[2 * (2 * c + 1) + h] = vreinterpretq_s8_u8(hi);
      }
    }
    kquant_scale_bytes(blk + 4, sm);
    uint16_t h16;
    memcpy(&h16, blk, 2);
    d = f16_to_f32(h16);
    memcpy(&h16, blk + 2, 2);
    dmin = f16_to_f32(h16);
  }
  int32_t isum(const int8_t* xq, const int16_t*) const {
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) {
      int32x4_t acc = vdupq_n_s32(0);
      acc = dot16(acc, q[2 * j], vld1q_s8(xq + 32 * j));
      acc = dot16(acc, q[2 * j + 1], vld1q_s8(xq + 32 * j + 16));
      s += sm[j] * vaddvq_s32(acc);
    }
    return s;
  }
  int32_t msum(const int16_t* sum32) const {
    int32_t s = 0;
    for (int j = 0; j < 8; ++j) s += sm[8 + j] * sum32[j];
    return s;
  }
};

struct DotQ6K : Q8DotNoMins {
  int8x16_t q[16];  // q - 32 of elements 16j .. 16j+15
  int8_t scales[16];
  void load(const uint8_t* blk) {
    const BlockQ6_K& b = *reinterpret_cast<const BlockQ6_K*>(blk);
    const uint8x16_t low4 = vdupq_n_u8(0x0F), three = vdupq_n_u8(3);
    const int8x16_t m32 = vdupq_n_s8(32);
    for (int half = 0; half < 2; ++half) {
      for (int h = 0; h < 2; ++h) {  // l = 16h .. 16h+15
        const uint8x16_t ql0 = vld1q_u8(b.ql + 64 * half + 16 * h);
        const uint8x16_t ql1 = vld1q_u8(b.ql + 64 * half + 32 + 16 * h);
        const uint8x16_t qh = vld1q_u8(b.qh + 32 * half + 16 * h);
        const uint8x16_t v[4] = {
            vorrq_u8(vandq_u8(ql0, low4), vshlq_n_u8(vandq_u8(qh, three), 4)),
            vorrq_u8(vandq_u8(ql1, low4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 2), three), 4)),
            vorrq_u8(vshrq_n_u8(ql0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 4), three), 4)),
            vorrq_u8(vshrq_n_u8(ql1, 4), vshlq_n_u8(vshrq_n_u8(qh, 6), 4))};
        for (int u = 0; u < 4; ++u)  // element 128*half + 32u + 16h + i
          q[8 * half + 2 * u + h] = vsubq_s8(vreinterpretq_s8_u8(v[u]), m32);
      }
    }
    memcpy(scales, b.scales, 16);
    d = f16_to_f32(b.d);
  }
  int32_t isum(const int8_t* xq, const int16_t*) const {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += scales[j] * vaddvq_s32(dot16(vdupq_n_s32(0), q[j], vld1q_s8(xq + 16 * j)));
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
    int32x4_t acc = dot16(vdupq_n_s32(0), vld1q_s8(b->qs), vld1q_s8(xq));
    acc = dot16(acc, vld1q_s8(b->qs + 16), vld1q_s8(xq + 16));
    return vaddvq_s32(acc);
  }
};

}  // namespace

void matvec_canon_neon(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                       int64_t ldy) {
  matvec_canon_neon_impl(w, x, ldx, t, r0, r1, y, ldy);
}

void matvec_q8_neon(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  q8_rows_by_type<DotKQuant45, DotQ6K, DotQ80>(w, a, r0, r1, y, ldy);
}

}  // namespace muser::cpu

#endif  // __aarch64__ && __ARM_NEON
