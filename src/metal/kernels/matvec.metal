// The LM-head matvec with f32 activations, logits y[k * ldy + r] = W[r] . x[k].
//
// matvec_<type>_f32 (canonical order, every route but reference): one weight
// row per 32-thread SIMD group, kMatvecRowsPerGroup groups per threadgroup;
// lane l of the group owns the row's elements l + 32 s and keeps one fma
// chain per token (muser/lanes.h), tokens taken kMatvecTokenTile at a time
// (the row is read again per tile); the lanes are joined by the canonical
// butterfly (common.h) and lane 0 writes. The order depends on nothing but
// the row, so the logits are bit-equal to the CPU's for every t.
//
// matvec_ref_<type>_f32 (the reference route): one thread per (row, token),
// the row dequantized a block at a time (muser/dequant.h), one f32
// accumulator in index order, acc = acc + w * x (two roundings), as
// cpu::matvec_reference.
//
// Buffers: 0 MatvecKargs, 1 the weight rows (bound at the first row of the
// dispatch), 2 x [t x ldx], 3 y (bound at the first row's logit).
// Grid: canonical ceil(rows / kMatvecRowsPerGroup) threadgroups of 32 *
// kMatvecRowsPerGroup threads; reference rows * t threads.
#include "common.h"
#include "muser/dequant.h"

using namespace muser;

constant constexpr int kMatvecRowsPerGroup = 4;
constant constexpr int kMatvecTokenTile = 8;

namespace {

struct RowQ5K {
  static void lane(device const uchar* row, int64_t cols, int lane, device const float* x, int64_t ldx, int nt,
                   thread float* acc) {
    canon_lane_kquant<LaneQ5K>((device const BlockQ5_K*)row, cols / kQK_K, lane, x, ldx, nt, acc);
  }
};
struct RowQ4K {
  static void lane(device const uchar* row, int64_t cols, int lane, device const float* x, int64_t ldx, int nt,
                   thread float* acc) {
    canon_lane_kquant<LaneQ4K>((device const BlockQ4_K*)row, cols / kQK_K, lane, x, ldx, nt, acc);
  }
};
struct RowQ6K {
  static void lane(device const uchar* row, int64_t cols, int lane, device const float* x, int64_t ldx, int nt,
                   thread float* acc) {
    canon_lane_kquant<LaneQ6K>((device const BlockQ6_K*)row, cols / kQK_K, lane, x, ldx, nt, acc);
  }
};
struct RowQ80 {
  static void lane(device const uchar* row, int64_t cols, int lane, device const float* x, int64_t ldx, int nt,
                   thread float* acc) {
    canon_lane_q8_0((device const BlockQ8_0*)row, cols / kQK8_0, lane, x, ldx, nt, acc);
  }
};
struct RowF32 {
  static void lane(device const uchar* row, int64_t cols, int lane, device const float* x, int64_t ldx, int nt,
                   thread float* acc) {
    canon_lane_float<WidenF32>((device const float*)row, cols, lane, x, ldx, nt, acc);
  }
};
struct RowF16 {
  static void lane(device const uchar* row, int64_t cols, int lane, device const float* x, int64_t ldx, int nt,
                   thread float* acc) {
    canon_lane_float<WidenF16>((device const ushort*)row, cols, lane, x, ldx, nt, acc);
  }
};
struct RowBF16 {
  static void lane(device const uchar* row, int64_t cols, int lane, device const float* x, int64_t ldx, int nt,
                   thread float* acc) {
    canon_lane_float<WidenBF16>((device const ushort*)row, cols, lane, x, ldx, nt, acc);
  }
};

// The reference order's row decode: block b of the row into out (its elements).
struct DecQ5K {
  enum { kElems = kQK_K };
  static void block(device const uchar* row, int64_t b, thread float* out) {
    dequant_block_q5_k((device const BlockQ5_K*)row + b, out);
  }
};
struct DecQ4K {
  enum { kElems = kQK_K };
  static void block(device const uchar* row, int64_t b, thread float* out) {
    dequant_block_q4_k((device const BlockQ4_K*)row + b, out);
  }
};
struct DecQ6K {
  enum { kElems = kQK_K };
  static void block(device const uchar* row, int64_t b, thread float* out) {
    dequant_block_q6_k((device const BlockQ6_K*)row + b, out);
  }
};
struct DecQ80 {
  enum { kElems = kQK8_0 };
  static void block(device const uchar* row, int64_t b, thread float* out) {
    dequant_block_q8_0((device const BlockQ8_0*)row + b, out);
  }
};
template <class E, class T>
struct DecFloat {
  enum { kElems = 1 };
  static void block(device const uchar* row, int64_t b, thread float* out) { out[0] = E::at(((device const T*)row)[b]); }
};
typedef DecFloat<WidenF32, float> DecF32;
typedef DecFloat<WidenF16, ushort> DecF16;
typedef DecFloat<WidenBF16, ushort> DecBF16;

template <class Row>
void matvec_f32(constant MatvecKargs& a, device const uchar* w, device const float* x, device float* y, uint group,
                uint sg, uint lane) {
  const int64_t r = (int64_t)group * kMatvecRowsPerGroup + sg;
  if (r >= a.rows) return;  // a whole SIMD group leaves together
  device const uchar* row = w + r * a.row_bytes;
  for (int t0 = 0; t0 < a.t; t0 += kMatvecTokenTile) {
    const int nt = a.t - t0 < kMatvecTokenTile ? a.t - t0 : kMatvecTokenTile;
    float acc[kMatvecTokenTile];
    for (int k = 0; k < kMatvecTokenTile; ++k) acc[k] = 0.0f;
    Row::lane(row, a.cols, (int)lane, x + (int64_t)t0 * a.ldx, a.ldx, nt, acc);
    for (int k = 0; k < nt; ++k) {
      const float v = simd_canon_tree(acc[k], lane);
      if (lane == 0) y[(int64_t)(t0 + k) * a.ldy + r] = v;
    }
  }
}

template <class Dec>
void matvec_ref_f32(constant MatvecKargs& a, device const uchar* w, device const float* x, device float* y,
                    uint pos) {
  const int64_t r = (int64_t)pos % a.rows, k = (int64_t)pos / a.rows;
  if (k >= a.t) return;
  device const uchar* row = w + r * a.row_bytes;
  device const float* xs = x + k * a.ldx;
  float out[Dec::kElems];
  float acc = 0.0f;
  for (int64_t b = 0; b < a.cols / Dec::kElems; ++b) {
    Dec::block(row, b, out);
    for (int i = 0; i < Dec::kElems; ++i) {
      const float p = out[i] * xs[b * Dec::kElems + i];
      acc = acc + p;
    }
  }
  y[k * a.ldy + r] = acc;
}

}  // namespace

#define MUSER_MATVEC_ARGS                                                                                \
  MUSER_ARG_CONSTANT(MatvecKargs, a, 0), MUSER_ARG_BUFFER_IN(uchar, w, 1), MUSER_ARG_BUFFER_IN(float, x, 2), \
      MUSER_ARG_BUFFER_OUT(float, y, 3)
// Each kernel spelled out: the emulator finds a library's kernels by their MUSER_KERNEL(name, ...) lines.
#define MUSER_CANON_ARGS MUSER_MATVEC_ARGS, MUSER_ARG_TGID(group), MUSER_ARG_SGID(sg), MUSER_ARG_LANE(lane)
#define MUSER_REF_ARGS MUSER_MATVEC_ARGS, MUSER_ARG_TID(pos)

MUSER_KERNEL(matvec_q5_K_f32, MUSER_CANON_ARGS) { matvec_f32<RowQ5K>(a, w, x, y, group, sg, lane); }
MUSER_KERNEL(matvec_q4_K_f32, MUSER_CANON_ARGS) { matvec_f32<RowQ4K>(a, w, x, y, group, sg, lane); }
MUSER_KERNEL(matvec_q6_K_f32, MUSER_CANON_ARGS) { matvec_f32<RowQ6K>(a, w, x, y, group, sg, lane); }
MUSER_KERNEL(matvec_q8_0_f32, MUSER_CANON_ARGS) { matvec_f32<RowQ80>(a, w, x, y, group, sg, lane); }
MUSER_KERNEL(matvec_f32_f32, MUSER_CANON_ARGS) { matvec_f32<RowF32>(a, w, x, y, group, sg, lane); }
MUSER_KERNEL(matvec_f16_f32, MUSER_CANON_ARGS) { matvec_f32<RowF16>(a, w, x, y, group, sg, lane); }
MUSER_KERNEL(matvec_bf16_f32, MUSER_CANON_ARGS) { matvec_f32<RowBF16>(a, w, x, y, group, sg, lane); }

MUSER_KERNEL(matvec_ref_q5_K_f32, MUSER_REF_ARGS) { matvec_ref_f32<DecQ5K>(a, w, x, y, pos); }
MUSER_KERNEL(matvec_ref_q4_K_f32, MUSER_REF_ARGS) { matvec_ref_f32<DecQ4K>(a, w, x, y, pos); }
MUSER_KERNEL(matvec_ref_q6_K_f32, MUSER_REF_ARGS) { matvec_ref_f32<DecQ6K>(a, w, x, y, pos); }
MUSER_KERNEL(matvec_ref_q8_0_f32, MUSER_REF_ARGS) { matvec_ref_f32<DecQ80>(a, w, x, y, pos); }
MUSER_KERNEL(matvec_ref_f32_f32, MUSER_REF_ARGS) { matvec_ref_f32<DecF32>(a, w, x, y, pos); }
MUSER_KERNEL(matvec_ref_f16_f32, MUSER_REF_ARGS) { matvec_ref_f32<DecF16>(a, w, x, y, pos); }
MUSER_KERNEL(matvec_ref_bf16_f32, MUSER_REF_ARGS) { matvec_ref_f32<DecBF16>(a, w, x, y, pos); }
