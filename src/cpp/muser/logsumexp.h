// The canonical logsumexp of a row of logits (docs/numerics.md, "The
// vocabulary reduction"): tiles of kLseTile ids; in a tile, lane l of 32 owns
// ids i = l (mod 32) and keeps an online (max, sum) in increasing i; lanes are
// joined by the butterfly tree, tiles by a fixed binary tree over the tile
// index. Every backend runs these functions in this order, so the bits do not
// depend on the backend, the batch size or the thread count.
#pragma once
#include "canonical.h"

namespace muser {

MUSER_CONSTANT constexpr int kLseTile = 2048;  // token ids per tile

// The tiles of a row of n ids (the last one may be short).
MUSER_HD int64_t lse_tile_count(int64_t n) { return (n + kLseTile - 1) / kLseTile; }

// (m, s): the running max and the sum of e^(v - m) over what was seen.
struct LsePair {
  float m;
  float s;
};

MUSER_HD float lse_neg_inf() { return bits_to_f32(0xff800000u); }
MUSER_HD LsePair lse_empty() { return LsePair{lse_neg_inf(), 0.0f}; }

// One more logit: a larger one rescales the sum; -inf adds nothing; NaN poisons s.
MUSER_HD LsePair lse_push(LsePair a, float v) {
  if (v == lse_neg_inf()) return a;
  if (v > a.m) return LsePair{v, fmaf(a.s, canon_exp_nonpos(a.m - v), 1.0f)};
  return LsePair{a.m, a.s + canon_exp_nonpos(v - a.m)};
}

// (m, s) + (m', s') = (M, s e^(m - M) + s' e^(m' - M)), M = max(m, m').
MUSER_HD LsePair lse_merge(LsePair a, LsePair b) {
  const float M = a.m > b.m ? a.m : b.m;
  if (M == lse_neg_inf()) return lse_empty();
  return LsePair{M, fmaf(a.s, canon_exp_nonpos(a.m - M), b.s * canon_exp_nonpos(b.m - M))};
}

// Joins a tile's 32 lane pairs in place by the butterfly tree (offsets 16,
// 8, 4, 2, 1: lane[l] = lse_merge(lane[l], lane[l + off])); returns lane[0].
template <class P>
MUSER_HD LsePair lse_join_lanes(P lane) {
  for (int off = kCanonLanes / 2; off >= 1; off >>= 1)
    for (int l = 0; l < off; ++l) lane[l] = lse_merge(lane[l], lane[l + off]);
  return lane[0];
}

// The pair of one tile: the n logits at v, n <= kLseTile, lanes then the tree.
// (The CPU's SIMD twins, cpu/canon_simd.h's lse_tile_v, run the lanes on
// registers and give these bits.)
template <class P>
MUSER_HD LsePair lse_tile(P v, int n) {
  LsePair lane[kCanonLanes];
  for (int l = 0; l < kCanonLanes; ++l) lane[l] = lse_empty();
  for (int i = 0; i < n; ++i) lane[i % kCanonLanes] = lse_push(lane[i % kCanonLanes], v[i]);
  return lse_join_lanes(lane);
}

// Joins the n tile pairs in place by the fixed tree (pairs 2k, 2k+1 per level, an
// odd last one carried up); the result is tiles[0].
template <class P>
MUSER_HD LsePair lse_tree(P tiles, int n) {
  while (n > 1) {
    const int half = n / 2;
    for (int k = 0; k < half; ++k) tiles[k] = lse_merge(tiles[2 * k], tiles[2 * k + 1]);
    if (n % 2) tiles[half] = tiles[n - 1];
    n = half + n % 2;
  }
  return n == 1 ? tiles[0] : lse_empty();
}

// Whether token j with logit v ranks ahead of token `tok` with logit `target`:
// a larger logit, or an equal one with a lower id; NaN is behind every number,
// NaNs among themselves by id. A rank is 1 + the count of ids ahead.
MUSER_HD bool ranks_ahead(float v, int64_t j, float target, int64_t tok) {
  if (!(target == target)) return v == v || j < tok;
  return v > target || (v == target && j < tok);
}

MUSER_HD float lse_value(LsePair a) {
  if (a.m == lse_neg_inf()) return a.m;
  return a.m + canon_log(a.s);
}

}  // namespace muser
