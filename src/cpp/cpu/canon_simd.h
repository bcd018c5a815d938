// The canonical epilogue (canon_epilogue / canon_tanh of muser/canonical.h)
// on SIMD registers, written once over a small vector interface V and
// instantiated by epilogue_avx512.cpp and epilogue_avx2.cpp. Both branches of
// canon_tanh are computed for every lane and the lane's own branch is
// selected, so each lane performs exactly the scalar definition's operations
// in the scalar order: the result is bit-equal (tests compare every twin
// with the scalar one over millions of inputs, NaN and infinities included).
// The polynomials and their coefficients are canonical.h's own templates,
// instantiated on V.
//
// V provides: F (register), kLanes, set1, load, store, add, sub, mul, div,
// fma (one rounding), fnma (-(a*b)+c, one rounding = fma(-a, b, c)),
// abs_bits / sign_bits / or_bits, lt (mask a < b), isnan (mask), select
// (mask ? a : b), exp2i (2^n for integer-valued n, from the bits).
//
// Internal linkage: each including file is compiled for its own ISA.
#pragma once
#include <cstdint>
#include <cstring>

#include "muser/canonical.h"

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

}  // namespace
}  // namespace muser::cpu
