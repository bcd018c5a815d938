// acts="q8": the normed activations quantized exactly as the CPU does
// (cpu/acts_q8.cpp, muser/q8_dot.h), then the q8 dot product in the CPU's
// order (docs/numerics.md): per (row, token) the row's blocks in increasing
// order, each with its exact integer sums, through q8_step.h's fma chain. So
// Metal's q8 logits are the CPU's, bit for bit.
//
// quantize_q8_K / quantize_q8_0: one thread per (token, activation block);
//   writes the quants xq [t x cols] (int8), the block scales dx [t x blocks]
//   (f32; Q8_0's f16 widened) and, for Q8_K, the 32-element sums s32 [t x cols/32].
// matvec_<type>_q8_K / matvec_q8_0_q8_0: one thread per (row, token).
// Buffers: quantize 0 Q8MetalKargs, 1 x, 2 xq, 3 dx, 4 s32; grid blocks * t threads.
//          matvec   0 MatvecKargs, 1 weight rows, 2 xq, 3 dx, 4 s32, 5 y, 6 Q8MetalKargs; grid rows * t threads.
#include "common.h"
#include "muser/q8_dot.h"
#include "muser/q8_step.h"

using namespace muser;

MUSER_KERNEL(quantize_q8_K, MUSER_ARG_CONSTANT(Q8MetalKargs, a, 0), MUSER_ARG_BUFFER_IN(float, x, 1),
             MUSER_ARG_BUFFER_OUT(char, xq, 2), MUSER_ARG_BUFFER_OUT(float, dx, 3), MUSER_ARG_BUFFER_OUT(int, s32, 4),
             MUSER_ARG_TID(pos)) {
  const int64_t b = (int64_t)pos % a.blocks, k = (int64_t)pos / a.blocks;
  if (k >= a.t) return;
  device char* q = xq + k * a.cols + b * kQK_K;
  dx[k * a.blocks + b] = q8_quantize_block_q8_k(x + k * a.ldx + b * kQK_K, (device int8_t*)q);
  for (int j = 0; j < 8; ++j) {
    int s = 0;
    for (int i = 0; i < 32; ++i) s += (int)q[32 * j + i];
    s32[k * (a.cols / 32) + b * 8 + j] = s;
  }
}

MUSER_KERNEL(quantize_q8_0, MUSER_ARG_CONSTANT(Q8MetalKargs, a, 0), MUSER_ARG_BUFFER_IN(float, x, 1),
             MUSER_ARG_BUFFER_OUT(char, xq, 2), MUSER_ARG_BUFFER_OUT(float, dx, 3), MUSER_ARG_TID(pos)) {
  const int64_t b = (int64_t)pos % a.blocks, k = (int64_t)pos / a.blocks;
  if (k >= a.t) return;
  const uint16_t d = q8_quantize_block_q8_0(x + k * a.ldx + b * kQK8_0, (device int8_t*)(xq + k * a.cols + b * kQK8_0));
  dx[k * a.blocks + b] = f16_to_f32(d);
}

namespace {

enum Q8Weights { kQ5K, kQ4K, kQ6K, kQ80 };

template <int kW>
void matvec_q8(constant MatvecKargs& a, device const uchar* w, device const char* xq, device const float* dx,
               device const int* s32, device float* y, constant Q8MetalKargs& q, uint pos) {
  const int64_t r = (int64_t)pos % a.rows, k = (int64_t)pos / a.rows;
  if (k >= a.t) return;
  device const uchar* row = w + r * a.row_bytes;
  device const int8_t* xk = (device const int8_t*)(xq + k * q.cols);
  device const float* dk = dx + k * q.blocks;
  device const int* sk = s32 + k * (q.cols / 32);
  float sum_q = 0.0f, sum_m = 0.0f;
  for (int64_t b = 0; b < q.blocks; ++b) {
    if (kW == kQ5K) {
      device const BlockQ5_K* blk = (device const BlockQ5_K*)row + b;
      sum_q = q8_block_step(sum_q, dk[b], f16_to_f32(blk->d), q8_isum_q5_k(blk, xk + b * kQK_K));
      sum_m = q8_block_step(sum_m, dk[b], f16_to_f32(blk->dmin), q8_msum_kquant(blk, sk + b * 8));
    } else if (kW == kQ4K) {
      device const BlockQ4_K* blk = (device const BlockQ4_K*)row + b;
      sum_q = q8_block_step(sum_q, dk[b], f16_to_f32(blk->d), q8_isum_q4_k(blk, xk + b * kQK_K));
      sum_m = q8_block_step(sum_m, dk[b], f16_to_f32(blk->dmin), q8_msum_kquant(blk, sk + b * 8));
    } else if (kW == kQ6K) {
      device const BlockQ6_K* blk = (device const BlockQ6_K*)row + b;
      sum_q = q8_block_step(sum_q, dk[b], f16_to_f32(blk->d), q8_isum_q6_k(blk, xk + b * kQK_K));
    } else {
      device const BlockQ8_0* blk = (device const BlockQ8_0*)row + b;
      sum_q = q8_0_block_step(sum_q, q8_isum_q8_0(blk, xk + b * kQK8_0), f16_to_f32(blk->d), dk[b]);
    }
  }
  y[k * a.ldy + r] = (kW == kQ5K || kW == kQ4K) ? q8_kquant45_result(sum_q, sum_m) : sum_q;
}

}  // namespace

// Each kernel spelled out: the emulator finds a library's kernels by their MUSER_KERNEL(name, ...) lines.
#define MUSER_MATVEC_Q8_ARGS                                                                                   \
  MUSER_ARG_CONSTANT(MatvecKargs, a, 0), MUSER_ARG_BUFFER_IN(uchar, w, 1), MUSER_ARG_BUFFER_IN(char, xq, 2),     \
      MUSER_ARG_BUFFER_IN(float, dx, 3), MUSER_ARG_BUFFER_IN(int, s32, 4), MUSER_ARG_BUFFER_OUT(float, y, 5), \
      MUSER_ARG_CONSTANT(Q8MetalKargs, q, 6), MUSER_ARG_TID(pos)

MUSER_KERNEL(matvec_q5_K_q8_K, MUSER_MATVEC_Q8_ARGS) { matvec_q8<kQ5K>(a, w, xq, dx, s32, y, q, pos); }
MUSER_KERNEL(matvec_q4_K_q8_K, MUSER_MATVEC_Q8_ARGS) { matvec_q8<kQ4K>(a, w, xq, dx, s32, y, q, pos); }
MUSER_KERNEL(matvec_q6_K_q8_K, MUSER_MATVEC_Q8_ARGS) { matvec_q8<kQ6K>(a, w, xq, dx, s32, y, q, pos); }
MUSER_KERNEL(matvec_q8_0_q8_0, MUSER_MATVEC_Q8_ARGS) { matvec_q8<kQ80>(a, w, xq, dx, s32, y, q, pos); }
