// Run-time choice of the kernel twin (cpu/isa.h): every twin computes the
// same bits, so the choice changes speed only. A twin this build or this
// machine lacks falls back to the scalar definition.
#include "cpu/isa.h"
#include "cpu/kernels.h"

namespace muser::cpu {

#if defined(MUSER_X86)
void matvec_canon_avx2(const WeightView&, const float*, int64_t, int, int64_t, int64_t, float*, int64_t);
void matvec_canon_avx512(const WeightView&, const float*, int64_t, int, int64_t, int64_t, float*, int64_t);
void matvec_q8_avx2(const WeightView&, const ActsQ8&, int64_t, int64_t, float*, int64_t);
void matvec_q8_avx512(const WeightView&, const ActsQ8&, int64_t, int64_t, float*, int64_t);
void softcap_canon_avx2(float*, int64_t, float, float, float);
void softcap_canon_avx512(float*, int64_t, float, float, float);
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
void matvec_canon_neon(const WeightView&, const float*, int64_t, int, int64_t, int64_t, float*, int64_t);
void matvec_q8_neon(const WeightView&, const ActsQ8&, int64_t, int64_t, float*, int64_t);
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
#if defined(__aarch64__) && defined(__ARM_NEON)
    case Isa::Neon: return matvec_canon_neon(w, x, ldx, t, r0, r1, y, ldy);
#endif
    default: return matvec_canon_scalar(w, x, ldx, t, r0, r1, y, ldy);
  }
}

void matvec_q8(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  matvec_q8_isa(active_isa(), w, a, r0, r1, y, ldy);
}

void matvec_q8_isa(Isa isa, const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy) {
  switch (isa) {
#if defined(MUSER_X86)
    case Isa::Avx512: return matvec_q8_avx512(w, a, r0, r1, y, ldy);
    case Isa::Avx2: return matvec_q8_avx2(w, a, r0, r1, y, ldy);
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    case Isa::Neon: return matvec_q8_neon(w, a, r0, r1, y, ldy);
#endif
    default: return matvec_q8_scalar(w, a, r0, r1, y, ldy);
  }
}

// The AVX-512 q8 kernel works on tiles of 16 rows; 64 keeps every other
// kernel's row groups (4 rows) whole too.
int64_t matvec_row_grain() { return 64; }

void softcap_canon_inplace(float* y, int64_t n, float scale, float cap, float inv_cap) {
  softcap_canon_isa(active_isa(), y, n, scale, cap, inv_cap);
}

void softcap_canon_isa(Isa isa, float* y, int64_t n, float scale, float cap, float inv_cap) {
  switch (isa) {
#if defined(MUSER_X86)
    case Isa::Avx512: return softcap_canon_avx512(y, n, scale, cap, inv_cap);
    case Isa::Avx2: return softcap_canon_avx2(y, n, scale, cap, inv_cap);
#endif
    default: return softcap_canon_scalar(y, n, scale, cap, inv_cap);
  }
}

}  // namespace muser::cpu
