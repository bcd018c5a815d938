// The final norm nodes: RMSNorm and LayerNorm (without gamma, which is the
// mul_rows node), one CTA of 256 threads per hidden state, the row staged in
// shared memory when it fits (load_row). The norm is not fused with γ here: a
// one-CTA-per-row norm + γ kernel made the q8 route 1.5 % slower at t = 1 than
// the two kernels overlapped by PDL (docs/performance.md). Where the q8 matvec
// follows, one kernel does the norm, γ and the activation quantizer
// (norm_gamma_q8_kernel): γ staged before the wait for the node before it,
// the quantizer reading the row from shared memory.
//
// Ggml order (routes graph, fused, reference): ggml's CPU arithmetic -- each
// square (or value) rounded to f32, summed in double -- with the double sum
// joined by a tree instead of in index order. The f32 mean equals the CPU's
// unless the two double sums round to different floats (a relative gap of
// ~1e-16 against a float spacing of ~6e-8), so in practice the normed bits
// match the CPU's; nothing promises it (docs/numerics.md).
//
// Canonical order (route canonical): warp 0 computes the canonical dot
// product x.x (lane l owns j = l mod 32, fmaf in increasing j, the butterfly
// tree) exactly as dot_canon on the CPU, so the normed bits are the CPU's.
//
// Division and square root are IEEE (__fdiv_rn, __fsqrt_rn), as on the CPU.
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"
#include "pdl.cuh"
#include "quantize_q8.cuh"

namespace muser::cuda {

namespace {

constexpr int kNormThreads = 256;

// Sum of one double per thread over the CTA (tree); every thread gets it.
__device__ double block_sum_double(double v, double* shared /*[kNormThreads / 32]*/) {
  for (int off = 16; off >= 1; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  double s = 0.0;
  for (int w = 0; w < kNormThreads / 32; ++w) s += shared[w];
  __syncthreads();
  return s;
}

// The canonical dot product of a with b over n (warp 0 computes; all get it).
__device__ float block_dot_canon(const float* a, const float* b, int64_t n, float* shared) {
  if (threadIdx.x < 32) {
    float acc = 0.0f;
#pragma unroll 16  // the loads run ahead of the one dependent chain of fmaf
    for (int64_t j = threadIdx.x; j < n; j += 32) acc = fmaf(a[j], b[j], acc);
    for (int off = 16; off >= 1; off >>= 1) acc = acc + __shfl_down_sync(0xffffffffu, acc, off);
    if (threadIdx.x == 0) shared[0] = acc;
  }
  __syncthreads();
  const float v = shared[0];
  __syncthreads();
  return v;
}

__device__ float inv_sqrt_ieee(float v, float eps) { return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(v, eps))); }

// The row a CTA normalizes, read once from global memory: staged into shared
// memory when it fits (every thread's loads in flight at once; the sums and
// the scaling read it back at shared-memory latency), else read in place.
template <bool kStaged>
__device__ __forceinline__ const float* load_row(const float* xr, int64_t H, float* xs) {
  if (!kStaged) return xr;
  if (H % 4 == 0 && (reinterpret_cast<uintptr_t>(xr) & 15) == 0) {  // 16-byte loads: one round trip per thread
    const float4* x4 = reinterpret_cast<const float4*>(xr);
    float4* s4 = reinterpret_cast<float4*>(xs);
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < H / 4; j += kNormThreads) s4[j] = x4[j];
  } else {
#pragma unroll 8
    for (int64_t j = threadIdx.x; j < H; j += kNormThreads) xs[j] = xr[j];
  }
  __syncthreads();
  return xs;
}

enum class NormKind { RmsGgml, RmsCanon, LayerGgml, LayerCanon };
__host__ __device__ constexpr bool is_layer_norm(NormKind k) { return k == NormKind::LayerGgml || k == NormKind::LayerCanon; }

// 1 / sqrt(statistic + eps) of the row xr (every thread gets it). The
// LayerNorm kinds first write the centred row x - mean to yr.
template <NormKind kKind>
__device__ float norm_inv_scale(const float* xr, float* yr, int64_t H, float eps) {
  if constexpr (kKind == NormKind::RmsGgml) {
    __shared__ double partial[kNormThreads / 32];
    double s = 0.0;
#pragma unroll 8
    for (int64_t j = threadIdx.x; j < H; j += kNormThreads) s += (double)__fmul_rn(xr[j], xr[j]);
    const float mean = __double2float_rn(__ddiv_rn(block_sum_double(s, partial), (double)H));
    return inv_sqrt_ieee(mean, eps);
  } else if constexpr (kKind == NormKind::RmsCanon) {
    __shared__ float shared[1];
    return inv_sqrt_ieee(__fdiv_rn(block_dot_canon(xr, xr, H, shared), (float)H), eps);
  } else if constexpr (kKind == NormKind::LayerGgml) {
    __shared__ double partial[kNormThreads / 32];
    double s = 0.0;
    for (int64_t j = threadIdx.x; j < H; j += kNormThreads) s += (double)xr[j];
    const float mean = __double2float_rn(__ddiv_rn(block_sum_double(s, partial), (double)H));
    double v2 = 0.0;
    for (int64_t j = threadIdx.x; j < H; j += kNormThreads) {
      const float v = __fsub_rn(xr[j], mean);
      yr[j] = v;
      v2 += (double)__fmul_rn(v, v);
    }
    return inv_sqrt_ieee(__double2float_rn(__ddiv_rn(block_sum_double(v2, partial), (double)H)), eps);
  } else {
    __shared__ float shared[1];
    if (threadIdx.x < 32) {  // canonical sum: 32 lane chains of plain adds, then the tree
      float acc = 0.0f;
#pragma unroll 16
      for (int64_t j = threadIdx.x; j < H; j += 32) acc = __fadd_rn(acc, xr[j]);
      for (int off = 16; off >= 1; off >>= 1) acc = acc + __shfl_down_sync(0xffffffffu, acc, off);
      if (threadIdx.x == 0) shared[0] = acc;
    }
    __syncthreads();
    const float mean = __fdiv_rn(shared[0], (float)H);
    __syncthreads();
    for (int64_t j = threadIdx.x; j < H; j += kNormThreads) yr[j] = __fsub_rn(xr[j], mean);
    __syncthreads();  // y is read back by warp 0 below
    return inv_sqrt_ieee(__fdiv_rn(block_dot_canon(yr, yr, H, shared), (float)H), eps);
  }
}

// One CTA per hidden state: y = x * r (RMSNorm) or (x - mean) * r (LayerNorm).
template <NormKind kKind, bool kStaged>
__global__ void norm_kernel(const float* x, float* y, int64_t H, float eps) {
  pdl_launch_dependents();
  pdl_wait();
  extern __shared__ float row_smem[];
  const float* xr = load_row<kStaged>(x + blockIdx.x * H, H, row_smem);
  float* yr = y + blockIdx.x * H;
  const float r = norm_inv_scale<kKind>(xr, yr, H, eps);
  const float* src = is_layer_norm(kKind) ? yr : xr;  // each thread reads back only what it wrote
  for (int64_t j = threadIdx.x; j < H; j += kNormThreads) yr[j] = __fmul_rn(src[j], r);
}

// The columns one CTA of norm_gamma_q8_kernel quantizes: a chunk of 256 per warp.
constexpr int64_t kNormQ8CtaCols = (kNormThreads / 32) * 256;

// RMSNorm, γ and the activation quantizer of a hidden state: CTA (k, g) of the
// grid [t, ceil(pitch / 2048)] computes token k's statistic over the whole row
// (every CTA of the token the same bits), then y = (x r) γ -- the norm's and
// mul_rows' two roundings -- over its 2,048 columns, written to y and
// quantized as quantize_q8_kernel does, a chunk of 256 per warp. A long row is
// thus quantized by several CTAs at once (one CTA quantizing all 26 chunks of
// a 6,656-column row serially made the seed head's call 2.5 µs slower than
// the three kernels apart). γ depends on no earlier node, so the CTA's part
// is staged before the wait (a strided read of it after the wait is what made
// an earlier norm + γ kernel slower). With kStaged the row ([H]) and the γ part
// live in shared memory, else both are read in place.
template <NormKind kKind, bool kStaged, Q8Kind kQ>
__global__ void norm_gamma_q8_kernel(const float* x, float* y, const float* gamma, int64_t H, float eps, int8_t* xq,
                                     uint8_t* meta, uint8_t* meta_f16, int64_t pitch, int64_t per_token) {
  static_assert(kKind == NormKind::RmsGgml || kKind == NormKind::RmsCanon, "RMSNorm only: its statistic reads x alone");
  pdl_launch_dependents();
  extern __shared__ float row_smem[];
  const int64_t c0 = (int64_t)blockIdx.y * kNormQ8CtaCols, c1 = min(H, c0 + kNormQ8CtaCols);
  float* gs = row_smem + H;  // γ[c0, c1) when staged
  if (kStaged) {  // H % 4 == 0 and 16-byte aligned: the launcher stages only then (c0 is a multiple of 2,048)
    const float4* g4 = reinterpret_cast<const float4*>(gamma + c0);
#pragma unroll 4
    for (int64_t j = threadIdx.x; j < (c1 - c0) / 4; j += kNormThreads) reinterpret_cast<float4*>(gs)[j] = g4[j];
    // (load_row's barrier below orders these writes before any read)
  }
  pdl_wait();
  const float* xr = load_row<kStaged>(x + blockIdx.x * H, H, row_smem);
  float* yr = y + blockIdx.x * H;
  const float r = norm_inv_scale<kKind>(xr, yr, H, eps);  // every read of xr is done when it returns
#pragma unroll 8
  for (int64_t j = c0 + threadIdx.x; j < c1; j += kNormThreads) {
    const float v = __fmul_rn(__fmul_rn(xr[j], r), kStaged ? gs[j - c0] : gamma[j]);
    yr[j] = v;
    if (kStaged) row_smem[j] = v;  // in place: thread j alone reads and writes column j here
  }
  __syncthreads();  // the row (shared memory, or y: global writes of the CTA) before the quantizer reads it
  const float* row = kStaged ? row_smem : yr;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t chunk = c0 / 256 + warp;
  if (chunk * 256 < pitch) quantize_q8_chunk<kQ>(row, H, pitch, chunk, blockIdx.x, lane, xq, meta, meta_f16, per_token);
}

__global__ void mul_rows_kernel(float* y, const float* v, int64_t n, int rows) {
  pdl_launch_dependents();
  pdl_wait();
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float vi = v[i];
    for (int k = 0; k < rows; ++k) y[k * n + i] = __fmul_rn(y[k * n + i], vi);
  }
}

// ---- launchers ----

constexpr int64_t kStagedRowBytes = 48 * 1024;  // rows up to 12,288 floats are staged (no opt-in needed)

// Launches the kernel with the row in shared memory when it fits, else reading it in place.
template <NormKind kKind>
void launch_norm(const char* what, const float* x, float* y, int64_t H, int t, float eps, cudaStream_t s) {
  const int64_t row_bytes = H * (int64_t)sizeof(float);
  if (row_bytes <= kStagedRowBytes)
    launch_pdl(norm_kernel<kKind, true>, dim3(t), dim3(kNormThreads), (size_t)row_bytes, s, what, x, y, H, eps);
  else
    launch_pdl(norm_kernel<kKind, false>, dim3(t), dim3(kNormThreads), 0, s, what, x, y, H, eps);
}

void launch_rms_norm(const float* x, float* y, int64_t H, int t, float eps, NormOrder order, cudaStream_t s) {
  if (order == NormOrder::Ggml) launch_norm<NormKind::RmsGgml>("rms_norm", x, y, H, t, eps, s);
  else launch_norm<NormKind::RmsCanon>("rms_norm", x, y, H, t, eps, s);
}

void launch_layer_norm(const float* x, float* y, int64_t H, int t, float eps, NormOrder order, cudaStream_t s) {
  if (order == NormOrder::Ggml) launch_norm<NormKind::LayerGgml>("layer_norm", x, y, H, t, eps, s);
  else launch_norm<NormKind::LayerCanon>("layer_norm", x, y, H, t, eps, s);
}

void launch_mul_rows(float* y, const float* v, int64_t n, int rows, cudaStream_t s) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 4096);
  if (n > 0 && rows > 0)
    launch_pdl(mul_rows_kernel, dim3((unsigned)blocks), dim3(threads), 0, s, "mul_rows", y, v, n, rows);
}

// the row and the CTA's γ part staged up to 22,528 columns (every data-center
// GPU muser builds for opts in to 96 KB a CTA)
constexpr int64_t kStagedRowAndGammaBytes = 96 * 1024;

template <NormKind kKind, Q8Kind kQ>
void launch_norm_gamma_q8(const float* x, float* y, const float* gamma, int64_t H, int t, float eps,
                          const Q8ActsOut& o, cudaStream_t s) {
  const dim3 grid((unsigned)t, (unsigned)((o.pitch + kNormQ8CtaCols - 1) / kNormQ8CtaCols));
  const int64_t smem = (H + std::min(H, kNormQ8CtaCols)) * (int64_t)sizeof(float);
  const bool aligned = H % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0 &&
                       (reinterpret_cast<uintptr_t>(gamma) & 15) == 0;
  if (aligned && smem <= kStagedRowAndGammaBytes) {
    if (smem > 48 * 1024)
      check(cudaFuncSetAttribute(norm_gamma_q8_kernel<kKind, true, kQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem),
            "cudaFuncSetAttribute(rms_norm_gamma_q8 shared memory)");
    launch_pdl(norm_gamma_q8_kernel<kKind, true, kQ>, grid, dim3(kNormThreads), (size_t)smem, s, "rms_norm_gamma_q8",
               x, y, gamma, H, eps, o.xq, o.meta, o.meta_f16, o.pitch, o.per_token);
  } else {
    launch_pdl(norm_gamma_q8_kernel<kKind, false, kQ>, grid, dim3(kNormThreads), 0, s, "rms_norm_gamma_q8", x, y,
               gamma, H, eps, o.xq, o.meta, o.meta_f16, o.pitch, o.per_token);
  }
}

template <NormKind kKind>
void launch_norm_gamma_q8_kind(const float* x, float* y, const float* gamma, int64_t H, int t, float eps,
                               uint32_t type, const Q8ActsOut& o, cudaStream_t s) {
  switch (q8_kind(type)) {
    case Q8Kind::Sum32: launch_norm_gamma_q8<kKind, Q8Kind::Sum32>(x, y, gamma, H, t, eps, o, s); break;
    case Q8Kind::Sum16: launch_norm_gamma_q8<kKind, Q8Kind::Sum16>(x, y, gamma, H, t, eps, o, s); break;
    case Q8Kind::Q80: launch_norm_gamma_q8<kKind, Q8Kind::Q80>(x, y, gamma, H, t, eps, o, s); break;
  }
}

}  // namespace

// ---- checked entries ----

void rms_norm_gamma_q8(const float* x, float* y, const float* gamma, int64_t H, int t, float eps, NormOrder order,
                       uint32_t type, void* scratch, cudaStream_t stream) {
  if (!is_q8_type(type) || H % q8_meta_cols(q8_kind(type)) != 0)
    throw DeviceError("rms_norm_gamma_q8: no q8 quantizer for this weight type and H=" + std::to_string(H));
  const Q8ActsOut o = q8_acts_out(type, H, t, scratch);
  if (order == NormOrder::Ggml) launch_norm_gamma_q8_kind<NormKind::RmsGgml>(x, y, gamma, H, t, eps, type, o, stream);
  else launch_norm_gamma_q8_kind<NormKind::RmsCanon>(x, y, gamma, H, t, eps, type, o, stream);
  check_launch(order == NormOrder::Ggml ? "rms_norm_gamma_q8_ggml" : "rms_norm_gamma_q8_canon");
}

void rms_norm(const float* x, float* y, int64_t H, int t, float eps, NormOrder order, cudaStream_t stream) {
  launch_rms_norm(x, y, H, t, eps, order, stream);
  check_launch(order == NormOrder::Ggml ? "rms_norm_ggml" : "rms_norm_canon");
}

void layer_norm(const float* x, float* y, int64_t H, int t, float eps, NormOrder order, cudaStream_t stream) {
  launch_layer_norm(x, y, H, t, eps, order, stream);
  check_launch(order == NormOrder::Ggml ? "layer_norm_ggml" : "layer_norm_canon");
}

void mul_rows(float* y, const float* v, int64_t n, int rows, cudaStream_t stream) {
  launch_mul_rows(y, v, n, rows, stream);
  check_launch("mul_rows");
}

}  // namespace muser::cuda
