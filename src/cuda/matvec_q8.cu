// acts="q8": the activation quantizer, the launch plan and the per-type
// dispatch of the int8 matvec (kernel and layout: matvec_q8.cuh).
//
// quantize_q8_kernel: the CPU quantizers bit for bit (quantize_q8.cuh, which the
// fused norm + gamma + quantizer kernel of norm.cu shares). One warp per (token,
// 256 columns).
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

template <Q8Kind kKind>
__global__ void quantize_q8_kernel(const float* x, int64_t ldx, int64_t K, int64_t pitch, int t, int8_t* xq,
                                   uint8_t* meta, uint8_t* meta_f16, int64_t meta_per_token) {
  pdl_launch_dependents();
  pdl_wait();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t chunk = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
  const int k = blockIdx.y;
  if (chunk * 256 >= pitch || k >= t) return;  // uniform per warp
  quantize_q8_chunk<kKind>(x + k * ldx, K, pitch, chunk, k, lane, xq, meta, meta_f16, meta_per_token);
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
  const size_t wg = q8_wgmma_type(type) && t >= q8_wgmma_min_tokens(type) ? q8_wgmma_acts_bytes(K, t) + 128 : 0;
  return quants + records * (size_t)q8_rec_bytes(kind) + f16_records + wg;
}

void quantize_acts_q8(uint32_t type, const float* x, int64_t ldx, int64_t K, int t, void* scratch, Q8Call* a,
                      cudaStream_t stream, bool quantized) {
  if (!q8_supported(type)) throw DeviceError("quantize_acts_q8: no q8 kernel for this weight type");
  const Q8Kind kind = q8_kind(type);
  if (K % q8_meta_cols(kind) != 0 || ldx % 4 != 0)
    throw DeviceError("quantize_acts_q8: K=" + std::to_string(K) + " is not a multiple of the block size");
  const Q8ActsOut o = q8_acts_out(type, K, t, scratch);
  const int64_t pitch = o.pitch, per_token = o.per_token;
  int8_t* xq = o.xq;
  uint8_t *meta = o.meta, *meta_f16 = o.meta_f16;
  const int warps = 8;
  const dim3 grid((unsigned)((pitch / 256 + warps - 1) / warps), (unsigned)t);
  if (!quantized) {
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
  }
  a->xq = xq;
  a->xq_pitch = pitch;
  a->meta = meta;
  a->meta_f16 = meta_f16;
  a->meta_per_token = per_token;
  a->t = t;
  a->wg = nullptr;
  if (q8_wgmma_ready(type, t)) {
    const uint8_t* records_end = meta_f16 ? meta_f16 + (size_t)t * (size_t)per_token * kQ8F16RecSrcBytes
                                          : meta + (size_t)t * (size_t)per_token * q8_rec_bytes(kind);
    const uintptr_t end = reinterpret_cast<uintptr_t>(records_end);
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

int q8_staged_stages(const Q8Args&, const Q8Plan& p, int stage_bytes) {
  const size_t optin = smem_optin_bytes();
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

int q8_token_tile(uint32_t) {
  // 32 tokens a launch (the staged and streamed batch kernels): 64 tokens of the seed head
  // took 1,364 us in the register kernel (8 tiles), 2 x 460 in two staged launches of 32
  // (now 2 x 376 streamed); the Gemma-3 head (Q8_0, 640 columns) 219.7 us in one register
  // launch, 204.7 in two staged ones, and 440.3 against 403.1 us at t = 128
  // (docs/performance.md). MUSER_Q8_TOKEN_TILE=32|64 overrides, for measuring.
  if (const char* e = std::getenv("MUSER_Q8_TOKEN_TILE")) return std::atoi(e) == 64 ? 64 : 32;
  return 32;
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
  if (a.wg && a.t >= q8_wgmma_min_tokens(a.type)) {  // laid out by quantize_acts_q8 where the device takes the kernel
    // launches of kQ8SharedChunk tokens on the shared-decode kernel while at least
    // q8_shared_min_tokens() are left, then of kQ8WgmmaChunk; a last part below the
    // threshold takes the mma.sync kernels, which are faster there
    for (int k0 = 0; k0 < a.t;) {
      const int left = a.t - k0;
      const int count = std::min(left >= q8_shared_min_tokens() ? kQ8SharedChunk : kQ8WgmmaChunk, left);
      const Q8Call part = q8_tokens(a, k0, count);
      if (part.t >= q8_wgmma_min_tokens(a.type)) matvec_q8_wgmma(part, stream);
      else matvec_q8(part, stream);
      k0 += count;
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
