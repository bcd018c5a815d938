// The canonical logsumexp tile's lanes (lse_tile of muser/logsumexp.h) on
// ARM NEON, 4 lanes per register (8 per group of 32): canon_simd.h's
// lse_lanes_v over the operations below; logsumexp.cpp joins the lanes.
// Bit-equal to lse_tile (tests/cpp/test_lse_twins.cpp, run under qemu-user
// by tests/apple_cross/neon_qemu.sh). NEON is AArch64's baseline: no
// per-file flags; the file compiles to nothing elsewhere.
#if defined(__aarch64__) && defined(__ARM_NEON)

#include <arm_neon.h>

#include "cpu/canon_simd.h"
#include "cpu/kernels.h"

namespace muser::cpu {

namespace {

struct V128 {
  using F = float32x4_t;
  using M = uint32x4_t;  // all-ones / all-zeros lanes
  static constexpr int kLanes = 4;
  static F set1(float v) { return vdupq_n_f32(v); }
  static F load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, F v) { vst1q_f32(p, v); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }   // c + a*b, one rounding
  static F fnma(F a, F b, F c) { return vfmsq_f32(c, a, b); }  // c - a*b, one rounding
  static M lt(F a, F b) { return vcltq_f32(a, b); }
  static M eq(F a, F b) { return vceqq_f32(a, b); }
  static M isnan(F a) { return vmvnq_u32(vceqq_f32(a, a)); }
  static F select(M m, F a, F b) { return vbslq_f32(m, a, b); }
  static F exp2i(F n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
  }
};

}  // namespace

void lse_lanes_neon(const float* v, int n, LsePair* lane) { lse_lanes_v<V128>(v, n, lane); }
void exp_nonpos_neon(const float* x, float* y, int64_t n) { exp_nonpos_v<V128>(x, y, n); }

}  // namespace muser::cpu

#endif  // __aarch64__ && __ARM_NEON
