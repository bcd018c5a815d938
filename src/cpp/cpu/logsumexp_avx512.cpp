// The canonical logsumexp tile's lanes (lse_tile of muser/logsumexp.h) on AVX-512, 16 lanes per
// register (2 per group of 32): canon_simd.h's lse_lanes_v over
// cpu/canon_ops_avx512.h; logsumexp.cpp joins the lanes. Bit-equal to lse_tile.
// x86 only: CMake compiles every source on every platform (MUSER_X86 is its flag).
#if defined(MUSER_X86)

#include "cpu/canon_ops_avx512.h"
#include "cpu/canon_simd.h"
#include "cpu/kernels.h"

namespace muser::cpu {

void lse_lanes_avx512(const float* v, int n, LsePair* lane) { lse_lanes_v<V512>(v, n, lane); }
void exp_nonpos_avx512(const float* x, float* y, int64_t n) { exp_nonpos_v<V512>(x, y, n); }

}  // namespace muser::cpu

#endif  // MUSER_X86
