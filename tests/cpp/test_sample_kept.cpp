// cpu::sample_rows (muser/sample.h's sample_row on the CPU: bucketed top_k /
// top_p prefixes, SIMD tile pairs, the raw side's shortcuts) against the
// kept set as docs/numerics.md ("Sampling") writes it, computed here the long
// way: every finite z sorted by the kept-set order, top_k, then top_p's
// running sum over the sorted survivors, then min_p; the kept set's pair from
// the scalar lse_tile. Token, log-probabilities and kept mass must be equal
// bit for bit on peaked, flat, tied and -inf rows, for cuts that the bucket
// bound settles and cuts it leaves to the full sort.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cpu/sample.h"
#include "muser/logsumexp.h"
#include "muser/sample.h"

using namespace muser;

namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

float row_lse(const std::vector<float>& v) {
  std::vector<LsePair> tiles((size_t)lse_tile_count(v.size()) + 1);
  return lse_value(sample_row_pair(v.data(), (int)v.size(), tiles.data()));
}

LsePair row_pair(const std::vector<float>& v) {
  std::vector<LsePair> tiles((size_t)lse_tile_count(v.size()) + 1);
  return sample_row_pair(v.data(), (int)v.size(), tiles.data());
}

// The draw of one row, the long way (no bias, no mask).
SampleResult reference(const std::vector<float>& x, SampleParams p, uint64_t position) {
  const int n = (int)x.size();
  std::vector<float> z(x);
  for (float& v : z)
    if (v != kNegInf) v = v / p.temperature;
  std::vector<int32_t> order;
  for (int i = 0; i < n; ++i)
    if (z[(size_t)i] != kNegInf) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return sample_before(z[(size_t)a], a, z[(size_t)b], b); });
  const int32_t top = order[0];
  const float m = z[(size_t)top];
  size_t keep = order.size();
  if (p.top_k > 0 && (size_t)p.top_k < keep) keep = (size_t)p.top_k;
  for (size_t j = keep; j < order.size(); ++j) z[(size_t)order[j]] = kNegInf;
  if (p.top_p < 1.0f) {
    uint64_t mass = 0;  // the kept set's fixed-point mass, then the shortest prefix reaching ceil(top_p * mass)
    for (size_t j = 0; j < keep; ++j) mass += sample_top_p_weight(z[(size_t)order[j]], m);
    const uint64_t target = sample_top_p_target(mass, p.top_p);
    uint64_t c = 0;
    size_t cut = keep;
    for (size_t j = 0; j < keep; ++j) {
      c += sample_top_p_weight(z[(size_t)order[j]], m);
      if (c >= target) {
        cut = j + 1;
        break;
      }
    }
    for (size_t j = cut; j < keep; ++j) z[(size_t)order[j]] = kNegInf;
  }
  if (p.min_p > 0.0f)
    for (float& v : z)
      if (v != kNegInf && canon_exp_nonpos(v - m) < p.min_p) v = kNegInf;
  SampleResult r{kSampleOk, 0, 0.0f, 0.0f, 0.0f};
  r.token = sample_race(z.data(), n, m, p.seed, position, top);
  const float lse = row_lse(x);
  r.processed_logprob = z[(size_t)r.token] - row_lse(z);
  std::vector<float> raw(x);
  for (int i = 0; i < n; ++i)
    if (z[(size_t)i] == kNegInf) raw[(size_t)i] = kNegInf;
  const float d = row_lse(raw) - lse;
  r.logprob = x[(size_t)r.token] - lse;
  r.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
  return r;
}

void expect_same(const SampleResult& want, const SampleResult& got, const std::string& what) {
  ASSERT_EQ(got.status, kSampleOk) << what;
  ASSERT_EQ(want.token, got.token) << what;
  ASSERT_EQ(f32_to_bits(want.logprob), f32_to_bits(got.logprob)) << what;
  ASSERT_EQ(f32_to_bits(want.processed_logprob), f32_to_bits(got.processed_logprob))
      << what << ": " << want.processed_logprob << " vs " << got.processed_logprob;
  ASSERT_EQ(f32_to_bits(want.kept_mass), f32_to_bits(got.kept_mass))
      << what << ": " << want.kept_mass << " vs " << got.kept_mass;
}

std::vector<float> make_row(std::mt19937& rng, int n, int kind) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x((size_t)n);
  for (float& v : x) v = nd(rng);
  switch (kind) {
    case 0: break;                                   // normal(0, 1): flat
    case 1: for (float& v : x) v *= 6.0f; break;     // peaked
    case 2: for (float& v : x) v *= 0.05f; break;    // nearly uniform
    case 3:  // many ties, -0 among the zeros (the order holds -0 and +0 equal)
      for (float& v : x) {
        v = (float)(int)(v * 2.0f);
        if (v == 0.0f && rng() % 2) v = -0.0f;
      }
      break;
    case 4:                                                        // -inf mixed in
      for (float& v : x)
        if (rng() % 3 == 0) v = kNegInf;
      x[rng() % (size_t)n] = 1.0f;
      break;
    case 5: for (float& v : x) v = 30.0f * std::tanh(v * 3.0f); break;  // capped, saturated: big ties at the top
    default:  // a tied top of -0 and +0 (the order holds them equal: ids decide), the rest far below
      for (float& v : x) v = v - 8.0f;
      for (int j = 0; j < n / 2; ++j) x[rng() % (size_t)n] = rng() % 2 ? -0.0f : 0.0f;
      break;
  }
  return x;
}

}  // namespace

TEST(SampleKeptSet, EqualsTheFullSortOfTheSpec) {
  std::mt19937 rng(31);
  const int sizes[] = {7, 300, 5000, 70001};
  const int top_ks[] = {0, 1, 5, 50, 1000, 6999};
  const float top_ps[] = {1.0f, 0.1f, 0.5f, 0.9f, 0.99f, 0.99999f};
  int cases = 0;
  for (int n : sizes)
    for (int kind = 0; kind < 7; ++kind) {
      const std::vector<float> x = make_row(rng, n, kind);
      for (int top_k : top_ks)
        for (float top_p : top_ps)
          for (float temperature : {1.0f, 0.7f}) {
            if ((top_k > 0) + (top_p < 1.0f) == 0 && temperature == 1.0f && kind != 0) continue;
            const float min_p = (cases % 5 == 0) ? 0.01f : 0.0f;
            const SampleParams p{temperature, top_k, top_p, min_p, (uint64_t)(1000 + cases)};
            const uint64_t position = (uint64_t)cases;
            const SampleResult want = reference(x, p, position);
            for (int threads : {1, 2}) {
              SampleResult got;
              const float lse = row_lse(x);
              cpu::sample_rows(x.data(), 1, n, &lse, nullptr, nullptr, p, &position, threads, &got);
              expect_same(want, got,
                           "n=" + std::to_string(n) + " kind=" + std::to_string(kind) + " top_k=" +
                               std::to_string(top_k) + " top_p=" + std::to_string(top_p) + " T=" +
                               std::to_string(temperature) + " min_p=" + std::to_string(min_p) + " threads=" +
                               std::to_string(threads));
            }
            ++cases;
          }
    }
  EXPECT_GT(cases, 500);
}

// top_p's target is ceil(top_p * S) exactly, for every float top_p in (0, 1] and S below 2^62.
TEST(TopPTarget, IsTheExactCeiling) {
  std::mt19937_64 rng(5);
  const float top_ps[] = {1.0f, 0.9f, 0.5f, 1e-3f, 1e-30f, 1e-45f, 0.99999994f, 0.1f};
  for (int i = 0; i < 20000; ++i) {
    const uint64_t S = i < 8 ? (uint64_t)i : rng() >> (2 + rng() % 62);
    const float top_p = i % 3 ? top_ps[i % 8] : std::max(1e-45f, (float)((rng() >> 11) * 0x1.0p-53));
    uint32_t b;
    std::memcpy(&b, &top_p, 4);
    const uint32_t e = b >> 23;
    const unsigned __int128 mant = e ? ((b & 0x7FFFFFu) | 0x800000u) : (b & 0x7FFFFFu);
    const int shift = e ? 150 - (int)e : 149;
    const unsigned __int128 prod = mant * (unsigned __int128)S;
    const unsigned __int128 q = shift >= 128 ? 0 : prod >> shift;
    const bool rem = shift >= 128 ? prod != 0 : (prod - (q << shift)) != 0;
    ASSERT_EQ(sample_top_p_target(S, top_p), (uint64_t)q + (rem ? 1 : 0)) << "S=" << S << " top_p=" << top_p;
  }
  EXPECT_EQ(sample_top_p_target(uint64_t{1} << 40, 0.5f), uint64_t{1} << 39);
  EXPECT_EQ(sample_top_p_target(3, 0.5f), 2u);
}
