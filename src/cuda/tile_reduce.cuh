// The canonical vocabulary reduction's device pieces (docs/numerics.md, "The
// vocabulary reduction"), shared by the kernels that reduce rows of logits
// (vocab_reduce.cu, sample.cu). A tile's (max, sum) pair is lse_tile's: lane l
// pushes ids l, l + 32, ... in increasing order (its kWarpTileSteps steps),
// then the lanes join by canon_tree32's butterfly (warp_lse_join); the same
// operations on the same operands as lse_push, so the CPU's bits. Two shapes:
//
//   warp per tile  a warp walks its tile a chunk of steps at a time (lane_chunks, LaneLse),
//                  kWarpTiles tiles to a CTA: few threads per tile, for
//                  launches with many tiles (vocab_reduce always: its work per
//                  id is a load and an exp);
//   CTA per tile   kTileThreads spread each lane's steps (tile_pair): warp w
//                  takes steps 8w .. 8w + 7 of every lane, each step's
//                  exponent from the running max the warps' maxima give, then
//                  warp 0 adds each lane's sum in order -- for few rows of
//                  long work per id (sample's), where a warp per tile would
//                  leave most of the GPU's schedulers idle.
//
// The CTA that finishes a row's last tile joins the row's pairs.
#pragma once
#include <cstdint>

#include "muser/logsumexp.h"

namespace muser::cuda {

// The CTA-per-tile shape (also sample_kept_best's and top_p's CTAs).
constexpr int kTileWarps = 8;
constexpr int kTileThreads = kTileWarps * 32;
constexpr int kStepsPerThread = kLseTile / kCanonLanes / kTileWarps;  // 8
static_assert(kStepsPerThread * kTileWarps * kCanonLanes == kLseTile, "a tile splits evenly over the CTA");

// The warp-per-tile kernels: a lane's steps in a tile, how many of them it holds
// in registers at once, and the tiles (warps) of a CTA.
constexpr int kWarpTileSteps = kLseTile / kCanonLanes;  // 64
constexpr int kWarpChunk = 8;
constexpr int kWarpTiles = 4;
constexpr int kWarpTileThreads = kWarpTiles * kCanonLanes;
static_assert(kWarpTileSteps % kWarpChunk == 0, "a lane's steps split into whole chunks");

// The finishing CTA joins a row's pairs in shared memory up to this many tiles
// (1,048,576 ids); a longer row joins them in place in global memory.
constexpr int kJoinSmemTiles = 512;
static_assert(kJoinSmemTiles % kCanonLanes == 0, "join_row's lanes load whole rounds");

// Shared memory of one CTA-per-tile pair, reused by the finishing CTA's join
// (join_row) or its staged top_k bests.
struct TileSmem {
  __align__(16) float exps[kLseTile];  // (16: sample_prep stages top_k's chunk bests here in pairs)
  uint8_t kinds[kLseTile];
  float group_max[kTileWarps][kCanonLanes];
  unsigned flag;
};
static_assert(2 * kJoinSmemTiles * sizeof(LsePair) <= sizeof(float) * kLseTile, "two join levels fit the exps");

// A lane's lse_push sequence over its steps of a tile, a chunk at a time: the
// running max each step meets first (compares only), then every step's
// exponent at once, then the sums in order -- the same operations on the same
// operands as lse_push, so its bits, with the chunk's exps in flight together.
struct LaneLse {
  float m = lse_neg_inf(), s = 0.0f;
  // Pushes v[0], v[1], ... in order (-inf pushes nothing); v is overwritten.
  template <int N>
  __device__ __forceinline__ void push(float (&v)[N]) {
    unsigned rises = 0, skips = 0;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const bool up = v[j] > m;
      rises |= (unsigned)up << j;
      skips |= (unsigned)(v[j] == lse_neg_inf()) << j;
      const float before = m;
      if (up) m = v[j];
      v[j] = canon_exp_nonpos(up ? before - v[j] : v[j] - before);
    }
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (!((skips >> j) & 1)) s = ((rises >> j) & 1) ? fmaf(s, v[j], 1.0f) : s + v[j];
  }
  __device__ __forceinline__ LsePair pair() const { return LsePair{m, s}; }
};

// A lane's steps of its tile (ids lane, lane + 32, ... < count: step s at index
// lane + 32 s) walked a chunk of kWarpChunk steps at a time, the next chunk's
// loads in flight while body(c, v) takes this one (v: steps c .. c + 7, `fill`
// past the end; load(i) reads index i). kFull: the tile has every id, no bounds.
template <bool kFull = false, class Load, class Body>
__device__ __forceinline__ void lane_chunks(int count, float fill, Load load, Body body) {
  const int lane = threadIdx.x % kCanonLanes;
  auto fetch = [&](int c, float(&into)[kWarpChunk]) {
#pragma unroll
    for (int j = 0; j < kWarpChunk; ++j) {
      const int i = lane + (c + j) * kCanonLanes;
      into[j] = kFull || i < count ? load(i) : fill;
    }
  };
  float next[kWarpChunk];
  fetch(0, next);
  for (int c = 0; c < kWarpTileSteps; c += kWarpChunk) {
    float v[kWarpChunk];
#pragma unroll
    for (int j = 0; j < kWarpChunk; ++j) v[j] = next[j];
    if (c + kWarpChunk < kWarpTileSteps) fetch(c + kWarpChunk, next);  // in flight while body takes this chunk
    body(c, v);
  }
}

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

// Step j of this thread: the index of its id within the tile.
__device__ __forceinline__ int tile_step_index(int j) {
  return (int)(threadIdx.x % kCanonLanes) + ((int)(threadIdx.x / kCanonLanes) * kStepsPerThread + j) * kCanonLanes;
}

// This thread's steps of a CTA-per-tile tile, every load in flight before any
// is used (the twin of lane_chunks): v[j] = load(i) for step j at index
// i = tile_step_index(j) < count, `fill` past the end.
template <class Load>
__device__ __forceinline__ void tile_steps(int count, float fill, Load load, float (&v)[kStepsPerThread]) {
#pragma unroll
  for (int j = 0; j < kStepsPerThread; ++j) {
    const int i = tile_step_index(j);
    v[j] = i < count ? load(i) : fill;
  }
}

// What a step does to its lane's sum (lse_push): nothing (-inf), add e, or
// rescale by e and add 1 (a new running max).
enum : uint8_t { kPushSkip = 0, kPushAdd = 1, kPushRescale = 2 };

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

// Where a tile lies: slot `slot` of the CTA's `per_cta` tiles (a warp's: its
// warp index of kWarpTiles; a CTA's: 0 of 1) in a row of n ids (or of a slice
// of them): its index, its first id, its count of ids (0 past the row's end),
// and how many of the CTA's tiles the row has (finished_row's share).
struct TileSpan {
  int64_t index, first;
  int count, cta_tiles;
  __device__ __forceinline__ TileSpan(int64_t n, int per_cta, int slot) {
    const int64_t tiles = lse_tile_count(n);
    index = (int64_t)blockIdx.x * per_cta + slot;
    first = index * kLseTile;
    count = index < tiles ? (int)min((int64_t)kLseTile, n - first) : 0;
    cta_tiles = (int)min((int64_t)per_cta, tiles - (int64_t)blockIdx.x * per_cta);
  }
};

// The CTAs of a warp-per-tile launch over a row of n ids.
__host__ __device__ constexpr int64_t warp_tile_ctas(int64_t n) {
  return (n + (int64_t)kLseTile * kWarpTiles - 1) / ((int64_t)kLseTile * kWarpTiles);
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
// warp 0 of the finishing CTA only, after the tiles are done with
// sm; every lane gets the root.
__device__ __forceinline__ LsePair join_row(LsePair* pairs, int tiles, TileSmem& sm) {
  const int lane = threadIdx.x % kCanonLanes;
  LsePair root;
  if (tiles <= kJoinSmemTiles) {
    LsePair* from = reinterpret_cast<LsePair*>(sm.exps);
    LsePair* to = from + kJoinSmemTiles;
    constexpr int kPerLane = kJoinSmemTiles / kCanonLanes;
    LsePair got[kPerLane];  // every load in flight before the first store
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) {
      const int i = lane + q * kCanonLanes;
      if (i < tiles) got[q] = LsePair{__ldcg(&pairs[i].m), __ldcg(&pairs[i].s)};
    }
#pragma unroll
    for (int q = 0; q < kPerLane; ++q) {
      const int i = lane + q * kCanonLanes;
      if (i < tiles) from[i] = got[q];
    }
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
