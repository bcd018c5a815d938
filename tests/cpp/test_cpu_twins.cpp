// Every SIMD twin of the CPU matvecs (matvec_*_avx2/avx512/neon.cpp) gives
// its scalar twin's bits, canonical (f32 activations) and q8 alike: the C++
// side of tests/test_cpu_kernels.py, so that a cross build run under
// qemu-user (tests/apple_cross/neon_qemu.sh) checks the NEON twins without
// Python. Sizes cross the twins' row groups (1, 3, 31, 33) and token tiles.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "simd_isas.h"
#include "random_blocks.h"

using namespace muser;

namespace {


bool kquant(GgmlType t) { return t == GgmlType::Q5_K || t == GgmlType::Q4_K || t == GgmlType::Q6_K; }

std::vector<int64_t> cols_of(GgmlType t) {
  if (kquant(t)) return {256, 768};
  if (t == GgmlType::Q8_0) return {96, 640};
  return {77, 33, 512};
}

const int64_t kRows[] = {1, 3, 31, 33};
const int kTokens[] = {1, 3, 8, 17};

void expect_bits_equal(const std::vector<float>& want, const std::vector<float>& got, const char* what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_EQ(f32_to_bits(want[i]), f32_to_bits(got[i])) << what << " element " << i;
}

}  // namespace

TEST(CpuTwins, ThisBuildHasASimdTwin) {
#if defined(__x86_64__) || (defined(__aarch64__) && defined(__ARM_NEON))
  EXPECT_FALSE(simd_isas().empty());
#endif
}

TEST(CpuTwins, CanonicalBitEqualToScalar) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (cpu::Isa isa : simd_isas())
    for (GgmlType type : {GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16,
                          GgmlType::BF16, GgmlType::F32})
      for (int64_t rows : kRows)
        for (int64_t cols : cols_of(type)) {
          const TypeTraits tt = type_traits((uint32_t)type);
          auto w = muser_test::random_rows(type, rows, cols, rng);
          const WeightView view{(uint32_t)type, rows, cols, cols / tt.block_elems * tt.block_bytes, w.data()};
          std::vector<float> x((size_t)(17 * cols));
          for (float& v : x) v = nd(rng);
          for (int t : kTokens) {
            std::vector<float> want((size_t)(t * rows)), got((size_t)(t * rows));
            cpu::matvec_canon_scalar(view, x.data(), cols, t, 0, rows, want.data(), rows);
            cpu::matvec_canon_isa(isa, view, x.data(), cols, t, 0, rows, got.data(), rows);
            SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + tt.name + " rows=" + std::to_string(rows) +
                         " cols=" + std::to_string(cols) + " t=" + std::to_string(t));
            expect_bits_equal(want, got, "canonical");
          }
        }
}

TEST(CpuTwins, Q8BitEqualToScalar) {
  std::mt19937 rng(13);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (cpu::Isa isa : simd_isas())
    for (GgmlType type : {GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q8_0})
      for (int64_t rows : kRows)
        for (int64_t cols : cols_of(type)) {
          const TypeTraits tt = type_traits((uint32_t)type);
          auto w = muser_test::random_rows(type, rows, cols, rng);
          const WeightView view{(uint32_t)type, rows, cols, cols / tt.block_elems * tt.block_bytes, w.data()};
          std::vector<float> x((size_t)(17 * cols));
          const float scale = 0.1f + 9.9f * (float)(rng() % 1000) / 1000.0f;
          for (float& v : x) v = nd(rng) * scale;
          for (int t : kTokens) {
            cpu::ActsQ8 a;
            cpu::quantize_acts_q8((uint32_t)type, x.data(), cols, cols, t, &a);
            std::vector<float> want((size_t)(t * rows)), got((size_t)(t * rows));
            cpu::matvec_q8_scalar(view, a, 0, rows, want.data(), rows);
            cpu::matvec_q8_isa(isa, view, a, 0, rows, got.data(), rows);
            SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + tt.name + " rows=" + std::to_string(rows) +
                         " cols=" + std::to_string(cols) + " t=" + std::to_string(t));
            expect_bits_equal(want, got, "q8");
          }
        }
}
