// The canonical epilogue (canon_epilogue / canon_tanh of muser/canonical.h)
// and the canonical logsumexp tile (lse_tile of muser/logsumexp.h) on SIMD
// registers, written once over a small vector interface V and instantiated
// by epilogue_*.cpp and logsumexp_*.cpp (the V of each ISA: cpu/canon_ops_*.h,
// the NEON one in logsumexp_neon.cpp). Both branches of
// canon_tanh are computed for every lane and the lane's own branch is
// selected, so each lane performs exactly the scalar definition's operations
// in the scalar order: the result is bit-equal (tests compare every twin
// with the scalar one over millions of inputs, NaN and infinities included).
// The polynomials and their coefficients are canonical.h's own templates,
// instantiated on V.
//
// V provides: F (register), kLanes, set1, load, store, add, sub, mul, div,
// fma (one rounding), fnma (-(a*b)+c, one rounding = fma(-a, b, c)),
// abs_bits / sign_bits / or_bits, lt (mask a < b), eq (mask a == b), isnan
// (mask), select (mask ? a : b), exp2i (2^n for integer-valued n, from the
// bits). Comparisons are IEEE's ordered ones (false when a NaN is involved),
// as C++'s < and == are.
//
// Internal linkage: each including file is compiled for its own ISA.
#pragma once
#include <cstdint>
#include <cstring>

#include "muser/canonical.h"
#include "muser/logsumexp.h"

namespace muser::cpu {
namespace {

template <class V>
inline typename V::F canon_tanh_v(typename V::F u) {
  using F = typename V::F;
  const F a = V::abs_bits(u);
  const F small = canon_tanh_small<V>(a);  // |u| < 0.625
  // |u| < 9.1: 1 - 2 / (e^(2|u|) + 1), e^y = P(r) * 2^n
  const F y = V::add(a, a);
  const F n = canon_exp_n<V>(y);
  const F e = V::mul(canon_exp_poly<V>(y, n), V::exp2i(n));
  const F mid = canon_tanh_mid<V>(e);
  const F one = V::set1(1.0f);
  const F t = V::select(V::lt(a, V::set1(kCanonTanhSmall)), small,
                        V::select(V::lt(a, V::set1(kCanonTanhOne)), mid, one));
  return V::select(V::isnan(a), u, V::or_bits(t, V::sign_bits(u)));
}

// y[i] = canon_epilogue(y[i], scale, cap, inv_cap) for i < n.
template <class V>
void softcap_canon_v(float* y, int64_t n, float scale, float cap, float inv_cap) {
  using F = typename V::F;
  const F s = V::set1(scale), c = V::set1(cap), ic = V::set1(inv_cap);
  const bool capped = cap > 0.0f;
  auto one = [&](F v) {
    v = V::mul(v, s);
    return capped ? V::mul(c, canon_tanh_v<V>(V::mul(v, ic))) : v;
  };
  int64_t i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) V::store(y + i, one(V::load(y + i)));
  if (i < n) {  // the tail through a padded copy: no access past the end
    float pad[V::kLanes] = {};
    memcpy(pad, y + i, (size_t)(n - i) * sizeof(float));
    V::store(pad, one(V::load(pad)));
    memcpy(y + i, pad, (size_t)(n - i) * sizeof(float));
  }
}


// canon_exp_nonpos on registers: the scalar's n, r, P(r) and 2^n for every
// lane, then the scalar's early returns as selects (NaN: x itself; below
// kCanonExpMin, -inf included: 0). The lanes that select them computed
// garbage from a garbage n, never used.
template <class V>
inline typename V::F canon_exp_nonpos_v(typename V::F x) {
  using F = typename V::F;
  const F n = canon_exp_n<V>(x);
  const F e = V::mul(canon_exp_poly<V>(x, n), V::exp2i(n));
  return V::select(V::isnan(x), x, V::select(V::lt(x, V::set1(kCanonExpMin)), V::set1(0.0f), e));
}

// lse_push on registers, lane by lane: the larger-logit branch (v > m:
// (v, fma(s, e^(m - v), 1))) and the other (s + e^(v - m)) with the one exp
// their lane needs, selected per lane; v = -inf keeps (m, s) as it is; a NaN
// v fails v > m and adds NaN to s, as in the scalar.
template <class V>
inline void lse_push_v(typename V::F& m, typename V::F& s, typename V::F v) {
  using F = typename V::F;
  const auto up = V::lt(m, v);
  const F e = canon_exp_nonpos_v<V>(V::select(up, V::sub(m, v), V::sub(v, m)));
  const F grown = V::select(up, V::fma(s, e, V::set1(1.0f)), V::add(s, e));
  s = V::select(V::eq(v, V::set1(lse_neg_inf())), s, grown);
  m = V::select(up, v, m);  // v > m is false for -inf and NaN
}

// lse_tile's lanes on registers: the 32 canonical lanes are kCanonLanes /
// V::kLanes registers (register k holds lanes k * kLanes ...), so lane l
// still takes ids l, l + 32, ... in increasing order; a short last group of
// 32 is padded with -inf, which lse_push leaves out. Writes the 32 lane pairs;
// the caller joins them with the scalar lse_join_lanes, compiled for the
// baseline ISA like the scalar lse_tile (a tree compiled here would fuse its
// fmaf into an FMA instruction whose choice between two NaN operands is not
// libm's: the bits would differ for rows with NaN).
template <class V>
void lse_lanes_v(const float* v, int n, LsePair* lane) {
  using F = typename V::F;
  constexpr int kRegs = kCanonLanes / V::kLanes;
  static_assert(kRegs * V::kLanes == kCanonLanes, "the lanes must fill whole registers");
  F m[kRegs], s[kRegs];
  for (int k = 0; k < kRegs; ++k) {
    m[k] = V::set1(lse_neg_inf());
    s[k] = V::set1(0.0f);
  }
  int i = 0;
  for (; i + kCanonLanes <= n; i += kCanonLanes)
    for (int k = 0; k < kRegs; ++k) lse_push_v<V>(m[k], s[k], V::load(v + i + k * V::kLanes));
  if (i < n) {  // the tail through a padded copy: no access past the end
    float pad[kCanonLanes];
    for (float& p : pad) p = lse_neg_inf();
    memcpy(pad, v + i, (size_t)(n - i) * sizeof(float));
    for (int k = 0; k < kRegs; ++k) lse_push_v<V>(m[k], s[k], V::load(pad + k * V::kLanes));
  }
  float lm[kCanonLanes], ls[kCanonLanes];
  for (int k = 0; k < kRegs; ++k) {
    V::store(lm + k * V::kLanes, m[k]);
    V::store(ls + k * V::kLanes, s[k]);
  }
  for (int l = 0; l < kCanonLanes; ++l) lane[l] = LsePair{lm[l], ls[l]};
}

// y[i] = canon_exp_nonpos(x[i]) for i < n (a short tail through a padded copy).
template <class V>
void exp_nonpos_v(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) V::store(y + i, canon_exp_nonpos_v<V>(V::load(x + i)));
  if (i < n) {
    float pad[V::kLanes] = {};
    memcpy(pad, x + i, (size_t)(n - i) * sizeof(float));
    V::store(pad, canon_exp_nonpos_v<V>(V::load(pad)));
    memcpy(y + i, pad, (size_t)(n - i) * sizeof(float));
  }
}

}  // namespace
}  // namespace muser::cpu
