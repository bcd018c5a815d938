// The consumer layer's reductions over the vocabulary on the device
// (docs/numerics.md, "The vocabulary reduction"), in one kernel: the canonical
// logsumexp of muser/logsumexp.h (tile_reduce.cuh: a CTA per row and tile,
// the finishing CTA joins the row) and the rank counts of chosen ids
// (ranks_ahead, summed exactly in integers), so a batch costs one launch.
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"
#include "tile_reduce.cuh"
#include "muser/logsumexp.h"

namespace muser::cuda {

namespace {

constexpr int kMaxFusedIds = 4;  // chosen ids per row counted while the logits are in registers

// grid (tiles, t), kTileThreads per (row, tile): the tile's pair (tile_pair),
// the counts of its ids ranked ahead of the row's chosen ids, and in the CTA
// that finishes the row's last tile, the row's join, logsumexp, chosen logits
// and ranks -- leaving the accumulators at zero for the next launch.
__global__ void __launch_bounds__(kTileThreads, 4) vocab_reduce_kernel(VocabReduceArgs a) {
  __shared__ TileSmem sm;
  __shared__ unsigned rank_sum[kMaxFusedIds];
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  const int64_t k = blockIdx.y, tile = blockIdx.x, i0 = tile * kLseTile;
  const int tiles = (int)gridDim.x;
  const int count = (int)(a.n - i0 < kLseTile ? a.n - i0 : kLseTile);
  const float* row = a.y + k * a.ld;
  const int fused_ids = a.m < kMaxFusedIds ? a.m : kMaxFusedIds;
  if (threadIdx.x < kMaxFusedIds) rank_sum[threadIdx.x] = 0;
  float v[kStepsPerThread];
#pragma unroll
  for (int j = 0; j < kStepsPerThread; ++j) {
    const int i = tile_step_index(j);
    v[j] = i < count ? __ldg(row + i0 + i) : lse_neg_inf();  // -inf: pushes nothing
  }
  // rank counts: the fused ids among the logits in registers, the others in passes of their own
  unsigned ahead[kMaxFusedIds] = {};
#pragma unroll
  for (int q = 0; q < kMaxFusedIds; ++q) {
    if (q >= fused_ids) break;
    const int64_t tok = a.ids[k * a.m + q];
    const float target = __ldg(row + tok);
#pragma unroll
    for (int j = 0; j < kStepsPerThread; ++j) {
      const int i = tile_step_index(j);
      ahead[q] += i < count && ranks_ahead(v[j], i0 + i, target, tok);
    }
  }
  const LsePair p = tile_pair(v, sm);  // its __syncthreads also publish rank_sum's zeros
#pragma unroll
  for (int q = 0; q < kMaxFusedIds; ++q) {
    if (q >= fused_ids) break;
    unsigned c = ahead[q];
    for (int off = 16; off >= 1; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
    if (lane == 0 && c) atomicAdd(&rank_sum[q], c);
  }
  for (int q = fused_ids; q < a.m; ++q) {
    const int64_t tok = a.ids[k * a.m + q];
    const float target = __ldg(row + tok);
    unsigned c = 0;
    for (int i = threadIdx.x; i < count; i += kTileThreads) c += ranks_ahead(__ldg(row + i0 + i), i0 + i, target, tok);
    for (int off = 16; off >= 1; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
    if (lane == 0 && c) atomicAdd(a.ahead_acc + k * a.m + q, (unsigned long long)c);
  }
  __syncthreads();
  LsePair* pairs = a.pairs + k * tiles;
  if (threadIdx.x == 0) pairs[tile] = p;
  if (threadIdx.x < fused_ids && rank_sum[threadIdx.x])
    atomicAdd(a.ahead_acc + k * a.m + threadIdx.x, (unsigned long long)rank_sum[threadIdx.x]);
  if (!finished_row(a.done + k, (unsigned)tiles, sm) || warp != 0) return;
  const LsePair root = join_row(pairs, tiles, sm);
  if (lane == 0) {
    a.lse[k] = lse_value(root);
    a.done[k] = 0;
  }
  const float lse = lse_value(root);
  for (int q = lane; q < a.m; q += kCanonLanes) {
    const int64_t at = k * a.m + q;
    const float v = row[a.ids[at]];
    a.values[at] = v;
    a.logprobs[at] = v - lse;  // log_softmax's one subtraction
    a.ranks[at] = 1 + (int64_t)atomicExch(a.ahead_acc + at, 0ull);
  }
}

__global__ void subtract_rows_kernel(float* y, int64_t V, int t, const float* lse) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < V * t; i += stride) y[i] = y[i] - lse[i / V];
}

}  // namespace

size_t lse_pair_bytes() { return sizeof(LsePair); }

void vocab_reduce(const VocabReduceArgs& a, cudaStream_t stream) {
  const int64_t tiles = (a.n + kLseTile - 1) / kLseTile;
  if (tiles == 0 || a.t == 0) return;
  vocab_reduce_kernel<<<dim3((unsigned)tiles, (unsigned)a.t), kTileThreads, 0, stream>>>(a);
  check_launch("vocab_reduce");
}

void subtract_rows(float* y, int64_t V, int t, const float* lse, cudaStream_t stream) {
  const int64_t n = V * t;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
  subtract_rows_kernel<<<(unsigned)std::max<int64_t>(blocks, 1), 256, 0, stream>>>(y, V, t, lse);
  check_launch("subtract_rows");
}

}  // namespace muser::cuda
