// The activation quantizer of acts="q8", one definition for the quantizer
// kernel (matvec_q8.cu) and the fused norm + gamma + quantizer kernel (norm.cu).
//
// It reproduces the CPU's quantizers (src/cpp/cpu/acts_q8.cpp,
// ggml's x86 ones) bit for bit:
//   Q8_K (K-quant weights), per 256: max = the value of largest |x| (the first
//     on ties), iscale = -127/max, q = min(127, round-half-even(iscale*x)),
//     d = 1/iscale; all-zero blocks get d = 0. Sums of 16 (Q6_K) or 32 quants.
//     (NaN, reachable with check_finite=False, quantizes to 0 as on the CPU.)
//   Q8_0, per 32: amax = max |x|, d = f16(amax/127), id = amax ? 127/amax : 0,
//     q = round-half-even(x*id) (NaN -> -128, as the CPU's saturating pack).
// One warp per (token, 256 columns); lane l owns columns 8l..8l+7.
#pragma once
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>

#include "byte_pack.cuh"
#include "quant_types.h"

namespace muser::cuda {

enum class Q8Kind { Sum32, Sum16, Q80 };  // Q4_K/Q5_K records, Q6_K records, Q8_0 scales

__host__ __device__ constexpr Q8Kind q8_kind(uint32_t type) {
  return type == (uint32_t)GgmlType::Q8_0 ? Q8Kind::Q80 : type == (uint32_t)GgmlType::Q6_K ? Q8Kind::Sum16 : Q8Kind::Sum32;
}
// a (token, block) record: Sum32 lo[8] | hi[8] | d | pad, Sum16 lo[16] | hi[16] | d | pad (matvec_q8.cuh)
constexpr int kQ8Sum32RecBytes = 32, kQ8Sum16RecBytes = 48, kQ8Sum16DxOffset = 32;
__host__ __device__ constexpr int q8_rec_bytes(Q8Kind k) {
  return k == Q8Kind::Q80 ? 4 : k == Q8Kind::Sum16 ? kQ8Sum16RecBytes : kQ8Sum32RecBytes;
}
inline int q8_meta_cols(Q8Kind k) { return k == Q8Kind::Q80 ? 32 : 256; }
inline int64_t q8_pitch(int64_t K) { return (K + 255) / 256 * 256; }

// The quantizer's copy of the Q4_K/Q5_K records as f16 halves in global memory
// (Q8Args::meta_f16), padded to three 16-byte pieces so that cp.async copies them.
constexpr int kQ8F16RecSrcBytes = 48;

// Where t tokens' quants and records lie in the quantizer's scratch:
// quants [t][pitch], then the records [t][per_token], then (Q4_K/Q5_K) their f16 copies.
struct Q8ActsOut {
  int8_t* xq;
  uint8_t* meta;
  uint8_t* meta_f16;
  int64_t pitch, per_token;
};
inline Q8ActsOut q8_acts_out(uint32_t type, int64_t K, int t, void* scratch) {
  const Q8Kind kind = q8_kind(type);
  const int64_t pitch = q8_pitch(K), per_token = pitch / q8_meta_cols(kind);
  auto* xq = static_cast<int8_t*>(scratch);
  auto* meta = static_cast<uint8_t*>(scratch) + ((size_t)t * (size_t)pitch + 15) / 16 * 16;
  // Q4_K/Q5_K: the f16 records after the raw ones (16-byte aligned: 32-byte raw records)
  uint8_t* meta_f16 = kind == Q8Kind::Sum32 ? meta + (size_t)t * (size_t)per_token * 32 : nullptr;
  return {xq, meta, meta_f16, pitch, per_token};
}

// One warp quantizes columns [256 chunk, 256 chunk + 256) of token k's row xrow
// (K columns; zeros past K) into the scratch; lane l owns columns 8l..8l+7.
template <Q8Kind kKind>
__device__ __forceinline__ void quantize_q8_chunk(const float* xrow, int64_t K, int64_t pitch, int64_t chunk, int k,
                                                  int lane, int8_t* xq, uint8_t* meta, uint8_t* meta_f16,
                                                  int64_t meta_per_token) {
  const int64_t c0 = chunk * 256 + 8 * lane;
  float v[8];
  if (c0 < K) {  // K is a multiple of 32: a lane's 8 columns are all in or all out
    const float4* p = reinterpret_cast<const float4*>(xrow + c0);
    const float4 a = p[0], b = p[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = 0.0f;
  }
  int q[8];
  if constexpr (kKind == Q8Kind::Q80) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const __half dh = __float2half_rn(amax / 127.0f);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float s = v[i] * id;
      q[i] = s != s ? -128 : max(-128, min(127, __float2int_rn(s)));
    }
    if ((lane & 3) == 0) {
      const int64_t blk = chunk * 8 + (lane >> 2);
      if (blk < meta_per_token) reinterpret_cast<float*>(meta)[k * meta_per_token + blk] = __half2float(dh);
    }
  } else {
    // the first element of largest magnitude (strictly greater wins, as the CPU's scan)
    float amax = 0.0f, mx = 0.0f;
    int idx = INT_MAX;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float ax = fabsf(v[i]);
      if (ax > amax) amax = ax, mx = v[i], idx = 8 * lane + i;
    }
#pragma unroll
    for (int off = 16; off >= 1; off >>= 1) {
      const float oa = __shfl_xor_sync(0xffffffffu, amax, off), om = __shfl_xor_sync(0xffffffffu, mx, off);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, off);
      if (oa > amax || (oa == amax && oi < idx)) amax = oa, mx = om, idx = oi;
    }
    float d = 0.0f;
    if (amax != 0.0f) {
      const float iscale = -127.0f / mx;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float s = iscale * v[i];
        q[i] = s != s ? 0 : min(127, __float2int_rn(s));  // NaN -> 0, as nearest_int's bit trick gives
      }
      d = 1.0f / iscale;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) q[i] = 0;
    }
    int s8 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s8 += q[i];
    const int s16 = s8 + __shfl_xor_sync(0xffffffffu, s8, 1);
    const int s32 = s16 + __shfl_xor_sync(0xffffffffu, s16, 2);
    uint8_t* rec =
        meta + (k * meta_per_token + chunk) * (kKind == Q8Kind::Sum16 ? kQ8Sum16RecBytes : kQ8Sum32RecBytes);
    if constexpr (kKind == Q8Kind::Sum16) {
      if ((lane & 1) == 0) {
        rec[lane >> 1] = (uint8_t)(s16 & 0xff);
        rec[16 + (lane >> 1)] = (uint8_t)((s16 >> 8) & 0xff);
      }
      if (lane == 0) {
        *reinterpret_cast<float*>(rec + kQ8Sum16DxOffset) = d;
        reinterpret_cast<uint32_t*>(rec)[9] = reinterpret_cast<uint32_t*>(rec)[10] = reinterpret_cast<uint32_t*>(rec)[11] = 0;
      }
    } else {
      if ((lane & 3) == 0) {
        rec[lane >> 2] = (uint8_t)(s32 & 0xff);
        rec[8 + (lane >> 2)] = (uint8_t)((s32 >> 8) & 0xff);
      }
      if (lane == 0) {
        reinterpret_cast<float*>(rec)[4] = d;
        reinterpret_cast<uint32_t*>(rec)[5] = reinterpret_cast<uint32_t*>(rec)[6] = reinterpret_cast<uint32_t*>(rec)[7] = 0;
      }
      // the same sums as the f16 halves the tensor-core mins read (kQ8F16RecBytes), so the
      // streamed batch kernel copies records instead of converting them
      const int s32_next = __shfl_down_sync(0xffffffffu, s32, 4);  // sub-block 2q + 1's, at lane 8q
      uint32_t* rf = reinterpret_cast<uint32_t*>(meta_f16 + (k * meta_per_token + chunk) * kQ8F16RecSrcBytes);
      if ((lane & 7) == 0) {
        const int qq = lane >> 3;
        const __half2 lo = __halves2half2(__int2half_rn(s32 & 0xff), __int2half_rn(s32_next & 0xff));
        const __half2 hi = __halves2half2(__int2half_rn((int)(int8_t)((s32 >> 8) & 0xff)),
                                          __int2half_rn((int)(int8_t)((s32_next >> 8) & 0xff)));
        rf[2 * qq] = *reinterpret_cast<const uint32_t*>(&lo);
        rf[2 * qq + 1] = *reinterpret_cast<const uint32_t*>(&hi);
      }
      if (lane == 0) {
        rf[8] = __float_as_uint(d);
        rf[9] = rf[10] = rf[11] = 0;
      }
    }
  }
  uint2 packed;
  packed.x = pack_bytes4(q[0], q[1], q[2], q[3]);
  packed.y = pack_bytes4(q[4], q[5], q[6], q[7]);
  *reinterpret_cast<uint2*>(xq + k * pitch + c0) = packed;
}

}  // namespace muser::cuda
