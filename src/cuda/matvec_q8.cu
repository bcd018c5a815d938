// acts="q8": the activation quantizer, the launch plan and the per-type
// dispatch of the int8 matvec (kernel and layout: matvec_q8.cuh).
//
// quantize_q8_kernel reproduces the CPU's quantizers (src/cpp/cpu/acts_q8.cpp,
// ggml's x86 ones) bit for bit:
//   Q8_K (K-quant weights), per 256: max = the value of largest |x| (the first
//     on ties), iscale = -127/max, q = min(127, round-half-even(iscale*x)),
//     d = 1/iscale; all-zero blocks get d = 0. Sums of 16 (Q6_K) or 32 quants.
//     (NaN, reachable with check_finite=False, quantizes to 0 as on the CPU.)
//   Q8_0, per 32: amax = max |x|, d = f16(amax/127), id = amax ? 127/amax : 0,
//     q = round-half-even(x*id) (NaN -> -128, as the CPU's saturating pack).
// One warp per (token, 256 columns); lane l owns columns 8l..8l+7.
#include <algorithm>
#include <climits>
#include <cstdlib>

#include "cuda_check.h"
#include "matvec_q8.cuh"
#include "pdl.cuh"
#include "quant_types.h"

namespace muser::cuda {

namespace {

constexpr size_t kQ8SmemBudget = 100 * 1024;  // staged quants + records per CTA before columns are chunked

enum class Q8Kind { Sum32, Sum16, Q80 };  // Q4_K/Q5_K records, Q6_K records, Q8_0 scales

Q8Kind q8_kind(uint32_t type) {
  return type == (uint32_t)GgmlType::Q8_0 ? Q8Kind::Q80 : type == (uint32_t)GgmlType::Q6_K ? Q8Kind::Sum16 : Q8Kind::Sum32;
}
int q8_rec_bytes(Q8Kind k) { return k == Q8Kind::Q80 ? 4 : k == Q8Kind::Sum16 ? 48 : 32; }
int q8_meta_cols(Q8Kind k) { return k == Q8Kind::Q80 ? 32 : 256; }
int64_t q8_pitch(int64_t K) { return (K + 255) / 256 * 256; }

template <Q8Kind kKind>
__global__ void quantize_q8_kernel(const float* x, int64_t ldx, int64_t K, int64_t pitch, int t, int8_t* xq,
                                   uint8_t* meta, uint8_t* meta_f16, int64_t meta_per_token) {
  pdl_launch_dependents();
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t chunk = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
  const int k = blockIdx.y;
  if (chunk * 256 >= pitch || k >= t) return;  // uniform per warp
  const int64_t c0 = chunk * 256 + 8 * lane;
  float v[8];
  if (c0 < K) {  // K is a multiple of 32: a lane's 8 columns are all in or all out
    const float4* p = reinterpret_cast<const float4*>(x + k * ldx + c0);
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
    uint8_t* rec = meta + (k * meta_per_token + chunk) * (kKind == Q8Kind::Sum16 ? 48 : 32);
    if constexpr (kKind == Q8Kind::Sum16) {
      if ((lane & 1) == 0) {
        rec[lane >> 1] = (uint8_t)(s16 & 0xff);
        rec[16 + (lane >> 1)] = (uint8_t)((s16 >> 8) & 0xff);
      }
      if (lane == 0) {
        reinterpret_cast<float*>(rec)[8] = d;
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
  packed.x = __byte_perm(__byte_perm(q[0], q[1], 0x0040), __byte_perm(q[2], q[3], 0x0040), 0x5410);
  packed.y = __byte_perm(__byte_perm(q[4], q[5], 0x0040), __byte_perm(q[6], q[7], 0x0040), 0x5410);
  *reinterpret_cast<uint2*>(xq + k * pitch + c0) = packed;
}

}  // namespace

bool q8_supported(uint32_t type) { return is_q8_type(type); }  // a kernel for every type of the table

size_t acts_q8_scratch_bytes(uint32_t type, int64_t K, int t) {
  const Q8Kind kind = q8_kind(type);
  const int64_t pitch = q8_pitch(K);
  const size_t quants = ((size_t)t * (size_t)pitch + 15) / 16 * 16;
  const size_t records = (size_t)t * (size_t)(pitch / q8_meta_cols(kind));
  const size_t f16_records = kind == Q8Kind::Sum32 ? records * kQ8F16RecSrcBytes : 0;
  // the wgmma kernel's layout after the records, 128-byte aligned
  const size_t wg = kind == Q8Kind::Sum32 && t >= q8_wgmma_min_tokens() ? q8_wgmma_acts_bytes(K, t) + 128 : 0;
  return quants + records * (size_t)q8_rec_bytes(kind) + f16_records + wg;
}

void quantize_acts_q8(uint32_t type, const float* x, int64_t ldx, int64_t K, int t, void* scratch, Q8Call* a,
                      cudaStream_t stream) {
  if (!q8_supported(type)) throw DeviceError("quantize_acts_q8: no q8 kernel for this weight type");
  const Q8Kind kind = q8_kind(type);
  if (K % q8_meta_cols(kind) != 0 || ldx % 4 != 0)
    throw DeviceError("quantize_acts_q8: K=" + std::to_string(K) + " is not a multiple of the block size");
  const int64_t pitch = q8_pitch(K);
  auto* xq = static_cast<int8_t*>(scratch);
  auto* meta = static_cast<uint8_t*>(scratch) + ((size_t)t * (size_t)pitch + 15) / 16 * 16;
  const int64_t per_token = pitch / q8_meta_cols(kind);
  // Q4_K/Q5_K: the f16 records after the raw ones (16-byte aligned: 32-byte raw records)
  uint8_t* meta_f16 = kind == Q8Kind::Sum32 ? meta + (size_t)t * (size_t)per_token * 32 : nullptr;
  const int warps = 8;
  const dim3 grid((unsigned)((pitch / 256 + warps - 1) / warps), (unsigned)t);
  switch (kind) {
    case Q8Kind::Sum32:
      launch_pdl(quantize_q8_kernel<Q8Kind::Sum32>, grid, dim3(32 * warps), 0, stream, "quantize_acts_q8", x, ldx, K,
                 pitch, t, xq, meta, meta_f16, per_token);
      break;
    case Q8Kind::Sum16:
      launch_pdl(quantize_q8_kernel<Q8Kind::Sum16>, grid, dim3(32 * warps), 0, stream, "quantize_acts_q8", x, ldx, K,
                 pitch, t, xq, meta, meta_f16, per_token);
      break;
    case Q8Kind::Q80:
      launch_pdl(quantize_q8_kernel<Q8Kind::Q80>, grid, dim3(32 * warps), 0, stream, "quantize_acts_q8", x, ldx, K,
                 pitch, t, xq, meta, meta_f16, per_token);
      break;
  }
  check_launch("quantize_acts_q8");
  a->xq = xq;
  a->xq_pitch = pitch;
  a->meta = meta;
  a->meta_f16 = meta_f16;
  a->meta_per_token = per_token;
  a->t = t;
  a->wg = nullptr;
  if (kind == Q8Kind::Sum32 && q8_wgmma_ready(type, t)) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(meta_f16 + (size_t)t * (size_t)per_token * kQ8F16RecSrcBytes);
    auto* wg = reinterpret_cast<uint8_t*>((end + 127) / 128 * 128);
    q8_wgmma_relayout(*a, K, wg, stream);
    a->wg = wg;
    a->wg_tokens = q8_wgmma_layout_tokens(t);
    a->wg_k0 = 0;
  }
}

Q8Plan plan_matvec_q8(const Q8Args& a, int tile_tokens, int meta_cols, int rec_bytes, int x_tokens, size_t budget) {
  if (budget == 0) budget = kQ8SmemBudget;
  // columns per chunk: all of them when the tile's tokens fit the budget, else
  // as many 256-column slices as fit (at least one)
  const int64_t kpad = (a.cols + 255) / 256 * 256;
  auto bytes = [&](int64_t cols) {
    return (size_t)x_tokens * (size_t)(cols + kQ8XPad) +
           (size_t)tile_tokens * (size_t)q8_rec_pitch((int)(cols / meta_cols), rec_bytes);
  };
  int64_t cols = kpad;
  while (cols > 256 && bytes(cols) > budget) cols -= 256;
  Q8Plan p;
  p.chunk_cols = (int)cols;
  p.smem_bytes = bytes(cols);
  return p;
}

size_t q8_smem_optin() {
  int dev = 0, optin = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "cudaDeviceGetAttribute(shared memory per block)");
  return (size_t)optin;
}

int q8_staged_stages(const Q8Args&, const Q8Plan& p, int stage_bytes) {
  const size_t optin = q8_smem_optin();
  // two stages (one unit ahead per warp, 6 MB in flight over the H200) measured
  // faster than three or four once the weight is tiled: 220.8 against 224.1
  // and 225.9 us at t = 1, 227 against 228 us at t = 8 (docs/performance.md).
  // MUSER_Q8_STAGES=0|2|3|4 asks for another depth, for measuring (0: the
  // register kernel); a depth that does not fit falls to the largest that does.
  int want = 2;
  if (const char* e = std::getenv("MUSER_Q8_STAGES")) want = std::min(4, std::max(0, std::atoi(e)));
  for (int s = want; s >= 2; --s)
    if (p.smem_bytes + (size_t)s * (size_t)stage_bytes <= (size_t)optin) return s;
  return 0;
}

bool q8_stream_enabled() {
  const char* e = std::getenv("MUSER_Q8_STREAM");
  return !(e && std::atoi(e) == 0);
}

void launch_matvec_q8_kernel(const void* kernel, const Q8Args& a, const Q8Plan& p, cudaStream_t stream, int threads,
                             int rows_per_cta) {
  Q8Args args = a;
  int chunk = p.chunk_cols;
  void* params[] = {&args, &chunk};
  launch_persistent(kernel, params, threads, p.smem_bytes, a.rows, rows_per_cta, stream, "matvec_q8");
}

int q8_token_tile(uint32_t type) {
  // 32 for the types with a staged kernel: 64 tokens of the seed head took 1,364 us in the
  // register kernel (8 tiles), 2 x 460 in two staged launches of 32 (now 2 x 376 streamed);
  // the Gemma-3 head (Q8_0, 640 columns) 219.7 us in one register launch, 204.7 in two
  // staged ones, and 440.3 against 403.1 us at t = 128 (docs/performance.md). Q6_K has
  // only the register kernel: 64. MUSER_Q8_TOKEN_TILE=32|64 overrides, for measuring.
  if (const char* e = std::getenv("MUSER_Q8_TOKEN_TILE")) return std::atoi(e) == 64 ? 64 : 32;
  return type == (uint32_t)GgmlType::Q6_K ? 64 : 32;
}

Q8Call q8_tokens(const Q8Call& a, int k0, int count) {
  Q8Call s = a;
  s.t = count;
  s.xq = a.xq + k0 * a.xq_pitch;
  s.meta = a.meta + k0 * a.meta_per_token * q8_rec_bytes(q8_kind(a.type));
  if (a.meta_f16) s.meta_f16 = a.meta_f16 + k0 * a.meta_per_token * kQ8F16RecSrcBytes;
  s.wg_k0 = a.wg_k0 + k0;
  if (k0 % 8) s.wg = nullptr;  // the wgmma layout's token groups are 8 tokens
  s.y = a.y + k0 * a.ldy;
  return s;
}

void matvec_q8(const Q8Call& a, cudaStream_t stream) {
  if (a.select && a.t > kQ8FoldMaxTokens)  // one launch whose tiles fold (store_q8_tile)
    throw DeviceError("matvec_q8: a selection in the matvec takes at most kQ8FoldMaxTokens tokens");
  if (a.wg && a.t >= q8_wgmma_min_tokens()) {  // laid out by quantize_acts_q8 where the device takes the kernel
    // launches of kQ8WgmmaChunk tokens; a last part below the threshold takes the mma.sync
    // kernels, which are faster there (t = 129: 128 + 1 tokens, the one at t = 1's cost)
    for (int k0 = 0; k0 < a.t; k0 += kQ8WgmmaChunk) {
      const Q8Call part = q8_tokens(a, k0, std::min(kQ8WgmmaChunk, a.t - k0));
      if (part.t >= q8_wgmma_min_tokens()) matvec_q8_wgmma(part, stream);
      else matvec_q8(part, stream);
    }
    return;
  }
  const int kTokenTile = q8_token_tile(a.type);  // t <= kTokenTile reads the weight once, larger t once per tile
  for (int k0 = 0; k0 < a.t; k0 += kTokenTile) {
    const Q8Call tile = q8_tokens(a, k0, std::min(kTokenTile, a.t - k0));
    switch (a.type) {
      case (uint32_t)GgmlType::Q5_K: matvec_q8_q5_k(tile, stream); break;
      case (uint32_t)GgmlType::Q4_K: matvec_q8_q4_k(tile, stream); break;
      case (uint32_t)GgmlType::Q6_K: matvec_q8_q6_k(tile, stream); break;
      case (uint32_t)GgmlType::Q8_0: matvec_q8_q8_0(tile, stream); break;
      default: throw DeviceError("matvec_q8: no q8 kernel for this weight type");
    }
    check_launch("matvec_q8");
  }
}

}  // namespace muser::cuda
