// Seeded sampling of one row of logits (docs/numerics.md, "Sampling"): the
// processed logits z (logit_bias, allowed, temperature), the kept set (top_k,
// top_p, min_p, in that order, each over the previous one's survivors), and
// the exponential race that draws a token from the kept set with Philox
// uniforms keyed by (seed, position, token id). Every sum is the canonical
// logsumexp of muser/logsumexp.h or (top_p's mass) an integer sum, every exp
// and log the canonical one, so the token and its log-probabilities depend on
// nothing but the row, the seed and the position: not on the batch, the
// thread count or the backend.
//
// A dropped token has z = -inf (it then adds nothing to a logsumexp). The one
// step that needs an order (top_k, top_p: descending z, ties to the lower id)
// is the caller's: sample_row takes a Steps policy (ops.prefix sorts, ops.pair,
// ops.race and ops.top_p_mass may split their work over threads;
// SampleSerialSteps holds the serial forms), so the CPU sorts with the
// standard library and a device kernel selects or sorts its own way. Any
// correct sort gives the same order (the order is total), and pairs and races
// split by tiles or ranges give the bits of the serial ones (the fixed tile
// tree; race_beats is a total order).
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
// (never returned to a caller) a device's ranked prefix of the kept-set order ends
// before top_p's cut: the device leaves the row to the host's full walk
MUSER_CONSTANT constexpr int32_t kSampleUndecided = 3;
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
// tiles, lanes, the trees); `tiles` holds lse_tile_count(n) pairs.
template <class PZ>
MUSER_HD LsePair sample_tile_pair(PZ z, int n, int k) {
  const int i0 = k * kLseTile;
  return lse_tile(z + i0, n - i0 < kLseTile ? n - i0 : kLseTile);
}
template <class PZ, class PT>
MUSER_HD LsePair sample_row_pair(PZ z, int n, PT tiles) {
  const int count = (int)lse_tile_count(n);
  for (int k = 0; k < count; ++k) tiles[k] = sample_tile_pair(z, n, k);
  return lse_tree(tiles, count);
}

// What the steps did to the row, so that later steps can skip work whose
// result is known exactly: z is x itself (temperature 1, no bias), and
// whether a token with a logit above -inf was dropped.
struct SampleShape {
  int32_t status;  // kSampleOk, or what went wrong at `top`
  int32_t top;     // the first largest z: first in the kept-set order, kept by every step
  bool z_is_x;
  bool dropped;
};

// Step 1: z[i] = (x[i] + bias[i]) / temperature for allowed tokens, -inf for
// the others; a -inf logit stays out. At temperature 0, z = x + bias (greedy
// takes its argmax). bias and allowed may be null. status: kSampleOk, or
// kSampleNonFinite at the first token whose z is NaN or +-inf (from a NaN or
// +inf logit, or a division that overflows), or kSampleEmpty.
// sample_processed without logit_bias and allowed, in loops without an
// early exit or a branch (compilers vectorize them): z = x / temperature for
// finite x (x at temperature 0, and -inf stays), then the first largest z.
// Returns false, with z unfinished, when some token fails (NaN, +inf, an
// overflowing division): the general loop then finds the first one.
template <class PX, class PZ>
MUSER_HD bool sample_processed_plain(PX x, int n, float temperature, PZ z, MUSER_THREAD SampleShape& sh) {
  // on the bits (finite: exponent not all ones; -inf: 0xff800000), which
  // compilers vectorize where float compares may trap
  const uint32_t exponent = 0x7f800000u, neg_inf = 0xff800000u;
  uint32_t bad = 0, same = 1;
  int32_t best = (int32_t)0x807fffffu;  // the largest z as an order key (below); this one is -inf's
  const float divisor = temperature > 0.0f ? temperature : 1.0f;  // x / 1 is x
  for (int i = 0; i < n; ++i) {
    const float v = x[i];
    const uint32_t b = f32_to_bits(v);
    const uint32_t d = f32_to_bits(v / divisor);  // divided unconditionally: a select, no branch
    const uint32_t finite = (uint32_t)((b & exponent) != exponent), keep = 0u - finite;  // all ones if finite
    const uint32_t q = (d & keep) | (b & ~keep);
    bad |= (finite & (uint32_t)((d & exponent) == exponent)) | ((finite ^ 1u) & (uint32_t)(b != neg_inf));
    same &= (uint32_t)(q == b);
    z[i] = bits_to_f32(q);
    // a key whose signed order is the float order of non-NaN values (-0 just below +0)
    const int32_t key = (int32_t)(q ^ ((uint32_t)((int32_t)q >> 31) & 0x7fffffffu));
    best = key > best ? key : best;
  }
  if (bad) return false;
  sh.z_is_x = same != 0;
  sh.dropped = false;
  const uint32_t best_bits = (uint32_t)(best ^ (int32_t)((uint32_t)(best >> 31) & 0x7fffffffu));
  if (best_bits == neg_inf) {
    sh.status = kSampleEmpty;
    sh.top = -1;
    return true;
  }
  // the first largest z (-0 and +0 are equal: the first zero when zero is the max)
  const float m = bits_to_f32(best_bits);
  int top = 0;
  while (!(z[top] == m)) ++top;
  sh.status = kSampleOk;
  sh.top = top;
  return true;
}

// Step 1 for one allowed token whose logit plus its bias is v: z = v / temperature
// (v at temperature 0). `finite` is false where z is NaN or +-inf -- from a NaN or
// +-inf v, or a division that overflows -- except for a -inf v, which stays out
// as a token of probability 0. Every backend's step 1 calls it per token.
MUSER_HD float sample_processed_one(float v, float temperature, MUSER_THREAD bool& finite) {
  finite = v - v == 0.0f;  // false for NaN and +-inf
  if (finite && temperature > 0.0f) {
    v = v / temperature;
    finite = v - v == 0.0f;  // a tiny temperature can overflow
  } else if (v == lse_neg_inf()) {
    finite = true;
  }
  return v;
}

template <class PX, class PB, class PA, class PZ>
MUSER_HD SampleShape sample_processed(PX x, PB bias, PA allowed, int n, float temperature, PZ z) {
  SampleShape sh{kSampleEmpty, -1, true, false};
  if (!bias && !allowed && sample_processed_plain(x, n, temperature, z, sh)) return sh;
  const float neg_inf = lse_neg_inf();
  float best = neg_inf;
  for (int i = 0; i < n; ++i) {
    float v = neg_inf;
    if (!allowed || allowed[i]) {
      bool finite;
      v = sample_processed_one(bias ? x[i] + bias[i] : x[i], temperature, finite);
      if (!finite) {
        sh.status = kSampleNonFinite;
        sh.top = i;
        return sh;
      }
    } else {
      sh.dropped = sh.dropped || x[i] != neg_inf;
    }
    z[i] = v;
    sh.z_is_x = sh.z_is_x && f32_to_bits(v) == f32_to_bits(x[i]);  // bits: -0 + 0 is +0
    if (v > best) {
      best = v;
      sh.top = i;
    }
  }
  if (sh.top >= 0) sh.status = kSampleOk;
  return sh;
}

// top_p's mass (docs/numerics.md, "Sampling"): a token's weight e^(z - m) in
// fixed point, trunc(e^(z - m) * 2^38), summed as integers. Integer
// sums do not depend on the order of the additions, so a parallel reduction, a
// sharded one and the CPU's running sum give the same total and the same cut
// (a float running sum would pin one serial order of tens of thousands of
// additions). With W <= 2^38 a vocabulary of up to 2^24 ids sums below 2^62.
MUSER_CONSTANT constexpr float kTopPScale = 274877906944.0f;  // 2^38
// A weight w in [0, 1] in fixed point (the product is exact; the cast truncates).
MUSER_HD uint64_t sample_top_p_fixed(float w) { return (uint64_t)(w * kTopPScale); }
MUSER_HD uint64_t sample_top_p_weight(float z, float m) { return sample_top_p_fixed(canon_exp_nonpos(z - m)); }

// The mass top_p's cut must reach: ceil(top_p * S), exactly (top_p in (0, 1],
// S < 2^62): top_p = mant * 2^-shift, the product mant * S in two 64-bit words.
MUSER_HD uint64_t sample_top_p_target(uint64_t S, float top_p) {
  const uint32_t b = f32_to_bits(top_p);
  const uint32_t e = b >> 23;
  const uint64_t mant = e ? ((b & 0x7FFFFFu) | 0x800000u) : (b & 0x7FFFFFu);
  const int shift = e ? 150 - (int)e : 149;  // >= 23 for top_p <= 1
  const uint64_t p0 = mant * (S & 0xFFFFFFFFu), p1 = mant * (S >> 32);  // each < 2^54
  const uint64_t lo = p0 + (p1 << 32);
  const uint64_t hi = (p1 >> 32) + (lo < p0 ? 1u : 0u);
  uint64_t q;
  bool rem;
  if (shift >= 128) {
    q = 0;
    rem = (hi | lo) != 0;
  } else if (shift >= 64) {
    q = shift == 64 ? hi : hi >> (shift - 64);
    rem = lo != 0 || (shift > 64 && (hi & ((uint64_t{1} << (shift - 64)) - 1)) != 0);
  } else {
    q = (lo >> shift) | (hi << (64 - shift));
    rem = (lo & ((uint64_t{1} << shift) - 1)) != 0;
  }
  return q + (rem ? 1u : 0u);
}

// top_p's mass S of the finite z among n (m: their largest).
template <class PZ>
MUSER_HD uint64_t sample_top_p_mass(PZ z, int n, float m) {
  const float neg_inf = lse_neg_inf();
  uint64_t S = 0;
  for (int i = 0; i < n; ++i)
    if (z[i] != neg_inf) S += sample_top_p_weight(z[i], m);
  return S;
}

// The top_p cut: over the first n tokens of `order` (already in the kept-set
// order), how many the smallest prefix whose mass reaches `target`
// (sample_top_p_target of the kept set's mass) takes; 0 when the n do not reach it.
template <class PZ, class PO>
MUSER_HD int sample_top_p_count(PZ z, PO order, int n, float m, uint64_t target) {
  uint64_t c = 0;
  for (int j = 0; j < n; ++j) {
    c += sample_top_p_weight(z[order[j]], m);
    if (c >= target) return j + 1;
  }
  return 0;
}

// A kept token's entry in the race: its weight e^(z - m) over its clock.
MUSER_HD float sample_race_key(float z, float m, uint64_t seed, uint64_t position, int32_t token) {
  return canon_exp_nonpos(z - m) / sample_exponential(seed, position, token);
}

// The race's standing: the best key so far and its token (-1: none yet).
struct RaceEntry {
  float key;
  int32_t token;
};
// a beats b: a larger key, or an equal one with a lower id (a total order, so
// ranges raced apart and merged give the one winner of the whole race)
MUSER_HD bool race_beats(RaceEntry a, RaceEntry b) {
  return a.key > b.key || (a.key == b.key && a.token >= 0 && (b.token < 0 || a.token < b.token));
}

// Pruning bounds (they only skip work: a skipped token's key is provably
// below the standing best, so the winner is the same as without them).
// No clock is below 2^-24 (u <= 1 - 2^-24, -log u > 1 - u), so a token with
// e^(z - m) < best * 2^-24 cannot win; 1e-3 in the log covers the rounding
// of canon_exp, canon_log and the division many times over.
MUSER_CONSTANT constexpr float kRaceClockFloor = 5.9604644775390625e-08f;  // 2^-24
MUSER_CONSTANT constexpr float kRaceLogMargin = 1e-3f;
MUSER_HD float race_z_floor(float best_key) {
  const float b = best_key * kRaceClockFloor;
  return b >= 1.17549435e-38f ? canon_log(b) - kRaceLogMargin : lse_neg_inf();  // normal floats only
}

// The race over the ids [i0, i1), from the standing `best`: the kept token
// with the largest e^(z - m) / E (E its exponential clock) wins, ties to the
// lower id. A token of weight w needs E < w / best = r to win; as
// E >= (1 - u)(1 - 2^-20), u < 1 - 4r rules that out without the log (the
// factor 4 also covers the rounding of 1 - 4r and clocks below 2^-24 r).
template <class PZ>
MUSER_HD RaceEntry sample_race_range(PZ z, int i0, int i1, float m, uint64_t seed, uint64_t position,
                                     RaceEntry best) {
  const float neg_inf = lse_neg_inf();
  float z_floor = race_z_floor(best.key);
  for (int i = i0; i < i1; ++i) {
    const float d = z[i] - m;
    if (z[i] == neg_inf || d < z_floor) continue;
    const float w = canon_exp_nonpos(d);
    if (best.key > 0.0f) {
      const float r = w / best.key;
      if (r < 0.125f && philox_uniform(philox_token_bits(seed, position, (uint32_t)i)) < 1.0f - 4.0f * r) continue;
    }
    const RaceEntry e{w / sample_exponential(seed, position, i), i};
    if (race_beats(e, best)) {
      best = e;
      z_floor = race_z_floor(best.key);
    }
  }
  return best;
}

// The whole race, serially, standing first on the top token (the best guess
// at the winner, so the bounds prune from the start); returns the winner.
template <class PZ>
MUSER_HD int32_t sample_race(PZ z, int n, float m, uint64_t seed, uint64_t position, int32_t top) {
  const RaceEntry first{sample_race_key(z[top], m, seed, position, top), top};
  return sample_race_range(z, 0, n, m, seed, position, first).token;
}

// The serial forms of the steps a backend may run in parallel (the policy
// sample_row takes: ops.pair, ops.race, ops.top_p_mass and ops.top_p_count
// (sample_top_p_mass's and sample_top_p_count's integers, in any order of
// additions), and ops.prefix, the sort).
struct SampleSerialSteps {
  template <class PZ, class PT>
  MUSER_HD LsePair pair(PZ z, int n, PT tiles) const {
    return sample_row_pair(z, n, tiles);
  }
  template <class PZ>
  MUSER_HD int32_t race(PZ z, int n, float m, uint64_t seed, uint64_t position, int32_t top) const {
    return sample_race(z, n, m, seed, position, top);
  }
  template <class PZ>
  MUSER_HD uint64_t top_p_mass(PZ z, int n, float m) const {
    return sample_top_p_mass(z, n, m);
  }
  template <class PZ, class PO>
  MUSER_HD int top_p_count(PZ z, PO order, int n, float m, uint64_t target) const {
    return sample_top_p_count(z, order, n, m, target);
  }
};

// The kept set's largest z and logsumexp: the race's m, the processed
// distribution's normalizer.
struct KeptSet {
  float m;
  float lse;
};

// The kept-set order's buckets: bucket b holds the finite z with
// floor((m - z) * kSampleBucketsPerUnit) = b (m the largest z), the last one
// everything from 64 below m on. The bucket grows as z falls,
// so the ids of buckets 0 .. B are a prefix of the kept-set order (ties share
// a bucket): top_k and top_p sort that prefix alone instead of the row.
MUSER_CONSTANT constexpr int kSampleBuckets = 513;
MUSER_CONSTANT constexpr float kSampleBucketsPerUnit = 8.0f;
MUSER_HD int sample_bucket(float z, float m) {
  const float f = (m - z) * kSampleBucketsPerUnit;
  return f < (float)(kSampleBuckets - 1) ? (int)f : kSampleBuckets - 1;
}

// order[0, count) = the ids of the finite z in buckets 0 .. last, increasing id.
template <class PZ, class PO>
MUSER_HD int sample_bucket_ids(PZ z, int n, float m, int last, PO order) {
  const float neg_inf = lse_neg_inf();
  int count = 0;
  for (int i = 0; i < n; ++i) {  // written always, counted when taken: no branch to mispredict
    order[count] = i;
    count += (int)((z[i] != neg_inf) & (sample_bucket(z[i], m) <= last));
  }
  return count;
}

// Keeps the kept-set order's prefix ending at token `last` (z[last] = zl):
// every other finite z becomes -inf.
template <class PZ>
MUSER_HD void sample_keep_through(PZ z, int n, float zl, int32_t last) {
  const float neg_inf = lse_neg_inf();
  for (int i = 0; i < n; ++i) {  // a select, no branch: z > zl, or z == zl at an id up to last's
    const float v = z[i];
    z[i] = (v > zl) | ((v == zl) & (i <= last)) ? v : neg_inf;
  }
}

// Steps 3-5 on z (written by sample_processed, which gave `sh`): drops
// tokens to -inf for top_k, top_p, min_p (sh.dropped records it). `order`
// has room for n ids, `tiles` for ceil(n / kLseTile) pairs;
// ops.prefix(order, count, k, z) must leave in order[0, k) the k first of
// the `count` ids in order[0, count) in the kept-set order (sample_before).
// row_lse: the logits' canonical logsumexp, which is the kept set's when z
// is x and nothing was dropped (the same pair of the same row).
// top_k and top_p rank only a prefix of the order that provably holds their
// cut (the buckets above; a bucket's weights are at least e^-(b+1)/8): the
// cut is the one a sort of the whole row gives, which is what they fall back
// to when the bound does not settle it.
template <class PZ, class PO, class PT, class Steps>
MUSER_HD KeptSet sample_kept_set(PZ z, int n, SampleParams p, float row_lse, MUSER_THREAD SampleShape& sh, PO order,
                                 PT tiles, MUSER_THREAD Steps& ops) {
  const float neg_inf = lse_neg_inf();
  const float m = z[sh.top];
  if (p.top_k > 0 || p.top_p < 1.0f) {
    int hist[kSampleBuckets + 1];  // and one slot for -inf, so that no branch skips it
    for (int b = 0; b <= kSampleBuckets; ++b) hist[b] = 0;
    for (int i = 0; i < n; ++i) ++hist[z[i] == neg_inf ? kSampleBuckets : sample_bucket(z[i], m)];
    int count = n - hist[kSampleBuckets];  // the finite z
    const bool top_k_cuts = p.top_k > 0 && p.top_k < count;
    if (top_k_cuts) {  // the buckets holding the top_k first, then their order
      int last = 0;
      for (int within = hist[0]; within < p.top_k; within += hist[++last]) {
      }
      const int candidates = sample_bucket_ids(z, n, m, last, order);
      ops.prefix(order, candidates, p.top_k, z);
      sample_keep_through(z, n, z[order[p.top_k - 1]], order[p.top_k - 1]);
      count = p.top_k;
      sh.dropped = true;
    }
    if (p.top_p < 1.0f) {
      const uint64_t target = sample_top_p_target(ops.top_p_mass(z, n, m), p.top_p);
      int cut = 0;
      if (top_k_cuts) {  // top_k sorted its survivors
        cut = ops.top_p_count(z, order, count, m, target);
      } else {
        // the fewest buckets whose mass, bounded below, reaches the target: their
        // prefix holds the cut (the bound's margin covers canon_exp's rounding;
        // the walk over them confirms it)
        uint64_t mass = 0;
        int last = -1, candidates = 0;
        for (int b = 0; b < kSampleBuckets - 1 && mass < target; ++b) {
          const float w = canon_exp_nonpos(-(float)(b + 1) / kSampleBucketsPerUnit) * 0.999f;
          mass += (uint64_t)hist[b] * sample_top_p_fixed(w);
          candidates += hist[b];
          last = b;
        }
        if (mass >= target && candidates < count) {
          candidates = sample_bucket_ids(z, n, m, last, order);
          ops.prefix(order, candidates, candidates, z);
          cut = ops.top_p_count(z, order, candidates, m, target);
        }
      }
      if (cut == 0) {  // the whole order: sort a growing prefix until its mass reaches the target
        count = 0;
        for (int i = 0; i < n; ++i)
          if (z[i] != neg_inf) order[count++] = i;
        int sorted = 0;
        // every weight is <= kTopPScale, so the prefix holds at least target / kTopPScale tokens: start
        // there (any start finds the same cut: the first prefix reaching, in a sorted prefix)
        const float at_least = (float)target / kTopPScale;
        int want = at_least < 64.0f ? 64 : at_least < (float)count ? (int)at_least + 1 : count;
        for (;; want = want > count / 4 ? count : want * 4) {
          const int k = want < count ? want : count;
          if (k > sorted) {
            ops.prefix(order, count, k, z);
            sorted = k;
          }
          cut = ops.top_p_count(z, order, k, m, target);
          if (cut > 0 || k == count) break;
        }
      }
      if (cut < count) {
        sample_keep_through(z, n, z[order[cut - 1]], order[cut - 1]);
        sh.dropped = true;
      }
    }
  }
  if (p.min_p > 0.0f)  // e^(z - max) = p / p_max: the normalization cancels
    for (int i = 0; i < n; ++i)
      if (z[i] != neg_inf && canon_exp_nonpos(z[i] - m) < p.min_p) {
        z[i] = neg_inf;
        sh.dropped = true;
      }
  if (sh.z_is_x && !sh.dropped) return KeptSet{m, row_lse};
  return KeptSet{m, lse_value(ops.pair(z, n, tiles))};
}

// The raw side of a draw: logprob of r.token against the row's logsumexp
// lse (computed as score computes it), and the raw mass of the kept set (the
// tokens with z > -inf) through `raw` (scratch for n floats). The shortcuts
// give the bits of the full computation: nothing dropped, the kept row is the
// row (mass 1); one kept token, its pair is (x, 1) and its logsumexp x;
// raw_is_z (z equals x where kept), raw is z, whose logsumexp is z_lse.
template <class PX, class PZ, class PR, class PT, class Steps>
MUSER_HD void sample_raw_side(PX x, PZ z, int n, float lse, bool dropped, bool one_kept, PR raw, PT tiles,
                              MUSER_THREAD Steps& ops, MUSER_THREAD SampleResult& r, bool raw_is_z, float z_lse) {
  float kept_lse = lse;
  if (one_kept) {
    kept_lse = x[r.token];
  } else if (dropped && raw_is_z) {
    kept_lse = z_lse;
  } else if (dropped) {
    const float neg_inf = lse_neg_inf();
    for (int i = 0; i < n; ++i) raw[i] = z[i] == neg_inf ? neg_inf : x[i];
    kept_lse = lse_value(ops.pair(raw, n, tiles));
  }
  const float d = kept_lse - lse;
  r.logprob = x[r.token] - lse;
  r.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
}

// One row, start to end. x: the n capped logits; lse: their canonical
// logsumexp; z, raw: scratch for n floats; order: n ids; tiles: ceil(n /
// kLseTile) pairs; ops: the Steps policy (above).
template <class PX, class PB, class PA, class PZ, class PR, class PO, class PT, class Steps>
MUSER_HD SampleResult sample_row(PX x, PB bias, PA allowed, int n, float lse, SampleParams p, uint64_t position,
                                 PZ z, PR raw, PO order, PT tiles, MUSER_THREAD Steps& ops) {
  SampleShape sh = sample_processed(x, bias, allowed, n, p.temperature, z);
  SampleResult r{sh.status, sh.top, 0.0f, 0.0f, 0.0f};
  if (sh.status != kSampleOk) return r;
  if (p.temperature > 0.0f) {
    const KeptSet kept = sample_kept_set(z, n, p, lse, sh, order, tiles, ops);
    r.token = ops.race(z, n, kept.m, p.seed, position, sh.top);
    r.processed_logprob = z[r.token] - kept.lse;
    sample_raw_side(x, z, n, lse, sh.dropped, false, raw, tiles, ops, r, sh.z_is_x, kept.lse);
  } else {  // greedy: the kept set is the top token alone (z is left as step 1 wrote it)
    r.processed_logprob = 0.0f;
    sample_raw_side(x, z, n, lse, true, true, raw, tiles, ops, r, false, 0.0f);
  }
  return r;
}

}  // namespace muser
