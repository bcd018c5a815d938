// The canonical-order matvec on CUDA: logits[k][row] = W[row] . x[k] for t
// tokens, bit-equal to the CPU's matvec_canon (docs/numerics.md).
//
// Algorithm. Lane l of a warp owns the elements j = l (mod 32) of a row and
// accumulates acc = fmaf(w[j], x[j], acc) in increasing j from +0; the warp
// then joins its 32 partials with __shfl_down_sync for offsets 16, 8, 4, 2, 1,
// which is canon_tree32 (lane l adds lane l+off). Nothing else touches the
// sums, so the grid, the batch size t and the rows per warp never change a bit.
//
// Thread mapping. 8 or 16 warps per CTA (MatvecCta); a warp carries R consecutive rows and all
// t tokens of them (acc[R][TT] in registers, TT >= t a compile-time tile), so
// each weight byte is read once per call for t <= 64. The grid is persistent:
// about as many CTAs as fit at once, striding over groups of 8*R rows. A
// "unit" is the slice of a row a lane decodes at once (one 256-element block
// for K-quants: 8 elements per lane); the next unit's bytes are loaded before
// the current one is computed, so two units per row are in flight.
// Q4_K/Q5_K at t = 6..8 (and every 8-token tile above) run the wide kernel
// further down instead: 8 rows per warp, the same sums.
//
// Activations live in shared memory transposed per lane, xs[k][lane][step]
// (step = j / 32), each lane row padded by 4 floats so the 16-byte reads of 8
// consecutive lanes hit distinct banks; one pair of float4 reads serves R rows.
// When t*H floats do not fit, columns are staged in chunks with a CTA barrier
// (once per row group: costly, so MatvecCta sizes the budget to avoid it up to t = 8).
//
// Decode. A K-quant weight is d1*q - m1 with one (d1, m1) per 32-element
// sub-block. In the canonical order every lane touches all 8 sub-blocks of a
// block, so each lane computes ONE of the 16 factors of one of two rows and the
// warp shares them through shared memory (store_factors, read_factors). Q4_K/Q5_K blocks are
// permuted at load (device_layout.h) so a lane's 4 quant bytes are one 32-bit load
// and its 8 fifth bits one byte; q becomes an exact float as 2^23 + q - 2^23.
// Weights stream through ld.global.nc.L1::no_allocate (read once, keep L1 for x).
//
// Fuses nothing: the final norm before and the epilogue after are nodes of
// their own, so the profile books this kernel alone under "lm_head".
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "byte_pack.cuh"
#include "kernels.h"
#include "muser/quant_blocks.h"
#include "pdl.cuh"
#include "muser/device_layout.h"

namespace muser::cuda {

constexpr int kMatvecWarps = 8;
constexpr int kMatvecThreads = 32 * kMatvecWarps;
constexpr int kLanePad = 4;  // floats after each lane's row of staged x (bank spread)

// ---------------------------------------------------------------- loads

__device__ __forceinline__ uint32_t ld_weight_u8(const uint8_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u8 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_weight_u16(const uint8_t* p) {
  unsigned short v;
  asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t ld_weight_u32(const uint8_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ld_weight_v4(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// cp.async of 16 bytes, through L2 only.
__device__ __forceinline__ void cp_async16(uint8_t* dst, const uint8_t* src) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
// the same where `copy` (a predicate in the instruction, not a branch around it)
__device__ __forceinline__ void cp_async16_if(uint8_t* dst, const uint8_t* src, bool copy) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %2, 0;\n @p cp.async.cg.shared.global [%0], [%1], 16;\n}" ::"r"(d),
      "l"(src), "r"((int)copy)
      : "memory");
}
// 16 bytes of floats, zero-filled (nothing read) when !valid
__device__ __forceinline__ void cp_async16(float* dst, const float* src, bool valid) {
  const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// canon_tree32 over a warp: lane l += lane l + off for off = 16 .. 1; lane 0 holds the sum.
__device__ __forceinline__ float canon_tree32_warp(float v) {
#pragma unroll
  for (int off = 16; off >= 1; off >>= 1) v = v + __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// Byte c of q as an exact float: 0x4B0000qq is 2^23 + q (integer and float
// pipes only; the int->float converter runs at a quarter of the FMA rate).
// `exponent` is kExponentBits passed in as a kernel argument: a value the
// compiler cannot fold keeps it in a register, so each PRMT encodes its byte
// selector as an immediate instead of first moving a constant into a register.
// `less` (a small integer) comes off in the same subtraction: q - less, exactly.
constexpr uint32_t kExponentBits = 0x4B000000u;  // the float 2^23
__device__ __forceinline__ float byte_as_float(uint32_t q, uint32_t c, uint32_t exponent, float less = 0.0f) {
  return __int_as_float((int)__byte_perm(q, exponent, 0x7540u | c)) - (8388608.0f + less);
}
__device__ __forceinline__ float byte_as_float(uint32_t q, uint32_t c) { return byte_as_float(q, c, kExponentBits); }

__device__ __forceinline__ float half_bits_to_float(uint32_t h) {
  return __half2float(__ushort_as_half((unsigned short)h));  // exact, like f16_to_f32
}

// The first block of row r of a warp's group in the device layout (row tiles
// for quantized types, device_layout.h); rows past the end re-read the last row
// (their results are never stored) so every warp runs the same loop and barriers.
template <bool kTiled, int kBlockBytes>
__device__ __forceinline__ const uint8_t* row_ptr(const MatvecArgs& a, int64_t row) {
  const int64_t r = row < a.rows ? row : a.rows - 1;
  return a.w + (kTiled ? tiled_row_offset(r, a.row_bytes, kBlockBytes) : r * a.row_bytes);
}

// ---------------------------------------------------------------- K-quant factors

// Which of the 16 sub-block factors of a K-quant block this lane computes
// (d*sc_j for v < 8, dmin*m_j for v >= 8; j = v mod 8, v = lane mod 16), as
// constants of the lane so the per-block work is a handful of ALU operations.
struct KFactorLane {
  bool is_min, high;      // a min (else a scale); j >= 4 (its 6 bits are split)
  uint32_t byte_sel;      // __byte_perm selector putting byte j%4 under the 2^23 exponent
  uint32_t low_shift;     // 4 for mins: their low 4 bits are the high nibble of scales[8+j%4]
  uint32_t half_shift;    // 16 for mins: dmin is the high half of the first word
  int slot;               // index in the warp's shared factors of its row pair
  uint32_t exponent;      // kExponentBits, from the kernel arguments (see byte_as_float)
  __device__ KFactorLane(int lane, uint32_t exponent_bits) : exponent(exponent_bits) {
    const int v = lane & 15, j = v & 7;
    is_min = v >= 8;
    high = j >= 4;
    byte_sel = 0x7540u | (uint32_t)(j & 3);
    low_shift = is_min ? 4u : 0u;
    half_shift = is_min ? 16u : 0u;
    slot = (lane >> 4) * 16 + v;
  }
  // The factor from a block header (d | dmin << 16, scales[0..3], [4..7], [8..11]):
  // this lane's half of quant_blocks.h's unpacker, then an exact product of an
  // f16 and a 6-bit integer.
  __device__ __forceinline__ float factor(const uint4& h) const {
    const uint32_t a = is_min ? h.z : h.y;  // 6-bit values j < 4; their top 2 bits for j >= 4
    const uint32_t b = h.w >> low_shift;    // low 4 bits of values j >= 4
    const uint32_t word = high ? kscale_high(b, a) : kscale_low(a);
    const float q = __int_as_float((int)__byte_perm(word, exponent, byte_sel)) - 8388608.0f;
    return half_bits_to_float((h.x >> half_shift) & 0xffffu) * q;
  }
};

// Shares the factors of R rows' current blocks: lane (lane / 16) of pass p
// computes its factor of row 2p + lane/16 and stores it; after one __syncwarp
// every lane reads a row's 16 factors with four broadcast 16-byte loads
// (read_factors). scratch alternates between two buffers by block parity.
template <int R>
__device__ __forceinline__ void store_factors(const uint4 (&hdr)[(R + 1) / 2], const KFactorLane& fl, int lane,
                                              float* scratch) {
#pragma unroll
  for (int p = 0; p < (R + 1) / 2; ++p)
    if (R % 2 == 0 || 2 * p + (lane >> 4) < R) scratch[32 * p + fl.slot] = fl.factor(hdr[p]);
  __syncwarp();
}

__device__ __forceinline__ void read_factors(const float* scratch, int r, float (&d1)[8], float (&m1)[8]) {
  const float4* f = reinterpret_cast<const float4*>(scratch + 16 * r);
  const float4 a = f[0], b = f[1], c = f[2], d = f[3];
  d1[0] = a.x, d1[1] = a.y, d1[2] = a.z, d1[3] = a.w, d1[4] = b.x, d1[5] = b.y, d1[6] = b.z, d1[7] = b.w;
  m1[0] = c.x, m1[1] = c.y, m1[2] = c.z, m1[3] = c.w, m1[4] = d.x, m1[5] = d.y, m1[6] = d.z, m1[7] = d.w;
}

// ---------------------------------------------------------------- decoders
// Each decoder: kUnit elements per unit, kSteps = kUnit / 32 per lane.
// Lane<R> holds the lane's pointers into R rows (set once per row group,
// advanced one unit at a time: no 64-bit multiplies in the loop); Raw<R> one
// unit's undecoded bytes. load() fetches the unit the pointers are at,
// decode() writes w[r][s] = weight of element u*kUnit + 32s + lane.
// kGuard: units may run past the row's end (elements j >= K are skipped).
// kScratch: decode() shares per-block factors through the warp's scratch
// (K-quants, Q6_K) and load() takes the unit ahead as an immediate offset;
// kFactors: the K-quants' (d1, m1), which the wide, stream and shared-decode
// kernels below are written for.

// A lane's quants of one Q4_K/Q5_K block as two words: q of sub-block 2c is byte c
// of qe, of sub-block 2c+1 byte c of qo (qs: the lane's qs' word; qh: its qh' byte,
// Q5_K only). For Q5_K the multiply spreads qh' bit c to bit 8c+4 (no carries:
// see device_layout.h).
template <bool kHigh>
__device__ __forceinline__ void kquant_lane_quants(uint32_t qs, uint32_t qh, uint32_t& qe, uint32_t& qo) {
  if constexpr (kHigh) {
    qe = (qs & 0x0f0f0f0fu) | (((qh & 0xfu) * 0x02040810u) & 0x10101010u);
    qo = ((qs >> 4) & 0x0f0f0f0fu) | (((qh >> 4) * 0x02040810u) & 0x10101010u);
  } else {
    qe = qs & 0x0f0f0f0fu, qo = (qs >> 4) & 0x0f0f0f0fu;
  }
}

// Q5_K (kHigh) and Q4_K, repacked (device_layout.h): one 32-bit word of qs'
// per lane and block (byte c: sub-blocks 2c, 2c+1), plus its qh' byte for Q5_K.
template <bool kHigh>
struct DecodeKQuant {
  static constexpr bool kHighBits = kHigh;  // Q5_K's fifth bits (named for the wide kernel's dispatch)
  using Block = std::conditional_t<kHigh, BlockQ5_K, BlockQ4_K>;
  static constexpr int kUnit = kQK_K, kSteps = 8, kBlockBytes = (int)sizeof(Block),
                       kBlockStride = kTileRows * kBlockBytes;
  static constexpr int kQsOffset = kHigh ? kQ5KQuantsOffset : kQ4KQuantsOffset;
  static constexpr bool kGuard = false, kFactors = true, kScratch = true;
  template <int R>
  struct Lane {
    const uint8_t* qs[R];  // this lane's qs' word of the row's current block
    const uint8_t* qh[R];  // this lane's qh' byte (Q5_K)
    const uint8_t* hdr[(R + 1) / 2];  // header of the row whose factor this lane computes
    __device__ Lane(const MatvecArgs& a, int64_t row0, int lane) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        qs[r] = row_ptr<true, kBlockBytes>(a, row0 + r) + kQsOffset + 4 * lane;
        if constexpr (kHigh) qh[r] = row_ptr<true, kBlockBytes>(a, row0 + r) + kQ5KHighBitsOffset + lane;
      }
#pragma unroll
      for (int p = 0; p < (R + 1) / 2; ++p) hdr[p] = row_ptr<true, kBlockBytes>(a, row0 + min(2 * p + (lane >> 4), R - 1));
    }
    __device__ __forceinline__ void advance(int units) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        qs[r] += units * kBlockStride;
        if constexpr (kHigh) qh[r] += units * kBlockStride;
      }
#pragma unroll
      for (int p = 0; p < (R + 1) / 2; ++p) hdr[p] += units * kBlockStride;
    }
  };
  template <int R>
  struct Raw {
    uint4 hdr[(R + 1) / 2];
    uint32_t qs[R], qh[R];
  };
  template <int R, int kAhead>
  static __device__ __forceinline__ void load(Raw<R>& raw, const Lane<R>& p) {
#pragma unroll
    for (int q = 0; q < (R + 1) / 2; ++q) raw.hdr[q] = ld_weight_v4(p.hdr[q] + kAhead * kBlockStride);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      raw.qs[r] = ld_weight_u32(p.qs[r] + kAhead * kBlockStride);
      if constexpr (kHigh) raw.qh[r] = ld_weight_u8(p.qh[r] + kAhead * kBlockStride);
    }
  }
  template <int R>
  static __device__ __forceinline__ void decode(const Raw<R>& raw, const KFactorLane& fl, int lane, float* scratch,
                                                float (&w)[R][kSteps]) {
    store_factors<R>(raw.hdr, fl, lane, scratch);
#pragma unroll
    for (int r = 0; r < R; ++r) decode_row(raw.qs[r], kHigh ? raw.qh[r] : 0u, fl, scratch, r, w[r]);
  }
  // row r of the rows whose factors store_factors shared through scratch: its lane word
  // of qs' (and qh' byte)
  static __device__ __forceinline__ void decode_row(uint32_t qs, uint32_t qh, const KFactorLane& fl,
                                                    const float* scratch, int r, float (&w)[kSteps]) {
    float d1[8], m1[8];
    read_factors(scratch, r, d1, m1);
    uint32_t qe, qo;
    kquant_lane_quants<kHigh>(qs, qh, qe, qo);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      w[2 * c] = fmaf(d1[2 * c], byte_as_float(qe, c, fl.exponent), -m1[2 * c]);
      w[2 * c + 1] = fmaf(d1[2 * c + 1], byte_as_float(qo, c, fl.exponent), -m1[2 * c + 1]);
    }
  }
};
using DecodeQ5K = DecodeKQuant<true>;
using DecodeQ4K = DecodeKQuant<false>;

// Q6_K in row tiles of GGUF blocks (210 bytes: only 2-byte aligned, so byte
// loads): element 32s + lane of a block has its low bits in
// ql[32(2(s/4) + s%2) + lane] (nibble (s%4)/2), its high bits in
// qh[32(s/4) + lane] (pair s%4) and its scale in scales[2s + lane/16]
// (q6k_quant). Like the K-quants' (d1, m1), the block's 16 factors d * scale
// are computed once a warp -- lane v = lane%16 of row 2p + lane/16 computes
// scale v's -- and shared through the scratch, where a lane reads its 8 (the
// scales of its parity) with two broadcast 16-byte loads. A lane's 8 quants
// are assembled four at a time in the bytes of two words (q6k_lane_quants).
// Per weight that is a quarter of the loads and half the instructions of a
// lane decoding its own scales and quants byte by byte, which made the t = 1
// kernel issue-bound at ~3.5 x the read (docs/performance.md).
struct DecodeQ6K {
  static constexpr int kUnit = kQK_K, kSteps = 8, kBlockBytes = (int)sizeof(BlockQ6_K),
                       kBlockStride = kTileRows * kBlockBytes;
  static constexpr bool kGuard = false, kFactors = false, kScratch = true;
  template <int R>
  struct Lane {
    const uint8_t* row[R];             // ql[lane] of the row's current block
    const uint8_t* fac[(R + 1) / 2];   // scales[lane % 16] of row 2p + lane/16
    const uint8_t* fd[(R + 1) / 2];    // that row's d
    __device__ Lane(const MatvecArgs& a, int64_t row0, int lane) {
#pragma unroll
      for (int r = 0; r < R; ++r) row[r] = row_ptr<true, kBlockBytes>(a, row0 + r) + lane;
#pragma unroll
      for (int p = 0; p < (R + 1) / 2; ++p) {
        const uint8_t* b = row_ptr<true, kBlockBytes>(a, row0 + min(2 * p + (lane >> 4), R - 1));
        fac[p] = b + kQ6KScalesOffset + (lane & 15);
        fd[p] = b + kQ6KDOffset;
      }
    }
    __device__ __forceinline__ void advance(int units) {
#pragma unroll
      for (int r = 0; r < R; ++r) row[r] += units * kBlockStride;
#pragma unroll
      for (int p = 0; p < (R + 1) / 2; ++p) fac[p] += units * kBlockStride, fd[p] += units * kBlockStride;
    }
  };
  template <int R>
  struct Raw {
    uint32_t ql[R];  // byte i: ql[32i + lane]
    uint32_t qh[R];  // byte h: qh[32h + lane]
    uint32_t sc[(R + 1) / 2], d[(R + 1) / 2];  // this lane's scale byte and its row's d
  };
  template <int R, int kAhead>
  static __device__ __forceinline__ void load(Raw<R>& raw, const Lane<R>& p) {
    constexpr int o = kAhead * kBlockStride;
#pragma unroll
    for (int q = 0; q < (R + 1) / 2; ++q) {
      raw.sc[q] = ld_weight_u8(p.fac[q] + o);
      raw.d[q] = ld_weight_u16(p.fd[q] + o);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint8_t* b = p.row[r] + o;
      raw.ql[r] = pack_bytes4(ld_weight_u8(b), ld_weight_u8(b + 32), ld_weight_u8(b + 64), ld_weight_u8(b + 96));
      raw.qh[r] = __byte_perm(ld_weight_u8(b + kQ6KQhOffset), ld_weight_u8(b + kQ6KQhOffset + 32), 0x0040);
    }
  }
  template <int R>
  static __device__ __forceinline__ void decode(const Raw<R>& raw, const KFactorLane& fl, int lane, float* scratch,
                                                float (&w)[R][kSteps]) {
    // this lane's factor d * scale (dequant_block_q6_k's product: f16 times an
    // exact int8, one rounding), at [row][scale parity][scale / 2]
    const int slot = (lane >> 4) * 16 + 8 * (lane & 1) + ((lane & 15) >> 1);
#pragma unroll
    for (int p = 0; p < (R + 1) / 2; ++p)
      if (R % 2 == 0 || 2 * p + (lane >> 4) < R) {
        const float sc = byte_as_float(raw.sc[p] ^ 0x80u, 0, fl.exponent, 128.0f);  // the int8, exactly
        scratch[32 * p + slot] = half_bits_to_float(raw.d[p]) * sc;
      }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float4* f4 = reinterpret_cast<const float4*>(scratch + 16 * r + 8 * (lane >> 4));
      const float4 fa = f4[0], fb = f4[1];
      const float f[8] = {fa.x, fa.y, fa.z, fa.w, fb.x, fb.y, fb.z, fb.w};  // the scales of steps 0..7
      uint32_t qa, qb;
      q6k_lane_quants(raw.ql[r], raw.qh[r], qa, qb);
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint32_t word = (s & 2) ? qb : qa, byte = (uint32_t)((s & 1) | ((s >> 2) << 1));
        const float q = byte_as_float(word, byte, fl.exponent, 32.0f);  // q - 32, exactly
        w[r][s] = f[s] * q;  // as dequant_block_q6_k: (d * scale) * q, two roundings
      }
    }
  }
  // A lane's 6-bit quants (0..63, q6k_quant + 32) of one block, four to a word:
  // qa holds steps 0, 1, 4, 5 in bytes 0..3 and qb steps 2, 3, 6, 7. ql bytes
  // 0, 1 (2, 3) carry the low nibbles of half 0 (1): steps 4h + {0, 1} in their
  // low nibbles, 4h + {2, 3} in their high ones; qh byte h carries step 4h + c's
  // two high bits at bits 2c, 2c + 1, moved to bits 4, 5 of its quant's byte.
  static __device__ __forceinline__ void q6k_lane_quants(uint32_t lo, uint32_t qh, uint32_t& qa, uint32_t& qb) {
    const uint32_t hi = __byte_perm(qh, 0, 0x1100);  // bytes qh0, qh0, qh1, qh1
    qa = (lo & 0x0f0f0f0fu) | ((hi << 4) & 0x00300030u) | ((hi << 2) & 0x30003000u);
    qb = ((lo >> 4) & 0x0f0f0f0fu) | (hi & 0x00300030u) | ((hi >> 2) & 0x30003000u);
  }
};

// Q8_0: a unit is kBlocks blocks of 32; step s is block kBlocks*u + s, lane l
// its quant l. The R x kBlocks scales d of a unit are converted once a warp
// (lane kBlocks*r + s takes row r's block s) and shared through the scratch,
// where a lane reads a row's with broadcast 16-byte loads; a lane's quant
// bytes of a row are kBlocks/4 words. 8 blocks a unit keep twice the bytes
// of 4 in flight (a warp's 4 rows x 2 units x 1,088 B: what the Gemma-3
// head's short rows need; docs/performance.md). Units past a row's end (K
// is a multiple of 32 only) read the next row tile's bytes or the weight's
// padding (kWeightPadBytes: the unit ahead of a last partial one ends at
// most 2 kBlocks - 1 blocks of 16 rows past the row tile), never used: kGuard
// skips their products.
template <int kBlocks>
struct DecodeQ80Units {
  static_assert(kBlocks % 4 == 0, "whole words of quant bytes");
  static constexpr int kUnit = kBlocks * kQK8_0, kSteps = kBlocks, kBlockBytes = (int)sizeof(BlockQ8_0),
                       kBlockStride = kTileRows * kBlockBytes, kWords = kBlocks / 4;
  static_assert((2 * kBlocks - 1) * kBlockStride <= (int)kWeightPadBytes, "the padding covers the unit ahead");
  static constexpr bool kGuard = true, kFactors = false, kScratch = true;
  template <int R>
  struct Lane {
    const uint8_t* qs[R];  // qs[lane] of the row's current unit's first block
    const uint8_t* d;      // d of block lane % kBlocks of row lane / kBlocks (lanes past: of row R-1)
    __device__ Lane(const MatvecArgs& a, int64_t row0, int lane) {
#pragma unroll
      for (int r = 0; r < R; ++r) qs[r] = row_ptr<true, kBlockBytes>(a, row0 + r) + kQ8_0QsOffset + lane;
      d = row_ptr<true, kBlockBytes>(a, row0 + min(lane / kBlocks, R - 1)) + (lane % kBlocks) * kBlockStride;
    }
    __device__ __forceinline__ void advance(int units) {
#pragma unroll
      for (int r = 0; r < R; ++r) qs[r] += units * kBlocks * kBlockStride;
      d += units * kBlocks * kBlockStride;
    }
  };
  template <int R>
  struct Raw {
    uint32_t qs[R][kWords];  // byte c of word i: block 4i + c's quant of this lane
    uint32_t d;              // this lane's scale (f16 bits)
  };
  template <int R, int kAhead>
  static __device__ __forceinline__ void load(Raw<R>& raw, const Lane<R>& p) {
    constexpr int o = kAhead * kBlocks * kBlockStride;
    raw.d = ld_weight_u16(p.d + o);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        const uint8_t* b = p.qs[r] + o + 4 * i * kBlockStride;
        raw.qs[r][i] = pack_bytes4(ld_weight_u8(b), ld_weight_u8(b + kBlockStride), ld_weight_u8(b + 2 * kBlockStride),
                                   ld_weight_u8(b + 3 * kBlockStride));
      }
  }
  template <int R>
  static __device__ __forceinline__ void decode(const Raw<R>& raw, const KFactorLane& fl, int lane, float* scratch,
                                                float (&w)[R][kSteps]) {
    static_assert(kBlocks * R <= 32, "a lane per scale");
    if (lane < kBlocks * R) scratch[lane] = half_bits_to_float(raw.d);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int i = 0; i < kWords; ++i) {
        const float4 d = reinterpret_cast<const float4*>(scratch + kBlocks * r)[i];
        const float ds[4] = {d.x, d.y, d.z, d.w};
        const uint32_t q = raw.qs[r][i] ^ 0x80808080u;  // int8 + 128 in each byte
#pragma unroll
        for (int c = 0; c < 4; ++c)  // as dequant_block_q8_0: (float)q * d, the int8 q exactly
          w[r][4 * i + c] = byte_as_float(q, c, fl.exponent, 128.0f) * ds[c];
      }
  }
};
using DecodeQ80 = DecodeQ80Units<8>;

// F16, BF16, F32: 256 elements per unit, exact widening; any K.
template <uint32_t kType>
struct DecodeFloat {
  static constexpr int kUnit = 256, kSteps = 8;
  static constexpr int kElemBytes = kType == (uint32_t)GgmlType::F32 ? 4 : 2;
  static constexpr bool kGuard = true, kFactors = false, kScratch = false;
  template <int R>
  struct Lane {
    const uint8_t* row[R];  // element 32s + lane of the current unit is at row + (32s + lane) * bytes
    int64_t left;           // elements of the row from the current unit on
    __device__ Lane(const MatvecArgs& a, int64_t row0, int lane) : left(a.cols - lane) {
#pragma unroll
      for (int r = 0; r < R; ++r) row[r] = row_ptr<false, 0>(a, row0 + r) + lane * kElemBytes;
    }
    __device__ __forceinline__ void advance(int units) {
#pragma unroll
      for (int r = 0; r < R; ++r) row[r] += units * kUnit * kElemBytes;
      left -= units * kUnit;
    }
  };
  template <int R>
  struct Raw {
    uint32_t v[R][8];
  };
  template <int R>
  static __device__ __forceinline__ void load(Raw<R>& raw, const Lane<R>& p, int) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint8_t* q = p.row[r] + (32 * s < p.left ? 32 * s : 0) * kElemBytes;  // past the end: re-read
        raw.v[r][s] = kElemBytes == 4 ? ld_weight_u32(q) : ld_weight_u16(q);
      }
  }
  template <int R>
  static __device__ __forceinline__ void decode(const Raw<R>& raw, float (&w)[R][kSteps]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int s = 0; s < 8; ++s) {
        const uint32_t v = raw.v[r][s];
        w[r][s] = kType == (uint32_t)GgmlType::F32    ? __uint_as_float(v)
                  : kType == (uint32_t)GgmlType::BF16 ? __uint_as_float(v << 16)
                                                      : half_bits_to_float(v);
      }
  }
};

// Uniform calls for the two decoder shapes (with or without shared factors).
// Loads the unit kAhead units past the lane pointers (an immediate offset).
template <class Dec, int R, int kAhead>
__device__ __forceinline__ void load_unit(typename Dec::template Raw<R>& raw,
                                          const typename Dec::template Lane<R>& p, int lane) {
  if constexpr (Dec::kScratch) {
    Dec::template load<R, kAhead>(raw, p);
  } else {
    typename Dec::template Lane<R> q = p;
    if (kAhead) q.advance(kAhead);
    Dec::template load<R>(raw, q, lane);
  }
}

template <class Dec, int R>
__device__ __forceinline__ void decode_unit(const typename Dec::template Raw<R>& raw, const KFactorLane& fl,
                                            int lane, float* scratch, float (&w)[R][Dec::kSteps]) {
  if constexpr (Dec::kScratch) Dec::template decode<R>(raw, fl, lane, scratch, w);
  else Dec::template decode<R>(raw, w);
}

// ---------------------------------------------------------------- the kernel

// Rows per warp for a token tile: more rows share each x read (what bounds
// t > 1), fewer keep the accumulators in registers and more warps resident.
template <int TT>
struct RowsPerWarp {
  static constexpr int value = TT <= 2 ? 2 : TT <= 8 ? 4 : TT <= 16 ? 2 : 1;
};
// The CTA per token tile (CanonShape below picks the quantized types' own). min_ctas:
// CTAs per SM the register allocation must allow (24 warps per SM keep enough
// bytes in flight at t = 1 for the decoders without shared factors; a tighter
// cap made the compiler recompute lane constants in the loop).
// x_budget: staged x per CTA before columns are chunked. A chunked x is
// restaged for every row group (all of x per 8 warps' rows: at t = 8 that
// moved more bytes through shared memory than the weight through DRAM and
// cost 12 x the read limit), so the budget holds the seed's x whole up to
// t = 8: 2 tokens with 3 CTAs per SM, 4 with 2, 8 with one CTA of 16 warps
// (6,656 columns: 54, 109 and 217 KB of the 228 KB an SM has).
template <int TT>
struct MatvecCta {
  static constexpr int warps = TT >= 8 ? 16 : 8;
  static constexpr int min_ctas = TT <= 2 ? 3 : TT <= 4 ? 2 : 1;
  static constexpr size_t x_budget = TT <= 1 ? 48 * 1024 : TT <= 2 ? 64 * 1024 : TT <= 4 ? 110 * 1024 : 216 * 1024;
};

// The kernel's shape for decoder Dec and token tile TT: rows a warp, warps a
// CTA, CTAs a SM (the register cap) and the staged x's budget. The K-quants
// (shared factors) run t <= 8 as the t = 8 tile does, 4 rows a warp in one
// CTA of 16 warps a SM: at t = 1 the tile's own shape (2 rows, 3 CTAs of 8
// warps) took 558 against 495 us, 695 against 605 at t = 2, 796 against 764
// at t = 4 (H100, seed head; bench/experiments/cuda_canon_wide.cu's `small`
// mode, bit-equal: the shape moves no sum). Q8_0 does too: on the Gemma-3
// head (262,144 x 640) t = 1 took 193.1 against 227.3 us (H200, `small_q80`
// mode; docs/performance.md; 137.3 against 147.7 on an H100 with the shared
// scales), and Q6_K: 1,180 against 1,366 us at t = 1 of a seed-shaped Q6_K
// head (H100, `small_q6k` mode; 636 against 677 with the shared factors).
// The float types keep the tile's. Q8_0 at t <= 2 loads the next row group's
// first unit during a group's last (kCrossGroup): Gemma-3's rows are 3 units,
// and each group's start waited a DRAM latency. Its route took 126 against 140
// us at t = 1, 160 against 173 at t = 2 (H100, the same binary, two runs); at
// t = 8 the harness had it slower (397 against 331 us), at t = 4 level.
template <class Dec, int TT>
struct CanonShape {
  static constexpr bool kQuantized = Dec::kScratch;
  static constexpr int tile = kQuantized && TT <= 8 ? 8 : TT;
  static constexpr int rows = RowsPerWarp<tile>::value, warps = MatvecCta<tile>::warps,
                       min_ctas = MatvecCta<tile>::min_ctas;
  static constexpr size_t x_budget = MatvecCta<tile>::x_budget;
  static constexpr bool cross_group = std::is_same_v<Dec, DecodeQ80> && TT <= 2;
};

// Copies columns [col0, col0 + chunk_cols) of the t tokens' x into xs,
// transposed per lane; columns past K become 0 (their products are skipped).
__device__ __forceinline__ void stage_x(float* xs, const MatvecArgs& a, int64_t col0, int chunk_cols,
                                        int lane_stride) {
  const int n = a.t * chunk_cols;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int k = i / chunk_cols, c = i - k * chunk_cols;
    const int64_t col = col0 + c;
    xs[(k * 32 + (c & 31)) * lane_stride + (c >> 5)] = col < a.cols ? a.x[k * a.ldx + col] : 0.0f;
  }
}

// One unit of R rows: decode, then acc[r][k] = fmaf(w[r][s], x[k][j], acc[r][k])
// for s = 0..S-1 (j = 32s + lane, increasing), every token k < t.
template <class Dec, int TT, int R>
__device__ __forceinline__ void compute_unit(const typename Dec::template Raw<R>& raw, const KFactorLane& fl,
                                             int lane, float* scratch, const float* xs_lane, int lane_stride,
                                             int unit_in_chunk, int64_t j0, const MatvecArgs& a,
                                             float (&acc)[R][TT]) {
  constexpr int S = Dec::kSteps;
  float w[R][S];
  decode_unit<Dec, R>(raw, fl, lane, scratch, w);
#pragma unroll
  for (int k = 0; k < TT; ++k) {
    if (TT == 1 || k < a.t) {
      const float4* xp = reinterpret_cast<const float4*>(xs_lane + k * 32 * lane_stride + unit_in_chunk * S);
      float xv[S];
#pragma unroll
      for (int q = 0; q < S / 4; ++q) {
        const float4 v = xp[q];
        xv[4 * q] = v.x, xv[4 * q + 1] = v.y, xv[4 * q + 2] = v.z, xv[4 * q + 3] = v.w;
      }
#pragma unroll
      for (int s = 0; s < S; ++s) {
        if (Dec::kGuard && j0 + 32 * s >= a.cols) continue;
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][k] = fmaf(w[r][s], xv[s], acc[r][k]);
      }
    }
  }
}

// One row group of a warp: R rows from row0, every unit, then the sums'
// tree and stores. `first` holds unit 0 on entry. Two register buffers
// alternate (first: even units, second: odd), so the next unit's bytes are
// in flight while the current one is computed, with no copies between them.
// The unit after a row's last is the next group's unit 0 when next_row0 >= 0
// (kCrossGroup: short rows, a few units a group, would otherwise wait for a
// whole DRAM latency at each group's start), else one unit past the row,
// never used (the next row tile or the weight's padding, kWeightPadBytes).
// Returns whether the next group's unit 0 went to `second` (kCrossGroup and an
// odd count of units), so the caller swaps the buffers' roles.
template <class Dec, int TT, int R, bool kCrossGroup>
__device__ __forceinline__ bool canon_group(typename Dec::template Raw<R>& first, typename Dec::template Raw<R>& second,
                                            typename Dec::template Lane<R>& ptr, int64_t row0, int64_t next_row0,
                                            const MatvecArgs& a, const KFactorLane& fl, int lane, float* xs,
                                            float* scratch, int scratch_half, int lane_stride, int chunk_cols,
                                            int units, int units_per_chunk, bool one_chunk) {
  using Lane = typename Dec::template Lane<R>;
  const float* xs_lane = xs + lane * lane_stride;
  float acc[R][TT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < TT; ++k) acc[r][k] = 0.0f;
  int unit_in_chunk = 0;
  for (int u = 0; u < units; ++u) {
    if (!one_chunk && unit_in_chunk == 0) {
      __syncthreads();  // every warp is done with the previous chunk
      stage_x(xs, a, (int64_t)u * Dec::kUnit, chunk_cols, lane_stride);
      __syncthreads();
    }
    const int64_t j0 = (int64_t)u * Dec::kUnit + lane;
    float* sc = scratch + (u & 1) * scratch_half;
    const bool last = kCrossGroup && u + 1 == units;
    // the pointers move two units at a time; the unit ahead is an immediate offset
    if ((u & 1) == 0) {
      if (last) {
        if (next_row0 >= 0) {
          ptr = Lane(a, next_row0, lane);
          load_unit<Dec, R, 0>(second, ptr, lane);
        }
      } else {
        load_unit<Dec, R, 1>(second, ptr, lane);
      }
      compute_unit<Dec, TT, R>(first, fl, lane, sc, xs_lane, lane_stride, unit_in_chunk, j0, a, acc);
    } else {
      if (last) {
        if (next_row0 >= 0) {
          ptr = Lane(a, next_row0, lane);
          load_unit<Dec, R, 0>(first, ptr, lane);
        }
      } else {
        ptr.advance(2);
        load_unit<Dec, R, 0>(first, ptr, lane);
      }
      compute_unit<Dec, TT, R>(second, fl, lane, sc, xs_lane, lane_stride, unit_in_chunk, j0, a, acc);
    }
    if (++unit_in_chunk == units_per_chunk) unit_in_chunk = 0;
  }

  // canon_tree32: lane l += lane l + off, off = 16 .. 1; lane 0 holds the dot product
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < TT; ++k) {
      if (TT == 1 || k < a.t) {
        const float v = canon_tree32_warp(acc[r][k]);
        if (lane == 0 && row0 + r < a.rows) a.y[k * a.ldy + row0 + r] = v;
      }
    }
  return kCrossGroup && (units & 1) != 0;
}

template <class Dec, int TT, int R = CanonShape<Dec, TT>::rows, int kWarps = CanonShape<Dec, TT>::warps,
          int kMinCtas = CanonShape<Dec, TT>::min_ctas, bool kCrossGroup = CanonShape<Dec, TT>::cross_group>
__global__ void __launch_bounds__(32 * kWarps, kMinCtas) matvec_canon_kernel(MatvecArgs a, int chunk_cols) {
  using Raw = typename Dec::template Raw<R>;
  using Lane = typename Dec::template Lane<R>;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);  // [t][32][lane_stride]
  const int lane_stride = chunk_cols / 32 + kLanePad;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* scratch = xs + a.t * 32 * lane_stride + warp * 2 * 32 * ((R + 1) / 2);  // 2 buffers of the row pairs' factors
  const int scratch_half = 32 * ((R + 1) / 2);
  const KFactorLane fl(lane, a.exponent_bits);

  const int units = (int)((a.cols + Dec::kUnit - 1) / Dec::kUnit);
  const int units_per_chunk = chunk_cols / Dec::kUnit;
  const bool one_chunk = units_per_chunk >= units;
  const int64_t groups = (a.rows + kWarps * R - 1) / (kWarps * R);

  pdl_launch_dependents();
  pdl_wait();  // x is the previous node's output
  if (one_chunk) {
    stage_x(xs, a, 0, chunk_cols, lane_stride);
    __syncthreads();
  }
  int64_t g = blockIdx.x;
  if (g >= groups) return;
  Lane ptr(a, (g * kWarps + warp) * R, lane);
  Raw even, odd;
  load_unit<Dec, R, 0>(even, ptr, lane);
  bool swapped = false;  // the group's unit 0 is in odd
  for (; g < groups; g += gridDim.x) {
    const int64_t row0 = (g * kWarps + warp) * R;
    if (!kCrossGroup && g != blockIdx.x) {
      ptr = Lane(a, row0, lane);
      load_unit<Dec, R, 0>(even, ptr, lane);
    }
    const int64_t next_row0 = g + gridDim.x < groups ? ((g + gridDim.x) * kWarps + warp) * R : -1;
    if (!swapped)
      swapped = canon_group<Dec, TT, R, kCrossGroup>(even, odd, ptr, row0, next_row0, a, fl, lane, xs, scratch,
                                                     scratch_half, lane_stride, chunk_cols, units, units_per_chunk,
                                                     one_chunk);
    else
      swapped = !canon_group<Dec, TT, R, kCrossGroup>(odd, even, ptr, row0, next_row0, a, fl, lane, xs, scratch,
                                                      scratch_half, lane_stride, chunk_cols, units, units_per_chunk,
                                                      one_chunk);
  }
}

// ---------------------------------------------------------------- the wide kernel (K-quants, t = 6 .. 8)
//
// The same sums as matvec_canon_kernel, mapped for t = 8. With 4 rows per warp
// each 4-byte x value a lane reads from shared memory served 4 FMAs: one
// wavefront per 4 FMA instructions, as many as the SM's four schedulers issue
// in a cycle, so the t = 8 kernel was bound by shared memory (3.5 x the FMA
// bound). Here a warp carries 8 rows (x read once per 8 FMAs), all 8 token
// slots (x of tokens >= t staged as zeros, their sums never stored), and walks
// a block two steps at a time: one 8-byte x read per token, one broadcast
// 16-byte read of the row's (d1, m1) pair per row, then 2 x 8 FMAs per row --
// the weight decoded just in time, so no decoded unit is held in registers
// (64 accumulators + one unit's raw bytes in flight fit 12 warps per SM).
// Rows of a warp lie in one row tile (8 | 16), so one pointer and immediate
// offsets reach all of them. Factors per row are stored pair-major:
// [d1(2p), d1(2p+1), m1(2p), m1(2p+1)] for p = 0..3.
constexpr int kWideRows = 8;     // rows per warp
constexpr int kWideTokens = 8;   // token slots per launch
constexpr int kWideMinTokens = 6;  // it computes all 8 slots: at t = 5 the 4-row kernel was faster (939 vs 970 us)
constexpr int kWideWarps = 12;   // 64 accumulators + the unit in flight: <= 168 registers
constexpr int kWideLanePad = 2;  // lane rows of 2 (mod 8) floats: 8-byte reads of 16 lanes hit distinct banks

// Shared-memory floats of the wide kernel: x of kWideTokens tokens, then two factor buffers per warp.
__host__ __device__ constexpr int wide_lane_stride(int64_t cols) { return (int)((cols + 255) / 256 * 8) + kWideLanePad; }
__host__ __device__ constexpr size_t wide_smem_floats(int64_t cols, int warps) {
  return (size_t)kWideTokens * 32 * wide_lane_stride(cols) + (size_t)warps * 2 * kWideRows * 16;
}

// A warp's 8 rows (one row tile's half or whole) of the wide and stream kernels:
// their pointers, one unit's raw bytes in flight, and the unit's decode and FMAs
// over TT token slots. Words are shared by shuffles, so a unit in flight is 9
// registers a lane (Q4_K: a header word and 8 quant words) or 11 (Q5_K: 2 qh words).
template <bool kHigh>
struct WideRows {
  using Dec = DecodeKQuant<kHigh>;
  static constexpr int R = kWideRows, B = Dec::kBlockBytes, kStride = Dec::kBlockStride;
  struct Raw {
    uint32_t hdr;    // the 8 rows' 16-byte headers, one word per lane
    uint32_t qh[2];  // the 8 rows' 32-byte qh', one word per lane and half
    uint32_t qs[R];
  };
  const uint8_t *phdr, *pqs, *pqh;
  float* factors;  // the warp's two buffers of R x 16 factors, pair-major
  KFactorLane fl;
  int lane, fslot;  // fslot: where this lane's factor of row 2p + lane/16 goes in a buffer
  uint32_t qh_sel;  // __byte_perm: byte lane%4, zeros above

  __device__ WideRows(const uint8_t* base, float* factors_, int lane_, uint32_t exponent_bits)
      : phdr(base + (lane_ >> 2) * B + 4 * (lane_ & 3)),  // word lane%4 of row lane/4's header
        pqs(base + Dec::kQsOffset + 4 * lane_),
        pqh(base + (lane_ >> 3) * B + kQ5KHighBitsOffset + 4 * (lane_ & 7)),  // rows lane/8 and 4 + lane/8
        factors(factors_), fl(lane_, exponent_bits), lane(lane_) {
    const int fv = lane & 15, fj = fv & 7;
    fslot = (lane >> 4) * 16 + 4 * (fj >> 1) + (fv >= 8 ? 2 : 0) + (fj & 1);
    qh_sel = 0x4440u | (uint32_t)(lane & 3);
  }
  __device__ __forceinline__ void load(Raw& raw, int ahead) const {
    raw.hdr = ld_weight_u32(phdr + ahead * kStride);
#pragma unroll
    for (int r = 0; r < R; ++r) raw.qs[r] = ld_weight_u32(pqs + r * B + ahead * kStride);
    if constexpr (kHigh)
#pragma unroll
      for (int h = 0; h < 2; ++h) raw.qh[h] = ld_weight_u32(pqh + 4 * h * B + ahead * kStride);
  }
  __device__ __forceinline__ void advance_two() { phdr += 2 * kStride, pqs += 2 * kStride, pqh += 2 * kStride; }

  // Unit u's FMAs: xpair(k, c) is token k's x of this lane's steps 2c and 2c + 1
  // (columns 64c + lane and 64c + 32 + lane of the unit).
  template <int TT, class XPair>
  __device__ __forceinline__ void fmas(const Raw& raw, int u, XPair xpair, float (&acc)[R][TT]) const {
    float* buf = factors + (u & 1) * R * 16;
#pragma unroll
    for (int p = 0; p < R / 2; ++p) {  // this lane's factor of row 2p + lane/16: words 0, 1 or 2 (a min), 3
      const int src = 4 * (2 * p + (lane >> 4));
      const uint32_t d = __shfl_sync(0xffffffffu, raw.hdr, src);
      const uint32_t sc = __shfl_sync(0xffffffffu, raw.hdr, src + (fl.is_min ? 2 : 1));
      const uint32_t hi = __shfl_sync(0xffffffffu, raw.hdr, src + 3);
      buf[32 * p + fslot] = fl.factor(make_uint4(d, sc, sc, hi));
    }
    __syncwarp();
    uint32_t qe[R], qo[R];  // as DecodeKQuant::decode
#pragma unroll
    for (int r = 0; r < R; ++r) {
      uint32_t qh = 0;
      if constexpr (kHigh) {
        // this lane's qh' byte of row r: byte lane%4 of word (r%4)*8 + lane/4 of half r/4
        const uint32_t word = __shfl_sync(0xffffffffu, raw.qh[r / 4], (r % 4) * 8 + (lane >> 2));
        qh = __byte_perm(word, 0u, qh_sel);
      }
      kquant_lane_quants<kHigh>(raw.qs[r], qh, qe[r], qo[r]);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {  // steps 2c (sub-block 2c, byte c of qe) and 2c + 1 (byte c of qo)
      float2 xv[TT];
#pragma unroll
      for (int k = 0; k < TT; ++k) xv[k] = xpair(k, c);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 f = reinterpret_cast<const float4*>(buf + 16 * r)[c];
        const float w0 = fmaf(f.x, byte_as_float(qe[r], c, fl.exponent), -f.z);
        const float w1 = fmaf(f.y, byte_as_float(qo[r], c, fl.exponent), -f.w);
#pragma unroll
        for (int k = 0; k < TT; ++k) acc[r][k] = fmaf(w0, xv[k].x, acc[r][k]);
#pragma unroll
        for (int k = 0; k < TT; ++k) acc[r][k] = fmaf(w1, xv[k].y, acc[r][k]);
      }
    }
  }
};

// canon_tree32 of a warp's R x TT sums, as matvec_canon_kernel; slots k >= t are not stored
template <int R, int TT>
__device__ __forceinline__ void store_wide_sums(const MatvecArgs& a, int64_t row0, int lane, float (&acc)[R][TT]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < TT; ++k) {
      const float v = canon_tree32_warp(acc[r][k]);
      if (lane == 0 && k < a.t && row0 + r < a.rows) a.y[k * a.ldy + row0 + r] = v;
    }
}

template <bool kHigh, int kWarps>
__global__ void __launch_bounds__(32 * kWarps, 1) matvec_canon_wide_kernel(MatvecArgs a) {
  using Rows = WideRows<kHigh>;
  constexpr int R = kWideRows, TT = kWideTokens, B = Rows::B;
  extern __shared__ float4 smem_f4[];
  float* xs = reinterpret_cast<float*>(smem_f4);  // [TT][32][lane_stride]
  const int lane_stride = wide_lane_stride(a.cols);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* factors = xs + TT * 32 * lane_stride + warp * 2 * R * 16;

  const int units = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + kWarps * R - 1) / (kWarps * R);
  const int64_t last_group_row = (a.rows - 1) / R * R;  // warps past the end re-read the last rows

  pdl_launch_dependents();
  pdl_wait();  // x is the previous node's output
  {
    const int64_t kpad = (int64_t)(lane_stride - kWideLanePad) * 32;
    for (int k = 0; k < TT; ++k) {
      const float* xk = a.x + (int64_t)min(k, a.t - 1) * a.ldx;
      float* dst = xs + k * 32 * lane_stride;
#pragma unroll 4
      for (int c = threadIdx.x; c < kpad; c += blockDim.x)
        dst[(c & 31) * lane_stride + (c >> 5)] = k < a.t && c < a.cols ? xk[c] : 0.0f;
    }
  }
  __syncthreads();

  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row0 = (g * kWarps + warp) * R;
    Rows rows(a.w + tiled_row_offset(min(row0, last_group_row), a.row_bytes, B), factors, lane, a.exponent_bits);
    float acc[R][TT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int k = 0; k < TT; ++k) acc[r][k] = 0.0f;
    const float* xl = xs + lane * lane_stride;
    auto fmas = [&](const typename Rows::Raw& raw, int u) {
      const float* xu = xl + u * 8;
      rows.template fmas<TT>(
          raw, u, [&](int k, int c) { return *reinterpret_cast<const float2*>(xu + k * 32 * lane_stride + 2 * c); }, acc);
    };
    // two register buffers, alternating: the next unit's bytes are in flight
    // while the current one is computed; two units per iteration, so only one
    // buffer is live across the back edge. The last unit prefetches one unit
    // past the row: the next tile or the weight's padding (kWeightPadBytes).
    typename Rows::Raw even, odd;
    rows.load(even, 0);
    for (int u = 0;; u += 2) {
      rows.load(odd, 1);
      fmas(even, u);
      if (u + 1 >= units) break;
      rows.advance_two();
      rows.load(even, 0);
      fmas(odd, u + 1);
      if (u + 2 >= units) break;
    }
    store_wide_sums(a, row0, lane, acc);
  }
}

// ---------------------------------------------------------------- the stream kernel (K-quants, tiles of 9 .. 16)
//
// The wide kernel's rows and sums over 16 token slots, so each weight element is
// decoded once per 16 tokens instead of 8. x of 16 tokens does not fit shared memory
// whole (6,656 columns: 426 KB), so it streams unit by unit through two buffers
// (16-byte cp.async, the columns in order), one CTA barrier a unit; 128 accumulators
// leave 8 warps a CTA. On the seed head (H100) a launch of 16 took 1,732 us where two
// wide launches of 8 take 1,905; at 8 slots (12 warps) it lost to the wide kernel
// (1,069 against 951), hence 9 .. 16 only. The order of every fmaf is the canonical one.
constexpr int kStreamTokens = 16;
constexpr int kStreamWarps = 8;
__host__ __device__ constexpr size_t stream_smem_bytes() {
  return sizeof(float) * ((size_t)2 * kStreamTokens * kQK_K + (size_t)kStreamWarps * 2 * kWideRows * 16);
}

// Unit u's x of kTokens token slots into buf ([kTokens][256], the columns in order)
// by 16-byte cp.async, the CTA's kThreads threads sharing the copies (64 a token);
// slots k >= a.t are zero-filled. One commit group. The stream and shared-decode
// kernels stage x this way; kUnroll is each one's unroll of the copy loop, 0 for
// whole (the shared-decode kernel spills at 128 registers with it unrolled whole).
template <int kTokens, int kThreads, int kUnroll>
__device__ __forceinline__ void stage_x_unit(float* buf, const MatvecArgs& a, int u) {
  constexpr int kChunks = kQK_K / 4, kPass = kThreads / kChunks;
  static_assert(kThreads % kChunks == 0 && kTokens % kPass == 0, "whole tokens per pass");
  const int c4 = 4 * (threadIdx.x % kChunks), k0 = threadIdx.x / kChunks;
  float* dst = buf + c4;
  const float* src = a.x + (int64_t)u * kQK_K + c4;
  auto copy = [&](int k) {
    const bool valid = k < a.t;
    cp_async16(dst + k * kQK_K, valid ? src + (int64_t)k * a.ldx : a.x, valid);
  };
  if constexpr (kUnroll == 0) {
#pragma unroll
    for (int k = k0; k < kTokens; k += kPass) copy(k);
  } else {
#pragma unroll kUnroll
    for (int k = k0; k < kTokens; k += kPass) copy(k);
  }
  cp_async_commit();
}

template <bool kHigh>
__global__ void __launch_bounds__(32 * kStreamWarps, 1) matvec_canon_stream_kernel(MatvecArgs a) {
  using Rows = WideRows<kHigh>;
  constexpr int R = kWideRows, TT = kStreamTokens, B = Rows::B;
  extern __shared__ float4 smem_f4[];
  float* const xs = reinterpret_cast<float*>(smem_f4);  // [2][TT][256]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* const factors = xs + 2 * TT * kQK_K + warp * 2 * R * 16;
  const int units = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + kStreamWarps * R - 1) / (kStreamWarps * R);
  const int64_t last_group_row = (a.rows - 1) / R * R;  // warps past the end re-read the last rows

  pdl_launch_dependents();
  pdl_wait();  // x is the previous node's output
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row0 = (g * kStreamWarps + warp) * R;
    Rows rows(a.w + tiled_row_offset(min(row0, last_group_row), a.row_bytes, B), factors, lane, a.exponent_bits);
    auto stage_x = [&](int u, int buf) { stage_x_unit<TT, 32 * kStreamWarps, 0>(xs + buf * TT * kQK_K, a, u); };
    float acc[R][TT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int k = 0; k < TT; ++k) acc[r][k] = 0.0f;
    auto fmas = [&](const typename Rows::Raw& raw, int u) {
      const float* xl = xs + (u & 1) * TT * kQK_K + lane;
      rows.template fmas<TT>(
          raw, u, [&](int k, int c) { return make_float2(xl[k * kQK_K + 64 * c], xl[k * kQK_K + 64 * c + 32]); },
          acc);
    };
    // the weight as in the wide kernel (a unit ahead in registers); x a unit ahead
    // in the other buffer, which the barrier after each unit frees
    typename Rows::Raw even, odd;
    rows.load(even, 0);
    stage_x(0, 0);
    cp_async_wait<0>();
    __syncthreads();
    for (int u = 0;; u += 2) {
      rows.load(odd, 1);
      if (u + 1 < units) stage_x(u + 1, 1);
      fmas(even, u);
      cp_async_wait<0>();
      __syncthreads();
      if (u + 1 >= units) break;
      rows.advance_two();
      rows.load(even, 0);
      if (u + 2 < units) stage_x(u + 2, 0);
      fmas(odd, u + 1);
      cp_async_wait<0>();
      __syncthreads();
      if (u + 2 >= units) break;
    }
    store_wide_sums(a, row0, lane, acc);
  }
}

// ---------------------------------------------------------------- the shared-decode kernel (K-quants, tiles of 25 .. 32)
//
// The same sums once more, for token tiles larger than 8. The wide kernel decodes
// every weight element once per 8 tokens, and that decode (the exact 2^23 + q - 2^23,
// d1*q - m1 and the bit work) is ~0.6 issue slots per FMA. Here a CTA of 16 warps owns
// RC rows and TC tokens (TG token groups of 8, RG = 16 / TG row groups of 8); per unit
// (256 columns) each warp decodes RC / 16 of the rows into shared memory, the unit's x
// of the TC tokens arrives by cp.async, and every warp runs its 8 rows x 8 tokens from
// shared memory -- so each element is decoded once per TC tokens. Both are double-
// buffered: one CTA barrier per unit, the next unit's bytes loaded during this one.
// A lane's slice of a row (or of x) is stored [q][lane][2] (the floats of steps 2q,
// 2q + 1 side by side), so one 8-byte read serves two steps and 16 lanes fill the 32
// banks. The order of every fmaf is the canonical one: steps in increasing order,
// units in increasing order, then canon_tree32.
constexpr int kSharedWarps = 16;
constexpr int kSharedTokenGroups = 4;  // 32 rows x 32 tokens a CTA (two groups, 64 x 16, need registers 16 warps lack)
// A tile of fewer tokens computes 32 slots all the same (3,330 us on the seed head, H100), where
// wide launches of 8 cost ~960 us each: up to 24 tokens three or fewer of those cost less.
constexpr int kSharedMinTokens = 25;
template <int TG>
struct SharedTile {
  static constexpr int rows = 8 * (kSharedWarps / TG), tokens = 8 * TG, decode_rows = rows / kSharedWarps;
  static constexpr int factor_floats = 32 * ((decode_rows + 1) / 2);  // a warp's scratch for store_factors
  static constexpr size_t smem_bytes =
      sizeof(float) * ((size_t)2 * (rows + tokens) * kQK_K + (size_t)kSharedWarps * factor_floats);
};

template <bool kHigh, int TG>
__global__ void __launch_bounds__(32 * kSharedWarps, 1) matvec_canon_shared_kernel(MatvecArgs a) {
  using Dec = DecodeKQuant<kHigh>;
  using Tile = SharedTile<TG>;
  constexpr int RC = Tile::rows, TC = Tile::tokens, RD = Tile::decode_rows, B = Dec::kBlockBytes;
  constexpr int kThreads = 32 * kSharedWarps;
  static_assert(RD % 2 == 0 && kTileRows % RD == 0, "a warp decodes row pairs of one row tile");
  extern __shared__ float4 smem_f4[];
  float* const ws = reinterpret_cast<float*>(smem_f4);  // [2][RC][4][32][2]
  float* const xs = ws + 2 * RC * kQK_K;                 // [2][TC][256], the columns in order
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* const scratch = xs + 2 * TC * kQK_K + warp * Tile::factor_floats;
  const int rg = warp / TG, tg = warp % TG;
  const KFactorLane fl(lane, a.exponent_bits);
  const int units = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + RC - 1) / RC;
  const int64_t last_decode_row = (a.rows - 1) / RD * RD;  // decoders past the end re-read the last rows

  pdl_launch_dependents();
  pdl_wait();  // x is the previous node's output
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row0 = g * RC;
    const uint8_t* const base =
        a.w + tiled_row_offset(min(row0 + warp * RD, last_decode_row), a.row_bytes, B);
    const uint8_t* phdr = base + (lane >> 4) * B;
    const uint8_t* pqs = base + Dec::kQsOffset + 4 * lane;
    const uint8_t* pqh = base + kQ5KHighBitsOffset + lane;
    typename Dec::template Raw<RD> raw;
    auto load = [&]() {
#pragma unroll
      for (int p = 0; p < RD / 2; ++p) raw.hdr[p] = ld_weight_v4(phdr + 2 * p * B);
#pragma unroll
      for (int r = 0; r < RD; ++r) {
        raw.qs[r] = ld_weight_u32(pqs + r * B);
        if constexpr (kHigh) raw.qh[r] = ld_weight_u8(pqh + r * B);
      }
      phdr += Dec::kBlockStride, pqs += Dec::kBlockStride, pqh += Dec::kBlockStride;
    };
    auto stage_x = [&](int u, int buf) { stage_x_unit<TC, kThreads, 2>(xs + buf * TC * kQK_K, a, u); };
    auto decode_unit = [&](int buf) {
      float w[RD][8];
      Dec::template decode<RD>(raw, fl, lane, scratch, w);
      float* dst = ws + buf * RC * kQK_K + warp * RD * kQK_K + 2 * lane;
#pragma unroll
      for (int r = 0; r < RD; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          *reinterpret_cast<float2*>(dst + r * kQK_K + 64 * q) = make_float2(w[r][2 * q], w[r][2 * q + 1]);
    };

    float acc[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[r][k] = 0.0f;
    load();
    stage_x(0, 0);
    decode_unit(0);
    if (units > 1) load();
    cp_async_wait<0>();
    __syncthreads();
    for (int u = 0; u < units; ++u) {
      const int buf = u & 1;
      if (u + 1 < units) stage_x(u + 1, buf ^ 1);
      const float* wl = ws + buf * RC * kQK_K + rg * 8 * kQK_K + 2 * lane;
      const float* xl = xs + buf * TC * kQK_K + tg * 8 * kQK_K + lane;
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float2 xv[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) xv[k] = make_float2(xl[k * kQK_K + 64 * q], xl[k * kQK_K + 64 * q + 32]);
#pragma unroll
        for (int r = 0; r < 8; ++r) {
          const float2 wv = *reinterpret_cast<const float2*>(wl + r * kQK_K + 64 * q);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[r][k] = fmaf(wv.x, xv[k].x, acc[r][k]);
#pragma unroll
          for (int k = 0; k < 8; ++k) acc[r][k] = fmaf(wv.y, xv[k].y, acc[r][k]);
        }
      }
      if (u + 1 < units) {
        decode_unit(buf ^ 1);
        if (u + 2 < units) load();
      }
      cp_async_wait<0>();
      __syncthreads();
    }

    // canon_tree32, as matvec_canon_kernel
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float v = canon_tree32_warp(acc[r][k]);
        const int64_t row = row0 + rg * 8 + r;
        const int token = tg * 8 + k;
        if (lane == 0 && token < a.t && row < a.rows) a.y[token * a.ldy + row] = v;
      }
  }
}

// The shared memory one CTA may opt in to on the current device (matvec.cu).
size_t smem_optin_bytes();
// Whether the wide kernel runs a's weight: Q4_K or Q5_K, with x of 8 tokens
// and the factor buffers in one CTA's shared memory (matvec.cu).
bool matvec_wide_fits(const MatvecArgs& a);
// Launches the wide kernel when matvec_wide_fits; false leaves the call to matvec_canon_kernel.
bool launch_matvec_wide(const void* kernel, const MatvecArgs& a, int warps, cudaStream_t stream);
// Whether the shared-decode kernel runs a's weight: Q4_K or Q5_K, x in 16-byte
// aligned rows (its cp.async copies) and its tile's buffers in one CTA's shared memory.
bool matvec_shared_fits(const MatvecArgs& a);
// Launches kernel (matvec_canon_shared_kernel<., kSharedTokenGroups>) over a's rows.
void launch_matvec_shared(const void* kernel, const MatvecArgs& a, cudaStream_t stream);
// Whether the stream kernel runs a's weight: Q4_K or Q5_K, x in 16-byte aligned rows.
bool matvec_stream_fits(const MatvecArgs& a);
// Launches kernel (matvec_canon_stream_kernel<.>) over a's rows.
void launch_matvec_stream(const void* kernel, const MatvecArgs& a, cudaStream_t stream);

// Launch plan for one token tile (host side, in matvec.cu).
struct MatvecPlan {
  int chunk_cols = 0;
  size_t smem_bytes = 0;
};
MatvecPlan plan_matvec(const MatvecArgs& a, int unit, int rows_per_warp, int warps, size_t x_budget);
void launch_matvec_kernel(const void* kernel, const MatvecArgs& a, const MatvecPlan& p, int rows_per_warp, int warps,
                          cudaStream_t stream);
// Launches a persistent-grid matvec kernel (matvec.cu): as many CTAs as fit on
// the GPU at once, at most one per group of rows_per_cta rows, after raising
// its dynamic shared-memory limit when smem_bytes needs it. `what` names the
// kernel in errors ("<what>: no CTA fits ...").
void launch_persistent(const void* kernel, void** params, int threads, size_t smem_bytes, int64_t rows,
                       int64_t rows_per_cta, cudaStream_t stream, const std::string& what);
// Asks the driver to give kernel's launches the most L1 the SM allows (matvec.cu:
// which kernels need it, and why).
void prefer_max_l1(const void* kernel, const char* what);

// Per-type entry points (matvec_<type>.cu): run one token tile, t <= 64.
void matvec_canon_q5_k(const MatvecArgs& a, cudaStream_t stream);
void matvec_canon_q4_k(const MatvecArgs& a, cudaStream_t stream);
void matvec_canon_q6_k(const MatvecArgs& a, cudaStream_t stream);
void matvec_canon_q8_0(const MatvecArgs& a, cudaStream_t stream);
void matvec_canon_float(const MatvecArgs& a, cudaStream_t stream);  // F16, BF16, F32

// Picks the smallest token tile >= a.t and launches Dec's kernel for it.
template <class Dec>
void launch_matvec_tiles(const MatvecArgs& a, cudaStream_t stream) {
  auto go = [&](auto tile) {
    constexpr int TT = decltype(tile)::value;
    using Shape = CanonShape<Dec, TT>;
    const MatvecPlan p = plan_matvec(a, Dec::kUnit, Shape::rows, Shape::warps, Shape::x_budget);
    launch_matvec_kernel(reinterpret_cast<const void*>(&matvec_canon_kernel<Dec, TT>), a, p, Shape::rows,
                         Shape::warps, stream);
  };
  if constexpr (Dec::kFactors) {
    if (a.t >= kSharedMinTokens && a.t <= SharedTile<kSharedTokenGroups>::tokens && matvec_shared_fits(a)) {
      launch_matvec_shared(reinterpret_cast<const void*>(&matvec_canon_shared_kernel<Dec::kHighBits, kSharedTokenGroups>),
                           a, stream);
      return;
    }
    if (a.t > kWideTokens && a.t <= kStreamTokens && matvec_stream_fits(a)) {
      launch_matvec_stream(reinterpret_cast<const void*>(&matvec_canon_stream_kernel<Dec::kHighBits>), a, stream);
      return;
    }
    if (a.t >= kWideMinTokens && a.t <= kWideTokens &&
        launch_matvec_wide(reinterpret_cast<const void*>(&matvec_canon_wide_kernel<Dec::kHighBits, kWideWarps>), a,
                           kWideWarps, stream))
      return;
  }
  if (a.t <= 1) go(std::integral_constant<int, 1>{});
  else if (a.t <= 2) go(std::integral_constant<int, 2>{});
  else if (a.t <= 4) go(std::integral_constant<int, 4>{});
  else if (a.t <= 8) go(std::integral_constant<int, 8>{});
  else if (a.t <= 16) go(std::integral_constant<int, 16>{});
  else if (a.t <= 32) go(std::integral_constant<int, 32>{});
  else go(std::integral_constant<int, 64>{});
}

}  // namespace muser::cuda
