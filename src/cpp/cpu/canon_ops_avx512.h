// The operations canon_simd.h's formulas run on, on AVX-512 registers (16
// floats): included only by the *_avx512.cpp twins, which CMake compiles for
// AVX-512. Internal linkage: each including file has its own copy.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "cpu/x86_f32_ops.h"

namespace muser::cpu {
namespace {

struct V512 {
  MUSER_X86_F32_OPS(__m512, _mm512, 16)
  using M = __mmask16;
  static F abs_bits(F a) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff))); }
  static F sign_bits(F a) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN))); }
  static F or_bits(F a, F b) { return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(a), _mm512_castps_si512(b))); }
  static M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
  static M isnan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }
  static F exp2i(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
};

}  // namespace
}  // namespace muser::cpu
