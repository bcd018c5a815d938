// The split kernel: canonical f32 (Q4_K/Q5_K) for tiles of 16, 32 or 64 tokens, an
// experiment beside the tree's kernels (matvec.cuh), run by cuda_canon_wide.cu against
// them. Bit-equal to the 4-row kernel at every t, but slower than the route's kernels
// (H200: 2.70-2.75 x the FP32-FMA bound at t >= 32 against the shared-decode kernel's
// 2.57 x; 1.55 instructions a FFMA at 57 % issue with 2 warps a scheduler), so not in
// the route (docs/performance.md, "Canonical f32 with the lanes split over two passes").
#pragma once
#include "matvec.cuh"

namespace muser::cuda {

// ---------------------------------------------------------------- the split kernel (K-quants, tiles of 16 .. 64)
//
// The same sums again, with the canonical lanes split over two passes so that a
// thread's 128 sums are all FMAs of one lane. The tree's kernels give a thread a
// lane and its rows x tokens, and pay per FMA for x and weight reads that feed
// 4..8 FMAs each, plus the decode of every element per 8..32 tokens. Here a
// thread holds one canonical lane of 16 rows x 8 tokens, the lane's weights of a
// unit are decoded once a CTA into shared memory ([row][lane][step], a 16-byte
// read brings 4 steps of a row) and x stays in its column order (one read, shared
// by 16 rows, per step and token). A CTA owns RC rows x TC tokens (RC * TC =
// 2,048 pairs); its 256 threads are 16 lanes x 16 (row group, token group) slots,
// so a pass covers 16 of the 32 lanes: pass 0 the lanes 0-7 and 16-23, pass 1
// 8-15 and 24-31. Each pass ends with canon_tree32's level 16 (lane l + lane
// l+16, the two threads 8 apart in a half warp) and keeps its 8 lanes of every
// pair in shared memory; the second adds level 8 to the first's, and the CTA
// finishes levels 4, 2, 1. Additions of two operands commute, so which thread
// adds them moves no bit. Per thread and unit: 1,024 FMAs, 96 shared reads, the
// decode of RC / 2 elements. Each pass reads its lanes' quant words; the headers
// and fifth bits are read in both passes.
constexpr int kSplitWarps = 8;
constexpr int kSplitRows = 16, kSplitTokens = 8;  // one thread: one lane of 16 rows x 8 tokens (128 sums)
template <int TC>
struct SplitTile {
  static constexpr int tokens = TC, token_groups = TC / kSplitTokens, row_groups = 16 / token_groups,
                       rows = kSplitRows * row_groups;
  static constexpr int decode_lanes = rows / 16;  // lanes of one row a thread decodes (RC rows x 16 lanes / 256)
  // floats of a row's unit in a pass: [lane 16][step 8], + 4 so that the decode's 16-byte
  // stores of a warp's rows at one lane offset spread over the banks
  static constexpr int w_row = 16 * 8 + 4;
  static constexpr int x_token = 16 * 8 + 16;     // floats of a token's unit: [step 8][lane 16], + 16 (banks)
  static constexpr int w_floats = rows * w_row, x_floats = tokens * x_token, p_floats = rows * tokens * 8,
                       f_floats = rows * 16;
  static constexpr size_t smem_bytes = sizeof(float) * (size_t)(2 * w_floats + 2 * x_floats + p_floats + f_floats);
  static_assert(token_groups % 2 == 0 && row_groups * token_groups == 16, "a warp: one row group, two token groups");
};

// The canonical lane a pass's lane slot cl (0..15) is: 0-7 and 16-23, then 8-15 and 24-31.
__device__ __forceinline__ int split_lane(int cl, int pass) { return (cl & 7) + 16 * (cl >> 3) + 8 * pass; }

template <bool kHigh, int TC>
__global__ void __launch_bounds__(32 * kSplitWarps, 1) matvec_canon_split_kernel(MatvecArgs a) {
  using Dec = DecodeKQuant<kHigh>;
  using Tile = SplitTile<TC>;
  constexpr int RC = Tile::rows, TG = Tile::token_groups, LJ = Tile::decode_lanes, B = Dec::kBlockBytes;
  constexpr int R = kSplitRows, T = kSplitTokens, WR = Tile::w_row, XT = Tile::x_token;
  extern __shared__ float4 smem_f4[];
  float* const ws = reinterpret_cast<float*>(smem_f4);  // [2][RC][16][8] (+ 4 a row)
  float* const xs = ws + 2 * Tile::w_floats;              // [2][TC][8][16 + pad]
  float* const ps = xs + 2 * Tile::x_floats;              // [TC][RC][8]: level-16 sums of lanes 0-7
  float* const fs = ps + Tile::p_floats;                  // [RC][16]: the decoded rows' factors
  const int tid = threadIdx.x, warp = tid >> 5, hl = tid & 31;
  // compute slot: lane cl of rows rg*16 .. +15 and tokens tg + TG*k
  const int cl = hl & 15, tg = 2 * (warp % (TG / 2)) + (hl >> 4), rg = warp / (TG / 2);
  // decode job: row drow, lanes dcl .. dcl + LJ - 1 (of the pass)
  const int drow = tid / (16 / LJ), dcl = tid % (16 / LJ) * LJ;
  const int units = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + RC - 1) / RC;

  struct Item {
    int64_t g;
    int pass, u;
  };
  auto next = [&](Item it) {
    if (++it.u == units) {
      it.u = 0;
      if (++it.pass == 2) it.pass = 0, it.g += gridDim.x;
    }
    return it;
  };
  // this thread's undecoded bytes of one item
  uint4 hdr;
  uint32_t qs[LJ], qh[(LJ + 3) / 4];
  auto load_raw = [&](const Item& it) {
    const int64_t row = min(it.g * RC + drow, a.rows - 1);  // rows past the end re-read the last (never stored)
    const uint8_t* blk = a.w + tiled_row_offset(row, a.row_bytes, B) + (int64_t)it.u * Dec::kBlockStride;
    const int lane0 = split_lane(dcl, it.pass);
    hdr = ld_weight_v4(blk);
    if constexpr (LJ >= 4) {
#pragma unroll
      for (int v = 0; v < LJ / 4; ++v) {
        const uint4 q = ld_weight_v4(blk + Dec::kQsOffset + 4 * lane0 + 16 * v);
        qs[4 * v] = q.x, qs[4 * v + 1] = q.y, qs[4 * v + 2] = q.z, qs[4 * v + 3] = q.w;
        if constexpr (kHigh) qh[v] = ld_weight_u32(blk + kQ5KHighBitsOffset + lane0 + 4 * v);
      }
    } else {
#pragma unroll
      for (int v = 0; v < LJ; ++v) qs[v] = ld_weight_u32(blk + Dec::kQsOffset + 4 * (lane0 + v));
      if constexpr (kHigh) qh[0] = ld_weight_u16(blk + kQ5KHighBitsOffset + lane0);
    }
  };
  // the row's factors v = dcl .. dcl + LJ - 1 of its 16 (d*sc_j for v < 8, dmin*m_j for
  // v >= 8: KFactorLane's, v standing for its lane), then the elements
  // fmaf(d1, 2^23 + q - 2^23, -m1) of lanes dcl.. into ws[buf]
  auto decode = [&](int buf) {
    float* const frow = fs + drow * 16;
#pragma unroll
    for (int i = 0; i < LJ; ++i) frow[dcl + i] = KFactorLane(dcl + i, a.exponent_bits).factor(hdr);
    __syncwarp();
    float d1[8], m1[8];
    read_factors(fs, drow, d1, m1);
    float* const dst = ws + buf * Tile::w_floats + drow * WR + dcl * 8;
#pragma unroll
    for (int i = 0; i < LJ; ++i) {
      uint32_t qe, qo;
      kquant_lane_quants<kHigh>(qs[i], kHigh ? (qh[i / 4] >> (8 * (i % 4))) & 0xffu : 0u, qe, qo);
      float w[8];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        w[2 * c] = fmaf(d1[2 * c], byte_as_float(qe, c, a.exponent_bits), -m1[2 * c]);
        w[2 * c + 1] = fmaf(d1[2 * c + 1], byte_as_float(qo, c, a.exponent_bits), -m1[2 * c + 1]);
      }
      reinterpret_cast<float4*>(dst + 8 * i)[0] = make_float4(w[0], w[1], w[2], w[3]);
      reinterpret_cast<float4*>(dst + 8 * i)[1] = make_float4(w[4], w[5], w[6], w[7]);
    }
  };
  // the item's x: per token and step, the pass's 16 lanes as four 16-byte pieces
  auto stage_x = [&](const Item& it, int buf) {
    float* const base = xs + buf * Tile::x_floats;
#pragma unroll
    for (int n = 0; n < TC / 8; ++n) {
      const int e = tid + 256 * n, q = e & 3, s = (e >> 2) & 7, tok = e >> 5;
      const int col = it.u * kQK_K + 32 * s + 8 * it.pass + 4 * q + 8 * (q >> 1);
      const bool valid = tok < a.t;
      cp_async16(base + tok * XT + 16 * s + 4 * q, valid ? a.x + (int64_t)tok * a.ldx + col : a.x, valid);
    }
    cp_async_commit();
  };

  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < T; ++k) acc[r][k] = 0.0f;

  pdl_launch_dependents();
  pdl_wait();  // x is the previous node's output
  Item cur{blockIdx.x, 0, 0};
  if (cur.g >= groups) return;
  Item nxt = next(cur);
  load_raw(cur);
  stage_x(cur, 0);
  decode(0);
  if (nxt.g < groups) load_raw(nxt);
  cp_async_wait<0>();
  __syncthreads();
  for (int buf = 0; cur.g < groups; buf ^= 1) {
    const Item after = next(nxt);
    if (nxt.g < groups) stage_x(nxt, buf ^ 1);
    {
      const float* const wl = ws + buf * Tile::w_floats + rg * R * WR + cl * 8;
      const float* const xl = xs + buf * Tile::x_floats + tg * XT + cl;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float xv[T][4];
#pragma unroll
        for (int k = 0; k < T; ++k)
#pragma unroll
          for (int s = 0; s < 4; ++s) xv[k][s] = xl[TG * k * XT + 16 * (4 * h + s)];
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float4 wv = reinterpret_cast<const float4*>(wl + r * WR + 4 * h)[0];
#pragma unroll
          for (int k = 0; k < T; ++k) acc[r][k] = fmaf(wv.x, xv[k][0], acc[r][k]);
#pragma unroll
          for (int k = 0; k < T; ++k) acc[r][k] = fmaf(wv.y, xv[k][1], acc[r][k]);
#pragma unroll
          for (int k = 0; k < T; ++k) acc[r][k] = fmaf(wv.z, xv[k][2], acc[r][k]);
#pragma unroll
          for (int k = 0; k < T; ++k) acc[r][k] = fmaf(wv.w, xv[k][3], acc[r][k]);
        }
      }
    }
    if (nxt.g < groups) {
      decode(buf ^ 1);
      if (after.g < groups) load_raw(after);
    }
    if (cur.u == units - 1) {
      // canon_tree32's level 16 inside the half warp: slot cl < 8 adds its partner's
      // (cl + 8) first 64 sums to its own, the partner the last 64; pass 1 adds level 8
      const bool low = cl < 8;
      const int c = cl & 7;
#pragma unroll
      for (int i = 0; i < R * T / 2; ++i) {
        constexpr int kHalf = R * T / 2;
        const int ra = i / T, ka = i % T, rb = (i + kHalf) / T, kb = (i + kHalf) % T;
        const float send = low ? acc[rb][kb] : acc[ra][ka];
        const float keep = low ? acc[ra][ka] : acc[rb][kb];
        const float sum = keep + __shfl_xor_sync(0xffffffffu, send, 8);
        const int r = low ? ra : rb, k = low ? ka : kb;
        float* const slot = ps + ((tg + TG * k) * RC + rg * R + r) * 8 + c;
        *slot = cur.pass == 0 ? sum : *slot + sum;
      }
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int k = 0; k < T; ++k) acc[r][k] = 0.0f;
    }
    cp_async_wait<0>();
    __syncthreads();
    if (cur.u == units - 1 && cur.pass == 1) {
      // levels 4, 2, 1 of every pair
      for (int p = tid; p < RC * TC; p += 32 * kSplitWarps) {
        const float4 lo = reinterpret_cast<const float4*>(ps + 8 * p)[0];
        const float4 hi = reinterpret_cast<const float4*>(ps + 8 * p)[1];
        const float v0 = lo.x + hi.x, v1 = lo.y + hi.y, v2 = lo.z + hi.z, v3 = lo.w + hi.w;
        const float sum = (v0 + v2) + (v1 + v3);
        const int64_t row = cur.g * RC + p % RC;
        const int tok = p / RC;
        if (row < a.rows && tok < a.t) a.y[tok * a.ldy + row] = sum;
      }
      __syncthreads();  // before the next tile's first pass ends (with one unit a row, at once)
    }
    cur = nxt, nxt = after;
  }
}

}  // namespace muser::cuda
