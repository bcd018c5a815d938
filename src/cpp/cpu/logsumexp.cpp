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

// The twins' lanes (logsumexp_avx512/avx2/neon.cpp); the lane tree is joined
// here, in code compiled like the scalar lse_tile's (canon_simd.h says why).
#if defined(MUSER_X86)
void lse_lanes_avx512(const float* v, int n, LsePair* lane);
void lse_lanes_avx2(const float* v, int n, LsePair* lane);
void exp_nonpos_avx512(const float* x, float* y, int64_t n);
void exp_nonpos_avx2(const float* x, float* y, int64_t n);
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
void lse_lanes_neon(const float* v, int n, LsePair* lane);
void exp_nonpos_neon(const float* x, float* y, int64_t n);
#endif

void exp_nonpos_isa(Isa isa, const float* x, float* y, int64_t n) {
  switch (isa) {
#if defined(MUSER_X86)
    case Isa::Avx512: return exp_nonpos_avx512(x, y, n);
    case Isa::Avx2: return exp_nonpos_avx2(x, y, n);
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    case Isa::Neon: return exp_nonpos_neon(x, y, n);
#endif
    default:
      for (int64_t i = 0; i < n; ++i) y[i] = canon_exp_nonpos(x[i]);
  }
}

void exp_nonpos_cpu(const float* x, float* y, int64_t n) { exp_nonpos_isa(active_isa(), x, y, n); }

LsePair lse_tile_isa(Isa isa, const float* v, int n) {
  LsePair lane[kCanonLanes];
  switch (isa) {
#if defined(MUSER_X86)
    case Isa::Avx512: lse_lanes_avx512(v, n, lane); break;
    case Isa::Avx2: lse_lanes_avx2(v, n, lane); break;
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
    case Isa::Neon: lse_lanes_neon(v, n, lane); break;
#endif
    default: return lse_tile(v, n);
  }
  return lse_join_lanes(lane);
}

LsePair lse_tile_cpu(const float* v, int n) { return lse_tile_isa(active_isa(), v, n); }

void logsumexp_rows(const float* logits, int t, int64_t V, int threads, float* lse) {
  const int64_t tiles = lse_tile_count(V);
  std::vector<LsePair> pairs((size_t)(tiles > 0 ? tiles : 1));
  for (int r = 0; r < t; ++r) {
    const float* row = logits + (int64_t)r * V;
    parallel_for(tiles, 8, threads, [&](int64_t a, int64_t b) {
      for (int64_t k = a; k < b; ++k) {
        const int64_t i0 = k * kLseTile;
        const int n = (int)(V - i0 < kLseTile ? V - i0 : kLseTile);
        pairs[(size_t)k] = lse_tile_cpu(row + i0, n);
      }
    });
    lse[r] = lse_value(lse_tree(pairs.data(), (int)tiles));
  }
}

void log_softmax_rows(float* logits, int t, int64_t V, const float* lse, int threads) {
  for (int r = 0; r < t; ++r) {  // row by row: no index division per logit, and a loop compilers vectorize
    float* row = logits + (int64_t)r * V;
    const float l = lse[r];
    parallel_for(V, 1 << 18, threads, [&](int64_t a, int64_t b) {
      for (int64_t i = a; i < b; ++i) row[i] = row[i] - l;
    });
  }
}

int64_t count_ranked_ahead(const float* row, int64_t n, int64_t id0, float target, int64_t tok) {
  // ranks_ahead (muser/logsumexp.h) split at tok: an id below it is ahead with
  // an equal logit too, one above only with a larger one; a NaN target is
  // behind every number and behind the NaNs of lower ids
  const int64_t split = tok - id0 < 0 ? 0 : tok - id0 > n ? n : tok - id0;
  int64_t ahead = 0;
  if (!(target == target)) {
    ahead = split;
    for (int64_t i = split; i < n; ++i) ahead += row[i] == row[i];
    return ahead;
  }
  for (int64_t i = 0; i < split; ++i) ahead += row[i] >= target;
  for (int64_t i = split; i < n; ++i) ahead += row[i] > target;
  return ahead;
}

void score_rows(const float* logits, int t, int64_t V, const int64_t* ids, int m, const float* lse, int threads,
                float* logprobs, float* values, int64_t* ranks) {
  parallel_for((int64_t)t * m, 1, threads, [&](int64_t a, int64_t b) {
    for (int64_t q = a; q < b; ++q) {
      const int64_t r = q / m, tok = ids[q];
      const float* row = logits + r * V;
      const float v = row[tok];
      values[q] = v;
      logprobs[q] = v - lse[r];
      ranks[q] = 1 + count_ranked_ahead(row, V, 0, v, tok);  // rank: 1 + the ids ahead of tok
    }
  });
}

}  // namespace muser::cpu
