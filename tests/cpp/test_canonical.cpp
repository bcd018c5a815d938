// The canonical arithmetic of muser/canonical.h: the tanh's accuracy and
// symmetry, and the exact lane-combining order of canon_tree32. Every backend
// copies these functions; a change that breaks one of these tests changes the
// bits of the `canonical` route everywhere (docs/numerics.md).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "muser/canonical.h"

namespace muser {
namespace {

// Distance of `got` from the exact value `ref`, in units of the f32 ulp at ref.
double ulps_from(float got, double ref) {
  int exp;
  std::frexp(ref, &exp);  // |ref| in [2^(exp-1), 2^exp)
  const double ulp = std::ldexp(1.0, std::max(exp - 24, -149));
  return std::fabs((double)got - ref) / ulp;
}

// Every 97th float in [0, 10], ascending; the stride is odd so the sample
// visits every mantissa pattern class.
std::vector<float> positive_sample() {
  std::vector<float> v;
  const uint32_t ten = f32_to_bits(10.0f);
  v.reserve(ten / 97 + 2);
  for (uint32_t b = 0; b <= ten; b += 97) v.push_back(bits_to_f32(b));
  v.push_back(10.0f);
  return v;
}

TEST(CanonTanh, WithinTwoUlpOfFloat64OnAStridedSampleOfMinus10To10) {
  double worst = 0;
  float worst_at = 0;
  for (float u : positive_sample()) {
    for (float s : {u, -u}) {
      const double e = ulps_from(canon_tanh(s), std::tanh((double)s));
      if (e > worst) {
        worst = e;
        worst_at = s;
      }
    }
  }
  EXPECT_LE(worst, 2.0) << "worst at u = " << worst_at;
  RecordProperty("worst_ulp", std::to_string(worst));
}

TEST(CanonTanh, ExactlyOdd) {
  for (float u : positive_sample())
    ASSERT_EQ(f32_to_bits(canon_tanh(-u)), f32_to_bits(-canon_tanh(u))) << u;
  EXPECT_TRUE(std::signbit(canon_tanh(-0.0f)));
  EXPECT_FALSE(std::signbit(canon_tanh(0.0f)));
}

TEST(CanonTanh, MonotoneNonDecreasing) {
  const std::vector<float> pos = positive_sample();
  std::vector<float> xs;
  for (size_t i = pos.size(); i-- > 1;) xs.push_back(-pos[i]);
  xs.insert(xs.end(), pos.begin(), pos.end());
  float prev = canon_tanh(xs[0]);
  for (size_t i = 1; i < xs.size(); ++i) {
    const float t = canon_tanh(xs[i]);
    ASSERT_GE(t, prev) << "tanh decreases between " << xs[i - 1] << " and " << xs[i];
    prev = t;
  }
}

TEST(CanonTanh, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(canon_tanh(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(canon_tanh(-std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(canon_tanh(inf), 1.0f);
  EXPECT_EQ(canon_tanh(-inf), -1.0f);
  EXPECT_EQ(canon_tanh(9.1f), 1.0f);
  EXPECT_EQ(canon_tanh(-1e30f), -1.0f);
  // Tiny arguments return themselves (tanh(u) = u - u^3/3 rounds to u).
  EXPECT_EQ(canon_tanh(1e-20f), 1e-20f);
  EXPECT_EQ(canon_tanh(-std::numeric_limits<float>::denorm_min()),
            -std::numeric_limits<float>::denorm_min());
  // |tanh| never exceeds 1.
  for (float u : {0.625f, 1.0f, 5.0f, 9.0f, 9.09f}) EXPECT_LE(canon_tanh(u), 1.0f);
}

TEST(CanonRound, RoundsHalfToEven) {
  EXPECT_EQ(canon_round(0.5f), 0.0f);
  EXPECT_EQ(canon_round(1.5f), 2.0f);
  EXPECT_EQ(canon_round(2.5f), 2.0f);
  EXPECT_EQ(canon_round(-2.5f), -2.0f);
  EXPECT_EQ(canon_round(28.8539f), 29.0f);
}

TEST(CanonEpilogue, ScalesThenCaps) {
  const float scale = 0.196116f, cap = 20.0f, inv_cap = 1.0f / cap;
  for (float l : {-300.0f, -3.0f, 0.0f, 0.7f, 42.0f, 1e4f}) {
    const float v = l * scale;
    EXPECT_EQ(f32_to_bits(canon_epilogue(l, scale, cap, inv_cap)),
              f32_to_bits(cap * canon_tanh(v * inv_cap)));
    EXPECT_EQ(canon_epilogue(l, scale, 0.0f, 0.0f), v);  // cap <= 0: no cap
  }
}

// The documented order, written out level by level: offset 16, then 8, 4, 2, 1.
float documented_tree(const float* lanes) {
  float level16[16], level8[8], level4[4], level2[2];
  for (int l = 0; l < 16; ++l) level16[l] = lanes[l] + lanes[l + 16];
  for (int l = 0; l < 8; ++l) level8[l] = level16[l] + level16[l + 8];
  for (int l = 0; l < 4; ++l) level4[l] = level8[l] + level8[l + 4];
  for (int l = 0; l < 2; ++l) level2[l] = level4[l] + level4[l + 2];
  return level2[0] + level2[1];
}

TEST(CanonTree32, FoldsByDescendingOffsets) {
  // 1e8 + 1 rounds to 1e8 (ulp 8), so the answer depends on who meets whom.
  float a[32] = {};
  a[0] = 1e8f;
  a[8] = -1e8f;
  a[16] = 1.0f;
  // butterfly: (1e8 + 1) + (-1e8) = 0; a left-to-right sum would give 1.
  EXPECT_EQ(canon_tree32(a), 0.0f);

  float b[32] = {};
  b[0] = 1.0f;
  b[1] = 1e8f;
  b[17] = -1e8f;
  // butterfly: lane 1 cancels first (1e8 + -1e8), leaving 1; left to right gives 0.
  EXPECT_EQ(canon_tree32(b), 1.0f);

  float c[32] = {};
  c[0] = 1e8f;
  c[1] = 1.0f;
  c[16] = -1e8f;
  c[17] = 1.0f;
  // lanes 0/16 cancel, lanes 1/17 give 2; adjacent pairing would lose both ones.
  EXPECT_EQ(canon_tree32(c), 2.0f);
}

TEST(CanonTree32, EqualsTheLevelByLevelOrderOnRandomLanes) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mag(-30.0f, 30.0f);
  std::normal_distribution<float> norm(0.0f, 1.0f);
  int differs_from_sequential = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    float lanes[32], copy[32];
    for (float& v : lanes) v = norm(rng) * std::exp2(mag(rng));
    memcpy(copy, lanes, sizeof lanes);
    const float want = documented_tree(lanes);
    ASSERT_EQ(f32_to_bits(canon_tree32(copy)), f32_to_bits(want)) << "trial " << trial;
    float seq = 0;
    for (float v : lanes) seq = seq + v;
    differs_from_sequential += f32_to_bits(seq) != f32_to_bits(want);
  }
  EXPECT_GT(differs_from_sequential, 100);  // the order is observable, so it is tested
}

}  // namespace
}  // namespace muser
