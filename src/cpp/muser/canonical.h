// muser's canonical arithmetic: the fixed reduction order and the tanh that
// make the `canonical` route bit-identical on every backend, for every batch
// size and thread count. docs/numerics.md is the specification; this header
// is its one implementation, compiled as host C++, CUDA and Metal code.
//
// Only IEEE-exact operations appear here: +, -, *, fmaf, /, sqrtf and bit
// manipulation. Every fused multiply-add is written as fmaf(); every other
// product and sum is a separate, individually rounded operation, so the
// translation units that include this header must be built without
// floating-point contraction (-ffp-contract=off, nvcc --fmad=false, Metal
// with fast math off).
//
// The tanh's polynomial pieces are templates over an operations type V
// (float_ops.h): the scalar code here runs them on floats, the SIMD twins
// (cpu/canon_simd.h) on registers; the coefficients exist once, below.
#pragma once
#include "float_ops.h"
#include "quant_blocks.h"

namespace muser {

// A dot product of length K is split over 32 lanes: lane l owns the elements
// j with j % 32 == l and accumulates them in increasing j with
// acc = fmaf(w[j], x[j], acc), starting from +0. The 32 partial sums are then
// joined by the butterfly tree below (a CUDA warp's shuffle-down, a Metal
// simdgroup's, or two AVX-512 registers folded in halves).
MUSER_CONSTANT constexpr int kCanonLanes = 32;

// ---- the coefficients of canon_exp_pos and canon_tanh (the only copy) ----
MUSER_CONSTANT constexpr float kCanonRoundMagic = 12582912.0f;  // 1.5 * 2^23
MUSER_CONSTANT constexpr float kCanonLog2e = 1.44269502f;
MUSER_CONSTANT constexpr float kCanonLn2Hi = 0.693145752f;      // 0x3f317200: 16 significant bits, n*ln2_hi exact
MUSER_CONSTANT constexpr float kCanonLn2Lo = 1.42860677e-06f;   // ln2 - ln2_hi
// e^r ~ P(r) on |r| <= ln2/2, Horner from the top (1/720, 1/120, 1/24, 1/6, 1/2, 1, 1)
MUSER_CONSTANT constexpr float kCanonExpP6 = 1.38888889e-03f;
MUSER_CONSTANT constexpr float kCanonExpP5 = 8.33333377e-03f;
MUSER_CONSTANT constexpr float kCanonExpP4 = 4.16666679e-02f;
MUSER_CONSTANT constexpr float kCanonExpP3 = 1.66666672e-01f;
MUSER_CONSTANT constexpr float kCanonExpP2 = 0.5f;
MUSER_CONSTANT constexpr float kCanonExpP1 = 1.0f;
MUSER_CONSTANT constexpr float kCanonExpP0 = 1.0f;
// tanh(a) ~ a + a^3 Q(a^2) on a < kCanonTanhSmall, Q a degree-4 minimax fit, from the top
MUSER_CONSTANT constexpr float kCanonTanhQ4 = -5.71856787e-03f;
MUSER_CONSTANT constexpr float kCanonTanhQ3 = 2.06527356e-02f;
MUSER_CONSTANT constexpr float kCanonTanhQ2 = -5.37445210e-02f;
MUSER_CONSTANT constexpr float kCanonTanhQ1 = 1.33315101e-01f;
MUSER_CONSTANT constexpr float kCanonTanhQ0 = -3.33332837e-01f;
MUSER_CONSTANT constexpr float kCanonTanhSmall = 0.625f;  // below: the polynomial
MUSER_CONSTANT constexpr float kCanonTanhOne = 9.1f;      // from here on: +-1 (tanh rounds to 1 beyond 9.01)
// e^x for x <= 0 underflows past this (e^-87.3 ~ FLT_MIN): 0 below it
MUSER_CONSTANT constexpr float kCanonExpMin = -87.3f;
// log(1 + f) = 2u + 2u z Q(z), u = f / (2 + f), z = u^2, |u| <= 0.1716; Q's
// terms are atanh's series 1/3, 1/5, ..., from the top
MUSER_CONSTANT constexpr float kCanonLogQ4 = 9.09090936e-02f;  // 1/11
MUSER_CONSTANT constexpr float kCanonLogQ3 = 1.11111112e-01f;  // 1/9
MUSER_CONSTANT constexpr float kCanonLogQ2 = 1.42857149e-01f;  // 1/7
MUSER_CONSTANT constexpr float kCanonLogQ1 = 2.00000003e-01f;  // 1/5
MUSER_CONSTANT constexpr float kCanonLogQ0 = 3.33333343e-01f;  // 1/3
MUSER_CONSTANT constexpr float kCanonSqrt2 = 1.41421354f;

// Join 32 lane partials: for offset 16, 8, 4, 2, 1: a[l] = a[l] + a[l + offset].
template <class P>
MUSER_HD float canon_tree32(P a) {
  for (int off = kCanonLanes / 2; off >= 1; off >>= 1)
    for (int l = 0; l < off; ++l) a[l] = a[l] + a[l + off];
  return a[0];
}

// Round-to-nearest-even of |y| < 2^22 with two additions (no rint needed).
template <class V = F32Ops>
MUSER_HD typename V::F canon_round(typename V::F y) {
  const typename V::F magic = V::set1(kCanonRoundMagic);
  return V::sub(V::add(y, magic), magic);
}

// e^y = P(r) * 2^n for 0 <= y <= 20: n = round(y log2e) (canon_exp_n), then
// r = y - n ln2 in two exact-product steps and the degree-6 P(r) (canon_exp_poly).
template <class V = F32Ops>
MUSER_HD typename V::F canon_exp_n(typename V::F y) {
  return canon_round<V>(V::mul(y, V::set1(kCanonLog2e)));
}
template <class V = F32Ops>
MUSER_HD typename V::F canon_exp_poly(typename V::F y, typename V::F n) {
  typename V::F r = V::fnma(n, V::set1(kCanonLn2Hi), y);
  r = V::fnma(n, V::set1(kCanonLn2Lo), r);
  typename V::F p = V::set1(kCanonExpP6);
  p = V::fma(p, r, V::set1(kCanonExpP5));
  p = V::fma(p, r, V::set1(kCanonExpP4));
  p = V::fma(p, r, V::set1(kCanonExpP3));
  p = V::fma(p, r, V::set1(kCanonExpP2));
  p = V::fma(p, r, V::set1(kCanonExpP1));
  p = V::fma(p, r, V::set1(kCanonExpP0));
  return p;
}

MUSER_HD float canon_exp_pos(float y) {
  const float n = canon_exp_n(y);
  const float p = canon_exp_poly(y, n);
  const float two_n = bits_to_f32((uint32_t)((int)n + 127) << 23);
  return p * two_n;
}

// e^x for x <= 0 (the logsumexp terms): the same n, r and P as canon_exp_pos,
// 2^n built in the exponent bits (n >= -126); 0 below kCanonExpMin and for
// -inf; NaN propagates.
MUSER_HD float canon_exp_nonpos(float x) {
  if (!(x == x)) return x;
  if (x < kCanonExpMin) return 0.0f;
  const float n = canon_exp_n(x);
  const float p = canon_exp_poly(x, n);
  return p * bits_to_f32((uint32_t)((int)n + 127) << 23);
}

// log(s) for s >= 1 (a logsumexp's sum: its largest term is e^0): s = 2^e m
// with 1/sqrt2 <= m < sqrt2 (the halving and m - 1 are exact), then
// e ln2 (the two-part constant, e ln2_hi exact) + log(1 + f). NaN and +inf
// propagate.
MUSER_HD float canon_log(float s) {
  if (!(s == s) || s > 3.40282347e38f) return s;
  const uint32_t b = f32_to_bits(s);
  int e = (int)((b >> 23) & 0xffu) - 127;
  float m = bits_to_f32((b & 0x007fffffu) | 0x3f800000u);
  if (m > kCanonSqrt2) {
    m = m * 0.5f;
    e += 1;
  }
  const float f = m - 1.0f;
  const float u = f / (2.0f + f);
  const float z = u * u;
  float q = kCanonLogQ4;
  q = fmaf(q, z, kCanonLogQ3);
  q = fmaf(q, z, kCanonLogQ2);
  q = fmaf(q, z, kCanonLogQ1);
  q = fmaf(q, z, kCanonLogQ0);
  const float two_u = u + u;
  const float log_1p = fmaf(two_u * z, q, two_u);
  const float ef = (float)e;
  return fmaf(ef, kCanonLn2Hi, fmaf(ef, kCanonLn2Lo, log_1p));
}

// tanh(a) for 0 <= a < kCanonTanhSmall: a + a^3 * Q(a^2).
template <class V = F32Ops>
MUSER_HD typename V::F canon_tanh_small(typename V::F a) {
  const typename V::F z = V::mul(a, a);
  typename V::F q = V::set1(kCanonTanhQ4);
  q = V::fma(q, z, V::set1(kCanonTanhQ3));
  q = V::fma(q, z, V::set1(kCanonTanhQ2));
  q = V::fma(q, z, V::set1(kCanonTanhQ1));
  q = V::fma(q, z, V::set1(kCanonTanhQ0));
  return V::fma(V::mul(z, a), q, a);
}
// tanh(a) for kCanonTanhSmall <= a < kCanonTanhOne from e = e^(2a): 1 - 2 / (e + 1).
template <class V = F32Ops>
MUSER_HD typename V::F canon_tanh_mid(typename V::F e) {
  const typename V::F one = V::set1(1.0f);
  return V::sub(one, V::div(V::set1(2.0f), V::add(e, one)));
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
  if (a < kCanonTanhSmall) {
    t = canon_tanh_small(a);
  } else if (a < kCanonTanhOne) {
    t = canon_tanh_mid(canon_exp_pos(a + a));
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
