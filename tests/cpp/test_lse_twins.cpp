// Every SIMD twin of the canonical logsumexp tile (cpu/logsumexp_avx512,
// avx2, neon.cpp: canon_simd.h's lse_tile_v) gives the scalar lse_tile's
// pair (m, s) bit for bit, on every ISA this machine runs: random rows of
// many scales, rows with -inf, NaN and +inf, ties, values near the float
// range's ends and subnormals, and every tile length n = 1 .. kLseTile.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "simd_isas.h"
#include "muser/logsumexp.h"

using namespace muser;

namespace {

const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

// The twin's pair equals the scalar's, bit for bit. One exception: a NaN s
// (a NaN logit, or inf - inf) must be NaN in both, its sign and payload not
// compared. IEEE 754 leaves which NaN an operation on two NaNs returns to the
// implementation, and the scalar lse_tile itself is not stable there: the
// compiler may swap fmaf's multiplicands (lse_merge), so the same source gives
// 0x7fc00000 inlined in one file and 0xffc00000 called from another. Rows
// with one NaN per lane are compared bit for bit all the same (NaNInLane).
void expect_tile_equal(cpu::Isa isa, const std::vector<float>& v, int n, const std::string& what,
                       bool nan_payload = false) {
  const LsePair want = lse_tile(v.data(), n);
  const LsePair got = cpu::lse_tile_isa(isa, v.data(), n);
  ASSERT_EQ(f32_to_bits(want.m), f32_to_bits(got.m))
      << cpu::isa_name(isa) << " " << what << " n=" << n << ": m " << want.m << " vs " << got.m;
  if (!nan_payload && std::isnan(want.s)) {
    ASSERT_TRUE(std::isnan(got.s)) << cpu::isa_name(isa) << " " << what << " n=" << n << ": s NaN vs " << got.s;
    return;
  }
  ASSERT_EQ(f32_to_bits(want.s), f32_to_bits(got.s))
      << cpu::isa_name(isa) << " " << what << " n=" << n << ": s " << want.s << " vs " << got.s;
}

std::vector<float> normal_row(std::mt19937& rng, int n, float scale) {
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v((size_t)n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST(LseTwins, ThisBuildHasASimdTwin) {
#if defined(__x86_64__) || (defined(__aarch64__) && defined(__ARM_NEON))
  EXPECT_FALSE(simd_isas().empty());
#endif
}

TEST(LseTwins, EveryTileLength) {
  std::mt19937 rng(21);
  const std::vector<float> v = normal_row(rng, kLseTile, 8.0f);
  for (cpu::Isa isa : simd_isas())
    for (int n = 1; n <= kLseTile; ++n) expect_tile_equal(isa, v, n, "normal(0, 8)");
}

TEST(LseTwins, RandomRowsOfManyScales) {
  std::mt19937 rng(22);
  for (cpu::Isa isa : simd_isas())
    for (float scale : {1e-30f, 1e-3f, 0.5f, 3.0f, 30.0f, 1e3f, 1e6f, 1e37f})
      for (int rep = 0; rep < 20; ++rep) {
        const int n = rep == 0 ? kLseTile : 1 + (int)(rng() % kLseTile);
        expect_tile_equal(isa, normal_row(rng, n, scale), n, "scale " + std::to_string(scale));
      }
}

// Increasing and decreasing rows: every push takes the larger-logit branch,
// or none does.
TEST(LseTwins, MonotoneRows) {
  for (cpu::Isa isa : simd_isas())
    for (int dir : {1, -1}) {
      std::vector<float> v((size_t)kLseTile);
      for (int i = 0; i < kLseTile; ++i) v[(size_t)i] = (float)(dir * i) * 0.0371f;
      expect_tile_equal(isa, v, kLseTile, dir > 0 ? "increasing" : "decreasing");
    }
}

TEST(LseTwins, Ties) {
  std::mt19937 rng(23);
  const float values[] = {-2.0f, 0.0f, -0.0f, 1.5f, 1.5f, 7.25f};
  for (cpu::Isa isa : simd_isas())
    for (int rep = 0; rep < 50; ++rep) {
      std::vector<float> v((size_t)kLseTile);
      for (float& x : v) x = values[rng() % 6];
      expect_tile_equal(isa, v, 1 + (int)(rng() % kLseTile), "ties");
    }
  for (cpu::Isa isa : simd_isas()) {
    std::vector<float> same((size_t)kLseTile, 3.0f);
    expect_tile_equal(isa, same, kLseTile, "all equal");
  }
}

// -inf (tokens of probability 0), alone and mixed in; a row of -inf only.
TEST(LseTwins, NegativeInfinity) {
  std::mt19937 rng(24);
  for (cpu::Isa isa : simd_isas()) {
    std::vector<float> all((size_t)kLseTile, -kInf);
    for (int n : {1, 31, 32, 33, kLseTile}) expect_tile_equal(isa, all, n, "all -inf");
    for (double frac : {0.01, 0.5, 0.97}) {
      for (int rep = 0; rep < 10; ++rep) {
        std::vector<float> v = normal_row(rng, kLseTile, 5.0f);
        for (float& x : v)
          if ((double)(rng() % 10000) < frac * 10000) x = -kInf;
        expect_tile_equal(isa, v, 1 + (int)(rng() % kLseTile), "-inf mixed in");
      }
    }
  }
}

// NaN poisons s; +inf makes m infinite (and a second +inf in its lane gives
// inf - inf = NaN); values near the ends of the float range; subnormals.
TEST(LseTwins, NaNInfinityAndExtremes) {
  std::mt19937 rng(25);
  const float specials[] = {kNaN, -kNaN, kInf, -kInf, 3.4028235e38f, -3.4028235e38f, 1e38f, -1e38f,
                            1.17549435e-38f, 1e-45f, -1e-45f, 0.0f, -0.0f, 88.0f, -88.0f, 87.3f, -87.3f};
  const int count = (int)(sizeof(specials) / sizeof(specials[0]));
  for (cpu::Isa isa : simd_isas()) {
    // one special value at every position of a short row, the rest normal
    for (int s = 0; s < count; ++s)
      for (int at = 0; at < 70; ++at) {
        std::vector<float> v = normal_row(rng, 70, 4.0f);
        v[(size_t)at] = specials[s];
        expect_tile_equal(isa, v, 70, "special " + std::to_string(specials[s]) + " at " + std::to_string(at),
                          true);
      }
    // rows dense with specials: several in one lane
    for (int rep = 0; rep < 200; ++rep) {
      std::vector<float> v = normal_row(rng, kLseTile, 20.0f);
      const int per_row = 1 + (int)(rng() % 64);
      for (int j = 0; j < per_row; ++j) v[rng() % kLseTile] = specials[rng() % count];
      expect_tile_equal(isa, v, 1 + (int)(rng() % kLseTile), "specials mixed in");
    }
  }
}

// One NaN of either sign in a lane of a full tile, everything else finite: s
// is that NaN, propagated through one operand at a time, so its bits are
// compared too.
TEST(LseTwins, NaNInLane) {
  std::mt19937 rng(27);
  for (cpu::Isa isa : simd_isas())
    for (float nan : {kNaN, -kNaN})
      for (int rep = 0; rep < 64; ++rep) {
        std::vector<float> v = normal_row(rng, kLseTile, 10.0f);
        v[(size_t)(rng() % kLseTile)] = nan;
        expect_tile_equal(isa, v, kLseTile, "one NaN", true);
      }
}

// The twin the CPU reductions use is the active ISA's, and equals lse_tile.
TEST(LseTwins, ActiveTwinEqualsScalar) {
  std::mt19937 rng(26);
  const std::vector<float> v = normal_row(rng, kLseTile, 6.0f);
  const LsePair want = lse_tile(v.data(), kLseTile), got = cpu::lse_tile_cpu(v.data(), kLseTile);
  EXPECT_EQ(f32_to_bits(want.m), f32_to_bits(got.m));
  EXPECT_EQ(f32_to_bits(want.s), f32_to_bits(got.s));
}

// The canon_exp_nonpos twin (the top_p running sum's weights): bit-equal to
// the scalar function on every float bit pattern in [-100, 0] strided, -0,
// -inf, NaN and the underflow edge, at lengths that leave every tail.
TEST(LseTwins, ExpNonposBitEqualToScalar) {
  std::vector<float> x;
  for (uint32_t b = 0x80000000u; b <= 0xc2c80000u; b += 97) x.push_back(bits_to_f32(b));  // -0 .. -100
  for (float v : {-kInf, kNaN, -kNaN, -87.3f, -87.29999f, -87.30001f, -0.0f, 0.0f, -1e-45f})
    x.push_back(v);
  for (cpu::Isa isa : simd_isas())
    for (size_t n : {x.size(), x.size() - 1, x.size() - 7, (size_t)1, (size_t)15}) {
      std::vector<float> got(n);
      cpu::exp_nonpos_isa(isa, x.data() + (x.size() - n), got.data(), (int64_t)n);
      for (size_t i = 0; i < n; ++i) {
        const float in = x[x.size() - n + i];
        ASSERT_EQ(f32_to_bits(canon_exp_nonpos(in)), f32_to_bits(got[i]))
            << cpu::isa_name(isa) << " x=" << in << " (bits " << std::hex << f32_to_bits(in) << ")";
      }
    }
}
