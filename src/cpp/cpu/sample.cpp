// Seeded sampling on the CPU (docs/numerics.md, "Sampling"): each row runs
// muser/sample.h's sample_row with its own scratch; rows are independent, so
// the batch size and the thread count never change a token.
#include "cpu/sample.h"

#include <algorithm>
#include <vector>

#include "cpu/parallel.h"

namespace muser::cpu {
namespace {

// The kept-set order (sample_before) by the standard library's partial sort.
struct PartialSorter {
  void prefix(int32_t* order, int count, int k, const float* z) const {
    std::partial_sort(order, order + k, order + count,
                      [z](int32_t a, int32_t b) { return sample_before(z[a], a, z[b], b); });
  }
};

// Per-row scratch: z, the raw mask row, the order, the tile pairs.
struct Scratch {
  std::vector<float> z, raw;
  std::vector<int32_t> order;
  std::vector<LsePair> tiles;
  explicit Scratch(int64_t V)
      : z((size_t)V), raw((size_t)V), order((size_t)V), tiles((size_t)((V + kLseTile - 1) / kLseTile + 1)) {}
};

}  // namespace

void sample_rows(const float* logits, int t, int64_t V, const float* lse, const float* bias, const uint8_t* allowed,
                 SampleParams params, const uint64_t* positions, int threads, SampleResult* out) {
  parallel_for(t, 1, threads, [&](int64_t a, int64_t b) {
    Scratch s(V);
    PartialSorter sort;
    for (int64_t r = a; r < b; ++r)
      out[r] = sample_row(logits + r * V, bias, allowed, (int)V, lse[r], params, positions[r], s.z.data(),
                          s.raw.data(), s.order.data(), s.tiles.data(), sort);
  });
}

SampleResult sample_positions(const float* logits, int64_t V, float lse, const float* bias, const uint8_t* allowed,
                              SampleParams params, const uint64_t* positions, int64_t n, int threads,
                              int64_t* tokens) {
  Scratch s(V);
  PartialSorter sort;
  SampleResult first = sample_row(logits, bias, allowed, (int)V, lse, params, positions[0], s.z.data(), s.raw.data(),
                                  s.order.data(), s.tiles.data(), sort);
  if (first.status != kSampleOk) return first;
  if (!(params.temperature > 0.0f)) {
    std::fill(tokens, tokens + n, (int64_t)first.token);
    return first;
  }
  // z now holds the kept set (-inf elsewhere); its max is the top token's z
  float m = lse_neg_inf();
  for (int64_t i = 0; i < V; ++i) m = s.z[(size_t)i] > m ? s.z[(size_t)i] : m;
  // the race only over the kept ids: the same winner as sample_race over the whole row
  std::vector<float> kept_z;
  for (int64_t i = 0; i < V; ++i)
    if (s.z[(size_t)i] != lse_neg_inf()) {
      s.order[kept_z.size()] = (int32_t)i;
      kept_z.push_back(s.z[(size_t)i]);
    }
  parallel_for(n, 1024, threads, [&](int64_t a, int64_t b) {
    for (int64_t j = a; j < b; ++j) {
      int32_t winner = -1;
      float best = -1.0f;
      for (size_t q = 0; q < kept_z.size(); ++q) {
        const int32_t id = s.order[q];
        const float key = sample_race_key(kept_z[q], m, params.seed, positions[j], id);
        if (key > best) {
          best = key;
          winner = id;
        }
      }
      tokens[j] = winner;
    }
  });
  return first;
}

}  // namespace muser::cpu
