// The canonical vocabulary reduction's device pieces (docs/numerics.md, "The
// vocabulary reduction"), shared by the kernels that reduce rows of logits
// (vocab_reduce.cu, sample.cu): a CTA of kTileThreads per (row, tile of
// kLseTile ids) computes the tile's (max, sum) pair, and the CTA that finishes
// a row's last tile joins the row's pairs.
//
// The tile pair is lse_push's sequence spread over the CTA: lane l owns ids
// l, l + 32, ... in increasing order (its 64 steps); warp w takes steps
// 8w .. 8w + 7 of every lane. Each step's exponent depends only on the running
// max it meets, which the warps' maxima give, so every thread computes its
// exps at once; warp 0 then adds each lane's sum in order (the one sequential
// part) and joins the lanes by canon_tree32's butterfly. The same operations
// on the same operands as lse_push, so the same bits as the CPU's lse_tile.
#pragma once
#include <cstdint>

#include "muser/logsumexp.h"

namespace muser::cuda {

constexpr int kTileWarps = 8;
constexpr int kTileThreads = kTileWarps * 32;
constexpr int kStepsPerThread = kLseTile / kCanonLanes / kTileWarps;  // 8
static_assert(kStepsPerThread * kTileWarps * kCanonLanes == kLseTile, "a tile splits evenly over the CTA");
// The finishing CTA joins a row's pairs in shared memory up to this many tiles
// (1,048,576 ids); a longer row joins them in place in global memory.
constexpr int kJoinSmemTiles = 512;

// Shared memory of one tile pair (reused by the join).
struct TileSmem {
  __align__(16) float exps[kLseTile];  // (16: sample_prep stages top_k's chunk bests here in pairs)
  uint8_t kinds[kLseTile];
  float group_max[kTileWarps][kCanonLanes];
  unsigned flag;
};
static_assert(2 * kJoinSmemTiles * sizeof(LsePair) <= sizeof(float) * kLseTile, "two join levels fit the exps");

// Step j of this thread: the index of its id within the tile.
__device__ __forceinline__ int tile_step_index(int j) {
  return (int)(threadIdx.x % kCanonLanes) + ((int)(threadIdx.x / kCanonLanes) * kStepsPerThread + j) * kCanonLanes;
}

// What a step does to its lane's sum (lse_push): nothing (-inf), add e, or
// rescale by e and add 1 (a new running max).
enum : uint8_t { kPushSkip = 0, kPushAdd = 1, kPushRescale = 2 };

// canon_tree32 over a warp's lane pairs (lane l joins lane l + off, off = 16 … 1):
// the warp's pair in lane 0. Every lane of the warp calls it.
__device__ __forceinline__ LsePair warp_lse_join(LsePair p) {
  const int lane = threadIdx.x % kCanonLanes;
  for (int off = kCanonLanes / 2; off >= 1; off >>= 1) {
    LsePair o;
    o.m = __shfl_down_sync(0xffffffffu, p.m, off);
    o.s = __shfl_down_sync(0xffffffffu, p.s, off);
    if (lane < off) p = lse_merge(p, o);
  }
  return p;
}

// The tile's pair from every thread's kStepsPerThread values (v[j] at
// tile_step_index(j); -inf where the tile ends): valid in lane 0 of warp 0.
// Every thread of the CTA must call it (it holds __syncthreads).
__device__ __forceinline__ LsePair tile_pair(const float (&v)[kStepsPerThread], TileSmem& sm) {
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  __syncthreads();  // a previous call's warp 0 may still read sm
  float m = lse_neg_inf();
#pragma unroll
  for (int j = 0; j < kStepsPerThread; ++j)
    if (v[j] > m) m = v[j];  // lse_push's max: -inf and NaN never raise it
  sm.group_max[warp][lane] = m;
  __syncthreads();
  float before = lse_neg_inf();  // the running max this thread's first step meets
  for (int w = 0; w < warp; ++w)
    if (sm.group_max[w][lane] > before) before = sm.group_max[w][lane];
#pragma unroll
  for (int j = 0; j < kStepsPerThread; ++j) {
    const int i = tile_step_index(j);
    const bool rises = v[j] > before;
    sm.exps[i] = canon_exp_nonpos(rises ? before - v[j] : v[j] - before);
    sm.kinds[i] = v[j] == lse_neg_inf() ? kPushSkip : rises ? kPushRescale : kPushAdd;
    if (rises) before = v[j];
  }
  __syncthreads();
  LsePair p = lse_empty();
  if (warp == 0) {
    float sum = 0.0f;
#pragma unroll 16
    for (int step = 0; step < kLseTile / kCanonLanes; ++step) {
      const int i = lane + step * kCanonLanes;
      const float e = sm.exps[i];
      const uint8_t kind = sm.kinds[i];
      sum = kind == kPushRescale ? fmaf(sum, e, 1.0f) : kind == kPushAdd ? sum + e : sum;
    }
    float mx = lse_neg_inf();
    for (int w = 0; w < kTileWarps; ++w)
      if (sm.group_max[w][lane] > mx) mx = sm.group_max[w][lane];
    p = warp_lse_join(LsePair{mx, sum});
  }
  return p;
}

// After this CTA's results for `mine` of row k's tiles are written: true in
// every thread of the CTA that finished the row's last tile (then its reads of
// the other CTAs' writes see them). Every thread must call it.
// flag: a shared word of the CTA's.
__device__ __forceinline__ bool finished_row(unsigned* done, unsigned tiles, unsigned& flag, unsigned mine = 1) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();  // this CTA's writes before its count
    flag = atomicAdd(done, mine) + mine == tiles;
  }
  __syncthreads();
  const bool last = flag != 0;
  if (last) __threadfence();
  return last;
}
__device__ __forceinline__ bool finished_row(unsigned* done, unsigned tiles, TileSmem& sm, unsigned mine = 1) {
  return finished_row(done, tiles, sm.flag, mine);
}

// The row's tile pairs joined by lse_tree's levels (pairs 2i, 2i + 1; an odd
// last one carried up), each level's merges across warp 0's lanes. Call from
// warp 0 of the finishing CTA only, after the tile_pair calls are done with
// sm; every lane gets the root.
__device__ __forceinline__ LsePair join_row(LsePair* pairs, int tiles, TileSmem& sm) {
  const int lane = threadIdx.x % kCanonLanes;
  LsePair root;
  if (tiles <= kJoinSmemTiles) {
    LsePair* from = reinterpret_cast<LsePair*>(sm.exps);
    LsePair* to = from + kJoinSmemTiles;
    for (int i = lane; i < tiles; i += kCanonLanes) from[i] = LsePair{__ldcg(&pairs[i].m), __ldcg(&pairs[i].s)};
    __syncwarp();
    int n = tiles;
    while (n > 1) {
      const int half = n / 2;
      for (int i = lane; i < half; i += kCanonLanes) to[i] = lse_merge(from[2 * i], from[2 * i + 1]);
      if (n % 2 && lane == 0) to[half] = from[n - 1];
      __syncwarp();
      LsePair* swap = from;
      from = to;
      to = swap;
      n = half + n % 2;
    }
    root = from[0];
  } else {
    if (lane == 0) root = lse_tree(pairs, tiles);  // in place: the pairs are rewritten by the next launch
    root.m = __shfl_sync(0xffffffffu, root.m, 0);
    root.s = __shfl_sync(0xffffffffu, root.s, 0);
  }
  return root;
}

}  // namespace muser::cuda
