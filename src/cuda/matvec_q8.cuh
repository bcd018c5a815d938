// acts="q8" on CUDA: the LM-head matvec with int8 activations and integer
// dot products on the tensor cores, bit-equal to the CPU's q8 mode
// (docs/numerics.md, "CUDA q8").
//
// Activations. quantize_acts_q8 (matvec_q8.cu) quantizes the normed vector
// exactly as the CPU's q8 mode does (ggml's x86 quantizers): Q8_K blocks of
// 256 for K-quant weights, Q8_0 blocks of 32 for Q8_0 weights. It writes the
// quants [t][Kpad] (int8, zero past K) and one record per (token, block):
//   Q4_K/Q5_K (32 B): lo[8] | hi[8] | d | pad   the 8 sums of 32 quants as lo + 256*hi
//   Q6_K      (48 B): lo[16] | hi[16] | d | pad the 16 sums of 16 quants
//   Q8_0       (4 B): d (the f16 scale, widened)
// (lo unsigned, hi signed bytes, so dp4a multiplies them with packed 6/8-bit scales).
// Q4_K/Q5_K also get the same sums as f16 halves (Q8Staging, 48 B a record,
// Q8Args::meta_f16) for the kernels that take the mins' sums on the tensor cores.
//
// Integer sums. A warp owns 16 rows (rows G and G+8 of lane G*4+q) and up to
// 64 tokens in tiles of 8: one mma.sync m16n8k32 (u8 weights x s8 quants;
// m16n8k16 for Q6_K's 16-element groups, s8 x s8 for Q8_0) per sub-block and
// token tile gives the exact integer dot product of every (row, token) pair of
// the tile, in the lane that holds that pair (C fragment: rows G, G+8 x tokens
// 2q, 2q+1). The k index of the mma is matched to element positions by the
// same rule on both sides (lane quad q: positions 8q..8q+7 of the sub-block),
// so the activations stay in their natural order in shared memory.
//   isum = sum_s sc_s * C_s            (IMAD per sub-block)
//   msum = sum_s m_s * sum32_s         (dp4a against the record's lo/hi bytes)
// are the CPU's exact integers.
//
// Float order. The lane holding a (row, token) pair runs the CPU's chain over
// the row's blocks in increasing order, through the same functions
// (muser/q8_step.h):
//   sum_q = q8_block_step(sum_q, dx, d, isum); sum_m = q8_block_step(sum_m, dx, dmin, msum)
//   y = q8_kquant45_result(sum_q, sum_m)   (Q6_K: y = sum_q; Q8_0: q8_0_block_step)
// and stores epilogue_apply(fold, y): the route's one element-wise node when the
// route fuses it into the matvec (cuda_fusable), the epilogue kernel's function.
// so the logits equal the CPU's bit for bit, for any t and any row mapping.
//
// Weights. Q4_K/Q5_K use the device layout of device_layout.h (qs' words: one
// position, four nibble pairs); a lane reads its 8 positions (32 bytes, two
// 16-byte loads per row) and transposes them with 8 PRMTs per 16 bytes into
// registers of 4 same-sub-block quants, merging the fifth bits from qh' with
// one LOP3 each. Q6_K and Q8_0 blocks (2-byte aligned) are read in 16-bit
// halves. Loads are ld.global.nc.L1::no_allocate, one unit ahead; for t <= 8
// Q4_K/Q5_K/Q8_0 units go through shared memory instead (matvec_q8_staged_kernel),
// and for t <= 32 too, with 2 or 4 token tiles per warp (launches of 32 tokens;
// matvec_q8_stream_kernel where those tokens' activations do not fit whole).
// Q4_K/Q5_K batches of 65 tokens and more on an sm_90 device take the wgmma
// kernel instead (matvec_q8_wgmma_sm90a.cu: the same integers and chain).
#pragma once
#include "epilogue.cuh"
#include "kernels.h"
#include "logit_keys.cuh"
#include "matvec.cuh"
#include "muser/q8_step.h"
#include "quantize_q8.cuh"

#include <type_traits>

namespace muser::cuda {

constexpr int kQ8RowsPerWarp = 16;
constexpr int kQ8XPad = 32;  // bytes after each token's staged quants: 8 banks, so 4 tokens' LDS.64 never collide

// ---------------------------------------------------------------- primitives

__device__ __forceinline__ uint2 ld_weight_v2(const uint8_t* p) {
  uint2 v;
  asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
  return v;
}
// 4 bytes at a 2-byte aligned address
__device__ __forceinline__ uint32_t ld_weight_u32_a2(const uint8_t* p) {
  return __byte_perm(ld_weight_u16(p), ld_weight_u16(p + 2), 0x5410);
}

// D = A(16x32 u8) B(32x8 s8), int32; A = {row G k 4q.., row G+8 k 4q.., row G k 16+4q.., row G+8 k 16+4q..}
__device__ __forceinline__ void mma_u8s8_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
__device__ __forceinline__ void mma_s8s8_k32(int (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
}
// D = A(16x16 u8) B(16x8 s8); A = {row G k 4q.., row G+8 k 4q..}
__device__ __forceinline__ void mma_u8s8_k16(int (&d)[4], uint32_t a0, uint32_t a1, uint32_t b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
      : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
      : "r"(a0), "r"(a1), "r"(b), "r"(0));
}

// D(f32) = A(16x16 f16) B(16x8 f16); A = {row G k 2q.., row G+8 k 2q.., row G k 8+2q.., row G+8 k 8+2q..},
// B = {k 2q.., k 8+2q..} of column G (two halves a register)
__device__ __forceinline__ void mma_f16_k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%10, %10, %10, %10};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));
}

// sum of 4 byte products: unsigned x unsigned, unsigned x signed, signed x unsigned, signed x signed
__device__ __forceinline__ int dp4a_uu(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dp4a_su(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.u32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// byte c of w as an unsigned / sign-extended int (c a constant after unrolling)
__device__ __forceinline__ int byte_u(uint32_t w, int c) { return (int)__byte_perm(w, 0u, 0x4440u | (uint32_t)c); }
__device__ __forceinline__ int byte_s(uint32_t w, int c) {
  int r;
  asm("bfe.s32 %0, %1, %2, 8;" : "=r"(r) : "r"(w), "r"(8 * c));
  return r;
}

// (a & 0x0f0f0f0f) | (b & 0xf0f0f0f0): one LOP3
__device__ __forceinline__ uint32_t merge_nibbles(uint32_t a, uint32_t b) {
  return (a & 0x0f0f0f0fu) | (b & 0xf0f0f0f0u);
}

// T[c] = byte c of w0, w1, w2, w3 (a 4x4 byte transpose, 8 PRMTs)
__device__ __forceinline__ void transpose_bytes(const uint4& w, uint32_t (&T)[4]) {
  const uint32_t a = __byte_perm(w.x, w.y, 0x5140), b = __byte_perm(w.x, w.y, 0x7362);
  const uint32_t c = __byte_perm(w.z, w.w, 0x5140), d = __byte_perm(w.z, w.w, 0x7362);
  T[0] = __byte_perm(a, c, 0x5410);
  T[1] = __byte_perm(a, c, 0x7632);
  T[2] = __byte_perm(b, d, 0x5410);
  T[3] = __byte_perm(b, d, 0x7632);
}

// The first block of a row in the device layout (row tiles, device_layout.h); rows
// past the end re-read the last row (never stored).
template <int kBlockBytes>
__device__ __forceinline__ const uint8_t* q8_row_ptr(const Q8Args& a, int64_t row) {
  return a.w + tiled_row_offset(row < a.rows ? row : a.rows - 1, a.row_bytes, kBlockBytes);
}

// What compute() reads from shared memory for one unit.
struct Q8Smem {
  const int8_t* x;     // staged quants of token G of tile 0, at the unit's first column + the lane's offset
  int tile_stride;     // bytes between token tiles (8 tokens)
  const uint8_t* rec;  // record of token 2q of tile 0 for the unit's first meta block
  int tok_stride;      // bytes between consecutive tokens' records
  const uint8_t* rec_b;  // f16 mins records (Q8Staging): token G's of tile 0, at the lane's 8q
  int tiles;           // token tiles holding a token < t: later tiles read the last one's quants
  int q;               // the lane's quad (lane & 3)
  // token tile nt's quants: tiles past t compute on the last staged tile (their sums are never
  // written) through a select, not a branch, so the tiles' mmas interleave
  __device__ __forceinline__ const int8_t* tile_x(int nt) const { return x + (nt < tiles ? nt : tiles - 1) * tile_stride; }
};

constexpr int kQ8F16RecBytes = 40;
// (The quantizer's copy of those records in global memory: kQ8F16RecSrcBytes, quantize_q8.cuh.)
// How a kernel instance stages the records. Lanes that keep two tokens (kJ = 2)
// of a K-quant with mins take the mins' sums on the tensor cores: an f16 mma
// of the 8 mins (and 256 x them) against the token's 8 sub-block sums split as
// lo + 256 * hi (lo 0..255, hi -16..15), every product and partial sum an
// integer below 2^24, so the f32 result is the integer msum exactly. Their
// staged record (kQ8F16RecBytes) is, per token and block:
//   [q = 0..3: half2(lo_2q, lo_2q+1), half2(hi_2q, hi_2q+1)] (32 B) | dx | pad
// The others (one token a lane, t = 1) keep the dp4a path on the raw record.
template <class Dec, int kJ>
struct Q8Staging {
  static constexpr bool kF16Mins = Dec::kMins && kJ == 2;
  static constexpr int kRecBytes = kF16Mins ? kQ8F16RecBytes : Dec::kRec;
};
// ---------------------------------------------------------------- Q4_K / Q5_K

// Scales and mins of a K-quant block header (d | dmin << 16, scales[0..3], [4..7], [8..11]):
// sc[0] = sc_0..sc_3, sc[1] = sc_4..sc_7, likewise m (one byte each: quant_blocks.h's
// unpacker halves, as kquant_scale_words applies them).
struct KScales {
  float d, dmin;
  uint32_t sc[2], m[2];
  __device__ __forceinline__ explicit KScales(const uint4& h) {
    d = half_bits_to_float(h.x & 0xffffu);
    dmin = half_bits_to_float(h.x >> 16);
    sc[0] = kscale_low(h.y);
    m[0] = kscale_low(h.z);
    sc[1] = kscale_high(h.w, h.y);
    m[1] = kscale_high(h.w >> 4, h.z);
  }
};

// The f16 A fragment of the mins' mma for lane quad q (rows G, G + 8 of ks[0], ks[1]):
// {m_2q, m_2q+1 of row G, the same of row G + 8, 256 x them}, k = 2q, 2q + 1 and
// 8 + 2q, 8 + 2q + 1 -- the B side holds a token's sub-block sums as lo_0..7 | hi_0..7.
// Every value is an integer below 2^14, so exact in f16.
__device__ __forceinline__ void kquant_mins_f16_frag(const KScales (&ks)[2], int q, uint32_t (&am)[4]) {
  const uint32_t sel = (q & 1) ? 0x4342u : 0x4140u;  // bytes 2q, 2q + 1 of the word into halves 0x64..
  const __half2 k1024 = __float2half2_rn(1024.0f), k256 = __float2half2_rn(256.0f);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t w = (q >> 1) ? ks[r].m[1] : ks[r].m[0];
    const uint32_t biased = __byte_perm(w, 0x64u, sel);  // halves 1024 + m (exact: m < 64)
    const __half2 m = __hsub2(*reinterpret_cast<const __half2*>(&biased), k1024);
    const __half2 m256 = __hmul2(m, k256);
    am[r] = *reinterpret_cast<const uint32_t*>(&m);
    am[2 + r] = *reinterpret_cast<const uint32_t*>(&m256);
  }
}

// The float chain of one block for the (row, token) pairs of each tile a lane
// keeps (kJ of its tokens 2q, 2q + 1), with the mins' sums msum from one of two
// sources (Q8Staging):
//   kF16 = false: dp4a of the mins against the raw record (lo03, lo47, hi03, hi47, dx);
//   kF16 = true (kJ = 2): an f16 mma, A = the block's mins of sub-blocks 2q, 2q + 1
//     (rows G, G + 8), then 256 x them; B = token G's staged halves; D = msum of the
//     lane's four (row, token) pairs, exactly, in the isum fragment's order.
template <int NT, int kJ, bool kF16>
__device__ __forceinline__ void kquant45_float_step(const KScales (&ks)[2], const int (&isum)[NT][4], const Q8Smem& sm,
                                                    float (&acc_q)[NT][4], float (&acc_m)[NT][4]) {
  static_assert(!kF16 || kJ == 2, "the f16 mins fill the whole C fragment");
  uint32_t am[4];
  if constexpr (kF16) kquant_mins_f16_frag(ks, sm.q, am);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float msum_f[4];
    if constexpr (kF16) {
      const uint2 b = *reinterpret_cast<const uint2*>(sm.rec_b + nt * 8 * sm.tok_stride);
      mma_f16_k16(msum_f, am, b.x, b.y);
    }
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const uint8_t* rec = sm.rec + (nt * 8 + j) * sm.tok_stride;
      const float dx = *reinterpret_cast<const float*>(rec + (kF16 ? 32 : 16));
      uint4 s;
      if constexpr (!kF16) s = *reinterpret_cast<const uint4*>(rec);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int i = 2 * r + j;
        acc_q[nt][i] = q8_block_step(acc_q[nt][i], dx, ks[r].d, isum[nt][i]);
        if constexpr (kF16) {
          acc_m[nt][i] = q8_block_step_exact(acc_m[nt][i], dx, ks[r].dmin, msum_f[i]);
        } else {
          const int lo = dp4a_uu(ks[r].m[1], s.y, dp4a_uu(ks[r].m[0], s.x, 0));
          const int hi = dp4a_us(ks[r].m[1], s.w, dp4a_us(ks[r].m[0], s.z, 0));
          acc_m[nt][i] = q8_block_step(acc_m[nt][i], dx, ks[r].dmin, hi * 256 + lo);
        }
      }
    }
  }
}

// One block of sub-blocks 2c, 2c+1 for every tile: isum += sc * (A . B)
// (for the kJ tokens a lane keeps).
template <int NT, int kJ>
__device__ __forceinline__ void kquant_pair_mma(const uint32_t (&alo)[4], const uint32_t (&ahi)[4], const KScales (&ks)[2],
                                                int c, const Q8Smem& sm, int (&isum)[NT][4]) {
  const int s0 = 2 * c, s1 = 2 * c + 1;
  const int sc00 = byte_u(ks[0].sc[s0 >> 2], s0 & 3), sc10 = byte_u(ks[1].sc[s0 >> 2], s0 & 3);
  const int sc01 = byte_u(ks[0].sc[s1 >> 2], s1 & 3), sc11 = byte_u(ks[1].sc[s1 >> 2], s1 & 3);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int8_t* xb = sm.tile_x(nt);
    const uint2 b0 = *reinterpret_cast<const uint2*>(xb + 32 * s0);
    const uint2 b1 = *reinterpret_cast<const uint2*>(xb + 32 * s1);
    int C[4];
    mma_u8s8_k32(C, alo, b0.x, b0.y);
    isum[nt][0] += sc00 * C[0];
    isum[nt][2] += sc10 * C[2];
    if (kJ == 2) {
      isum[nt][1] += sc00 * C[1];
      isum[nt][3] += sc10 * C[3];
    }
    mma_u8s8_k32(C, ahi, b1.x, b1.y);
    isum[nt][0] += sc01 * C[0];
    isum[nt][2] += sc11 * C[2];
    if (kJ == 2) {
      isum[nt][1] += sc01 * C[1];
      isum[nt][3] += sc11 * C[3];
    }
  }
}

template <bool kHigh>
struct Q8DecKQuant {  // Q5_K (kHigh) or Q4_K, repacked (device_layout.h)
  static constexpr int kUnit = kQK_K, kMetaCols = kQK_K, kRec = 32, kLaneBytes = 8;
  static constexpr int kBlockBytes = kHigh ? (int)sizeof(BlockQ5_K) : (int)sizeof(BlockQ4_K);
  static constexpr int kBlockStride = kTileRows * kBlockBytes;
  static constexpr int kUnitBytes = kBlockBytes;  // one block per unit
  static constexpr int kQsOffset = kHigh ? kQ5KQuantsOffset : kQ4KQuantsOffset;
  static constexpr bool kMins = true;
  struct Rows {
    const uint8_t* hdr[2];  // block header of rows G, G+8
    const uint8_t* qh[2];   // this lane's 8 bytes of qh' (Q5_K)
    const uint8_t* qs[2];   // this lane's 32 bytes of qs'
    __device__ Rows(const Q8Args& a, int64_t row_a, int64_t row_b, int q) {
      hdr[0] = q8_row_ptr<kBlockBytes>(a, row_a);
      hdr[1] = q8_row_ptr<kBlockBytes>(a, row_b);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        qh[i] = hdr[i] + kQ5KHighBitsOffset + 8 * q;
        qs[i] = hdr[i] + kQsOffset + 32 * q;
      }
    }
    __device__ __forceinline__ void advance(int units) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        hdr[i] += units * kBlockStride;
        if (kHigh) qh[i] += units * kBlockStride;
        qs[i] += units * kBlockStride;
      }
    }
  };
  struct Raw {
    uint4 hdr[2], qa[2], qb[2];
    uint2 qh[2];
  };
  template <int kAhead>
  static __device__ __forceinline__ void load(Raw& r, const Rows& p) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      r.hdr[i] = ld_weight_v4(p.hdr[i] + kAhead * kBlockStride);
      if (kHigh) r.qh[i] = ld_weight_v2(p.qh[i] + kAhead * kBlockStride);
      r.qa[i] = ld_weight_v4(p.qs[i] + kAhead * kBlockStride);
      r.qb[i] = ld_weight_v4(p.qs[i] + kAhead * kBlockStride + 16);
    }
  }
  // the same fields from a unit staged in shared memory ([16 rows][kBlockBytes], matvec_q8_staged_kernel)
  static constexpr bool kStageable = true;
  static __device__ __forceinline__ void load_staged(Raw& r, const uint8_t* st, int G, int q) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const uint8_t* b = st + (G + 8 * i) * kBlockBytes;
      r.hdr[i] = *reinterpret_cast<const uint4*>(b);
      if (kHigh) r.qh[i] = *reinterpret_cast<const uint2*>(b + kQ5KHighBitsOffset + 8 * q);
      r.qa[i] = *reinterpret_cast<const uint4*>(b + kQsOffset + 32 * q);
      r.qb[i] = *reinterpret_cast<const uint4*>(b + kQsOffset + 32 * q + 16);
    }
  }
  template <int NT, int kJ>
  static __device__ __forceinline__ void compute(const Raw& r, const Q8Smem& sm, int /*blocks_left*/,
                                                 float (&acc_q)[NT][4], float (&acc_m)[NT][4]) {
    const KScales ks[2] = {KScales(r.hdr[0]), KScales(r.hdr[1])};
    uint32_t T[2][4], U[2][4];  // T[i][c]: positions 8q..8q+3 of row i, nibble pair c; U: 8q+4..8q+7
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      transpose_bytes(r.qa[i], T[i]);
      transpose_bytes(r.qb[i], U[i]);
    }
    int isum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) isum[nt][i] = 0;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint32_t alo[4], ahi[4];  // sub-blocks 2c, 2c+1: {row G k-lo, row G+8 k-lo, row G k-hi, row G+8 k-hi}
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (kHigh) {
          // qh' bit c -> sub-block 2c, bit 4+c -> 2c+1; after >> c they sit at bits 0 and 4 of each byte
          const uint32_t x = (r.qh[i].x >> c) & 0x11111111u, xu = (r.qh[i].y >> c) & 0x11111111u;
          alo[i] = merge_nibbles(T[i][c], x << 4);
          alo[2 + i] = merge_nibbles(U[i][c], xu << 4);
          ahi[i] = merge_nibbles(T[i][c] >> 4, x);
          ahi[2 + i] = merge_nibbles(U[i][c] >> 4, xu);
        } else {
          alo[i] = T[i][c] & 0x0f0f0f0fu;
          alo[2 + i] = U[i][c] & 0x0f0f0f0fu;
          ahi[i] = (T[i][c] >> 4) & 0x0f0f0f0fu;
          ahi[2 + i] = (U[i][c] >> 4) & 0x0f0f0f0fu;
        }
      }
      kquant_pair_mma<NT, kJ>(alo, ahi, ks, c, sm, isum);
    }
    kquant45_float_step<NT, kJ, Q8Staging<Q8DecKQuant, kJ>::kF16Mins>(ks, isum, sm, acc_q, acc_m);
  }
};
using Q8DecQ5K = Q8DecKQuant<true>;
using Q8DecQ4K = Q8DecKQuant<false>;

// ---------------------------------------------------------------- Q6_K (GGUF layout)

// Element 16g + 4q + i of a block (lane quad q, group g = 8h + 2qq + gg):
// low 4 bits in ql[64h + 32(qq&1) + 16gg + 4q + i] (nibble qq>>1), high 2 bits
// in qh[32h + 16gg + 4q + i] (bits 2qq, 2qq+1), scale scales[g] (int8).
struct Q8DecQ6K {
  static constexpr int kUnit = kQK_K, kMetaCols = kQK_K, kRec = 48, kLaneBytes = 4;
  static constexpr int kBlockBytes = (int)sizeof(BlockQ6_K);
  static constexpr int kBlockStride = kTileRows * kBlockBytes;
  static constexpr bool kMins = false;
  struct Rows {
    const uint8_t* b[2];
    int q;  // the lane's quad
    __device__ Rows(const Q8Args& a, int64_t row_a, int64_t row_b, int quad) : q(quad) {
      b[0] = q8_row_ptr<kBlockBytes>(a, row_a);
      b[1] = q8_row_ptr<kBlockBytes>(a, row_b);
    }
    __device__ __forceinline__ void advance(int units) {
      b[0] += units * kBlockStride;
      b[1] += units * kBlockStride;
    }
  };
  struct Raw {
    uint32_t ql[2][8];  // [h*4 + a*2 + gg]
    uint32_t qh[2][4];  // [h*2 + gg]
    uint32_t sc[2][4];  // scales[4k .. 4k+3]
    uint32_t d[2];
  };
  // The lane's fields of row i's block, whatever holds it: word(i, byte) gives
  // the 4 bytes at an even offset, half(i, byte) 2 (a Q6_K block is 210 bytes,
  // so every other row of a tile starts 2 bytes off a word).
  template <class Word, class Half>
  static __device__ __forceinline__ void gather(Raw& r, int q, Word word, Half half) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int w = 0; w < 8; ++w) r.ql[i][w] = word(i, 4 * q + 64 * (w >> 2) + 32 * ((w >> 1) & 1) + 16 * (w & 1));
#pragma unroll
      for (int w = 0; w < 4; ++w) r.qh[i][w] = word(i, kQ6KQhOffset + 4 * q + 32 * (w >> 1) + 16 * (w & 1));
#pragma unroll
      for (int k = 0; k < 4; ++k) r.sc[i][k] = word(i, kQ6KScalesOffset + 4 * k);
      r.d[i] = half(i, kQ6KDOffset);
    }
  }
  static_assert(kQ6KQhOffset % 2 == 0 && kQ6KScalesOffset % 2 == 0 && kQ6KDOffset % 2 == 0, "halfword fields");
  template <int kAhead>
  static __device__ __forceinline__ void load(Raw& r, const Rows& p) {
    gather(
        r, p.q, [&](int i, int byte) { return ld_weight_u32_a2(p.b[i] + kAhead * kBlockStride + byte); },
        [&](int i, int byte) { return (uint32_t)ld_weight_u16(p.b[i] + kAhead * kBlockStride + byte); });
  }
  // the same fields from a unit staged in shared memory ([16 rows][210 bytes],
  // matvec_q8_staged_kernel): 2-byte aligned reads, as Q8_0's
  static constexpr bool kStageable = true;
  static constexpr int kUnitBytes = kBlockBytes;  // one block per unit
  static __device__ __forceinline__ void load_staged(Raw& r, const uint8_t* st, int G, int q) {
    auto halves = [&](int i) { return reinterpret_cast<const uint16_t*>(st + (G + 8 * i) * kBlockBytes); };
    gather(
        r, q, [&](int i, int byte) { return __byte_perm(halves(i)[byte >> 1], halves(i)[(byte >> 1) + 1], 0x5410); },
        [&](int i, int byte) { return (uint32_t)halves(i)[byte >> 1]; });
  }
  template <int NT, int kJ>
  static __device__ __forceinline__ void compute(const Raw& r, const Q8Smem& sm, int /*blocks_left*/,
                                                 float (&acc_q)[NT][4], float (&)[NT][4]) {
    int isum[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) isum[nt][i] = 0;
#pragma unroll
    for (int g = 0; g < 16; ++g) {
      const int h = g >> 3, qq = (g >> 1) & 3, gg = g & 1;
      uint32_t a[2];
      int sc[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t w = r.ql[i][h * 4 + (qq & 1) * 2 + gg];
        const uint32_t nib = (qq < 2 ? w : w >> 4) & 0x0f0f0f0fu;
        const uint32_t hb = ((r.qh[i][h * 2 + gg] >> (2 * qq)) & 0x03030303u) << 4;
        a[i] = nib | hb;
        sc[i] = byte_s(r.sc[i][g >> 2], g & 3);
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t b = *reinterpret_cast<const uint32_t*>(sm.tile_x(nt) + 16 * g);
        int C[4];
        mma_u8s8_k16(C, a[0], a[1], b);
        isum[nt][0] += sc[0] * C[0];
        isum[nt][2] += sc[1] * C[2];
        if (kJ == 2) {
          isum[nt][1] += sc[0] * C[1];
          isum[nt][3] += sc[1] * C[3];
        }
      }
    }
    // the weights are q in 0..63; the CPU's quant is q - 32: isum -= 32 * sum_g sc_g * sum16_g
    float d[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) d[i] = half_bits_to_float(r.d[i]);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const uint8_t* rec = sm.rec + (nt * 8 + j) * sm.tok_stride;
        const uint4 lo = *reinterpret_cast<const uint4*>(rec);
        const uint4 hi = *reinterpret_cast<const uint4*>(rec + 16);
        const float dx = *reinterpret_cast<const float*>(rec + kQ8Sum16DxOffset);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          int l = dp4a_su(r.sc[i][0], lo.x, 0);
          l = dp4a_su(r.sc[i][1], lo.y, l);
          l = dp4a_su(r.sc[i][2], lo.z, l);
          l = dp4a_su(r.sc[i][3], lo.w, l);
          int hh = dp4a_ss(r.sc[i][0], hi.x, 0);
          hh = dp4a_ss(r.sc[i][1], hi.y, hh);
          hh = dp4a_ss(r.sc[i][2], hi.z, hh);
          hh = dp4a_ss(r.sc[i][3], hi.w, hh);
          const int corr = hh * 256 + l;
          const int p = 2 * i + j;
          acc_q[nt][p] = q8_block_step(acc_q[nt][p], dx, d[i], isum[nt][p] - 32 * corr);
        }
      }
  }
};

// ---------------------------------------------------------------- Q8_0 (GGUF layout)

// A unit is 4 blocks of 32; lane quad q holds positions 8q..8q+7 of each.
struct Q8DecQ80 {
  static constexpr int kUnit = 4 * kQK8_0, kMetaCols = kQK8_0, kRec = 4, kLaneBytes = 8;
  static constexpr int kBlockBytes = (int)sizeof(BlockQ8_0);
  static_assert(kQ8_0QsOffset == 2, "load_staged reads the quants as the halfwords after d");
  static constexpr int kBlockStride = kTileRows * kBlockBytes;
  static constexpr bool kMins = false;
  struct Rows {
    const uint8_t* b[2];
    int q8;
    __device__ Rows(const Q8Args& a, int64_t row_a, int64_t row_b, int q) : q8(8 * q) {
      b[0] = q8_row_ptr<kBlockBytes>(a, row_a);
      b[1] = q8_row_ptr<kBlockBytes>(a, row_b);
    }
    __device__ __forceinline__ void advance(int units) {
      b[0] += units * 4 * kBlockStride;
      b[1] += units * 4 * kBlockStride;
    }
  };
  struct Raw {
    uint32_t lo[2][4], hi[2][4], d[2][4];
  };
  // units past the row's end read the next row or the padding after the weight (never used)
  template <int kAhead>
  static __device__ __forceinline__ void load(Raw& r, const Rows& p) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint8_t* b = p.b[i] + (kAhead * 4 + s) * kBlockStride;
        r.d[i][s] = ld_weight_u16(b);
        r.lo[i][s] = ld_weight_u32_a2(b + kQ8_0QsOffset + p.q8);
        r.hi[i][s] = ld_weight_u32_a2(b + kQ8_0QsOffset + 4 + p.q8);
      }
  }
  // the same fields from a unit staged in shared memory ([4 blocks][16 rows][34 bytes]: the
  // unit's four 16-row slabs of the row tile, matvec_q8_staged_kernel); 2-byte aligned reads
  static constexpr bool kStageable = true;
  static constexpr int kUnitBytes = 4 * kBlockBytes;
  static __device__ __forceinline__ void load_staged(Raw& r, const uint8_t* st, int G, int q) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint16_t* h = reinterpret_cast<const uint16_t*>(st + (s * kQ8RowsPerWarp + G + 8 * i) * kBlockBytes);
        r.d[i][s] = h[0];
        r.lo[i][s] = __byte_perm(h[1 + 4 * q], h[2 + 4 * q], 0x5410);  // bytes 2 + 8q .. 5 + 8q
        r.hi[i][s] = __byte_perm(h[3 + 4 * q], h[4 + 4 * q], 0x5410);  // bytes 6 + 8q .. 9 + 8q
      }
  }
  template <int NT, int kJ>
  static __device__ __forceinline__ void compute(const Raw& r, const Q8Smem& sm, int blocks_left,
                                                 float (&acc_q)[NT][4], float (&)[NT][4]) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if (s >= blocks_left) break;  // the row's last unit may hold fewer than 4 blocks (uniform)
      const uint32_t a[4] = {r.lo[0][s], r.lo[1][s], r.hi[0][s], r.hi[1][s]};
      const float dw[2] = {half_bits_to_float(r.d[0][s]), half_bits_to_float(r.d[1][s])};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint2 b = *reinterpret_cast<const uint2*>(sm.tile_x(nt) + 32 * s);
        int C[4];
        mma_s8s8_k32(C, a, b.x, b.y);
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          const float dx = *reinterpret_cast<const float*>(sm.rec + (nt * 8 + j) * sm.tok_stride + 4 * s);
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            const int p = 2 * i + j;
            acc_q[nt][p] = q8_0_block_step(acc_q[nt][p], C[p], dw[i], dx);
          }
        }
      }
    }
  }
};

// ---------------------------------------------------------------- the kernel

template <int NT>
struct Q8MinCtasPerSm {
  static constexpr int value = NT <= 2 ? 2 : 1;
};

// Bytes between two tokens' staged records: an odd multiple of 16, so lane
// quads q = 0..3, which read tokens 2q (32 * odd * q bytes apart mod 128),
// hit four different groups of banks; a dense pitch (832 bytes for Q5_K at
// 6,656 columns) put all four on the same banks.
//
// The f16 mins records (kQ8F16RecBytes, Q8Staging) are read twice: lanes
// (G, q) take 8 bytes of token G's at 8q for the mma (a half-warp reads tokens
// 0..3 or 4..7: a pitch of 32 x odd bytes puts each token's 32 on banks of its
// own), and lane quads read token 2q's scale (broadcast).
MUSER_HD constexpr int q8_rec_pitch(int mblocks, int rec_bytes) {
  return rec_bytes == kQ8F16RecBytes ? ((mblocks * rec_bytes + 31) / 32 | 1) * 32
                                     : ((mblocks * rec_bytes + 15) / 16 | 1) * 16;
}

// Copies columns [col0, col0 + chunk_cols) of the TT tokens' quants and the
// records of their blocks into shared memory (zeros for tokens >= t and
// columns past the quantized width); token k's records start at
// k * q8_rec_pitch.
template <class Dec, int kJ>
__device__ __forceinline__ void stage_q8(int8_t* xs, uint8_t* ms, const Q8Args& a, int64_t col0, int chunk_cols,
                                         int pitch, int TT, int XR) {  // XR <= TT: tokens whose quants are staged
  const int vecs = chunk_cols / 16;
  for (int i = threadIdx.x; i < XR * vecs; i += blockDim.x) {
    const int k = i / vecs, v = i - k * vecs;
    const int64_t col = col0 + 16 * v;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (k < a.t && col < a.xq_pitch) val = *reinterpret_cast<const uint4*>(a.xq + k * a.xq_pitch + col);
    *reinterpret_cast<uint4*>(xs + k * pitch + 16 * v) = val;
  }
  using St = Q8Staging<Dec, kJ>;
  constexpr int kWords = St::kRecBytes / 4;
  const int mblocks = chunk_cols / Dec::kMetaCols;
  const int64_t mb0 = col0 / Dec::kMetaCols;
  const uint32_t* meta = reinterpret_cast<const uint32_t*>(a.meta);
  uint32_t* dst = reinterpret_cast<uint32_t*>(ms);
  const int pitch_words = q8_rec_pitch(mblocks, St::kRecBytes) / 4;
  for (int i = threadIdx.x; i < TT * pitch_words; i += blockDim.x) {
    const int k = i / pitch_words, rest = i - k * pitch_words;
    const int mb = rest / kWords, w = rest - mb * kWords;
    uint32_t val = 0;
    if (k < a.t && mb < mblocks && mb0 + mb < a.meta_per_token) {
      const uint32_t* src = meta + (k * a.meta_per_token + mb0 + mb) * (Dec::kRec / 4);
      if constexpr (St::kF16Mins) {
        // words 2q, 2q + 1: the lo and hi halves of sub-blocks 2q, 2q + 1; word 8: dx (src word 4)
        if (w < 8) {
          const int s0 = 2 * (w >> 1), hi = w & 1;
          const uint32_t bytes = src[2 * hi + (s0 >> 2)] >> (8 * (s0 & 3));  // sub-blocks s0, s0 + 1
          const int v0 = hi ? (int)(int8_t)(bytes & 0xffu) : (int)(bytes & 0xffu);
          const int v1 = hi ? (int)(int8_t)((bytes >> 8) & 0xffu) : (int)((bytes >> 8) & 0xffu);
          const __half2 h = __halves2half2(__int2half_rn(v0), __int2half_rn(v1));
          val = *reinterpret_cast<const uint32_t*>(&h);
        } else if (w == 8) {
          val = src[4];
        }
      } else {
        val = src[w];
      }
    }
    dst[i] = val;
  }
}

// y through the route's element-wise node (epilogue.cuh: the epilogue kernel's
// function on the same operand, so the same bits), in registers: one switch
// on the node, then the node on every element.
template <int NT>
__device__ __forceinline__ void fold_q8_tile(const EpilogueFold& e, float (&y)[NT][4]) {
  epilogue_dispatch(e.op, [&](auto op) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) y[nt][i] = epilogue_op<decltype(op)::value>(y[nt][i], e.f0, e.f1, e.f2);
  });
}

// The call's selection (Q8Args::select, kernels.h's SelectSink). Argmax: a lane's
// best key of each of its tile's tokens, nt * 8 + 2q + j, over the rows of every
// tile it has finished -- Q8ArgmaxRun: in registers, reduced once at the end of
// the launch (an atomic per warp and tile, all on one address at t = 1, made the
// staged matvec 11 us slower); Q8ArgmaxAtomic: those atomics, for the register
// kernel, whose Q6_K instances spill with the run's registers. Top-k partials: an
// atomic per warp, tile and token on its chunk's best (64 tiles a chunk); not in
// the Q6_K register kernel (kPartials false: its t = 9..16 instance spilled with
// them), so the device never asks Q6_K for them (select_in_matvec).
template <int NT>
struct Q8ArgmaxRun {
  static constexpr bool kHeld = true, kPartials = true;
  unsigned long long best[NT][2] = {};
};
template <int NT, bool kTopkPartials>
struct Q8ArgmaxAtomic {
  static constexpr bool kHeld = false, kPartials = kTopkPartials;
};

// The best key of token nt * 8 + 2q + j over the tile's 16 rows and `best`, in
// every lane of the token's pair (same q): the 8 lanes G = 0..7 hold rows r, r + 8.
template <int NT>
__device__ __forceinline__ unsigned long long tile_best_key(const Q8Args& a, const float (&y)[NT][4], int nt, int j,
                                                            int q, int64_t r, unsigned long long best) {
  const int k = nt * 8 + 2 * q + j;
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // none past the weight's rows or t
    const int64_t row = r + 8 * h;
    const unsigned long long key = k < a.t && row < a.rows ? logit_key(y[nt][2 * h + j], row) : 0ull;
    best = key > best ? key : best;
  }
#pragma unroll
  for (int off = 4; off < 32; off <<= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
    best = o > best ? o : best;
  }
  return best;
}

// Argmax: the lane's logits of a (row, token) tile, laid out as store_q8_tile's,
// into the run instead of memory.
template <int NT, class Run>
__device__ __forceinline__ void argmax_q8_tile(const Q8Args& a, const float (&y)[NT][4], int q, int64_t r, Run& run) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if constexpr (Run::kHeld) {
        run.best[nt][j] = tile_best_key<NT>(a, y, nt, j, q, r, run.best[nt][j]);
      } else {
        const unsigned long long best = tile_best_key<NT>(a, y, nt, j, q, r, 0ull);
        if ((threadIdx.x & 31) < 4 && best) atomicMax(a.select->best + nt * 8 + 2 * q + j, best);
      }
    }
}

// Top-k partials: the tile's best key of each token into its chunk's (the tile's
// 16 rows lie in one chunk: row tiles start at multiples of 16).
template <int NT>
__device__ __forceinline__ void topk_bests_q8_tile(const Q8Args& a, const float (&y)[NT][4], int q, int64_t r) {
  const SelectSink& sink = *a.select;
  unsigned long long* chunk = sink.best + (r >> kTopkChunkShift);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const unsigned long long best = tile_best_key<NT>(a, y, nt, j, q, r, 0ull);
      if ((threadIdx.x & 31) < 4 && best) atomicMax(chunk + (nt * 8 + 2 * q + j) * sink.chunks, best);
    }
}

// Argmax: the CTA's best key of each token, from its lanes' runs, into the sink.
template <int NT>
__device__ __forceinline__ void flush_argmax_q8(const Q8Args& a, const Q8ArgmaxRun<NT>& run, void* smem) {
  auto* keys = static_cast<unsigned long long*>(smem);  // [warps][8 * NT]
  const int warps = (int)(blockDim.x >> 5), warp = (int)(threadIdx.x >> 5), q = (int)(threadIdx.x & 31);
  __syncthreads();  // every warp is done with the shared memory
  if (q < 4)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) keys[warp * 8 * NT + nt * 8 + 2 * q + j] = run.best[nt][j];
  __syncthreads();
  if ((int)threadIdx.x < a.t) {
    unsigned long long best = 0;
    for (int w = 0; w < warps; ++w) best = keys[w * 8 * NT + threadIdx.x] > best ? keys[w * 8 * NT + threadIdx.x] : best;
    if (best) atomicMax(a.select->best + threadIdx.x, best);
  }
}

// The end of a launch with an argmax sink (every thread calls it, after its last
// tile; smem: the kernel's dynamic shared memory, free by then). The CTA's best
// key of each token goes to the sink; the launch's last CTA to get here -- a
// ticket after a fence, so every CTA's keys are in -- writes each token's id and
// leaves the keys and the ticket zero for the next launch.
template <int NT, class Run>
__device__ __forceinline__ void finish_argmax_q8(const Q8Args& a, const Run& run, void* smem) {
  static_assert(8 * NT <= kQ8FoldMaxTokens, "a sink takes launches of at most kQ8FoldMaxTokens tokens");
  if (!a.select || !a.select->ids) return;
  if constexpr (Run::kHeld) flush_argmax_q8<NT>(a, run, smem);
  if (!last_cta_of_launch(a.select->done)) return;
  const SelectSink sink = *a.select;
  for (int k = threadIdx.x; k < a.t; k += blockDim.x)
    sink.ids[k] = (int64_t)logit_key_id(atomicExch(sink.best + k, 0ull));
  if (threadIdx.x == 0) *sink.done = 0;
}

// The end of a launch with top-k partials (every thread calls it, after its last
// tile; smem: the kernel's dynamic shared memory, free by then; kThreads: the
// CTA's threads). The launch's last CTA to get here -- a ticket after a fence, so
// every CTA's partials are in -- ranks each token's chunk bests into
// sink.ranked, best first (threshold_of_bests, staged in smem as far as it
// holds them), and leaves the bests and the ticket zero for the next launch.
template <int kThreads, class Run>
__device__ __forceinline__ void finish_topk_q8(const Q8Args& a, void* smem) {
  if constexpr (Run::kPartials) {
    if (!a.select || a.select->ids || !a.select->ranked) return;
    if (!last_cta_of_launch(a.select->done)) return;
    const SelectSink sink = *a.select;
    unsigned smem_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(smem_bytes));
    auto* staged = static_cast<unsigned long long*>(smem);
    const unsigned chunks = (unsigned)sink.chunks;
    for (int k = 0; k < a.t; ++k) {
      threshold_of_bests<kThreads, 1024>(sink.best + k * chunks, chunks, 0, staged, nullptr, sink.ranked + k * chunks,
                                         smem_bytes / 8);
      __syncthreads();  // every thread is done with staged
    }
    for (int i = threadIdx.x; i < a.t * (int)chunks; i += kThreads) sink.best[i] = 0;
    if (threadIdx.x == 0) *sink.done = 0;
  }
}

// Stores the lane's logits of a (row, token) tile: y[nt][i] is token nt*8 + 2q + (i & 1)
// of row r + 8*(i >> 1) (the mma C fragment) -- first through the route's
// element-wise node when the route fuses it into the matvec (fold_q8_tile; it
// was a rewrite of the stored logits, an L2 round trip per logit: Gemma-3's
// t = 8 and 16 were 4 and 7 % slower, t = 1 no different). Tiles of more
// than kQ8FoldMaxTokens tokens leave the node to a kernel of its own.
template <int NT, class Run>
__device__ __forceinline__ void store_q8_tile(const Q8Args& a, float (&y)[NT][4], int q, int64_t r, Run& run) {
  if constexpr (8 * NT > kQ8FoldMaxTokens) {
    // the caller runs the node as a kernel (kQ8FoldMaxTokens), and argmax after it (matvec_q8 refuses a selection here)
    if (a.fold.op != EpilogueOp::None) __trap();
  } else {
    fold_q8_tile<NT>(a.fold, y);
    if (a.select) {
      if (a.select->ids) {  // argmax: nothing stored
        argmax_q8_tile<NT, Run>(a, y, q, r, run);
        return;
      }
      if constexpr (Run::kPartials) topk_bests_q8_tile<NT>(a, y, q, r);
      else __trap();  // select_in_matvec asks no top-k partials of this kernel
    }
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = nt * 8 + 2 * q + (i & 1);
      const int64_t row = r + 8 * (i >> 1);
      if (k < a.t && row < a.rows) a.y[k * a.ldy + row] = y[nt][i];
    }
}

// The lane's logits of a tile from its chains (q8_kquant45_result for the K-quants
// with mins), stored through the route's node (store_q8_tile).
template <class Dec, int NT, class Run>
__device__ __forceinline__ void finish_q8_tile(const Q8Args& a, float (&acc_q)[NT][4], const float (&acc_m)[NT][4],
                                               int q, int64_t r, Run& run) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc_q[nt][i] = Dec::kMins ? q8_kquant45_result(acc_q[nt][i], acc_m[nt][i]) : acc_q[nt][i];
  store_q8_tile<NT, Run>(a, acc_q, q, r, run);
}

template <class Dec, int NT>
__global__ void __launch_bounds__(kMatvecThreads, Q8MinCtasPerSm<NT>::value)
    matvec_q8_kernel(Q8Args a, int chunk_cols) {
  constexpr int TT = 8 * NT;
  extern __shared__ uint4 smem_q8[];
  const int pitch = chunk_cols + kQ8XPad;
  int8_t* xs = reinterpret_cast<int8_t*>(smem_q8);            // [TT][pitch]
  uint8_t* ms = reinterpret_cast<uint8_t*>(xs + TT * pitch);  // [TT][mblocks] records
  const int mblocks = chunk_cols / Dec::kMetaCols;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = lane >> 2, q = lane & 3;

  const int units = (int)((a.cols + Dec::kUnit - 1) / Dec::kUnit);
  const int blocks = (int)(a.cols / Dec::kMetaCols);  // Q8_0: blocks of 32 in a row
  const int units_per_chunk = chunk_cols / Dec::kUnit;
  const bool one_chunk = units_per_chunk >= units;
  const int64_t groups = (a.rows + kMatvecWarps * kQ8RowsPerWarp - 1) / (kMatvecWarps * kQ8RowsPerWarp);

  // lane offsets into the staged tile: token G's quants at the lane's positions; token 2q's records
  const int x_lane = G * pitch + Dec::kLaneBytes * q;
  const int rec_pitch = q8_rec_pitch(mblocks, Q8Staging<Dec, 2>::kRecBytes);
  const int rec_lane = 2 * q * rec_pitch, rec_b_lane = G * rec_pitch + 8 * q;

  pdl_launch_dependents();
  pdl_wait();  // the quantized activations are the previous kernel's output
  if (one_chunk) {
    stage_q8<Dec, 2>(xs, ms, a, 0, chunk_cols, pitch, TT, TT);
    __syncthreads();
  }
  Q8ArgmaxAtomic<NT, !std::is_same_v<Dec, Q8DecQ6K>> run;  // argmax (Q8Args::select): straight to the sink
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row0 = (g * kMatvecWarps + warp) * kQ8RowsPerWarp;
    float acc_q[NT][4], acc_m[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_q[nt][i] = acc_m[nt][i] = 0.0f;

    typename Dec::Rows ptr(a, row0 + G, row0 + G + 8, q);
    typename Dec::Raw even, odd;
    Dec::template load<0>(even, ptr);
    int uc = 0;  // unit within the chunk
    for (int u = 0; u < units; ++u) {
      if (!one_chunk && uc == 0) {
        __syncthreads();  // every warp is done with the previous chunk
        stage_q8<Dec, 2>(xs, ms, a, (int64_t)u * Dec::kUnit, chunk_cols, pitch, TT, TT);
        __syncthreads();
      }
      const int mb = uc * (Dec::kUnit / Dec::kMetaCols);  // first record of the unit in the chunk
      const int mb_off = mb * Q8Staging<Dec, 2>::kRecBytes;
      const Q8Smem sm{xs + x_lane + uc * Dec::kUnit, 8 * pitch, ms + rec_lane + mb_off, rec_pitch,
                      ms + rec_b_lane + mb_off, NT, q};
      const int blocks_left = blocks - u * (Dec::kUnit / Dec::kMetaCols);
      if ((u & 1) == 0) {
        Dec::template load<1>(odd, ptr);
        Dec::template compute<NT, 2>(even, sm, blocks_left, acc_q, acc_m);
      } else {
        ptr.advance(2);
        Dec::template load<0>(even, ptr);
        Dec::template compute<NT, 2>(odd, sm, blocks_left, acc_q, acc_m);
      }
      if (++uc == units_per_chunk) uc = 0;
    }

    finish_q8_tile<Dec, NT, decltype(run)>(a, acc_q, acc_m, q, row0 + G, run);
  }
  if constexpr (8 * NT <= kQ8FoldMaxTokens) {  // larger tiles take no sink
    finish_argmax_q8<NT, decltype(run)>(a, run, smem_q8);
    finish_topk_q8<kMatvecThreads, decltype(run)>(a, smem_q8);
  }
}

// ---------------------------------------------------------------- the staged kernel (t <= 8, Q4_K/Q5_K/Q8_0)

// The same computation (same Raw, same compute(), same order), but the weight
// units travel through shared memory: each warp owns a ring of S stages of
// one unit (16 rows x one block; Q8_0: x four blocks) filled with
// cp.async.cg (16 bytes, L2 only), S - 1 units ahead, so the bytes in flight
// cost no registers. A warp's rows are one row tile, so a unit is one
// contiguous run and each copy instruction reads 512 consecutive bytes (the
// register kernel's lane-shaped loads touch 1.65 x the sectors, and Q8_0's
// 2-byte ones make it load-issue bound). One CTA of 16 warps per
// SM stages the activations once. Only the tokens < t of the tile have
// their quants staged: lanes of tokens >= t read token t - 1's (their sums
// are never written). S = 2 by default (q8_staged_stages), else the
// register kernel when even that does not fit.
//
// Batches (t > 8, one launch per 32 tokens): the same kernel with NT token
// tiles per warp (NT * 8 tokens); each weight unit lands in shared memory
// once and its decoded registers feed the NT tiles' mmas, so the weight is
// read once per launch. The staged quants are those of the tiles holding a
// token < t (rounded up to 8 tokens, zeros past t); tiles past t are
// computed on the last staged tile and never written (Q8Smem::tile_x).
// NT = 8 would need more registers than 16 warps allow (128 each): Q8StagedCta
// gives it 8 warps, but that variant lost to two launches of 4 tiles
// (docs/performance.md) and is not dispatched.
template <int NT>
struct Q8StagedCta {
  static constexpr int warps = NT >= 8 ? 8 : 16;
  static constexpr int threads = 32 * warps;
};

// Units of its first row group each warp pulls into L2 before it waits for
// the activations: the norm, gamma and quantizer kernels before it take
// ~10 us, and the S - 1 units of the ring alone would leave DRAM idle for
// most of that (on the seed head 2,112 warps x 6 x 2,816 bytes = 36 MB of
// the 50 MB L2, used within microseconds of the wait).
constexpr int kQ8WarmupUnits = 6;

// Tokens whose quants the staged kernel keeps in shared memory for t tokens
// and a tile of TT: t itself up to 8 (lanes of tokens >= t read token t - 1),
// but at least 4 from t = 2 on (zeros past t: t = 2 staging 2 rows ran 13 %
// slower than t = 4, docs/performance.md); else t rounded up to whole tiles
// of 8 (zeros past t).
MUSER_HD constexpr int q8_staged_tokens(int t, int TT) {
  return t <= 8 ? (t == 1 ? 1 : t < 4 ? 4 : t) : ((t + 7) / 8 * 8 < TT ? (t + 7) / 8 * 8 : TT);
}

// Pulls nbytes (a multiple of 16) at a 16-byte aligned p into L2; one lane calls it.
__device__ __forceinline__ void prefetch_l2_bulk(const uint8_t* p, uint32_t nbytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(nbytes) : "memory");
#else
  for (uint32_t off = 0; off < nbytes; off += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#endif
}

// This lane's first 16-byte piece of a warp's row tile in row group n of the
// persistent kernels' walk (the CTA's groups blockIdx.x, + gridDim.x, ...; rows
// past the end re-read the last tile, never stored): the tile's units follow at
// a stride of one unit.
template <int kWarps>
__device__ __forceinline__ const uint8_t* q8_warp_tile_src(const Q8Args& a, int64_t n, int warp, int lane) {
  const int64_t row0 = ((blockIdx.x + n * gridDim.x) * kWarps + warp) * kQ8RowsPerWarp;
  const int64_t tile = (row0 < a.rows ? row0 : a.rows - 1) / kTileRows;
  return a.w + tile * kTileRows * a.row_bytes + 16 * lane;
}

// This lane's share of a warp's cp.async copy of one unit (kBytes contiguous bytes):
// pieces lane, lane + 32, ..., so each instruction reads 512 contiguous bytes; dst
// and src point at the lane's first piece.
template <int kBytes>
__device__ __forceinline__ void cp_async_warp_unit(uint8_t* dst, const uint8_t* src, int lane) {
  constexpr int kPieces = kBytes / 16, kPerLane = (kPieces + 31) / 32;
#pragma unroll
  for (int k = 0; k < kPerLane; ++k)
    cp_async16_if(dst + 512 * k, src + 512 * k, kPieces % 32 == 0 || k < kPerLane - 1 || lane + 32 * k < kPieces);
}

// kJ: tokens of its C fragment (2q, 2q + 1) a lane computes -- 2, or 1 when
// t == 1 (only token 0 exists, so token 1's integer and float work is
// dropped: 14 % fewer instructions for Q5_K, Nsight Compute). The register kernel keeps kJ = 2: with 1,
// ptxas spills its Q6_K instance.
template <class Dec, int S, int kJ, int NT = 1>
__global__ void __launch_bounds__(Q8StagedCta<NT>::threads, 1) matvec_q8_staged_kernel(Q8Args a, int chunk_cols) {
  constexpr int TT = 8 * NT, kWarps = Q8StagedCta<NT>::warps;
  constexpr int kStage = kQ8RowsPerWarp * Dec::kUnitBytes;  // one unit of the warp's 16 rows
  static_assert(kQ8RowsPerWarp == kTileRows, "a warp's rows are one row tile");
  static_assert(S >= 2, "at least two stages");
  extern __shared__ uint4 smem_q8[];
  const int pitch = chunk_cols + kQ8XPad;
  const int XR = q8_staged_tokens(a.t, TT);
  const int tiles = (a.t + 7) / 8 < NT ? (a.t + 7) / 8 : NT;
  const int mblocks = chunk_cols / Dec::kMetaCols;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = lane >> 2, q = lane & 3;
  int8_t* xs = reinterpret_cast<int8_t*>(smem_q8);                                 // [XR][pitch]
  uint8_t* ms = reinterpret_cast<uint8_t*>(xs + XR * pitch);                        // [TT][mblocks] records
  constexpr int kRecBytes = Q8Staging<Dec, kJ>::kRecBytes;
  uint8_t* ws = ms + TT * q8_rec_pitch(mblocks, kRecBytes) + warp * (S * kStage);  // this warp's [S][16][block]

  const int units = (int)((a.cols + Dec::kUnit - 1) / Dec::kUnit);
  const int blocks = (int)(a.cols / Dec::kMetaCols);
  const int units_per_chunk = chunk_cols / Dec::kUnit;
  const bool one_chunk = units_per_chunk >= units;
  const int64_t groups = (a.rows + kWarps * kQ8RowsPerWarp - 1) / (kWarps * kQ8RowsPerWarp);

  const int x_lane = (G < XR ? G : XR - 1) * pitch + Dec::kLaneBytes * q;
  const int rec_pitch = q8_rec_pitch(mblocks, kRecBytes);
  const int rec_lane = 2 * q * rec_pitch, rec_b_lane = G * rec_pitch + 8 * q;
  uint8_t* const ws_lane = ws + 16 * lane;  // the lane's first piece of each stage (cp_async_warp_unit)

  // A warp's work is one row tile in each of the CTA's groups (blockIdx.x,
  // + gridDim.x, ...), unit after unit; the ring runs on across the tiles,
  // so the next tile's first unit is in flight while the last one of the
  // current tile computes (a drained ring at each tile cost a DRAM round
  // trip per tile). The tile's unit u is the kStage bytes at
  // tile_src + u * kStage, already in the [16 rows][block] order of a stage
  // (device_layout.h; pad rows are zeros).
  const int64_t my_groups = (groups - blockIdx.x + gridDim.x - 1) / gridDim.x;  // >= 1: grid <= groups
  auto tile_src = [&](int64_t n) { return q8_warp_tile_src<kWarps>(a, n, warp, lane); };
  // The copies, in order: the next from issue_src, with issue_left units of tile
  // issue_n left to copy (0 once every tile's are).
  int64_t issue_n = 0;
  int issue_left = units;
  const uint8_t* issue_src = tile_src(0);
  // The ring's stages by byte offset (with two, the next one is an xor).
  auto next_stage = [](int off) { return S == 2 ? off ^ kStage : off == (S - 1) * kStage ? 0 : off + kStage; };
  auto issue_next = [&](int stage_off) {
    if (issue_left > 0) {
      cp_async_warp_unit<kStage>(ws_lane + stage_off, issue_src, lane);
      issue_src += kStage;
      if (--issue_left == 0 && ++issue_n < my_groups) {
        issue_left = units;
        issue_src = tile_src(issue_n);
      }
    }
    cp_async_commit();  // one group per call, empty or not: cp_async_wait counts them
  };

  // The weight depends on no earlier node: the first units are in flight, and
  // the next ones on their way into L2, before the wait for the activations
  // (pdl.cuh); every CTA reaches the barrier after it.
  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue_next(s * kStage);
  const int warm = min(units - (S - 1), kQ8WarmupUnits);
  if (lane == 0 && warm > 0) prefetch_l2_bulk(tile_src(0) - 16 * lane + (int64_t)(S - 1) * kStage, (uint32_t)(warm * kStage));
  pdl_wait();  // the quantized activations are the previous kernel's output
  if (one_chunk) {
    stage_q8<Dec, kJ>(xs, ms, a, 0, chunk_cols, pitch, TT, XR);
    __syncthreads();
  }

  int rd = 0;                 // the stage this unit reads (byte offset)
  int wr = (S - 1) * kStage;  // the stage this unit's copies fill
  Q8ArgmaxRun<NT> run;  // argmax's best keys (Q8Args::select)
  // One unit (uc: its index in the chunk of staged columns): its copies have
  // landed, the copies S - 1 units ahead go out, then its block is computed.
  auto unit = [&](int uc, int u, float(&acc_q)[NT][4], float(&acc_m)[NT][4]) {
    cp_async_wait<S - 2>();  // this lane's pieces of this unit have landed
    __syncwarp();            // ... and every lane's; every lane is done with stage wr (the unit before)
    issue_next(wr);
    const int mb_off = uc * (Dec::kUnit / Dec::kMetaCols) * kRecBytes;
    const Q8Smem sm{xs + x_lane + uc * Dec::kUnit, 8 * pitch, ms + rec_lane + mb_off, rec_pitch,
                    ms + rec_b_lane + mb_off, tiles, q};
    const int blocks_left = blocks - u * (Dec::kUnit / Dec::kMetaCols);
    typename Dec::Raw r;
    Dec::load_staged(r, ws + rd, G, q);
    Dec::template compute<NT, kJ>(r, sm, blocks_left, acc_q, acc_m);
    rd = next_stage(rd);
    wr = next_stage(wr);
  };
  for (int64_t n = 0; n < my_groups; ++n) {
    const int64_t row0 = ((blockIdx.x + n * gridDim.x) * kWarps + warp) * kQ8RowsPerWarp;
    float acc_q[NT][4], acc_m[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_q[nt][i] = acc_m[nt][i] = 0.0f;
    if (one_chunk) {  // the row's activations are staged whole
      for (int u = 0; u < units; ++u) unit(u, u, acc_q, acc_m);
    } else {  // restaged a chunk of columns at a time, every warp at the barriers
      for (int u0 = 0; u0 < units; u0 += units_per_chunk) {
        __syncthreads();
        stage_q8<Dec, kJ>(xs, ms, a, (int64_t)u0 * Dec::kUnit, chunk_cols, pitch, TT, XR);
        __syncthreads();
        for (int uc = 0; uc < units_per_chunk && u0 + uc < units; ++uc) unit(uc, u0 + uc, acc_q, acc_m);
      }
    }
    finish_q8_tile<Dec, NT, decltype(run)>(a, acc_q, acc_m, q, row0 + G, run);
  }
  cp_async_wait<0>();  // no copy is left in flight at exit (the last ones are empty groups)
  if constexpr (8 * NT <= kQ8FoldMaxTokens) {  // larger tiles take no sink
    finish_argmax_q8<NT, decltype(run)>(a, run, smem_q8);
    finish_topk_q8<Q8StagedCta<NT>::threads, decltype(run)>(a, smem_q8);
  }
}

// ---------------------------------------------------------------- the streamed batch kernel (8 < t <= 32)

// Batches of Q4_K/Q5_K/Q8_0: the staged kernel's warps, rows and arithmetic
// (the same load_staged and compute(), so the same order and bits), with the
// activations streamed through the ring beside the weights. A stage holds one
// unit of the CTA: the 16 warps' weight units and that unit's quants and
// records of every token, all copied with cp.async, S - 1 units ahead. The
// staged kernel instead kept a whole row's activations in shared memory, which
// at t = 32 did not fit: it restaged them in column chunks twice per row group,
// every warp stopped at a barrier, and its ring was two stages deep. One
// barrier per unit here: the unit's copies have landed for every thread, and
// every warp is done with the stage the next copies overwrite.
// Two stages: 385.7, 399.2 and 415.7 us with 2, 3 and 4 at t = 32 of the seed head,
// 2,959, 3,056 and 3,181 us at t = 256 (docs/performance.md).
constexpr int kQ8StreamStages = 2;
template <class Dec>
struct Q8StreamLayout {
  static constexpr int kWarps = 16, kThreads = 32 * kWarps;
  static constexpr int kWeight = kQ8RowsPerWarp * Dec::kUnitBytes;  // one warp's unit
  static constexpr int kXPitch = Dec::kUnit + kQ8XPad;               // a token's quants of the unit
  // a token's records of the unit: the f16 mins record (Q8Staging), at 32 x odd bytes
  // (q8_rec_pitch's bank rule), or Q8_0's four scales
  static constexpr int kRecSrc = Dec::kMins ? kQ8F16RecSrcBytes : Dec::kRec * (Dec::kUnit / Dec::kMetaCols);
  static constexpr int kRecPitch = Dec::kMins ? 96 : kRecSrc;
  static_assert(kRecSrc % 16 == 0 && kRecPitch >= kRecSrc, "records travel in 16-byte pieces");
  MUSER_HD static constexpr size_t stage_bytes(int TT) {
    return (size_t)kWarps * kWeight + (size_t)TT * kXPitch + (size_t)TT * kRecPitch;
  }
};

template <class Dec, int S, int NT>
__global__ void __launch_bounds__(Q8StreamLayout<Dec>::kThreads, 1) matvec_q8_stream_kernel(Q8Args a) {
  using L = Q8StreamLayout<Dec>;
  constexpr int TT = 8 * NT, kWarps = L::kWarps;
  constexpr int kStage = (int)L::stage_bytes(TT);
  constexpr int kXOff = kWarps * L::kWeight, kRecOff = kXOff + TT * L::kXPitch;
  constexpr int kXPieces = Dec::kUnit / 16, kRecPieces = L::kRecSrc / 16;
  static_assert(kQ8RowsPerWarp == kTileRows, "a warp's rows are one row tile");
  static_assert(S >= 2, "at least two stages");
  extern __shared__ uint4 smem_q8[];
  uint8_t* const ring = reinterpret_cast<uint8_t*>(smem_q8);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, G = lane >> 2, q = lane & 3;
  const int units = (int)((a.cols + Dec::kUnit - 1) / Dec::kUnit);
  const int blocks = (int)(a.cols / Dec::kMetaCols);
  const int tiles = (a.t + 7) / 8 < NT ? (a.t + 7) / 8 : NT;
  const int64_t groups = (a.rows + kWarps * kQ8RowsPerWarp - 1) / (kWarps * kQ8RowsPerWarp);
  const int64_t my_groups = (groups - blockIdx.x + gridDim.x - 1) / gridDim.x;  // >= 1: grid <= groups
  const int64_t steps = my_groups * units;  // (group, unit) pairs, the same for every warp of the CTA

  auto tile_src = [&](int64_t n) { return q8_warp_tile_src<kWarps>(a, n, warp, lane); };
  // the weight copies run ahead of the activations' in the prologue (the weight depends on
  // no earlier node), so each has its own cursor
  int64_t w_step = 0, w_n = 0;
  int w_u = 0;
  const uint8_t* w_src = tile_src(0);
  auto issue_weight = [&](int stage) {
    if (w_step++ >= steps) return;
    cp_async_warp_unit<L::kWeight>(ring + stage * kStage + warp * L::kWeight + 16 * lane,
                                   w_src + (int64_t)w_u * L::kWeight, lane);
    if (++w_u == units) {
      w_u = 0;
      if (++w_n < my_groups) w_src = tile_src(w_n);
    }
  };
  int64_t x_step = 0;
  int x_u = 0;
  auto issue_acts = [&](int stage) {  // then commit: one group per unit, empty or not
    if (x_step++ < steps) {
      uint8_t* st = ring + stage * kStage;
      for (int i = threadIdx.x; i < a.t * kXPieces; i += L::kThreads) {
        const int k = i / kXPieces, v = i - k * kXPieces;
        cp_async16(st + kXOff + k * L::kXPitch + 16 * v,
                   reinterpret_cast<const uint8_t*>(a.xq) + k * a.xq_pitch + (int64_t)x_u * Dec::kUnit + 16 * v);
      }
      for (int i = threadIdx.x; i < a.t * kRecPieces; i += L::kThreads) {
        const int k = i / kRecPieces, v = i - k * kRecPieces;
        const uint8_t* src = Dec::kMins ? a.meta_f16 + (k * a.meta_per_token + x_u) * kQ8F16RecSrcBytes
                                        : a.meta + (k * a.meta_per_token + (int64_t)x_u * (Dec::kUnit / Dec::kMetaCols)) * Dec::kRec;
        cp_async16(st + kRecOff + k * L::kRecPitch + 16 * v, src + 16 * v);
      }
      if (++x_u == units) x_u = 0;
    }
    cp_async_commit();
  };

  pdl_launch_dependents();
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue_weight(s);
  const int64_t warm = min((int64_t)kQ8WarmupUnits, (int64_t)units - (S - 1));
  if (lane == 0 && warm > 0) prefetch_l2_bulk(tile_src(0) + (int64_t)(S - 1) * L::kWeight, (uint32_t)(warm * L::kWeight));  // lane 0: no lane offset
  // tokens t .. TT of every stage: zeros, never copied over (their sums are never stored)
  for (int i = threadIdx.x; i < S * (TT - a.t); i += L::kThreads) {
    const int st = i / (TT - a.t), k = a.t + i % (TT - a.t);
    uint8_t* base = ring + st * kStage;
    for (int v = 0; v < Dec::kUnit; v += 16) *reinterpret_cast<uint4*>(base + kXOff + k * L::kXPitch + v) = make_uint4(0, 0, 0, 0);
    for (int v = 0; v < L::kRecPitch; v += 16) *reinterpret_cast<uint4*>(base + kRecOff + k * L::kRecPitch + v) = make_uint4(0, 0, 0, 0);
  }
  pdl_wait();  // the quantized activations are the previous kernel's output
#pragma unroll
  for (int s = 0; s < S - 1; ++s) issue_acts(s);

  const int x_lane = G * L::kXPitch + Dec::kLaneBytes * q;
  const int rec_lane = 2 * q * L::kRecPitch, rec_b_lane = G * L::kRecPitch + 8 * q;
  int rd = 0, wr = S - 1;  // the stage computed this unit, the stage filled this unit
  Q8ArgmaxRun<NT> run;  // argmax's best keys (Q8Args::select)
  for (int64_t n = 0; n < my_groups; ++n) {
    const int64_t row0 = ((blockIdx.x + n * gridDim.x) * kWarps + warp) * kQ8RowsPerWarp;
    float acc_q[NT][4], acc_m[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc_q[nt][i] = acc_m[nt][i] = 0.0f;
    for (int u = 0; u < units; ++u) {
      cp_async_wait<S - 2>();  // this thread's copies of this unit have landed ...
      __syncthreads();         // ... and every thread's; every warp is done with stage wr
      issue_weight(wr);
      issue_acts(wr);
      const uint8_t* st = ring + rd * kStage;
      const Q8Smem sm{reinterpret_cast<const int8_t*>(st + kXOff + x_lane), 8 * L::kXPitch, st + kRecOff + rec_lane,
                      L::kRecPitch, st + kRecOff + rec_b_lane, tiles, q};
      typename Dec::Raw r;
      Dec::load_staged(r, st + warp * L::kWeight, G, q);
      Dec::template compute<NT, 2>(r, sm, blocks - u * (Dec::kUnit / Dec::kMetaCols), acc_q, acc_m);
      rd = rd == S - 1 ? 0 : rd + 1;
      wr = wr == S - 1 ? 0 : wr + 1;
    }
    finish_q8_tile<Dec, NT, decltype(run)>(a, acc_q, acc_m, q, row0 + G, run);
  }
  cp_async_wait<0>();  // no copy is left in flight at exit (the last ones are empty groups)
  if constexpr (8 * NT <= kQ8FoldMaxTokens) {  // larger tiles take no sink
    finish_argmax_q8<NT, decltype(run)>(a, run, smem_q8);
    finish_topk_q8<Q8StreamLayout<Dec>::kThreads, decltype(run)>(a, smem_q8);
  }
}

template <class Dec, class = void>
struct Q8Stageable : std::false_type {};
template <class Dec>
struct Q8Stageable<Dec, std::void_t<decltype(Dec::kStageable)>> : std::true_type {};

// Launch plan (host side, matvec_q8.cu): columns staged per chunk and shared memory.
struct Q8Plan {
  int chunk_cols = 0;
  size_t smem_bytes = 0;
};
// x_tokens: tokens whose quants are staged (tile_tokens, or q8_staged_tokens for the staged
// kernel); budget: bytes of quants and records before columns are chunked (0: the default, 100 KB)
Q8Plan plan_matvec_q8(const Q8Args& a, int tile_tokens, int meta_cols, int rec_bytes, int x_tokens,
                      size_t budget = 0);
void launch_matvec_q8_kernel(const void* kernel, const Q8Args& a, const Q8Plan& p, cudaStream_t stream,
                             int threads = kMatvecThreads, int rows_per_cta = kMatvecWarps * kQ8RowsPerWarp);
// stages of the staged kernel for a (0: use the register kernel); MUSER_Q8_STAGES overrides
int q8_staged_stages(const Q8Args& a, const Q8Plan& p, int stage_bytes);
// false when MUSER_Q8_STREAM=0 turns the streamed batch kernel off (for measuring)
bool q8_stream_enabled();

// The streamed batch kernel for a (t <= 8 * NT); false when its stages do not fit.
template <class Dec, int NT>
bool launch_matvec_q8_stream(const Q8Args& a, cudaStream_t stream) {
  using L = Q8StreamLayout<Dec>;
  const size_t smem = kQ8StreamStages * L::stage_bytes(8 * NT);
  if (smem > smem_optin_bytes()) return false;
  Q8Args args = a;
  void* params[] = {&args};
  launch_persistent(reinterpret_cast<const void*>(&matvec_q8_stream_kernel<Dec, kQ8StreamStages, NT>), params,
                    L::kThreads, smem, a.rows, L::kWarps * kQ8RowsPerWarp, stream, "matvec_q8_stream");
  return true;
}

// Batches of Q4_K/Q5_K/Q6_K on Hopper (matvec_q8_wgmma_sm90a.cu): from q8_wgmma_min_tokens()
// tokens on, launches of up to kQ8WgmmaChunk tokens whose integer sums run on wgmma (a
// last part below it runs on the mma.sync kernels). Launches of kQ8WsMinTokens ...
// kQ8WsMaxTokens of Q4_K/Q5_K take the warp-specialized kernel (decoder and math
// warpgroups): t = 64 646 against 751 us on the streamed kernel, t = 80 683 against 846 on
// the two-warpgroup one; at 32 it loses (519 against 385). Launches of 81 ... 128 take the
// two-warpgroup kernel, whose threshold alone was 65 (at 64 it tied the streamed kernel,
// 753 against 755 us; at 48 it lost, 738 against 624; docs/performance.md). Q6_K takes the
// two-warpgroup kernel from kQ8WgmmaMinTokensQ6K tokens on (H100, seed shape: 967 us at
// t = 41 and 951 at 48, where the mma.sync kernels' 32 + 8 tokens took 1,054 and 32 + 16
// 1,137; their last part costs at least a read of the weight, 354 us, and at 32 tokens
// they are faster, 668 against 841).
constexpr int kQ8WgmmaMinTokens = 65;
constexpr int kQ8WgmmaMinTokensQ6K = 33;
constexpr int kQ8WgmmaChunk = 128;
constexpr int kQ8WsMinTokens = 49;
constexpr int kQ8WsMaxTokens = 80;
// Launches of kQ8SharedMinTokens ... kQ8SharedChunk tokens take the shared-decode kernel
// (decoder warpgroups, 64 rows a CTA decoded once for two math warpgroups of up to 128
// tokens each), so a batch of 129 ... 256 tokens reads and decodes the weight once where
// launches of 128 did twice: seed head, H100, 1,152 against 1,280 us at t = 129, 1,647
// against 1,947 at 256 (Q6_K 1,286 against 1,603 and 1,610 against 2,480). From 128 tokens
// down the two-warpgroup kernel is faster (t = 128: 971 against 1,047).
constexpr int kQ8SharedMinTokens = 129;
constexpr int kQ8SharedChunk = 256;
// the shared-decode kernel's threshold in force (MUSER_Q8_SHARED=0 turns it off, =<t>
// moves it, for measuring)
int q8_shared_min_tokens();
// whether launches of kQ8WsMinTokens ... kQ8WsMaxTokens take the warp-specialized
// kernel (MUSER_Q8_WS=0: the two-warpgroup kernel from kQ8WgmmaMinTokens on, for measuring)
bool q8_ws_enabled();
// the weight types the wgmma kernels take
bool q8_wgmma_type(uint32_t type);
// the threshold in force for a type: kQ8WsMinTokens (Q4_K/Q5_K), or kQ8WgmmaMinTokens without
// the warp-specialized kernel; kQ8WgmmaMinTokensQ6K (MUSER_Q8_WGMMA=0 turns the kernels off,
// =<t> moves every threshold, for measuring)
int q8_wgmma_min_tokens(uint32_t type);
// whether t tokens of a `type` weight go to the wgmma kernel on the current device
bool q8_wgmma_ready(uint32_t type, int t);
// tokens of its activation layout for a call of t tokens (any slice of 8-token groups
// may be launched: zeros follow t) and the layout's bytes for K columns
int q8_wgmma_layout_tokens(int t);
size_t q8_wgmma_acts_bytes(int64_t K, int t);
// writes a's quantized activations into dst in that layout (after the quantizer, on its stream)
void q8_wgmma_relayout(const Q8Args& a, int64_t K, uint8_t* dst, cudaStream_t stream);
// y = W x for a.wg's activations, one launch (a.t <= kQ8WgmmaChunk, or kQ8SharedChunk from
// q8_shared_min_tokens() on; matvec_q8 splits larger t)
void matvec_q8_wgmma(const Q8Call& a, cudaStream_t stream);

// Tokens per matvec_q8 launch for a weight type: 32 for Q4_K, Q5_K and Q8_0 (the
// staged and streamed batch kernels), 64 for Q6_K (only the register kernel);
// MUSER_Q8_TOKEN_TILE=32|64 overrides, for measuring.
int q8_token_tile(uint32_t type);
void matvec_q8_q5_k(const Q8Args& a, cudaStream_t stream);
void matvec_q8_q4_k(const Q8Args& a, cudaStream_t stream);
void matvec_q8_q6_k(const Q8Args& a, cudaStream_t stream);
void matvec_q8_q8_0(const Q8Args& a, cudaStream_t stream);

template <class Dec>
void launch_matvec_q8_tiles(const Q8Args& a, cudaStream_t stream) {
  auto go = [&](auto tiles) {
    constexpr int NT = decltype(tiles)::value;
    const Q8Plan p = plan_matvec_q8(a, 8 * NT, Dec::kMetaCols, Q8Staging<Dec, 2>::kRecBytes, 8 * NT);
    const void* kernel = reinterpret_cast<const void*>(&matvec_q8_kernel<Dec, NT>);
    prefer_max_l1(kernel, "matvec_q8");  // its halfword loads of Q6_K touch each sector often
    launch_matvec_q8_kernel(kernel, a, p, stream);
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if constexpr (Q8Stageable<Dec>::value) {
    if (a.t <= 8) {
      const int rec_bytes = a.t == 1 ? Q8Staging<Dec, 1>::kRecBytes : Q8Staging<Dec, 2>::kRecBytes;  // kJ below
      const Q8Plan p = plan_matvec_q8(a, 8, Dec::kMetaCols, rec_bytes, q8_staged_tokens(a.t, 8));
      constexpr int kStage = Q8StagedCta<1>::warps * kQ8RowsPerWarp * Dec::kUnitBytes;
      const int S = q8_staged_stages(a, p, kStage);
      auto staged = [&](auto stages, auto lane_tokens) {
        constexpr int kS = decltype(stages)::value, kJ = decltype(lane_tokens)::value;
        Q8Plan ps = p;
        ps.smem_bytes += (size_t)kS * kStage;
        launch_matvec_q8_kernel(reinterpret_cast<const void*>(&matvec_q8_staged_kernel<Dec, kS, kJ>), a, ps, stream,
                                Q8StagedCta<1>::threads, Q8StagedCta<1>::warps * kQ8RowsPerWarp);
      };
      auto depth = [&](auto lane_tokens) {  // false: not even two stages fit
        switch (S) {
          case 4: staged(std::integral_constant<int, 4>{}, lane_tokens); return true;
          case 3: staged(std::integral_constant<int, 3>{}, lane_tokens); return true;
          case 2: staged(std::integral_constant<int, 2>{}, lane_tokens); return true;
          default: return false;
        }
      };
      if (a.t == 1 ? depth(One{}) : depth(Two{})) return;
    } else {
      // batches: NT tiles per warp. Where the tiles' activations fit in shared memory
      // whole beside a two-stage ring, the staged kernel keeps them there; where they
      // do not, the streamed kernel (its chunked columns were 13-15 % slower at t >= 32
      // of the seed head, and the streamed kernel 16-25 % slower where everything fits:
      // docs/performance.md); the register kernel when neither fits
      auto batch = [&](auto tiles) {
        constexpr int NT = decltype(tiles)::value;
        using Cta = Q8StagedCta<NT>;
        constexpr int kStage = Cta::warps * kQ8RowsPerWarp * Dec::kUnitBytes;
        const size_t optin = smem_optin_bytes();
        if (optin <= 2 * (size_t)kStage + 16 * 1024) return false;
        Q8Plan p = plan_matvec_q8(a, 8 * NT, Dec::kMetaCols, Q8Staging<Dec, 2>::kRecBytes, q8_staged_tokens(a.t, 8 * NT),
                                  optin - 2 * (size_t)kStage);
        const bool whole = p.chunk_cols >= (a.cols + 255) / 256 * 256;
        if (q8_staged_stages(a, p, kStage) < 2) return false;  // does not fit, or MUSER_Q8_STAGES=0
        if (!whole && q8_stream_enabled() && launch_matvec_q8_stream<Dec, NT>(a, stream)) return true;
        p.smem_bytes += 2 * (size_t)kStage;
        launch_matvec_q8_kernel(reinterpret_cast<const void*>(&matvec_q8_staged_kernel<Dec, 2, 2, NT>), a, p, stream,
                                Cta::threads, Cta::warps * kQ8RowsPerWarp);
        return true;
      };
      // t > 32 (MUSER_Q8_TOKEN_TILE=64, measuring): the register kernel's 8 tiles, which beat
      // an 8-warp staged variant (8 tiles need 197 registers a lane): 1,364 against 1,492 us
      // for 64 tokens of the seed head
      if (a.t <= 16 ? batch(Two{}) : a.t <= 32 && batch(std::integral_constant<int, 4>{})) return;
    }
  }
  if (a.t <= 8) go(One{});
  else if (a.t <= 16) go(Two{});
  else if (a.t <= 32) go(std::integral_constant<int, 4>{});
  else go(std::integral_constant<int, 8>{});
}

}  // namespace muser::cuda
