// The CPU feature detection behind the SIMD dispatch (src/cpp/cpu/isa.cpp)
// reads CPUID itself so GCC and clang builds pick the same twin; here each
// feature it reports is checked against the compiler's own
// __builtin_cpu_supports, for every feature string the compiler knows.
#include <gtest/gtest.h>

#include <algorithm>

#include "cpu/isa.h"

namespace {

using muser::cpu::Isa;

#if defined(MUSER_X86)
TEST(Isa, FeaturesMatchTheCompilersBuiltin) {
  __builtin_cpu_init();
  const muser::cpu::X86Features f = muser::cpu::x86_features();
  EXPECT_EQ(f.avx2, __builtin_cpu_supports("avx2") != 0);
  EXPECT_EQ(f.fma, __builtin_cpu_supports("fma") != 0);
  EXPECT_EQ(f.bmi2, __builtin_cpu_supports("bmi2") != 0);
  EXPECT_EQ(f.avx512f, __builtin_cpu_supports("avx512f") != 0);
  EXPECT_EQ(f.avx512bw, __builtin_cpu_supports("avx512bw") != 0);
  EXPECT_EQ(f.avx512vl, __builtin_cpu_supports("avx512vl") != 0);
  EXPECT_EQ(f.avx512dq, __builtin_cpu_supports("avx512dq") != 0);
  EXPECT_EQ(f.avx512vnni, __builtin_cpu_supports("avx512vnni") != 0);
  EXPECT_EQ(f.avx512vbmi, __builtin_cpu_supports("avx512vbmi") != 0);
#if !defined(__clang__)  // clang's builtin has no "f16c"
  EXPECT_EQ(f.f16c, __builtin_cpu_supports("f16c") != 0);
#endif
}

TEST(Isa, AvailablePathsFollowTheFeatures) {
  const muser::cpu::X86Features f = muser::cpu::x86_features();
  const auto isas = muser::cpu::available_isas();
  const auto has = [&](Isa i) { return std::find(isas.begin(), isas.end(), i) != isas.end(); };
  const bool avx2 = f.avx2 && f.fma && f.f16c && f.bmi2;
  EXPECT_TRUE(has(Isa::Scalar));
  EXPECT_EQ(has(Isa::Avx2), avx2);
  EXPECT_EQ(has(Isa::Avx512), avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq &&
                                  f.avx512vnni && f.avx512vbmi);
  EXPECT_TRUE(has(muser::cpu::active_isa()));
}
#endif

TEST(Isa, ScalarIsAlwaysFirst) {
  const auto isas = muser::cpu::available_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), Isa::Scalar);
}

}  // namespace
