// The consumer layer's reductions over the vocabulary on the device
// (docs/numerics.md, "The vocabulary reduction"), in one kernel: the canonical
// logsumexp of muser/logsumexp.h (tile_reduce.cuh: a CTA per row and tile,
// the finishing CTA joins the row) and the rank counts of chosen ids
// (ranks_ahead, summed exactly in integers), so a batch costs one launch.
#include <algorithm>

#include "cuda_check.h"
#include "epilogue.cuh"
#include "kernels.h"
#include "pdl.cuh"
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
  pdl_launch_dependents();
  __shared__ TileSmem sm;
  __shared__ unsigned rank_sum[kMaxFusedIds];
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  const int64_t k = blockIdx.y, tile = blockIdx.x, i0 = tile * kLseTile;
  const int tiles = (int)gridDim.x;
  const int count = (int)(a.n - i0 < kLseTile ? a.n - i0 : kLseTile);
  const float* row = a.y + k * a.ld;
  const int fused_ids = a.m < kMaxFusedIds ? a.m : kMaxFusedIds;
  if (threadIdx.x < kMaxFusedIds) rank_sum[threadIdx.x] = 0;
  // the row's first ids, which no node writes, are read while the route finishes,
  // once per CTA (they may be mapped host memory: one read across the bus, not one per warp)
  __shared__ int64_t first_ids[kCanonLanes];
  if (threadIdx.x < a.m && threadIdx.x < kCanonLanes) first_ids[threadIdx.x] = a.ids[k * a.m + threadIdx.x];
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  __syncthreads();
  int64_t tok[kMaxFusedIds] = {};
#pragma unroll
  for (int q = 0; q < kMaxFusedIds; ++q)
    if (q < fused_ids) tok[q] = first_ids[q];
  float v[kStepsPerThread];
#pragma unroll
  for (int j = 0; j < kStepsPerThread; ++j) {
    const int i = tile_step_index(j);
    v[j] = i < count ? epilogue_apply(a.fold, __ldg(row + i0 + i)) : lse_neg_inf();  // -inf: pushes nothing
  }
  // rank counts: the fused ids among the logits in registers, the others in passes of their own
  unsigned ahead[kMaxFusedIds] = {};
#pragma unroll
  for (int q = 0; q < kMaxFusedIds; ++q) {
    if (q >= fused_ids) break;
    const float target = epilogue_apply(a.fold, __ldg(row + tok[q]));
    const int64_t tok_q = tok[q];
#pragma unroll
    for (int j = 0; j < kStepsPerThread; ++j) {
      const int i = tile_step_index(j);
      ahead[q] += i < count && ranks_ahead(v[j], i0 + i, target, tok_q);
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
    const int64_t id = a.ids[k * a.m + q];
    const float target = epilogue_apply(a.fold, __ldg(row + id));
    unsigned c = 0;
    for (int i = threadIdx.x; i < count; i += kTileThreads)
      c += ranks_ahead(epilogue_apply(a.fold, __ldg(row + i0 + i)), i0 + i, target, id);
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
    const float v = epilogue_apply(a.fold, row[q < kCanonLanes ? first_ids[q] : a.ids[at]]);
    a.values[at] = v;
    a.logprobs[at] = v - lse;  // log_softmax's one subtraction
    a.ranks[at] = 1 + (int64_t)atomicExch(a.ahead_acc + at, 0ull);
  }
}

__global__ void subtract_rows_kernel(float* y, int64_t V, int t, const float* lse) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < V * t; i += stride) y[i] = y[i] - lse[i / V];
}

}  // namespace

size_t lse_pair_bytes() { return sizeof(LsePair); }

void vocab_reduce(const VocabReduceArgs& a, cudaStream_t stream) {
  const int64_t tiles = (a.n + kLseTile - 1) / kLseTile;
  if (tiles == 0 || a.t == 0) return;
  launch_consumer(vocab_reduce_kernel, dim3((unsigned)tiles, (unsigned)a.t), dim3(kTileThreads), 0, stream, "vocab_reduce",
             a);
}

void subtract_rows(float* y, int64_t V, int t, const float* lse, cudaStream_t stream) {
  const int64_t n = V * t;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
  launch_consumer(subtract_rows_kernel, dim3((unsigned)std::max<int64_t>(blocks, 1)), dim3(256), 0, stream, "subtract_rows",
             y, V, t, lse);
}

}  // namespace muser::cuda
