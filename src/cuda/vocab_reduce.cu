// The consumer layer's reductions over the vocabulary on the device
// (docs/numerics.md, "The vocabulary reduction"): the canonical logsumexp of
// muser/logsumexp.h -- one warp per (token, tile of kLseTile ids), lane l
// pushing ids l, l + 32, ... of its tile in increasing order, the lanes joined
// by the butterfly tree, the tiles by lse_tree -- and the rank counts of
// chosen ids (ranks_ahead, summed exactly in integers). The same functions the
// CPU runs, so the bits match it for any chunking of the vocabulary.
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"
#include "muser/device_layout.h"
#include "muser/logsumexp.h"
#include "quant_types.h"

namespace muser::cuda {

namespace {

constexpr int kRankThreads = 256;
constexpr int kRankItems = kLseTile / kRankThreads;  // 8 logits per thread: one tile per CTA
static_assert(kRankItems * kRankThreads == kLseTile, "a rank CTA covers one tile");

// grid (tiles of the chunk, t), one warp: pairs[k * tiles_total + tile0 + blockIdx.x]
__global__ void lse_tiles_kernel(const float* y, int64_t ld, int64_t n, int64_t tile0, int64_t tiles_total,
                                 LsePair* pairs) {
  const int lane = threadIdx.x;
  const int64_t k = blockIdx.y, i0 = (int64_t)blockIdx.x * kLseTile;
  const int64_t count = n - i0 < kLseTile ? n - i0 : kLseTile;
  const float* row = y + k * ld + i0;
  LsePair p = lse_empty();
  for (int64_t i = lane; i < count; i += kCanonLanes) p = lse_push(p, row[i]);
  // canon_tree32 over the lanes: lane l joins lane l + off (the lower lane's pair on the left)
  for (int off = kCanonLanes / 2; off >= 1; off >>= 1) {
    LsePair o;
    o.m = __shfl_down_sync(0xffffffffu, p.m, off);
    o.s = __shfl_down_sync(0xffffffffu, p.s, off);
    if (lane < off) p = lse_merge(p, o);
  }
  if (lane == 0) pairs[k * tiles_total + tile0 + blockIdx.x] = p;
}

// one thread per token: the tiles' fixed tree, in place, then m + log(s) (rows whose
// tiles do not fit shared memory)
__global__ void lse_finish_kernel(LsePair* pairs, int64_t tiles, int t, float* lse) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= t) return;
  lse[k] = lse_value(lse_tree(pairs + (int64_t)k * tiles, (int)tiles));
}

// one CTA per token: lse_tree's levels with each level's merges in parallel, from
// shared memory (the same merges of the same pairs: pairs 2i, 2i + 1, an odd last
// one carried up), so the bits are lse_tree's
constexpr int kFinishThreads = 128;
__global__ void lse_finish_shared_kernel(const LsePair* pairs, int tiles, float* lse) {
  extern __shared__ LsePair buf[];  // two levels: [0, tiles) and [tiles, 2 tiles)
  const int64_t k = blockIdx.x;
  LsePair* a = buf;
  LsePair* b = buf + tiles;
  for (int i = threadIdx.x; i < tiles; i += blockDim.x) a[i] = pairs[k * tiles + i];
  __syncthreads();
  int n = tiles;
  while (n > 1) {
    const int half = n / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) b[i] = lse_merge(a[2 * i], a[2 * i + 1]);
    if (n % 2 && threadIdx.x == 0) b[half] = a[n - 1];
    __syncthreads();
    LsePair* swap = a;
    a = b;
    b = swap;
    n = half + n % 2;
  }
  if (threadIdx.x == 0) lse[k] = lse_value(n == 1 ? a[0] : lse_empty());
}
constexpr int kFinishSharedMaxTiles = 48 * 1024 / (2 * (int)sizeof(LsePair));

// grid (tiles of the chunk, t): each CTA counts, for each of token k's m chosen
// ids, the ids of its tile ranked ahead (r0: the chunk's first id)
__global__ void rank_count_kernel(const float* y, int64_t ld, int64_t n, int64_t r0, const int64_t* ids,
                                  const float* values, int m, unsigned long long* ahead) {
  __shared__ unsigned warp_sum[kRankThreads / 32];
  const int64_t k = blockIdx.y, i0 = (int64_t)blockIdx.x * kLseTile;
  float v[kRankItems];
#pragma unroll
  for (int i = 0; i < kRankItems; ++i) {
    const int64_t j = i0 + (int64_t)i * kRankThreads + threadIdx.x;
    v[i] = j < n ? y[k * ld + j] : 0.0f;
  }
  for (int q = 0; q < m; ++q) {
    const int64_t tok = ids[k * m + q];
    const float target = values[k * m + q];
    unsigned c = 0;
#pragma unroll
    for (int i = 0; i < kRankItems; ++i) {
      const int64_t j = i0 + (int64_t)i * kRankThreads + threadIdx.x;
      c += j < n && ranks_ahead(v[i], r0 + j, target, tok);
    }
    for (int off = 16; off >= 1; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
    if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned total = 0;
      for (int w = 0; w < kRankThreads / 32; ++w) total += warp_sum[w];
      if (total) atomicAdd(ahead + k * m + q, (unsigned long long)total);
    }
    __syncthreads();
  }
}

// mini[u] = row uniq[u] of the weight, both in the device layout (row tiles for quantized types)
__global__ void gather_rows_kernel(const uint8_t* w, int64_t row_bytes, int64_t block_bytes, bool tiled,
                                   const int64_t* uniq, int64_t U, uint8_t* mini) {
  const int64_t u = blockIdx.x;
  if (u >= U) return;
  const int64_t r = uniq[u];
  if (!tiled) {
    for (int64_t b = threadIdx.x; b < row_bytes; b += blockDim.x) mini[u * row_bytes + b] = w[r * row_bytes + b];
    return;
  }
  // block c of row r lies kTileRows * block_bytes after block c - 1 (device_layout.h)
  const uint8_t* src = w + tiled_row_offset(r, row_bytes, block_bytes);
  uint8_t* dst = mini + tiled_row_offset(u, row_bytes, block_bytes);
  for (int64_t e = threadIdx.x; e < row_bytes; e += blockDim.x) {
    const int64_t c = e / block_bytes, o = e % block_bytes;
    dst[c * kTileRows * block_bytes + o] = src[c * kTileRows * block_bytes + o];
  }
}

// values[q] = mini_logits[(q / m) * U + slot[q]]; ahead[q] = 0
__global__ void gather_values_kernel(const float* mini_logits, const int* slot, int t, int m, int64_t U,
                                     float* values, unsigned long long* ahead) {
  const int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (q >= (int64_t)t * m) return;
  values[q] = mini_logits[(q / m) * U + slot[q]];
  ahead[q] = 0;
}

__global__ void subtract_rows_kernel(float* y, int64_t V, int t, const float* lse) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < V * t; i += stride) y[i] = y[i] - lse[i / V];
}

}  // namespace

void lse_tiles(const float* y, int64_t ld, int64_t n, int t, int64_t tile0, int64_t tiles_total, void* pairs,
               cudaStream_t stream) {
  const int64_t tiles = (n + kLseTile - 1) / kLseTile;
  if (tiles == 0) return;
  lse_tiles_kernel<<<dim3((unsigned)tiles, (unsigned)t), kCanonLanes, 0, stream>>>(y, ld, n, tile0, tiles_total,
                                                                                  static_cast<LsePair*>(pairs));
  check_launch("lse_tiles");
}

void lse_finish(void* pairs, int64_t tiles, int t, float* lse, cudaStream_t stream) {
  if (tiles <= kFinishSharedMaxTiles) {
    lse_finish_shared_kernel<<<(unsigned)t, kFinishThreads, 2 * (size_t)tiles * sizeof(LsePair), stream>>>(
        static_cast<const LsePair*>(pairs), (int)tiles, lse);
  } else {
    lse_finish_kernel<<<(t + 127) / 128, 128, 0, stream>>>(static_cast<LsePair*>(pairs), tiles, t, lse);
  }
  check_launch("lse_finish");
}

size_t lse_pair_bytes() { return sizeof(LsePair); }

void rank_count(const float* y, int64_t ld, int64_t n, int t, int64_t r0, const int64_t* ids, const float* values,
                int m, unsigned long long* ahead, cudaStream_t stream) {
  const int64_t tiles = (n + kLseTile - 1) / kLseTile;
  if (tiles == 0 || m == 0) return;
  rank_count_kernel<<<dim3((unsigned)tiles, (unsigned)t), kRankThreads, 0, stream>>>(y, ld, n, r0, ids, values, m,
                                                                                     ahead);
  check_launch("rank_count");
}

void gather_rows(const uint8_t* w, uint32_t type, int64_t row_bytes, const int64_t* uniq, int64_t U, uint8_t* mini,
                 cudaStream_t stream) {
  if (U == 0) return;
  gather_rows_kernel<<<(unsigned)U, 128, 0, stream>>>(w, row_bytes, type_traits(type).block_bytes,
                                                      is_tiled_type(type), uniq, U, mini);
  check_launch("gather_rows");
}

void gather_values(const float* mini_logits, const int* slot, int t, int m, int64_t U, float* values,
                   unsigned long long* ahead, cudaStream_t stream) {
  const int64_t n = (int64_t)t * m;
  if (n == 0) return;
  gather_values_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(mini_logits, slot, t, m, U, values, ahead);
  check_launch("gather_values");
}

void subtract_rows(float* y, int64_t V, int t, const float* lse, cudaStream_t stream) {
  const int64_t n = V * t;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
  subtract_rows_kernel<<<(unsigned)std::max<int64_t>(blocks, 1), 256, 0, stream>>>(y, V, t, lse);
  check_launch("subtract_rows");
}

}  // namespace muser::cuda
