// The canonical matvec compiled for scalar (flags set per file in CMakeLists.txt).
#define MUSER_MATVEC_NS isa_scalar
#include "cpu/matvec_generic.h"

namespace muser::cpu {
void matvec_canon_scalar(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                         int64_t ldy) {
  isa_scalar::matvec(w, x, ldx, t, r0, r1, y, ldy);
}
}  // namespace muser::cpu
