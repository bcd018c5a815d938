// Run-time choice of the matvec twin (cpu/isa.h); every twin computes the
// same bits, so the choice changes speed only.
#include "cpu/isa.h"
#include "cpu/kernels.h"

namespace muser::cpu {

#if defined(MUSER_X86)
void matvec_canon_avx2(const WeightView&, const float*, int64_t, int, int64_t, int64_t, float*, int64_t);
void matvec_canon_avx512(const WeightView&, const float*, int64_t, int, int64_t, int64_t, float*, int64_t);
#endif

void matvec_canon(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                  int64_t ldy) {
  matvec_canon_isa(active_isa(), w, x, ldx, t, r0, r1, y, ldy);
}

void matvec_canon_isa(Isa isa, const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1,
                      float* y, int64_t ldy) {
  switch (isa) {
#if defined(MUSER_X86)
    case Isa::Avx512: return matvec_canon_avx512(w, x, ldx, t, r0, r1, y, ldy);
    case Isa::Avx2: return matvec_canon_avx2(w, x, ldx, t, r0, r1, y, ldy);
#endif
    default: return matvec_canon_scalar(w, x, ldx, t, r0, r1, y, ldy);
  }
}

}  // namespace muser::cpu
