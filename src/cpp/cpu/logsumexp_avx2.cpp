// The canonical logsumexp tile's lanes (lse_tile of muser/logsumexp.h) on AVX2, 8 lanes per register
// (4 per group of 32): canon_simd.h's lse_lanes_v over
// cpu/canon_ops_avx2.h; logsumexp.cpp joins the lanes. Bit-equal to lse_tile.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

#include "cpu/canon_ops_avx2.h"
#include "cpu/canon_simd.h"
#include "cpu/kernels.h"

namespace muser::cpu {

void lse_lanes_avx2(const float* v, int n, LsePair* lane) { lse_lanes_v<V256>(v, n, lane); }
void exp_nonpos_avx2(const float* x, float* y, int64_t n) { exp_nonpos_v<V256>(x, y, n); }

}  // namespace muser::cpu

#endif  // MUSER_X86
