// Experiment (cuda_canon_wide.cu runs it): canonical f32 batches of Q4_K/Q5_K with
// the decode in warps of its own (sm_90a: setmaxnreg; build the harness with
// -gencode arch=compute_90a,code=sm_90a). Bit-equal to the 4-row kernel, and slower
// than the kernels it was meant to replace on an H100 (3.30 x the FP32-FMA bound
// against the shared-decode kernel's 2.57 x at t = 32; docs/performance.md), so the
// tree does not run it.
//
// The shared-decode kernel (matvec.cuh) has every warp decode two rows, stage x and
// wait at a CTA barrier each unit: 1.86 instructions a FFMA at 72.5 % issue, 2.56 x the
// FP32-FMA bound. Here a CTA of 12 warps owns RC rows x TC tokens:
//   - 4 producer warps (one warpgroup, kWsProducerRegs registers) take the unit's raw
//     blocks from a ring filled by bulk copies (cp.async.bulk: one copy a 16-row tile,
//     its block is contiguous in the device layout), decode them with DecodeKQuant's
//     decode_row (the same floats as every canonical kernel) into the stage's rows and
//     bulk-copy the tokens' x into it (one 1 KB copy a token), counted on the stage's
//     "full" mbarrier;
//   - 8 consumer warps (two warpgroups) of 16 rows x 8 tokens only read the stage and
//     FMA (1.17 instructions a FFMA in the SASS), then free it on its "empty" mbarrier.
//     The rings run on across row groups: no CTA barrier in the loop.
// Order: lane l of a consumer warp is the canonical lane l; per unit it takes steps
// 0..7 (columns l + 32 s) in order, units in order, then canon_tree32_many -- the
// canonical dot product (docs/numerics.md).
#pragma once
#include "async_copy.cuh"
#include "matvec.cuh"
#include "pdl.cuh"

namespace muser::cuda {

// canon_tree32 of N accumulators of every lane at once: each level halves the
// accumulators a lane keeps (lanes with bit `o` clear keep the lower half) and adds its
// partner's copy of them -- the same additions as canon_tree32_warp on each
// accumulator (a + b == b + a), in (N / 2 + N / 4 + ... + N / 32) shuffles instead of
// 5 N. Lane l ends with accumulators N / 32 * l ... N / 32 * (l + 1) - 1 in v[0 .. N / 32).
template <int n>
__device__ __forceinline__ void canon_tree32_level(float* cur, int lane, int o) {
  const bool upper = (lane & o) != 0;
#pragma unroll
  for (int i = 0; i < n / 2; ++i) {
    const float send = upper ? cur[i] : cur[i + n / 2];
    const float keep = upper ? cur[i + n / 2] : cur[i];
    cur[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
  }
}
template <int N>
__device__ __forceinline__ void canon_tree32_many(float (&v)[N], int lane) {
  static_assert(N % 32 == 0, "whole accumulators a lane");
  canon_tree32_level<N>(v, lane, 16);
  canon_tree32_level<N / 2>(v, lane, 8);
  canon_tree32_level<N / 4>(v, lane, 4);
  canon_tree32_level<N / 8>(v, lane, 2);
  canon_tree32_level<N / 16>(v, lane, 1);
}

// The shape's knobs are macros so that one source builds the trials' variants:
// WS_PRODUCERS (4 or 8 producer warps), WS_DECODE_ROWS (rows a producer warp decodes
// at once), WS_PRODUCER_REGS and WS_CONSUMER_REGS (setmaxnreg's counts).
#ifndef WS_PRODUCERS
#define WS_PRODUCERS 4
#endif
#ifndef WS_DECODE_ROWS
#define WS_DECODE_ROWS 8
#endif
#ifndef WS_PRODUCER_REGS
#define WS_PRODUCER_REGS 64
#endif
#ifndef WS_CONSUMER_REGS
#define WS_CONSUMER_REGS 216
#endif
constexpr int kWsProducers = WS_PRODUCERS, kWsConsumers = 8, kWsWarps = kWsProducers + kWsConsumers;
static_assert(kWsProducers % 4 == 0, "producers fill whole warpgroups (setmaxnreg is a warpgroup's)");
constexpr int kWsDecodeRows = WS_DECODE_ROWS;  // rows a producer warp decodes at once
// Registers a thread (setmaxnreg): the launch gives each thread 65536 / threads (168 for
// 384); the producers' warpgroups give back what the consumers' two take (.inc waits)
constexpr int kWsLaunchRegs = 65536 / (32 * kWsWarps) / 8 * 8;
constexpr int kWsProducerRegs = WS_PRODUCER_REGS, kWsConsumerRegs = WS_CONSUMER_REGS;
// every producer thread (named barrier 1): done with a raw stage
__device__ __forceinline__ void producers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(32 * kWsProducers) : "memory");
}
static_assert(32 * kWsProducers * (kWsLaunchRegs - kWsProducerRegs) >= 256 * (kWsConsumerRegs - kWsLaunchRegs) &&
                  kWsProducerRegs % 8 == 0 && kWsConsumerRegs % 8 == 0,
              "the consumers take no more registers than the producers give back, in setmaxnreg's steps");

// ---- the pieces the producer/consumer and ring kernels (cuda_canon_ring.cuh) share

// One unit's raw blocks of RC rows (RC / 16 row tiles; one block a 16-row tile is 16 * B
// contiguous bytes in the device layout: one bulk copy each) of row group g, unit u,
// into dst, counted on bar; rows past the end copy tile last_tile, (a.rows - 1) / 16,
// which the caller computes once (never stored)
template <int RC, int B>
__device__ __forceinline__ void copy_raw_unit(uint8_t* dst, const MatvecArgs& a, int64_t g, int u, int64_t last_tile,
                                              uint64_t* bar) {
  mbar_expect_tx(bar, RC * B);
#pragma unroll
  for (int t = 0; t < RC / kTileRows; ++t) {
    const int64_t tile = min(g * (RC / kTileRows) + t, last_tile);
    bulk_copy(dst + t * kTileRows * B, a.w + tile * kTileRows * a.row_bytes + (int64_t)u * kTileRows * B,
              kTileRows * B, bar);
  }
}

// the headers of RD rows of raw blocks (B bytes apart) as store_factors takes them
template <int RD, int B>
__device__ __forceinline__ void load_headers(const uint8_t* rows, int lane, uint4 (&hdr)[RD / 2]) {
#pragma unroll
  for (int p = 0; p < RD / 2; ++p) hdr[p] = *reinterpret_cast<const uint4*>(rows + (2 * p + (lane >> 4)) * B);
}
// a lane's quant word (and Q5_K's fifth-bit byte) of one raw block
template <class Dec>
__device__ __forceinline__ void load_lane_quants(const uint8_t* block, int lane, uint32_t& qs, uint32_t& qh) {
  qs = *reinterpret_cast<const uint32_t*>(block + Dec::kQsOffset + 4 * lane);
  qh = Dec::kHighBits ? block[kQ5KHighBitsOffset + lane] : 0u;
}
// row r's lane weights (decode_row) into a stage row: lane l's columns l + 32 s as the
// float2 pairs (s = 2q, 2q + 1) at 64 q + 2 l, where the consumers' chunks read them
template <class Dec>
__device__ __forceinline__ void store_decoded_row(uint32_t qs, uint32_t qh, const KFactorLane& fl, const float* sc,
                                                  int r, float* row_at_lane) {
  float w[8];
  Dec::decode_row(qs, qh, fl, sc, r, w);
#pragma unroll
  for (int q = 0; q < 4; ++q) *reinterpret_cast<float2*>(row_at_lane + 64 * q) = make_float2(w[2 * q], w[2 * q + 1]);
}

// A warp's 16 rows x 8 tokens of sums over one unit of a stage: wl at its first row
// (+ 2 lane), xl at its first token's x (+ lane). Chunk c = 2q + h multiplies rows 8h..8h+7
// by columns 64q + lane and 64q + 32 + lane, in that order: lane l's steps s = 0..7 in
// order, the canonical lane order. after_chunk(c) runs after chunk c (the ring kernel's
// decode of the next unit; a no-op for the consumers of the producer/consumer kernel).
template <class AfterChunk>
__device__ __forceinline__ void canon_tile_unit(float (&acc)[16][8], const float* wl, const float* xl,
                                                AfterChunk&& after_chunk) {
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float x0[8], x1[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) x0[j] = xl[j * kQK_K + 64 * q], x1[j] = xl[j * kQK_K + 64 * q + 32];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float2 wv[8];
#pragma unroll
      for (int r = 0; r < 8; ++r) wv[r] = *reinterpret_cast<const float2*>(wl + (8 * h + r) * kQK_K + 64 * q);
#pragma unroll
      for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[8 * h + r][j] = fmaf(wv[r].x, x0[j], acc[8 * h + r][j]);
          acc[8 * h + r][j] = fmaf(wv[r].y, x1[j], acc[8 * h + r][j]);
        }
      after_chunk(2 * q + h);
    }
  }
}
__device__ __forceinline__ void canon_tile_zero(float (&acc)[16][8]) {
#pragma unroll
  for (int r = 0; r < 16; ++r)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[r][j] = 0.0f;
}
// the lanes' sums joined by the canonical tree, stored as logits of rows row0.. row0 + 15,
// tokens tok0 .. tok0 + 7 (those past t or the rows' end are not stored)
__device__ __forceinline__ void canon_tile_store(float (&acc)[16][8], int lane, int64_t row0, int tok0,
                                                 const MatvecArgs& a) {
  float flat[128];  // lane l ends with acc[l / 2][4 (l % 2) + i] in flat[i]
#pragma unroll
  for (int r = 0; r < 16; ++r)
#pragma unroll
    for (int j = 0; j < 8; ++j) flat[8 * r + j] = acc[r][j];
  canon_tree32_many<128>(flat, lane);
  const int64_t row = row0 + lane / 2;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int token = tok0 + 4 * (lane % 2) + i;
    if (token < a.t && row < a.rows) a.y[token * a.ldy + row] = flat[i];
  }
}

// RG x TG consumer warps of 16 rows x 8 tokens (RG * TG == 8); a stage holds the unit's
// decoded rows and x, a raw stage the rows' undecoded blocks (one 16-row tile's block is
// 16 * B contiguous bytes in the device layout: one bulk copy)
template <bool kHigh, int RG, int TG>
struct WsTile {
  static_assert(RG * TG == kWsConsumers, "8 consumer warps");
  static constexpr int B = DecodeKQuant<kHigh>::kBlockBytes;
  static constexpr int rows = 16 * RG, tokens = 8 * TG;
  static constexpr int stage_bytes = (rows + tokens) * kQK_K * 4, raw_bytes = rows * B;
  static constexpr int scratch_bytes = kWsProducers * 2 * 32 * (kWsDecodeRows / 2) * 4;
  static constexpr size_t budget = 227 * 1024 - 256;  // 256: the barriers
  static constexpr int raw_stages = 4;
  static constexpr int stages_fit = (int)((budget - scratch_bytes - raw_stages * raw_bytes) / stage_bytes);
  static constexpr int stages = stages_fit > 4 ? 4 : stages_fit;
  static_assert(stages >= 2, "two stages at least");
  static constexpr size_t smem_bytes = (size_t)stages * stage_bytes + raw_stages * raw_bytes + scratch_bytes + 256;
  // rows a producer warp decodes at once: WS_DECODE_ROWS, or all of its rows where it has fewer
  static constexpr int decode_rows = rows / kWsProducers < kWsDecodeRows ? rows / kWsProducers : kWsDecodeRows;
  static_assert((rows / kWsProducers) % decode_rows == 0 && decode_rows % 2 == 0, "whole decode batches of row pairs");
  static_assert(raw_bytes % 16 == 0 && (16 * B) % 16 == 0, "bulk copies move 16-byte pieces");
};

template <bool kHigh, int RG, int TG>
__global__ void __launch_bounds__(32 * kWsWarps, 1) matvec_canon_ws_kernel(MatvecArgs a) {
  using Dec = DecodeKQuant<kHigh>;
  using Tile = WsTile<kHigh, RG, TG>;
  constexpr int RC = Tile::rows, TC = Tile::tokens, S = Tile::stages, RS = Tile::raw_stages, RD = Tile::decode_rows;
  constexpr int B = Tile::B, PR = RC / kWsProducers;  // PR: rows a producer warp decodes each unit
  extern __shared__ float4 smem_f4[];
  uint8_t* const smem = reinterpret_cast<uint8_t*>(smem_f4);
  float* const stages = reinterpret_cast<float*>(smem);  // [S][RC rows x 256 | TC tokens x 256]
  uint8_t* const raws = smem + S * Tile::stage_bytes;    // [RS][RC rows x B]
  float* const scratch_all = reinterpret_cast<float*>(raws + RS * Tile::raw_bytes);
  uint64_t* const full = reinterpret_cast<uint64_t*>(smem + Tile::smem_bytes - 256);
  uint64_t* const empty = full + S;
  uint64_t* const raw_full = empty + S;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int units = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + RC - 1) / RC;
  const int64_t my_units = (groups - blockIdx.x + gridDim.x - 1) / gridDim.x * units;
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], kWsProducers + 1);  // the producers' arrivals and the x copies' expect_tx
      mbar_init(&empty[s], kWsConsumers);
    }
    for (int s = 0; s < RS; ++s) mbar_init(&raw_full[s], 1);
    fence_mbar_init();
  }
  __syncthreads();
  pdl_launch_dependents();  // the producers wait for x below, after their first weight copies

  if (warp < kWsProducers) {
    setmaxnreg_dec<kWsProducerRegs>();
    // the raw copies of the CTA's k-th unit (its groups blockIdx.x, + gridDim.x, ..., each
    // row's units in order), issued by thread 0 into raw stage k % RS
    const int64_t last_tile = (a.rows - 1) / kTileRows;
    auto issue_raw = [&](int64_t k) {
      if (k >= my_units) return;
      copy_raw_unit<RC, B>(raws + (k % RS) * Tile::raw_bytes, a, blockIdx.x + (k / units) * gridDim.x,
                           (int)(k % units), last_tile, &raw_full[k % RS]);
    };
    if (threadIdx.x == 0)
      for (int k = 0; k < RS; ++k) issue_raw(k);  // the weight depends on no earlier node
    pdl_wait();  // x is the previous node's output
    const KFactorLane fl(lane, a.exponent_bits);
    float* const scratch = scratch_all + warp * 2 * 32 * (RD / 2);
    for (int64_t k = 0; k < my_units; ++k) {
      const int s = (int)(k % S), rs = (int)(k % RS);
      const int u = (int)(k % units);
      mbar_wait(&raw_full[rs], (uint32_t)((k / RS) & 1));
      mbar_wait(&empty[s], (uint32_t)(((k / S) & 1) ^ 1));  // a fresh barrier passes parity 1
      float* const ws = stages + s * (Tile::stage_bytes / 4);
      float* const xs = ws + RC * kQK_K;
      if (warp == 0) {
        if (lane == 0) mbar_expect_tx(&full[s], TC * kQK_K * 4);
        __syncwarp();
        if (lane < TC) {
          const int tok = lane < a.t ? lane : a.t - 1;  // slots past t copy the last token (never stored)
          bulk_copy(xs + lane * kQK_K, a.x + (int64_t)tok * a.ldx + (int64_t)u * kQK_K, kQK_K * 4, &full[s]);
        }
      }
      const uint8_t* const raw_rows = raws + rs * Tile::raw_bytes + warp * PR * B;
#pragma unroll
      for (int c = 0; c < PR / RD; ++c) {
        const uint8_t* base = raw_rows + c * RD * B;
        uint4 hdr[RD / 2];
        load_headers<RD, B>(base, lane, hdr);
        float* const sc = scratch + (int)((k * (PR / RD) + c) & 1) * 32 * (RD / 2);  // two in turn: no lane writes one a lane still reads
        store_factors<RD>(hdr, fl, lane, sc);
        float* dst = ws + (warp * PR + c * RD) * kQK_K + 2 * lane;
#pragma unroll
        for (int r = 0; r < RD; ++r) {
          uint32_t qs, qh;
          load_lane_quants<Dec>(base + r * B, lane, qs, qh);
          store_decoded_row<Dec>(qs, qh, fl, sc, r, dst + r * kQK_K);
        }
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(&full[s]);
      producers_sync();  // every producer is done with raw stage rs
      if (threadIdx.x == 0) issue_raw(k + RS);
    }
    return;
  }

  setmaxnreg_inc<kWsConsumerRegs>();
  pdl_wait();  // no logit is stored before the previous node is done
  const int cw = warp - kWsProducers, rg = cw / TG, tg = cw % TG;
  int64_t k = 0;
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    float acc[16][8];
    canon_tile_zero(acc);
    for (int u = 0; u < units; ++u, ++k) {
      const int s = (int)(k % S);
      mbar_wait(&full[s], (uint32_t)((k / S) & 1));
      const float* const wl = stages + s * (Tile::stage_bytes / 4) + rg * 16 * kQK_K + 2 * lane;
      const float* const xl = stages + s * (Tile::stage_bytes / 4) + RC * kQK_K + tg * 8 * kQK_K + lane;
      canon_tile_unit(acc, wl, xl, [](int) {});
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
    }
    canon_tile_store(acc, lane, g * RC + rg * 16, tg * 8, a);
  }
}

}  // namespace muser::cuda
