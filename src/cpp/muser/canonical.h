// muser's canonical arithmetic: the fixed reduction order and the tanh that
// make the `canonical` route bit-identical on every backend, for every batch
// size and thread count. docs/numerics.md is the specification; this header
// is its one implementation, compiled as host C++ and as CUDA device code.
//
// Only IEEE-exact operations appear here: +, -, *, fmaf, /, sqrtf and bit
// manipulation. Every fused multiply-add is written as fmaf(); every other
// product and sum is a separate, individually rounded operation, so the
// translation units that include this header must be built without
// floating-point contraction (-ffp-contract=off, nvcc --fmad=false).
#pragma once
#include <math.h>

#include "quant_blocks.h"

namespace muser {

// A dot product of length K is split over 32 lanes: lane l owns the elements
// j with j % 32 == l and accumulates them in increasing j with
// acc = fmaf(w[j], x[j], acc), starting from +0. The 32 partial sums are then
// joined by the butterfly tree below (a CUDA warp's shuffle-down, a Metal
// simdgroup's, or two AVX-512 registers folded in halves).
constexpr int kCanonLanes = 32;

// Join 32 lane partials: for offset 16, 8, 4, 2, 1: a[l] = a[l] + a[l + offset].
MUSER_HD float canon_tree32(float* a) {
  for (int off = kCanonLanes / 2; off >= 1; off >>= 1)
    for (int l = 0; l < off; ++l) a[l] = a[l] + a[l + off];
  return a[0];
}

// Round-to-nearest-even of |y| < 2^22 with two additions (no rint needed).
MUSER_HD float canon_round(float y) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  const float t = y + magic;
  return t - magic;
}

// e^y for 0 <= y <= 20: y = n ln2 + r with |r| <= ln2/2, e^r by a degree-6
// polynomial, times 2^n built exactly from its bits.
MUSER_HD float canon_exp_pos(float y) {
  const float log2e = 1.44269502f;
  const float ln2_hi = 0.693145752f;   // 0x3f317200: 16 significant bits, n*ln2_hi exact
  const float ln2_lo = 1.42860677e-06f;  // ln2 - ln2_hi
  const float n = canon_round(y * log2e);
  float r = fmaf(-n, ln2_hi, y);
  r = fmaf(-n, ln2_lo, r);
  float p = 1.38888889e-03f;  // 1/720
  p = fmaf(p, r, 8.33333377e-03f);  // 1/120
  p = fmaf(p, r, 4.16666679e-02f);  // 1/24
  p = fmaf(p, r, 1.66666672e-01f);  // 1/6
  p = fmaf(p, r, 0.5f);
  p = fmaf(p, r, 1.0f);
  p = fmaf(p, r, 1.0f);
  const float two_n = bits_to_f32((uint32_t)((int)n + 127) << 23);
  return p * two_n;
}

// tanh(u) from exact operations only, within 2 ulp of the true value (tested
// against float64 on every float in [-10, 10] by tests/cpp/test_canonical.cpp).
//   |u| < 0.625 : u + u^3 * Q(u^2), Q a degree-4 minimax fit
//   |u| < 9.1   : 1 - 2 / (e^(2|u|) + 1), sign restored
//   otherwise   : +-1 (tanh rounds to 1 in f32 beyond 9.01); NaN propagates
MUSER_HD float canon_tanh(float u) {
  const uint32_t bits = f32_to_bits(u);
  const uint32_t sign = bits & 0x80000000u;
  const float a = bits_to_f32(bits & 0x7fffffffu);
  if (!(a == a)) return u;  // NaN
  float t;
  if (a < 0.625f) {
    const float z = a * a;
    float q = -5.71856787e-03f;
    q = fmaf(q, z, 2.06527356e-02f);
    q = fmaf(q, z, -5.37445210e-02f);
    q = fmaf(q, z, 1.33315101e-01f);
    q = fmaf(q, z, -3.33332837e-01f);
    const float a3 = z * a;
    t = fmaf(a3, q, a);
  } else if (a < 9.1f) {
    const float e = canon_exp_pos(a + a);
    t = 1.0f - 2.0f / (e + 1.0f);
  } else {
    t = 1.0f;
  }
  return bits_to_f32(f32_to_bits(t) | sign);
}

// The canonical epilogue of one logit: scale, then cap * tanh(v * (1/cap)).
// inv_cap is 1/cap rounded to f32 once, on the host. cap <= 0 disables the cap.
MUSER_HD float canon_epilogue(float logit, float scale, float cap, float inv_cap) {
  const float v = logit * scale;
  if (!(cap > 0.0f)) return v;
  return cap * canon_tanh(v * inv_cap);
}

}  // namespace muser
