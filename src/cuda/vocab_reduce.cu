// The consumer layer's reductions over the vocabulary on the device
// (docs/numerics.md, "The vocabulary reduction"), in one kernel: the canonical
// logsumexp of muser/logsumexp.h (a warp per row and tile, the finishing CTA
// joins the row: tile_reduce.cuh) and the rank counts of chosen ids
// (ranks_ahead, summed exactly in integers), so a batch costs one launch per
// slice of the vocabulary.
#include <algorithm>
#include <type_traits>

#include "cuda_check.h"
#include "epilogue.cuh"
#include "kernels.h"
#include "pdl.cuh"
#include "tile_reduce.cuh"
#include "muser/logsumexp.h"

namespace muser::cuda {

namespace {

constexpr int kMaxFusedIds = 4;  // chosen ids per row counted while the logits are in registers

// grid (the slice's tiles / kWarpTiles, t), a warp per (row, tile): the
// tile's pair, stored at the tile's index in the vocabulary, and the counts of
// its ids ranked ahead of the row's chosen ids; the CTA that finishes the row's
// last tile (of any slice) joins the row and writes its logsumexp, chosen
// logits and ranks -- leaving the accumulators at zero for the next launch.
//
// A lane's pair is lse_push's sequence over its 64 ids (l, l + 32, ...) in
// order (LaneLse), the next chunk's loads in flight while one is reduced; the
// lanes then join by canon_tree32's butterfly (warp_lse_join). The folded node
// kOp is applied to each raw logit as it is loaded.
template <EpilogueOp kOp>
__global__ void __launch_bounds__(kWarpTileThreads, 8) vocab_reduce_kernel(VocabReduceArgs a) {
  pdl_launch_dependents();
  __shared__ TileSmem sm;  // the finishing CTA's join
  __shared__ unsigned rank_sum[kMaxFusedIds];
  __shared__ int64_t first_ids[kCanonLanes];
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  const int64_t k = blockIdx.y;
  const TileSpan tile(a.n, kWarpTiles, warp);  // of the slice
  const int64_t local0 = tile.first, i0 = a.first + local0;
  const int tiles = (int)lse_tile_count(a.vocab);
  const int count = tile.count;
  const float* row = a.y + k * a.ld;  // the slice's logits: id first + i at row[i]
  const int fused_ids = a.m < kMaxFusedIds ? a.m : kMaxFusedIds;
  auto fold = [&](float raw) { return epilogue_op<kOp>(raw, a.fold.f0, a.fold.f1, a.fold.f2); };
  auto load = [&](const float* p) { return fold(__ldg(p)); };
  // a chosen id's logit: in this row when it is the whole vocabulary, else gathered
  auto chosen = [&](int q, int64_t id) { return fold(a.chosen ? __ldg(a.chosen + k * a.chosen_ld + q) : __ldg(row + id)); };
  if (threadIdx.x < kMaxFusedIds) rank_sum[threadIdx.x] = 0;
  // the row's first ids, which no node writes, are read while the route finishes,
  // once per CTA (they may be mapped host memory: one read across the bus, not one per warp)
  if (threadIdx.x < a.m && threadIdx.x < kCanonLanes) first_ids[threadIdx.x] = a.ids[k * a.m + threadIdx.x];
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  __syncthreads();
  int64_t tok[kMaxFusedIds] = {};
  float target[kMaxFusedIds] = {};
#pragma unroll
  for (int q = 0; q < kMaxFusedIds; ++q)
    if (q < fused_ids) tok[q] = first_ids[q], target[q] = chosen(q, tok[q]);
  unsigned ahead[kMaxFusedIds] = {};
  LaneLse lane_lse;
  const float* tile_row = row + local0;
  // kFull: the tile has all kLseTile ids (no bounds per step)
  auto walk = [&](auto full) {
    constexpr bool kFull = decltype(full)::value;
    lane_chunks<kFull>(count, 0.0f, [&](int i) { return __ldg(tile_row + i); }, [&](int c, float(&v)[kWarpChunk]) {
#pragma unroll
      for (int j = 0; j < kWarpChunk; ++j)  // -inf past the end: pushes nothing
        v[j] = kFull || lane + (c + j) * kCanonLanes < count ? fold(v[j]) : lse_neg_inf();
#pragma unroll
      for (int q = 0; q < kMaxFusedIds; ++q) {
        if (q >= fused_ids) break;
#pragma unroll
        for (int j = 0; j < kWarpChunk; ++j) {
          const int i = lane + (c + j) * kCanonLanes;
          ahead[q] += (kFull || i < count) && ranks_ahead(v[j], i0 + i, target[q], tok[q]);
        }
      }
      lane_lse.push(v);
    });
  };
  if (count == kLseTile) walk(std::true_type{});
  else walk(std::false_type{});
  const LsePair p = warp_lse_join(lane_lse.pair());
  // rank counts: the fused ids from registers, the others in passes of their own
#pragma unroll
  for (int q = 0; q < kMaxFusedIds; ++q) {
    if (q >= fused_ids) break;
    unsigned n = ahead[q];
    for (int off = 16; off >= 1; off >>= 1) n += __shfl_xor_sync(0xffffffffu, n, off);
    if (lane == 0 && n) atomicAdd(&rank_sum[q], n);
  }
  for (int q = fused_ids; q < a.m; ++q) {
    const int64_t id = a.ids[k * a.m + q];
    const float t_q = chosen(q, id);
    unsigned n = 0;
    for (int i = lane; i < count; i += kCanonLanes) n += ranks_ahead(load(row + local0 + i), i0 + i, t_q, id);
    for (int off = 16; off >= 1; off >>= 1) n += __shfl_xor_sync(0xffffffffu, n, off);
    if (lane == 0 && n) atomicAdd(a.ahead_acc + k * a.m + q, (unsigned long long)n);
  }
  LsePair* pairs = a.pairs + k * tiles;
  if (lane == 0 && count > 0) pairs[i0 / kLseTile] = p;
  __syncthreads();
  if (threadIdx.x < fused_ids && rank_sum[threadIdx.x])
    atomicAdd(a.ahead_acc + k * a.m + threadIdx.x, (unsigned long long)rank_sum[threadIdx.x]);
  if (!finished_row(a.done + k, (unsigned)tiles, sm, (unsigned)tile.cta_tiles) || warp != 0) return;
  const LsePair root = join_row(pairs, tiles, sm);
  if (lane == 0) {
    a.lse[k] = lse_value(root);
    a.done[k] = 0;
  }
  const float lse = lse_value(root);
  for (int q = lane; q < a.m; q += kCanonLanes) {
    const int64_t at = k * a.m + q;
    const float v = chosen(q, q < kCanonLanes ? first_ids[q] : a.ids[at]);
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

int64_t vocab_reduce_ctas(int64_t n, int t) { return warp_tile_ctas(n) * t; }

void vocab_reduce(const VocabReduceArgs& a, cudaStream_t stream) {
  const int64_t ctas = vocab_reduce_ctas(a.n, 1);  // per row of this slice
  if (ctas == 0 || a.t == 0) return;
  epilogue_dispatch(a.fold.op, [&](auto op) {
    launch_consumer(vocab_reduce_kernel<decltype(op)::value>, dim3((unsigned)ctas, (unsigned)a.t),
                    dim3(kWarpTileThreads), 0, stream, "vocab_reduce", a);
  });
}

void subtract_rows(float* y, int64_t V, int t, const float* lse, cudaStream_t stream) {
  const int64_t n = V * t;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
  launch_consumer(subtract_rows_kernel, dim3((unsigned)std::max<int64_t>(blocks, 1)), dim3(256), 0, stream, "subtract_rows",
             y, V, t, lse);
}

}  // namespace muser::cuda
