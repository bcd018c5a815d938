// The final norms, one token row per 32-thread threadgroup (one SIMD group):
// lane l owns the elements l + 32 s (muser/norm.h), the lanes' sums are joined
// by the canonical butterfly (common.h), then every lane scales its own
// elements, times gamma in the same pass when the norm and gamma are fused
// (y = (x * r) * gamma, the two nodes' bytes).
//   rms_norm_canon_f32 / layer_norm_canon_f32: the canonical order
//   rms_norm_f32 / layer_norm_f32: the ggml order as Metal can run it, f32
//     sums of rounded squares (no double on Apple GPUs; docs/numerics.md)
//   mul_gamma_f32: y *= gamma alone (a route run with fuse=False)
// Buffers: 0 NormKargs, 1 x [t x ld], 2 y [t x ld], 3 gamma [n]; grid: t threadgroups.
#include "common.h"
#include "muser/norm.h"

using namespace muser;

namespace {

enum NormKind { kRmsCanon, kRmsF32, kLayerCanon, kLayerF32 };

template <int kKind>
void norm_row(constant NormKargs& a, device const float* x, device float* y, device const float* gamma,
              ushort lane) {
  float mean = 0.0f, ss;
  if (kKind == kLayerCanon || kKind == kLayerF32) mean = simd_canon_tree(lane_sum(x, a.n, lane), lane) / (float)a.n;
  if (kKind == kRmsCanon) ss = lane_sum_squares_fma(x, a.n, lane);
  else if (kKind == kLayerCanon) ss = lane_sum_dev_squares_fma(x, a.n, mean, lane);
  else ss = lane_sum_squares_rounded(x, a.n, mean, lane);
  const float r = norm_inv_rms(simd_canon_tree(ss, lane), a.n, a.eps);
  const bool layer = kKind == kLayerCanon || kKind == kLayerF32;
  for (int64_t j = lane; j < a.n; j += 32) {
    const float v = layer ? x[j] - mean : x[j];
    const float n = v * r;
    y[j] = a.gamma ? n * gamma[j] : n;
  }
}

}  // namespace

template <int kKind>
kernel void norm_f32(constant NormKargs& a [[buffer(0)]], device const float* x [[buffer(1)]],
                     device float* y [[buffer(2)]], device const float* gamma [[buffer(3)]],
                     uint row [[threadgroup_position_in_grid]], ushort lane [[thread_index_in_simdgroup]]) {
  norm_row<kKind>(a, x + (int64_t)row * a.ld, y + (int64_t)row * a.ld, gamma, lane);
}

typedef decltype(norm_f32<kRmsCanon>) norm_t;
MUSER_KERNEL_INSTANCE("rms_norm_canon_f32", norm_t, norm_f32<kRmsCanon>)
MUSER_KERNEL_INSTANCE("rms_norm_f32", norm_t, norm_f32<kRmsF32>)
MUSER_KERNEL_INSTANCE("layer_norm_canon_f32", norm_t, norm_f32<kLayerCanon>)
MUSER_KERNEL_INSTANCE("layer_norm_f32", norm_t, norm_f32<kLayerF32>)

// y[k * ld + i] *= gamma[i], one element per thread; grid: n * t threads.
kernel void mul_gamma_f32(constant NormKargs& a [[buffer(0)]], device float* y [[buffer(2)]],
                          device const float* gamma [[buffer(3)]], uint pos [[thread_position_in_grid]]) {
  const int64_t c = (int64_t)pos % a.n, k = (int64_t)pos / a.n;
  if (k >= a.t) return;
  y[k * a.ld + c] = y[k * a.ld + c] * gamma[c];
}
