// The canonical epilogue (scale, then cap * canon_tanh(v / cap)) on AVX2,
// 8 logits per register: canon_simd.h's algorithm over cpu/canon_ops_avx2.h.
// Bit-equal to softcap_canon_scalar. Fuses the logit scale and the cap.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

#include "cpu/canon_ops_avx2.h"
#include "cpu/canon_simd.h"
#include "cpu/kernels.h"

namespace muser::cpu {

void softcap_canon_avx2(float* y, int64_t n, float scale, float cap, float inv_cap) {
  softcap_canon_v<V256>(y, n, scale, cap, inv_cap);
}

}  // namespace muser::cpu

#endif  // MUSER_X86
