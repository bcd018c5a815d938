// The canonical epilogue (scale, then cap * canon_tanh(v / cap)) on AVX-512,
// 16 logits per register: canon_simd.h's algorithm over the interface below.
// Bit-equal to softcap_canon_scalar. Fuses the logit scale and the cap.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

#include <immintrin.h>

#include "cpu/canon_simd.h"
#include "cpu/kernels.h"
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
  static M isnan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }
  static F exp2i(F n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
};

}  // namespace

void softcap_canon_avx512(float* y, int64_t n, float scale, float cap, float inv_cap) {
  softcap_canon_v<V512>(y, n, scale, cap, inv_cap);
}

}  // namespace muser::cpu

#endif  // MUSER_X86
