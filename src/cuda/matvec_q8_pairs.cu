// The q8 logits of chosen (token, row) pairs -- score's chosen ids when it
// runs over slices of the vocabulary -- without a matvec over every chosen row
// for every token: a warp per pair. The lanes take the row's blocks (lane l:
// blocks l, l + 32, ...), each block's exact integer sums through q8_dot.h on
// the block restored to GGUF order (device_layout.h), and every lane then runs
// q8_step.h's chain over the blocks in increasing order from the owners'
// shuffled values: the CPU's q8 definition, so matvec_q8's bits for that pair
// (docs/numerics.md, "q8 activations").
#include <type_traits>

#include "cuda_check.h"
#include "epilogue.cuh"
#include "kernels.h"
#include "muser/device_layout.h"
#include "muser/q8_dot.h"
#include "muser/q8_step.h"
#include "pdl.cuh"
#include "quantize_q8.cuh"

namespace muser::cuda {

namespace {

constexpr int kPairWarps = 4;

// One block's contribution, as its owner lane computed it.
struct BlockTerms {
  int32_t isum = 0, msum = 0;
  float dx = 0.0f, d = 0.0f, dmin = 0.0f;
};

// Block b of a device-layout row (tiled at `row`: block b at b * kTileRows * B)
// against token quants xq (its block's 256 or 32) and record rec.
template <uint32_t kType>
__device__ BlockTerms block_terms(const uint8_t* row, int64_t b, const int8_t* xq, const uint8_t* rec) {
  BlockTerms t;
  if constexpr (kType == (uint32_t)GgmlType::Q5_K || kType == (uint32_t)GgmlType::Q4_K) {
    using Block = std::conditional_t<kType == (uint32_t)GgmlType::Q5_K, BlockQ5_K, BlockQ4_K>;
    const uint8_t* p = row + b * kTileRows * (int64_t)sizeof(Block);
    Block blk;
    if constexpr (kType == (uint32_t)GgmlType::Q5_K) {
      unpack_block_q5_k(p, &blk);
      t.isum = q8_isum_q5_k(&blk, xq);
    } else {
      unpack_block_q4_k(p, &blk);
      t.isum = q8_isum_q4_k(&blk, xq);
    }
    int32_t sum32[8];  // the record's sub-block sums: low byte, then the signed high byte
    for (int j = 0; j < 8; ++j) sum32[j] = (int32_t)(int8_t)rec[8 + j] * 256 + (int32_t)rec[j];
    t.msum = q8_msum_kquant(&blk, sum32);
    t.dx = *reinterpret_cast<const float*>(rec + 16);
    t.d = f16_to_f32(blk.d);
    t.dmin = f16_to_f32(blk.dmin);
  } else if constexpr (kType == (uint32_t)GgmlType::Q6_K) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(row + b * kTileRows * (int64_t)sizeof(BlockQ6_K));
    t.isum = q8_isum_q6_k(blk, xq);
    t.dx = *reinterpret_cast<const float*>(rec + kQ8Sum16DxOffset);
    t.d = f16_to_f32(blk->d);
  } else {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row + b * kTileRows * (int64_t)sizeof(BlockQ8_0));
    t.isum = q8_isum_q8_0(blk, xq);
    t.dx = *reinterpret_cast<const float*>(rec);
    t.d = f16_to_f32(blk->d);
  }
  return t;
}

// grid (pairs / kPairWarps), a warp per pair (token k, id q): y[k * m + q] =
// the logit of row rows[k * m + q] for token k, through a.fold as matvec_q8 stores it.
template <uint32_t kType>
__global__ void __launch_bounds__(kPairWarps * 32) matvec_q8_pairs_kernel(Q8Args a, const int64_t* rows, int m,
                                                                          float* y) {
  pdl_launch_dependents();
  const int lane = threadIdx.x & 31;
  const int64_t pair = (int64_t)blockIdx.x * kPairWarps + (threadIdx.x >> 5);
  if (pair >= (int64_t)a.t * m) return;
  const int64_t k = pair / m, r = rows[pair];
  constexpr bool kKQuant = kType != (uint32_t)GgmlType::Q8_0;
  constexpr int kCols = kKQuant ? kQK_K : kQK8_0;          // elements a block holds
  constexpr int kBlockBytes = block_bytes(kType);
  constexpr int rec_bytes = q8_rec_bytes(q8_kind(kType));
  const int64_t blocks = a.row_bytes / kBlockBytes;
  const uint8_t* row = a.w + tiled_row_offset(r, a.row_bytes, kBlockBytes);
  pdl_wait();  // the activations are an earlier node's writes
  const int8_t* xk = a.xq + k * a.xq_pitch;
  const uint8_t* rk = a.meta + k * a.meta_per_token * rec_bytes;
  float sum_q = 0.0f, sum_m = 0.0f;
  for (int64_t b0 = 0; b0 < blocks; b0 += 32) {
    const int64_t b = b0 + lane;
    BlockTerms mine;
    if (b < blocks) mine = block_terms<kType>(row, b, xk + b * kCols, rk + b * rec_bytes);
    const int n = (int)(blocks - b0 < 32 ? blocks - b0 : 32);
    for (int j = 0; j < n; ++j) {  // block b0 + j, from its owner, in increasing order
      const int32_t isum = __shfl_sync(0xffffffffu, mine.isum, j);
      const float dx = __shfl_sync(0xffffffffu, mine.dx, j), d = __shfl_sync(0xffffffffu, mine.d, j);
      if constexpr (kType == (uint32_t)GgmlType::Q8_0) {
        sum_q = q8_0_block_step(sum_q, isum, d, dx);
      } else {
        sum_q = q8_block_step(sum_q, dx, d, isum);
        if constexpr (kType != (uint32_t)GgmlType::Q6_K) {
          const int32_t msum = __shfl_sync(0xffffffffu, mine.msum, j);
          const float dmin = __shfl_sync(0xffffffffu, mine.dmin, j);
          sum_m = q8_block_step(sum_m, dx, dmin, msum);
        }
      }
    }
  }
  const bool kquant45 = kType == (uint32_t)GgmlType::Q5_K || kType == (uint32_t)GgmlType::Q4_K;
  const float v = kquant45 ? q8_kquant45_result(sum_q, sum_m) : sum_q;
  if (lane == 0) y[pair] = epilogue_apply(a.fold, v);
}

}  // namespace

void matvec_q8_pairs(const Q8Call& a, const int64_t* rows, int m, float* y, cudaStream_t stream) {
  const int64_t pairs = (int64_t)a.t * m;
  if (pairs == 0) return;
  const Q8Args& args = a;
  const dim3 grid((unsigned)((pairs + kPairWarps - 1) / kPairWarps)), block(kPairWarps * 32);
  auto launch = [&](auto type) {
    launch_pdl(matvec_q8_pairs_kernel<decltype(type)::value>, grid, block, 0, stream, "matvec_q8_pairs", args, rows,
               m, y);
  };
  using T = GgmlType;
  switch (a.type) {
    case (uint32_t)T::Q5_K: launch(std::integral_constant<uint32_t, (uint32_t)T::Q5_K>{}); break;
    case (uint32_t)T::Q4_K: launch(std::integral_constant<uint32_t, (uint32_t)T::Q4_K>{}); break;
    case (uint32_t)T::Q6_K: launch(std::integral_constant<uint32_t, (uint32_t)T::Q6_K>{}); break;
    case (uint32_t)T::Q8_0: launch(std::integral_constant<uint32_t, (uint32_t)T::Q8_0>{}); break;
    default: throw DeviceError("matvec_q8_pairs: no q8 kernel for this weight type");
  }
}

}  // namespace muser::cuda
