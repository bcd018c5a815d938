// The consumer's reductions over host logits, on the CPU: the canonical
// logsumexp (muser/logsumexp.h: tiles, lanes, the merge trees), log-softmax,
// and the scores of chosen tokens (logprob, logit, rank). Tiles run in
// parallel; their pairs are joined by the fixed tree, so the thread count
// never changes a bit.
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "muser/logsumexp.h"

namespace muser::cpu {

void logsumexp_rows(const float* logits, int t, int64_t V, int threads, float* lse) {
  const int64_t tiles = (V + kLseTile - 1) / kLseTile;
  std::vector<LsePair> pairs((size_t)(tiles > 0 ? tiles : 1));
  for (int r = 0; r < t; ++r) {
    const float* row = logits + (int64_t)r * V;
    parallel_for(tiles, 8, threads, [&](int64_t a, int64_t b) {
      for (int64_t k = a; k < b; ++k) {
        const int64_t i0 = k * kLseTile;
        const int n = (int)(V - i0 < kLseTile ? V - i0 : kLseTile);
        pairs[(size_t)k] = lse_tile(row + i0, n);
      }
    });
    lse[r] = lse_value(lse_tree(pairs.data(), (int)tiles));
  }
}

void log_softmax_rows(float* logits, int t, int64_t V, const float* lse, int threads) {
  parallel_for((int64_t)t * V, 1 << 20, threads, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) logits[i] = logits[i] - lse[i / V];
  });
}

void score_rows(const float* logits, int t, int64_t V, const int64_t* ids, int m, const float* lse, int threads,
                float* logprobs, float* values, int64_t* ranks) {
  parallel_for((int64_t)t * m, 1, threads, [&](int64_t a, int64_t b) {
    for (int64_t q = a; q < b; ++q) {
      const int64_t r = q / m, tok = ids[q];
      const float* row = logits + r * V;
      const float v = row[tok];
      // rank: 1 + the ids ahead of tok (muser/logsumexp.h)
      int64_t ahead = 0;
      for (int64_t j = 0; j < V; ++j) ahead += ranks_ahead(row[j], j, v, tok);
      values[q] = v;
      logprobs[q] = v - lse[r];
      ranks[q] = 1 + ahead;
    }
  });
}

}  // namespace muser::cpu
