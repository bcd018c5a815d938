// The canonical matvec compiled for avx512 (flags set per file in CMakeLists.txt).
#define MUSER_MATVEC_NS isa_avx512
#include "cpu/matvec_generic.h"

namespace muser::cpu {
void matvec_canon_avx512(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                         int64_t ldy) {
  isa_avx512::matvec(w, x, ldx, t, r0, r1, y, ldy);
}
}  // namespace muser::cpu
