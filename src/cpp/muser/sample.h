// Seeded sampling of one row of logits (docs/numerics.md, "Sampling"): the
// processed logits z (logit_bias, allowed, temperature), the kept set (top_k,
// top_p, min_p, in that order, each over the previous one's survivors), and
// the exponential race that draws a token from the kept set with Philox
// uniforms keyed by (seed, position, token id). Every sum is the canonical
// logsumexp of muser/logsumexp.h, every exp and log the canonical one, so the
// token and its log-probabilities depend on nothing but the row, the seed and
// the position: not on the batch, the thread count or the backend.
//
// A dropped token has z = -inf (it then adds nothing to a logsumexp). The one
// step that needs an order (top_k, top_p: descending z, ties to the lower id)
// is the caller's: sample_row takes a Sorter, so the CPU sorts with the
// standard library and a device kernel with its own sort; any correct sort
// gives the same order, because the order is total.
#pragma once
#include "logsumexp.h"
#include "philox.h"

namespace muser {

// What one draw is asked to do (host values, rounded to float32 once).
struct SampleParams {
  float temperature;  // 0: greedy; > 0: z = (logit + bias) / temperature
  int32_t top_k;      // 0: off; else keep the top_k largest z
  float top_p;        // 1: off; else the smallest prefix of the order reaching top_p of the mass
  float min_p;        // 0: off; else keep e^(z - z_max) >= min_p
  uint64_t seed;
};

// The result of one row; status != kSampleOk names what went wrong at `token`.
MUSER_CONSTANT constexpr int32_t kSampleOk = 0;
MUSER_CONSTANT constexpr int32_t kSampleNonFinite = 1;  // z[token] is NaN or +-inf from a finite or NaN logit
MUSER_CONSTANT constexpr int32_t kSampleEmpty = 2;      // no token left with a finite z
struct SampleResult {
  int32_t status;
  int32_t token;
  float logprob;            // logit[token] - logsumexp(logits): equal to score's
  float processed_logprob;  // z[token] - logsumexp(z over the kept set)
  float kept_mass;          // e^(logsumexp(logits over the kept set) - logsumexp(logits))
};

// True when token a comes before token b in the kept-set order.
MUSER_HD bool sample_before(float za, int32_t a, float zb, int32_t b) { return za > zb || (za == zb && a < b); }

// The exponential race's clock of one token: E = -log u, u the token's uniform.
// canon_log's reduction holds below 1 as well (every positive normal float);
// tests/cpp/test_philox.cpp checks it on every u this can give.
MUSER_HD float sample_exponential(uint64_t seed, uint64_t position, int32_t token) {
  return -canon_log(philox_uniform(philox_token_bits(seed, position, (uint32_t)token)));
}

// The canonical (max, sum) pair of a row of n values (muser/logsumexp.h:
// tiles, lanes, the trees); `tiles` holds ceil(n / kLseTile) pairs.
template <class PZ, class PT>
MUSER_HD LsePair sample_row_pair(PZ z, int n, PT tiles) {
  const int count = (n + kLseTile - 1) / kLseTile;
  for (int k = 0; k < count; ++k) {
    const int i0 = k * kLseTile;
    tiles[k] = lse_tile(z + i0, n - i0 < kLseTile ? n - i0 : kLseTile);
  }
  return lse_tree(tiles, count);
}

// Step 1: z[i] = (x[i] + bias[i]) / temperature for allowed tokens, -inf for
// the others; a -inf logit stays out. At temperature 0, z = x + bias (greedy
// takes its argmax). bias and allowed may be null. Returns kSampleOk, or the
// first token whose z is NaN or +-inf (from a NaN or +inf logit, or a
// division that overflows), or kSampleEmpty; r.token is the first largest z's token.
template <class PX, class PB, class PA, class PZ>
MUSER_HD SampleResult sample_processed(PX x, PB bias, PA allowed, int n, float temperature, PZ z) {
  SampleResult r{kSampleEmpty, -1, 0.0f, 0.0f, 0.0f};
  const float neg_inf = lse_neg_inf();
  float best = neg_inf;
  for (int i = 0; i < n; ++i) {
    float v = neg_inf;
    if (!allowed || allowed[i]) {
      v = bias ? x[i] + bias[i] : x[i];
      bool finite = v - v == 0.0f;  // false for NaN and +-inf
      if (finite && temperature > 0.0f) {
        v = v / temperature;
        finite = v - v == 0.0f;  // a tiny temperature can overflow
      } else if (v == neg_inf) {
        finite = true;  // a -inf logit is a token of probability 0: it stays out
      }
      if (!finite) {
        r.status = kSampleNonFinite;
        r.token = i;
        return r;
      }
    }
    z[i] = v;
    if (v > best) {
      best = v;
      r.token = i;
    }
  }
  if (r.token >= 0) r.status = kSampleOk;
  return r;
}

// The top_p cut: over the first n tokens of `order` (already in the kept-set
// order), how many the smallest prefix whose running sum of e^(z - m) reaches
// top_p * s takes (s: the kept set's canonical sum; the running sum adds in
// order, one rounding per term). All n when rounding keeps it from reaching.
template <class PZ, class PO>
MUSER_HD int sample_top_p_count(PZ z, PO order, int n, float m, float s, float top_p) {
  const float target = top_p * s;
  float c = 0.0f;
  for (int j = 0; j < n; ++j) {
    c = c + canon_exp_nonpos(z[order[j]] - m);
    if (c >= target) return j + 1;
  }
  return n;
}

// A kept token's entry in the race: its weight e^(z - m) over its clock.
MUSER_HD float sample_race_key(float z, float m, uint64_t seed, uint64_t position, int32_t token) {
  return canon_exp_nonpos(z - m) / sample_exponential(seed, position, token);
}

// The race: the kept token with the largest e^(z - m) / E (E its exponential
// clock) wins, ties to the lower id. P(token i wins) = e^(z_i) / sum e^(z_j).
template <class PZ>
MUSER_HD int32_t sample_race(PZ z, int n, float m, uint64_t seed, uint64_t position) {
  const float neg_inf = lse_neg_inf();
  int32_t winner = -1;
  float best = -1.0f;
  for (int i = 0; i < n; ++i) {
    if (z[i] == neg_inf) continue;
    const float key = sample_race_key(z[i], m, seed, position, i);
    if (key > best) {
      best = key;
      winner = i;
    }
  }
  return winner;
}

// Steps 2-5 on z (written by sample_processed, top token `top`): drops tokens
// to -inf for top_k, top_p, min_p; returns the kept set's pair (its max is
// z[top]). `order` has room for n ids, `tiles` for ceil(n / kLseTile) pairs;
// sort.prefix(order, count, k, z) must leave in order[0, k) the k first of
// the `count` ids in order[0, count) in the kept-set order (sample_before).
template <class PZ, class PO, class PT, class Sorter>
MUSER_HD LsePair sample_kept_set(PZ z, int n, SampleParams p, PO order, PT tiles, MUSER_THREAD Sorter& sort) {
  const float neg_inf = lse_neg_inf();
  const bool by_rank = p.top_k > 0 || p.top_p < 1.0f;
  int count = 0;
  if (by_rank)
    for (int i = 0; i < n; ++i)
      if (z[i] != neg_inf) order[count++] = i;
  const bool top_k_cuts = p.top_k > 0 && p.top_k < count;
  if (top_k_cuts) {
    sort.prefix(order, count, p.top_k, z);
    for (int j = p.top_k; j < count; ++j) z[order[j]] = neg_inf;
    count = p.top_k;
  }
  if (p.top_p < 1.0f) {
    const LsePair kept = sample_row_pair(z, n, tiles);
    // sort a growing prefix until its mass reaches top_p: a short prefix when
    // the distribution is peaked, the whole set at worst
    int sorted = top_k_cuts ? count : 0;  // top_k sorted its survivors
    int cut = count;
    for (int want = 64;; want *= 4) {
      const int k = want < count ? want : count;
      if (k > sorted) {
        sort.prefix(order, count, k, z);
        sorted = k;
      }
      cut = sample_top_p_count(z, order, k, kept.m, kept.s, p.top_p);
      if (cut < k || k == count) break;
    }
    for (int j = cut; j < count; ++j) z[order[j]] = neg_inf;
  }
  LsePair kept = sample_row_pair(z, n, tiles);
  if (p.min_p > 0.0f) {  // e^(z - max) = p / p_max: the normalization cancels
    for (int i = 0; i < n; ++i)
      if (z[i] != neg_inf && canon_exp_nonpos(z[i] - kept.m) < p.min_p) z[i] = neg_inf;
    kept = sample_row_pair(z, n, tiles);
  }
  return kept;
}

// The raw side of a draw: logprob of `token` against the full row's logsumexp
// lse (computed as score computes it), and the raw mass of the kept set (the
// tokens with z > -inf), through `raw` (scratch for n floats).
template <class PX, class PZ, class PR, class PT>
MUSER_HD void sample_raw_side(PX x, PZ z, int n, float lse, PR raw, PT tiles, MUSER_THREAD SampleResult& r) {
  const float neg_inf = lse_neg_inf();
  for (int i = 0; i < n; ++i) raw[i] = z[i] == neg_inf ? neg_inf : x[i];
  const float kept_lse = lse_value(sample_row_pair(raw, n, tiles));
  const float d = kept_lse - lse;
  r.logprob = x[r.token] - lse;
  r.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
}

// One row, start to end. x: the n capped logits; lse: their canonical
// logsumexp; z, raw: scratch for n floats; order: n ids; tiles: ceil(n /
// kLseTile) pairs.
template <class PX, class PB, class PA, class PZ, class PR, class PO, class PT, class Sorter>
MUSER_HD SampleResult sample_row(PX x, PB bias, PA allowed, int n, float lse, SampleParams p, uint64_t position,
                                 PZ z, PR raw, PO order, PT tiles, MUSER_THREAD Sorter& sort) {
  SampleResult r = sample_processed(x, bias, allowed, n, p.temperature, z);
  if (r.status != kSampleOk) return r;
  if (p.temperature > 0.0f) {
    const LsePair kept = sample_kept_set(z, n, p, order, tiles, sort);
    r.token = sample_race(z, n, kept.m, p.seed, position);
    r.processed_logprob = z[r.token] - lse_value(kept);
  } else {  // greedy: the kept set is the top token alone
    const float neg_inf = lse_neg_inf();
    for (int i = 0; i < n; ++i)
      if (i != r.token) z[i] = neg_inf;
    r.processed_logprob = 0.0f;
  }
  sample_raw_side(x, z, n, lse, raw, tiles, r);
  return r;
}

}  // namespace muser
