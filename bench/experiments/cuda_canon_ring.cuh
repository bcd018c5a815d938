// Experiment (cuda_canon_wide.cu runs it, built with -DWITH_CANON_WS): canonical f32
// batches of Q4_K/Q5_K where every warp both decodes and multiplies, the decode of
// the next unit interleaved with the FFMAs of this one, and mbarrier rings instead of
// CTA barriers. Compiled (no spills; 1.48 SASS instructions a FFMA in the 32 x 32
// loop with x by tensor copy, the shared-decode kernel's 1.74), NOT yet run: no GPU
// could be had after it was written (docs/performance.md, "Canonical f32 on mbarrier
// rings"). The harness checks its bits against the 4-row kernel's at every launch.
//
// Why: the producer/consumer kernel (cuda_canon_ws.cuh) lost to the shared-decode
// kernel because its producers starve. Nsight Compute on an H100 (t = 32, 32 x 32):
// the consumers wait on the full barrier 47 % of their samples while the producers,
// eligible, are "not selected" 33 % and issue 8.7 %: the schedulers keep issuing the
// consumers' FFMA, so a unit costs the consumers' time plus the producers' latency.
// Here no warp waits on another's decode in the same unit: warp w decodes RC / 8 rows of
// unit k + 1 between its FFMAs of unit k (one row a chunk of 128 FFMA), so the decode's
// latency hides under its own FFMAs, and one arrival a warp on the stage's "full"
// barrier says both "unit k + 1's rows are decoded" and "unit k is read".
//
// A CTA of 8 warps owns RC = 16 RG rows x TC = 8 TG tokens; warp (rg, tg) keeps 16 rows x
// 8 tokens of sums (the producer/consumer kernel's consumer loop: 1.17 instructions a
// FFMA). Rings, per CTA unit k (a row group's units in order, then the next group):
//   - raw stage k % RS: the RC rows' undecoded blocks (one cp.async.bulk a 16-row tile),
//     issued by thread 0 when unit k - RS is decoded by every warp;
//   - stage k % S: unit k's decoded rows and its TC tokens' x (each warp bulk-copies the
//     x of TC / 8 tokens, S - 1 units ahead, once unit k - 1 is read by every warp).
// full[k % S] completes after 16 arrivals: each warp's x copies (arrive.expect_tx) and
// each warp's decode of unit k (made at the end of its unit k - 1, so after it read
// unit k - 1: the stage the next x copies overwrite).
// Order: as every canonical kernel (lane l: columns l + 32 s, s = 0..7, units in order,
// then canon_tree32_many -- the canonical dot product, docs/numerics.md).
#pragma once
#include <cuda.h>

#include "cuda_canon_ws.cuh"

namespace muser::cuda {

constexpr int kRingWarps = 8;

template <bool kHigh, int RG, int TG>
struct RingTile {
  static_assert(RG * TG == kRingWarps, "8 warps of 16 rows x 8 tokens");
  static constexpr int B = DecodeKQuant<kHigh>::kBlockBytes;
  static constexpr int rows = 16 * RG, tokens = 8 * TG;
  static constexpr int decode_rows = rows / kRingWarps;  // rows a warp decodes each unit
  static_assert(decode_rows % 2 == 0 && decode_rows <= 8, "row pairs (store_factors), one row a chunk");
  static constexpr int stage_bytes = (rows + tokens) * kQK_K * 4, raw_bytes = rows * B;
  static constexpr int raw_stages = 3;
  static constexpr int scratch_bytes = kRingWarps * 2 * 32 * (decode_rows / 2) * 4;
  static constexpr size_t budget = 227 * 1024 - 256;  // 256: the barriers
  static constexpr int stages_fit = (int)((budget - scratch_bytes - raw_stages * raw_bytes) / stage_bytes);
  static constexpr int stages = stages_fit > 3 ? 3 : stages_fit;
  static_assert(stages >= 2, "two stages at least");
  static constexpr size_t smem_bytes = (size_t)stages * stage_bytes + raw_stages * raw_bytes + scratch_bytes + 256;
  static_assert((tokens / kRingWarps) * kRingWarps == tokens, "whole x copies a warp");
};

// x by bulk copies of 1 KB (each warp its TC / 8 tokens), or with kTmaX by one 2-D tensor
// copy a unit (xmap: x as [t][cols] floats, a box of 256 columns x TC tokens; tokens past t
// arrive as zeros and are never stored)
__device__ __forceinline__ void tensor_copy_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar))
      : "memory");
}

template <bool kHigh, int RG, int TG, bool kTmaX>
__global__ void __launch_bounds__(32 * kRingWarps, 1)
    matvec_canon_ring_kernel(MatvecArgs a, const __grid_constant__ CUtensorMap xmap) {
  using Dec = DecodeKQuant<kHigh>;
  using Tile = RingTile<kHigh, RG, TG>;
  constexpr int RC = Tile::rows, TC = Tile::tokens, S = Tile::stages, RS = Tile::raw_stages, RD = Tile::decode_rows;
  constexpr int B = Tile::B, XT = TC / kRingWarps;  // XT: tokens whose x a warp copies
  constexpr int kStageFloats = Tile::stage_bytes / 4;
  extern __shared__ float4 smem_f4[];
  uint8_t* const smem = reinterpret_cast<uint8_t*>(smem_f4);
  float* const stages = reinterpret_cast<float*>(smem);  // [S][RC rows x 256 | TC tokens x 256]
  uint8_t* const raws = smem + S * Tile::stage_bytes;    // [RS][RC rows x B]
  float* const scratch_all = reinterpret_cast<float*>(raws + RS * Tile::raw_bytes);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + Tile::smem_bytes - 256);
  uint64_t* const raw_full = full + S;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int rg = warp / TG, tg = warp % TG;
  const int units = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + RC - 1) / RC;
  const uint32_t my_units = (uint32_t)((groups - blockIdx.x + gridDim.x - 1) / gridDim.x) * units;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) mbar_init(&full[s], kTmaX ? kRingWarps + 1 : 2 * kRingWarps);
    for (int s = 0; s < RS; ++s) mbar_init(&raw_full[s], 1);
    fence_mbar_init();
  }
  __syncthreads();
  pdl_launch_dependents();
  if (my_units == 0) return;

  // where the next raw copy (thread 0) and the next x copy (lane 0 of each warp) go: the
  // CTA's units in order, counted along instead of divided out each unit
  const int64_t last_tile = (a.rows - 1) / kTileRows;
  int64_t raw_g = blockIdx.x;
  int raw_u = 0, x_u = 0;
  auto issue_raw = [&](uint32_t k) {  // thread 0: unit k's blocks into raw stage k % RS
    if (k >= my_units) return;
    copy_raw_unit<RC, B>(raws + (k % RS) * Tile::raw_bytes, a, raw_g, raw_u, last_tile, &raw_full[k % RS]);
    if (++raw_u == units) raw_u = 0, raw_g += gridDim.x;
  };
  // kTmaX: lane 0 of warp 1 (thread 0 issues the raw copies); else lane 0 of each warp
  const bool x_issuer = kTmaX ? threadIdx.x == 32 : lane == 0;
  auto issue_x = [&](uint32_t k) {  // unit k's x (this thread's part) into stage k % S
    if (k >= my_units) return;
    float* xs = stages + (k % S) * kStageFloats + RC * kQK_K;
    if constexpr (kTmaX) {
      mbar_expect_tx(&full[k % S], TC * kQK_K * 4);
      tensor_copy_2d(xs, &xmap, x_u * kQK_K, 0, &full[k % S]);
    } else {
      mbar_expect_tx(&full[k % S], XT * kQK_K * 4);
#pragma unroll
      for (int i = 0; i < XT; ++i) {
        const int slot = warp * XT + i;
        const int tok = slot < a.t ? slot : a.t - 1;  // slots past t copy the last token (never stored)
        bulk_copy(xs + slot * kQK_K, a.x + (int64_t)tok * a.ldx + (int64_t)x_u * kQK_K, kQK_K * 4, &full[k % S]);
      }
    }
    if (++x_u == units) x_u = 0;
  };

  const KFactorLane fl(lane, a.exponent_bits);
  float* const scratch = scratch_all + warp * 2 * 32 * (RD / 2);
  // unit k's raw rows of this warp, as decode() takes them
  auto load_raw = [&](uint32_t k, uint4 (&hdr)[RD / 2], uint32_t (&qs)[RD], uint32_t (&qh)[RD]) {
    const uint8_t* base = raws + (k % RS) * Tile::raw_bytes + warp * RD * B;
    load_headers<RD, B>(base, lane, hdr);
#pragma unroll
    for (int r = 0; r < RD; ++r) load_lane_quants<Dec>(base + r * B, lane, qs[r], qh[r]);
  };
  auto decode_store = [&](uint32_t k, int r, uint32_t qs, uint32_t qh, const float* sc) {
    store_decoded_row<Dec>(qs, qh, fl, sc, r, stages + (k % S) * kStageFloats + (warp * RD + r) * kQK_K + 2 * lane);
  };

  if (threadIdx.x == 0)
    for (uint32_t k = 0; k < RS; ++k) issue_raw(k);  // the weight depends on no earlier node
  pdl_wait();                                   // x is the previous node's output
  if (x_issuer)
    for (uint32_t k = 0; k < S - 1; ++k) issue_x(k);
  {  // unit 0's rows
    uint4 hdr[RD / 2];
    uint32_t qs[RD], qh[RD];
    mbar_wait(&raw_full[0], 0u);
    load_raw(0, hdr, qs, qh);
    store_factors<RD>(hdr, fl, lane, scratch);
#pragma unroll
    for (int r = 0; r < RD; ++r) decode_store(0, r, qs[r], qh[r], scratch);
    __syncwarp();
    if (lane == 0) mbar_arrive(&full[0]);
  }

  uint32_t k = 0;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    float acc[16][8];
    canon_tile_zero(acc);
    for (int u = 0; u < units; ++u, ++k) {
      mbar_wait(&full[k % S], (uint32_t)((k / S) & 1));
      if (threadIdx.x == 0) issue_raw(k + RS);  // every warp has decoded unit k: its raw stage is free
      if (x_issuer) issue_x(k + S - 1);         // every warp has read unit k - 1: its stage is free
      // unit k + 1's raw rows (the last unit decodes stale bytes into a stage nobody reads)
      const uint32_t kn = k + 1;
      if (kn < my_units) mbar_wait(&raw_full[kn % RS], (uint32_t)((kn / RS) & 1));
      uint4 hdr[RD / 2];
      uint32_t qs[RD], qh[RD];
      load_raw(kn, hdr, qs, qh);
      float* const sc = scratch + (kn & 1) * 32 * (RD / 2);  // two in turn: no lane writes one a lane still reads
      store_factors<RD>(hdr, fl, lane, sc);
      const float* const wl = stages + (k % S) * kStageFloats + rg * 16 * kQK_K + 2 * lane;
      const float* const xl = stages + (k % S) * kStageFloats + RC * kQK_K + tg * 8 * kQK_K + lane;
      canon_tile_unit(acc, wl, xl, [&](int c) {  // chunk c decodes row c of the next unit (8 chunks, RD <= 8 rows)
        if (c < RD) decode_store(kn, c, qs[c], qh[c], sc);
      });
      __syncwarp();
      if (lane == 0 && kn < my_units) mbar_arrive(&full[kn % S]);
    }
    canon_tile_store(acc, lane, g * RC + rg * 16, tg * 8, a);
  }
}

}  // namespace muser::cuda
