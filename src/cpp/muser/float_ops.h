// The f32 operations a shared formula is written in, as a type: formulas
// that SIMD twins also evaluate (the canonical tanh, the q8 float chain) are
// templates over V and run on plain floats through F32Ops, on AVX-512 /
// AVX2 / NEON registers through the twin's own V (one operation per
// intrinsic). So the order and the roundings are written once.
//
// V provides: F, set1, add, sub, mul, div, fma (one rounding), fnma
// (-(a*b)+c, one rounding = fma(-a, b, c)); I and cvt (int32 -> f32, exact
// for |i| < 2^24, else round to nearest) for the q8 chain. The canonical
// tanh needs more (canon_simd.h).
#pragma once
#include "platform.h"

namespace muser {

struct F32Ops {
  using F = float;
  using I = int32_t;
  static MUSER_HD float set1(float v) { return v; }
  static MUSER_HD float add(float a, float b) { return a + b; }
  static MUSER_HD float sub(float a, float b) { return a - b; }
  static MUSER_HD float mul(float a, float b) { return a * b; }
  static MUSER_HD float div(float a, float b) { return a / b; }
  static MUSER_HD float fma(float a, float b, float c) { return fmaf(a, b, c); }
  static MUSER_HD float fnma(float a, float b, float c) { return fmaf(-a, b, c); }
  static MUSER_HD float cvt(int32_t i) { return (float)i; }
};

}  // namespace muser
