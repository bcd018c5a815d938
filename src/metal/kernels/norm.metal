// The final norms, one token row per 32-thread threadgroup (one SIMD group):
// lane l owns the elements l + 32 s (muser/norm.h), the lanes' sums are joined
// by the canonical butterfly (common.h), then every lane scales its own
// elements, times gamma in the same pass when the norm and gamma are fused
// (y = (x * r) * gamma, the two nodes' bytes).
//   rms_norm_canon_f32 / layer_norm_canon_f32: the canonical order
//   rms_norm_f32 / layer_norm_f32: the ggml order as Metal can run it, f32
//     sums of rounded squares (no double on Apple GPUs; docs/numerics.md)
//   mul_gamma_f32: y *= gamma alone (a route run with fuse=False)
// Buffers: 0 NormKargs, 1 x [t x ld], 2 y [t x ld], 3 gamma [n].
// Grid: t threadgroups of 32 (norms); n * t threads (mul_gamma_f32).
#include "common.h"
#include "muser/norm.h"

using namespace muser;

namespace {

enum NormKind { kRmsCanon, kRmsF32, kLayerCanon, kLayerF32 };

template <int kKind>
void norm_row(constant NormKargs& a, device const float* x, device float* y, device const float* gamma, uint lane) {
  const bool layer = kKind == kLayerCanon || kKind == kLayerF32;
  float mean = 0.0f, ss;
  if (layer) mean = simd_canon_tree(lane_sum(x, a.n, (int)lane), lane) / (float)a.n;
  if (kKind == kRmsCanon) ss = lane_sum_squares_fma(x, a.n, (int)lane);
  else if (kKind == kLayerCanon) ss = lane_sum_dev_squares_fma(x, a.n, mean, (int)lane);
  else ss = lane_sum_squares_rounded(x, a.n, mean, (int)lane);
  const float r = norm_inv_rms(simd_canon_tree(ss, lane), a.n, a.eps);
  for (int64_t j = lane; j < a.n; j += 32) {
    const float v = layer ? x[j] - mean : x[j];
    const float n = v * r;
    y[j] = a.gamma ? n * gamma[j] : n;
  }
}

}  // namespace

// Each kernel spelled out: the emulator finds a library's kernels by their MUSER_KERNEL(name, ...) lines.
#define MUSER_NORM_ARGS                                                                              \
  MUSER_ARG_CONSTANT(NormKargs, a, 0), MUSER_ARG_BUFFER_IN(float, x, 1), MUSER_ARG_BUFFER_OUT(float, y, 2), \
      MUSER_ARG_BUFFER_IN(float, gamma, 3), MUSER_ARG_TGID(row), MUSER_ARG_LANE(lane)
#define MUSER_NORM_CALL(kind) norm_row<kind>(a, x + (int64_t)row * a.ld, y + (int64_t)row * a.ld, gamma, lane)

MUSER_KERNEL(rms_norm_canon_f32, MUSER_NORM_ARGS) { MUSER_NORM_CALL(kRmsCanon); }
MUSER_KERNEL(rms_norm_f32, MUSER_NORM_ARGS) { MUSER_NORM_CALL(kRmsF32); }
MUSER_KERNEL(layer_norm_canon_f32, MUSER_NORM_ARGS) { MUSER_NORM_CALL(kLayerCanon); }
MUSER_KERNEL(layer_norm_f32, MUSER_NORM_ARGS) { MUSER_NORM_CALL(kLayerF32); }

// y[k * ld + i] *= gamma[i], one element per thread.
MUSER_KERNEL(mul_gamma_f32, MUSER_ARG_CONSTANT(NormKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, y, 2),
             MUSER_ARG_BUFFER_IN(float, gamma, 3), MUSER_ARG_TID(pos)) {
  const int64_t c = (int64_t)pos % a.n, k = (int64_t)pos / a.n;
  if (k >= a.t) return;
  y[k * a.ld + c] = y[k * a.ld + c] * gamma[c];
}
