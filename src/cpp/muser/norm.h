// The final norms as one lane of a 32-lane SIMD group computes them (one
// group per token row; the lanes' partials joined by canon_join's tree, after
// which every lane holds the row's sum). Lane l owns the elements
// j = l + 32 s, as in the canonical dot product (docs/numerics.md).
//
//   canonical RMSNorm:  ss = canonical dot of x with itself (fmaf per lane);
//                       r = 1 / sqrtf(ss / n + eps); y = (x * r) [* gamma]
//   canonical LayerNorm: mean = (lane sums of x, +) / n; the deviations
//                       v = x - mean; var = canonical dot of v with itself / n;
//                       y = (v * r) [* gamma]
//   f32 "ggml" order (backends without double: Metal): ggml's CPU sums the
//                       f32-rounded squares in double; here they are summed
//                       in f32 lane sums (the square rounded, then added: no
//                       fma) joined by the tree, and the mean is ss / (float)n.
//                       Not bit-equal to the CPU's double sum (docs/numerics.md
//                       bounds the difference).
// Rows are pointer template arguments (any address space).
#pragma once
#include "platform.h"

namespace muser {

// acc = fmaf(x[j], x[j], acc) over the lane's elements.
template <class X>
MUSER_HD float lane_sum_squares_fma(X x, int64_t n, int lane) {
  float acc = 0.0f;
  for (int64_t j = lane; j < n; j += 32) acc = fmaf(x[j], x[j], acc);
  return acc;
}

// acc = fmaf(x[j] - mean, x[j] - mean, acc): the deviations' canonical dot.
template <class X>
MUSER_HD float lane_sum_dev_squares_fma(X x, int64_t n, float mean, int lane) {
  float acc = 0.0f;
  for (int64_t j = lane; j < n; j += 32) {
    const float v = x[j] - mean;
    acc = fmaf(v, v, acc);
  }
  return acc;
}

// acc = acc + x[j].
template <class X>
MUSER_HD float lane_sum(X x, int64_t n, int lane) {
  float acc = 0.0f;
  for (int64_t j = lane; j < n; j += 32) acc = acc + x[j];
  return acc;
}

// The f32 "ggml" order: each square (or squared deviation) rounded, then added.
template <class X>
MUSER_HD float lane_sum_squares_rounded(X x, int64_t n, float mean, int lane) {
  float acc = 0.0f;
  for (int64_t j = lane; j < n; j += 32) {
    const float v = x[j] - mean;
    const float p = v * v;
    acc = acc + p;
  }
  return acc;
}

// 1 / sqrt(sum / n + eps), each operation correctly rounded.
MUSER_HD float norm_inv_rms(float sum, int64_t n, float eps) {
  const float mean = sum / (float)n;
  return 1.0f / sqrtf(mean + eps);
}

}  // namespace muser
