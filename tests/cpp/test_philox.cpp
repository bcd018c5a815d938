// The generator of seeded sampling (muser/philox.h) against the Random123
// known-answer vectors, its uniform map on every value it can produce, the
// race's exponential clock against float64, and the per-row function of
// muser/sample.h on small rows whose answer is known exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "muser/philox.h"
#include "muser/sample.h"

namespace muser {
namespace {

// Random123 tests/kat_vectors, the three "philox4x32 10" lines.
struct Kat {
  PhiloxCounter ctr;
  PhiloxKey key;
  PhiloxCounter want;
};
const Kat kKats[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

TEST(Philox, MatchesRandom123KnownAnswers) {
  for (const Kat& k : kKats) {
    const PhiloxCounter got = philox4x32_10(k.ctr, k.key);
    EXPECT_EQ(got.x0, k.want.x0);
    EXPECT_EQ(got.x1, k.want.x1);
    EXPECT_EQ(got.x2, k.want.x2);
    EXPECT_EQ(got.x3, k.want.x3);
  }
}

TEST(Philox, TokenBitsUseTheDocumentedCounterAndKey) {
  const uint64_t seed = 0xa4093822299f31d0ull, pos = 0x85a308d3243f6a88ull;
  const uint32_t tok = 0x13198a2eu;
  const PhiloxCounter c = philox4x32_10(PhiloxCounter{(uint32_t)pos, (uint32_t)(pos >> 32), tok, 0u},
                                        PhiloxKey{(uint32_t)seed, (uint32_t)(seed >> 32)});
  EXPECT_EQ(philox_token_bits(seed, pos, tok), c.x0);
}

// Every uniform the map can give: (2b + 1) / 2^24 for b < 2^23, exactly; and
// the clock -log u on each within 2 ulp of float64 (canon_log below 1).
TEST(Philox, UniformIsExactAndTheClockWithinTwoUlpOnEveryValue) {
  double worst = 0;
  for (uint32_t b = 0; b < (1u << 23); ++b) {
    const float u = philox_uniform(b << 9);
    ASSERT_EQ((double)u, (2.0 * b + 1.0) / 16777216.0);
    ASSERT_EQ(philox_uniform((b << 9) | 0x1ffu), u);  // the low 9 bits are dropped
    const float e = -canon_log(u);
    const double ref = -std::log((double)u);
    int ex;
    std::frexp(ref, &ex);
    worst = std::max(worst, std::fabs((double)e - ref) / std::ldexp(1.0, ex - 24));
  }
  EXPECT_LE(worst, 2.0);
}

struct StdSteps : SampleSerialSteps {
  void prefix(int32_t* order, int count, int k, const float* z) const {
    std::partial_sort(order, order + k, order + count,
                      [z](int32_t a, int32_t b) { return sample_before(z[a], a, z[b], b); });
  }
};

struct Row {
  std::vector<float> z, raw;
  std::vector<int32_t> order;
  std::vector<LsePair> tiles;
  explicit Row(int n) : z(n), raw(n), order(n), tiles(n / kLseTile + 2) {}
  SampleResult run(const std::vector<float>& x, SampleParams p, uint64_t pos, const float* bias = nullptr,
                   const uint8_t* allowed = nullptr) {
    StdSteps s;
    const int n = (int)x.size();
    const LsePair pair = sample_row_pair(x.data(), n, tiles.data());
    return sample_row(x.data(), bias, allowed, n, lse_value(pair), p, pos, z.data(), raw.data(), order.data(),
                      tiles.data(), s);
  }
};

TEST(SampleRow, GreedyTakesTheFirstLargestAllowedBiasedLogit) {
  const std::vector<float> x = {1.0f, 3.0f, 3.0f, 2.0f};
  Row row(4);
  SampleParams p{0.0f, 0, 1.0f, 0.0f, 0};
  EXPECT_EQ(row.run(x, p, 0).token, 1);
  const float bias[4] = {0.0f, 0.0f, 0.0f, 1.5f};
  EXPECT_EQ(row.run(x, p, 0, bias).token, 3);
  const uint8_t allowed[4] = {1, 0, 1, 0};
  const SampleResult r = row.run(x, p, 0, nullptr, allowed);
  EXPECT_EQ(r.token, 2);
  EXPECT_EQ(r.processed_logprob, 0.0f);
}

TEST(SampleRow, TopKOfOneIsGreedyAtAnyTemperatureAndKeepsItsRawMass) {
  const std::vector<float> x = {0.5f, -1.0f, 2.0f, 1.0f, 2.0f};
  Row row(5);
  for (uint64_t pos = 0; pos < 50; ++pos) {
    const SampleResult r = row.run(x, SampleParams{1.7f, 1, 1.0f, 0.0f, 99}, pos);
    ASSERT_EQ(r.status, kSampleOk);
    EXPECT_EQ(r.token, 2);  // ties to the lower id
    EXPECT_EQ(r.processed_logprob, 0.0f);
    EXPECT_NEAR(r.kept_mass, std::exp(r.logprob), 1e-6);
  }
}

TEST(SampleRow, NonFiniteLogitsAreReportedAndMinusInfinityStaysOut) {
  const float inf = std::numeric_limits<float>::infinity();
  Row row(3);
  const SampleResult bad = row.run({0.0f, std::nanf(""), 1.0f}, SampleParams{1.0f, 0, 1.0f, 0.0f, 1}, 0);
  EXPECT_EQ(bad.status, kSampleNonFinite);
  EXPECT_EQ(bad.token, 1);
  for (uint64_t pos = 0; pos < 200; ++pos)
    EXPECT_NE(row.run({0.0f, -inf, 0.0f}, SampleParams{1.0f, 0, 1.0f, 0.0f, 1}, pos).token, 1);
  EXPECT_EQ(row.run({-inf, -inf, -inf}, SampleParams{1.0f, 0, 1.0f, 0.0f, 1}, 0).status, kSampleEmpty);
}

// The race's pruning only skips tokens that cannot win: on rows of every
// spread, its winner is the brute-force argmax of e^(z - m) / E (ties to the
// lower id) at every position.
TEST(SampleRace, PruningNeverChangesTheWinner) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal;
  for (float spread : {0.01f, 1.0f, 4.0f, 30.0f}) {
    std::vector<float> z(3000);
    for (float& v : z) v = normal(gen) * spread;
    z[17] = -std::numeric_limits<float>::infinity();
    int32_t top = 0;
    for (int32_t i = 1; i < 3000; ++i) top = z[i] > z[top] ? i : top;
    const float m = z[top];
    for (uint64_t pos = 0; pos < 300; ++pos) {
      int32_t want = -1;
      float best = -1.0f;
      for (int32_t i = 0; i < 3000; ++i) {
        if (i == 17) continue;
        const float key = sample_race_key(z[i], m, 11, pos, i);
        if (key > best) {
          best = key;
          want = i;
        }
      }
      ASSERT_EQ(sample_race(z.data(), 3000, m, 11, pos, top), want) << "spread " << spread << " position " << pos;
    }
  }
}

}  // namespace
}  // namespace muser
