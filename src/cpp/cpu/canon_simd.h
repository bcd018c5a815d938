// The canonical epilogue (canon_epilogue / canon_tanh of muser/canonical.h)
// on SIMD registers, written once over a small vector interface V and
// instantiated by epilogue_avx512.cpp and epilogue_avx2.cpp. Both branches of
// canon_tanh are computed for every lane and the lane's own branch is
// selected, so each lane performs exactly the scalar definition's operations
// in the scalar order: the result is bit-equal (tests compare every twin
// with the scalar one over millions of inputs, NaN and infinities included).
// The constants restate canonical.h's and must stay equal to them.
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

namespace muser::cpu {
namespace {

template <class V>
inline typename V::F canon_tanh_v(typename V::F u) {
  using F = typename V::F;
  const F a = V::abs_bits(u);
  // |u| < 0.625: u + u^3 * Q(u^2)
  const F z = V::mul(a, a);
  F q = V::set1(-5.71856787e-03f);
  q = V::fma(q, z, V::set1(2.06527356e-02f));
  q = V::fma(q, z, V::set1(-5.37445210e-02f));
  q = V::fma(q, z, V::set1(1.33315101e-01f));
  q = V::fma(q, z, V::set1(-3.33332837e-01f));
  const F small = V::fma(V::mul(z, a), q, a);
  // |u| < 9.1: 1 - 2 / (e^(2|u|) + 1), e^y = 2^n * P(r)
  const F y = V::add(a, a);
  const F magic = V::set1(12582912.0f);
  const F n = V::sub(V::add(V::mul(y, V::set1(1.44269502f)), magic), magic);
  F r = V::fnma(n, V::set1(0.693145752f), y);
  r = V::fnma(n, V::set1(1.42860677e-06f), r);
  F p = V::set1(1.38888889e-03f);
  p = V::fma(p, r, V::set1(8.33333377e-03f));
  p = V::fma(p, r, V::set1(4.16666679e-02f));
  p = V::fma(p, r, V::set1(1.66666672e-01f));
  p = V::fma(p, r, V::set1(0.5f));
  p = V::fma(p, r, V::set1(1.0f));
  p = V::fma(p, r, V::set1(1.0f));
  const F e = V::mul(p, V::exp2i(n));
  const F one = V::set1(1.0f);
  const F mid = V::sub(one, V::div(V::set1(2.0f), V::add(e, one)));
  const F t = V::select(V::lt(a, V::set1(0.625f)), small, V::select(V::lt(a, V::set1(9.1f)), mid, one));
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
