// Scalar CPU kernels: norms, the reference matvec and the epilogue. Their
// arithmetic is specified in docs/numerics.md; each loop is written in that
// order and nothing here may be reassociated (-ffp-contract=off). The
// canonical epilogue's SIMD twins are epilogue_avx512.cpp / epilogue_avx2.cpp.
#include "cpu/kernels.h"

#include <cmath>
#include <vector>

#include "muser/canonical.h"
#include "muser/dequant.h"

namespace muser::cpu {

float dot_canon(const float* a, const float* b, int64_t n) {
  float acc[kCanonLanes] = {};
  const int64_t full = n & ~(int64_t)(kCanonLanes - 1);
  for (int64_t s = 0; s < full; s += kCanonLanes)
    for (int l = 0; l < kCanonLanes; ++l) acc[l] = fmaf(a[s + l], b[s + l], acc[l]);
  for (int64_t l = 0; l < n - full; ++l) acc[l] = fmaf(a[full + l], b[full + l], acc[l]);
  return canon_tree32(acc);
}

void matvec_reference(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                      int64_t ldy) {
  std::vector<float> row(w.cols);
  for (int64_t r = r0; r < r1; ++r) {
    dequant_row(w.type, w.data + r * w.row_bytes, w.cols, row.data());
    for (int k = 0; k < t; ++k) {
      const float* xs = x + (int64_t)k * ldx;
      float acc = 0.0f;
      for (int64_t j = 0; j < w.cols; ++j) acc = acc + row[j] * xs[j];
      y[(int64_t)k * ldy + r] = acc;
    }
  }
}

// ggml's CPU rms_norm: squares rounded to f32, summed in double.
void rms_norm_ggml(const float* x, int64_t n, float eps, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (double)(x[i] * x[i]);
  const float mean = (float)(sum / (double)n);
  const float r = 1.0f / sqrtf(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
}

void rms_norm_canon(const float* x, int64_t n, float eps, float* y) {
  const float ss = dot_canon(x, x, n);
  const float mean = ss / (float)n;
  const float r = 1.0f / sqrtf(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
}

// ggml's CPU norm: mean in double, variance in double of f32 deviations.
void layer_norm_ggml(const float* x, int64_t n, float eps, float* y) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (double)x[i];
  const float mean = (float)(sum / (double)n);
  double var = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] - mean;
    y[i] = v;
    var += (double)(v * v);
  }
  const float variance = (float)(var / (double)n);
  const float r = 1.0f / sqrtf(variance + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * r;
}

void layer_norm_canon(const float* x, int64_t n, float eps, float* y) {
  float acc[kCanonLanes] = {};
  const int64_t full = n & ~(int64_t)(kCanonLanes - 1);
  for (int64_t s = 0; s < full; s += kCanonLanes)
    for (int l = 0; l < kCanonLanes; ++l) acc[l] = acc[l] + x[s + l];
  for (int64_t l = 0; l < n - full; ++l) acc[l] = acc[l] + x[full + l];
  const float mean = canon_tree32(acc) / (float)n;
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] - mean;
  const float var = dot_canon(y, y, n) / (float)n;
  const float r = 1.0f / sqrtf(var + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * r;
}

void scale_inplace(float* y, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) y[i] = y[i] * s;
}

void tanh_inplace(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = tanhf(y[i]);
}

void softcap_fused_inplace(float* y, int64_t n, float scale, float cap) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = y[i] * scale;
    y[i] = cap * tanhf(v / cap);
  }
}

void softcap_reference_inplace(float* y, int64_t n, float cap, float inv_cap) {
  for (int64_t i = 0; i < n; ++i) y[i] = cap * tanhf(y[i] * inv_cap);
}

void softcap_canon_scalar(float* y, int64_t n, float scale, float cap, float inv_cap) {
  for (int64_t i = 0; i < n; ++i) y[i] = canon_epilogue(y[i], scale, cap, inv_cap);
}

}  // namespace muser::cpu
