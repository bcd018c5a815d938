// muser/float_ops.h's operations on an x86 register (AVX2's __m256, AVX-512's
// __m512), one intrinsic each, written once for both widths: the intrinsic
// names differ only in their prefix. The *_avx2/*_avx512 twins put this in
// the op structs they instantiate the shared formulas with (the canonical
// tanh, the q8 chain) and add what only they need.
#pragma once

// REG: the register type; P: the intrinsic prefix (_mm256, _mm512); LANES: floats per register.
#define MUSER_X86_F32_OPS(REG, P, LANES)                                        \
  using F = REG;                                                                \
  [[maybe_unused]] static constexpr int kLanes = LANES;                         \
  static F set1(float v) { return P##_set1_ps(v); }                             \
  static F load(const float* p) { return P##_loadu_ps(p); }                     \
  static void store(float* p, F v) { P##_storeu_ps(p, v); }                     \
  static F add(F a, F b) { return P##_add_ps(a, b); }                           \
  static F sub(F a, F b) { return P##_sub_ps(a, b); }                           \
  static F mul(F a, F b) { return P##_mul_ps(a, b); }                           \
  static F div(F a, F b) { return P##_div_ps(a, b); }                           \
  static F fma(F a, F b, F c) { return P##_fmadd_ps(a, b, c); }                 \
  static F fnma(F a, F b, F c) { return P##_fnmadd_ps(a, b, c); }
