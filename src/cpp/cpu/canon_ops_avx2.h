// The operations canon_simd.h's formulas run on, on AVX2 registers (8
// floats): included only by the *_avx2.cpp twins, which CMake compiles for
// AVX2 + FMA. Internal linkage: each including file has its own copy.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "cpu/x86_f32_ops.h"

namespace muser::cpu {
namespace {

struct V256 {
  MUSER_X86_F32_OPS(__m256, _mm256, 8)
  using M = __m256;  // all-ones / all-zeros lanes
  static F abs_bits(F a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
  static F sign_bits(F a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(INT32_MIN))); }
  static F or_bits(F a, F b) { return _mm256_or_ps(a, b); }
  static M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M eq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
  static M isnan(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static F select(M m, F a, F b) { return _mm256_blendv_ps(b, a, m); }
  static F exp2i(F n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
};

}  // namespace
}  // namespace muser::cpu
