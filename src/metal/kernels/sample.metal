// Seeded sampling on the device (docs/numerics.md, "Sampling"): muser/sample.h's
// sample_row with its steps spread over SIMD groups, the same operations on the
// same operands, so the CPU's bits (src/cuda/sample.cu is the CUDA twin).
//
//   sample_tiles_f32      one SIMD group per (tile, row): z = the processed logits
//                         (bias, allowed, temperature) into a scratch row; the
//                         tile's pair of the logits (the row's logsumexp), its
//                         largest z as a key, its first non-finite z
//   sample_rows_f32       one thread per row: the tile tree, the top token, the
//                         verdict (a non-finite z, no finite z); greedy rows end here
//   sample_mass_tiles_f32 top_p without top_k: one SIMD group per (tile, row), the
//                         tile's fixed-point mass of its finite z (integers: any
//                         order gives the CPU's sum)
//   sample_cut_f32        from the m best keys of z (topk.metal's stages, in the
//                         kept-set order), the finite ones: top_k's; then top_p's
//                         shortest prefix reaching ceil(top_p * S) of the kept
//                         set's fixed-point mass S (top_k's k, or the whole row's
//                         from the tiles' masses): the key of the last kept token.
//                         A row whose m best do not reach it is left to the host
//                         (kSampleUndecided)
//   sample_kept_tiles_f32 one SIMD group per (tile, row): the kept set (the cut,
//                         min_p), the pairs of its z and of its raw logits, the
//                         tile's best race key (e^(z - m) / E, ties to the lower
//                         id: a maximum, so any split of the race finds the serial winner)
//   sample_kept_rows_f32  one thread per row: the two tile trees, the winner and
//                         the result
// Buffers: 0 TileRowsKargs, 1 SampleParams, 2 logits [rows x V], 3 z [rows x V],
// 4 bias [V], 5 allowed [V] (uchar), 6 positions [rows] (ulong), 7 pairs
// [rows x tiles] ((m, s) floats; the kept z's later), 8 keys [rows x tiles]
// (ulong: the tops, top_p's masses, the race later), 9 bad [rows x tiles] (uint: 0xFFFFFFFF - the
// first bad id, 0 for none), 10 row state [rows] (SampleTileRow), 11 results
// [rows] (SampleResult), 12 top_k's best keys [rows x m], 13 the kept raw logits' pairs.
#include "common.h"
#include "muser/sample.h"
#include "muser/topk_key.h"

using namespace muser;

MUSER_KERNEL(sample_tiles_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_CONSTANT(SampleParams, p, 1),
             MUSER_ARG_BUFFER_IN(float, logits, 2), MUSER_ARG_BUFFER_OUT(float, z, 3),
             MUSER_ARG_BUFFER_IN(float, bias, 4), MUSER_ARG_BUFFER_IN(uchar, allowed, 5),
             MUSER_ARG_BUFFER_OUT(float, pairs, 7), MUSER_ARG_BUFFER_OUT(ulong, tops, 8),
             MUSER_ARG_BUFFER_OUT(uint, bads, 9), MUSER_ARG_TGID(group), MUSER_ARG_LANE(lane)) {
  const int64_t tile = (int64_t)group % a.tiles, row = (int64_t)group / a.tiles, i0 = tile * kLseTile;
  const int n = (int)(a.V - i0 < kLseTile ? a.V - i0 : kLseTile);
  device const float* x = logits + row * a.V;
  device float* zr = z + row * a.V;
  const float neg_inf = lse_neg_inf();
  LsePair px = lse_empty();
  ulong top = 0;
  uint bad = 0;
  for (int i = (int)lane; i < n; i += kCanonLanes) {
    const int64_t id = i0 + i;
    const float v = x[id];
    px = lse_push(px, v);
    float w = neg_inf;  // sample_processed, one token
    if (!a.has_allowed || allowed[id]) {
      bool ok;
      w = sample_processed_one(a.has_bias ? v + bias[id] : v, p.temperature, ok);
      if (!ok) {
        const uint b = 0xFFFFFFFFu - (uint)id;
        bad = b > bad ? b : bad;
        w = neg_inf;
      }
    }
    zr[id] = w;
    if (w != neg_inf) {
      const ulong key = topk_key(w, id);
      top = key > top ? key : top;
    }
  }
  px = simd_lse_join(px, (ushort)lane);
  top = simd_max_key(top);
  for (ushort off = 16; off >= 1; off >>= 1) {
    const uint o = metal::simd_shuffle_xor(bad, off);
    bad = o > bad ? o : bad;
  }
  if (lane == 0) {
    const int at = (int)(row * a.tiles + tile);
    DevicePairs{pairs}[at] = px;
    tops[at] = top;
    bads[at] = bad;
  }
}

MUSER_KERNEL(sample_rows_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_CONSTANT(SampleParams, p, 1),
             MUSER_ARG_BUFFER_IN(float, logits, 2), MUSER_ARG_BUFFER_IN(float, z, 3),
             MUSER_ARG_BUFFER_INOUT(float, pairs, 7), MUSER_ARG_BUFFER_IN(ulong, tops, 8),
             MUSER_ARG_BUFFER_IN(uint, bads, 9), MUSER_ARG_BUFFER_OUT(SampleTileRow, rows, 10),
             MUSER_ARG_BUFFER_OUT(SampleResult, results, 11), MUSER_ARG_TID(row)) {
  if ((int)row >= a.rows) return;
  const int64_t base = (int64_t)row * a.tiles;
  const float lse = lse_value(lse_tree(DevicePairs{pairs + 2 * base}, (int)a.tiles));
  ulong top = 0;
  uint bad = 0;
  for (int64_t k = 0; k < a.tiles; ++k) {
    top = tops[base + k] > top ? tops[base + k] : top;
    bad = bads[base + k] > bad ? bads[base + k] : bad;
  }
  int32_t status = kSampleOk, token = 0;
  float logprob = 0.0f, mass = 0.0f;
  if (bad) {
    status = kSampleNonFinite;
    token = (int32_t)(0xFFFFFFFFu - bad);
  } else if (!top) {
    status = kSampleEmpty;
    token = -1;
  } else if (!(p.temperature > 0.0f)) {  // greedy: the kept set is the top token alone (sample_raw_side)
    token = (int32_t)topk_key_id(top);
    const float xt = logits[(int64_t)row * a.V + token];
    const float d = xt - lse;
    logprob = xt - lse;
    mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
  }
  results[row].status = status;
  results[row].token = token;
  results[row].logprob = logprob;
  results[row].processed_logprob = 0.0f;
  results[row].kept_mass = mass;
  rows[row].m = top ? z[(int64_t)row * a.V + topk_key_id(top)] : 0.0f;
  rows[row].lse = lse;
  rows[row].cut = 0;
}

MUSER_KERNEL(sample_mass_tiles_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_BUFFER_IN(float, z, 3),
             MUSER_ARG_BUFFER_OUT(ulong, masses, 8), MUSER_ARG_BUFFER_IN(SampleTileRow, rows, 10),
             MUSER_ARG_TGID(group), MUSER_ARG_LANE(lane)) {
  const int64_t tile = (int64_t)group % a.tiles, row = (int64_t)group / a.tiles, i0 = tile * kLseTile;
  const int n = (int)(a.V - i0 < kLseTile ? a.V - i0 : kLseTile);
  device const float* zr = z + row * a.V + i0;
  const float m = rows[row].m;
  ulong S = 0;  // at most 2^38 a token, kLseTile tokens: far below 2^64
  for (int i = (int)lane; i < n; i += kCanonLanes)
    if (zr[i] != lse_neg_inf()) S += sample_top_p_weight(zr[i], m);
  S = simd_sum_u64(S);
  if (lane == 0) masses[row * a.tiles + tile] = S;
}

namespace {
// A row's best keys read as the kept-set order's token ids, and as their z.
struct KeyIds {
  device const ulong* b;
  int64_t operator[](int j) const { return (int64_t)topk_key_id(b[j]); }
};
struct ZOfKeys {
  device const float* z;
  device const ulong* b;
  float operator[](int j) const { return z[topk_key_id(b[j])]; }
};
}  // namespace

MUSER_KERNEL(sample_cut_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_CONSTANT(SampleParams, p, 1),
             MUSER_ARG_BUFFER_IN(float, z, 3), MUSER_ARG_BUFFER_IN(ulong, masses, 8),
             MUSER_ARG_BUFFER_INOUT(SampleTileRow, rows, 10), MUSER_ARG_BUFFER_INOUT(SampleResult, results, 11),
             MUSER_ARG_BUFFER_IN(ulong, best, 12), MUSER_ARG_TID(row)) {
  if ((int)row >= a.rows || results[row].status != kSampleOk) return;
  device const ulong* b = best + (int64_t)row * a.m;
  device const float* zr = z + (int64_t)row * a.V;
  const float m = rows[row].m;
  const KeyIds order{b};
  int count = 0;  // the finite z among the m best: a prefix of them (-inf ranks last)
  while (count < a.m && zr[order[count]] != lse_neg_inf()) ++count;
  int keep = count;
  if (p.top_p < 1.0f) {  // over the kept-set order, as sample_kept_set
    ulong S = 0;  // the kept set's mass: top_k's k best, or (top_p alone) the whole row's
    if (p.top_k > 0) {
      S = sample_top_p_mass(ZOfKeys{zr, b}, count, m);
    } else {
      for (int64_t k = 0; k < a.tiles; ++k) S += masses[(int64_t)row * a.tiles + k];
    }
    keep = sample_top_p_count(zr, order, count, m, sample_top_p_target(S, p.top_p));
    if (keep == 0) {  // only top_p alone ends here: the m best hold less than the target
      results[row].status = kSampleUndecided;
      return;
    }
  }
  rows[row].cut = keep > 0 ? b[keep - 1] : 0;
}

MUSER_KERNEL(sample_kept_tiles_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0),
             MUSER_ARG_CONSTANT(SampleParams, p, 1), MUSER_ARG_BUFFER_IN(float, logits, 2),
             MUSER_ARG_BUFFER_IN(float, z, 3), MUSER_ARG_BUFFER_IN(ulong, positions, 6),
             MUSER_ARG_BUFFER_OUT(float, pairs, 7), MUSER_ARG_BUFFER_OUT(ulong, races, 8),
             MUSER_ARG_BUFFER_IN(SampleTileRow, rows, 10), MUSER_ARG_BUFFER_IN(SampleResult, results, 11),
             MUSER_ARG_BUFFER_OUT(float, raw_pairs, 13), MUSER_ARG_TGID(group), MUSER_ARG_LANE(lane)) {
  const int64_t tile = (int64_t)group % a.tiles, row = (int64_t)group / a.tiles, i0 = tile * kLseTile;
  if (results[row].status != kSampleOk) return;  // the whole SIMD group: the row's verdict stands
  const int n = (int)(a.V - i0 < kLseTile ? a.V - i0 : kLseTile);
  device const float* x = logits + row * a.V;
  device const float* zr = z + row * a.V;
  const float m = rows[row].m;
  const ulong cut = rows[row].cut;
  const uint64_t position = positions[row];
  LsePair pz = lse_empty(), px = lse_empty();
  ulong race = 0;
  for (int i = (int)lane; i < n; i += kCanonLanes) {
    const int64_t id = i0 + i;
    const float zi = zr[id];
    if (zi == lse_neg_inf() || (cut && topk_key(zi, id) < cut)) continue;  // dropped: -inf adds nothing
    if (p.min_p > 0.0f && canon_exp_nonpos(zi - m) < p.min_p) continue;
    pz = lse_push(pz, zi);
    px = lse_push(px, x[id]);
    const float key = sample_race_key(zi, m, p.seed, position, (int32_t)id);
    const ulong packed = topk_key(key, id);  // ranked as a logit: larger, then lower id (race_beats)
    race = packed > race ? packed : race;
  }
  pz = simd_lse_join(pz, (ushort)lane);
  px = simd_lse_join(px, (ushort)lane);
  race = simd_max_key(race);
  if (lane == 0) {
    const int at = (int)(row * a.tiles + tile);
    DevicePairs{pairs}[at] = pz;
    DevicePairs{raw_pairs}[at] = px;
    races[at] = race;
  }
}

MUSER_KERNEL(sample_kept_rows_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_BUFFER_IN(float, logits, 2),
             MUSER_ARG_BUFFER_IN(float, z, 3), MUSER_ARG_BUFFER_INOUT(float, pairs, 7),
             MUSER_ARG_BUFFER_IN(ulong, races, 8), MUSER_ARG_BUFFER_IN(SampleTileRow, rows, 10),
             MUSER_ARG_BUFFER_INOUT(SampleResult, results, 11), MUSER_ARG_BUFFER_INOUT(float, raw_pairs, 13),
             MUSER_ARG_TID(row)) {
  if ((int)row >= a.rows || results[row].status != kSampleOk) return;
  const int64_t base = (int64_t)row * a.tiles;
  const float kept_lse = lse_value(lse_tree(DevicePairs{pairs + 2 * base}, (int)a.tiles));
  const float raw_lse = lse_value(lse_tree(DevicePairs{raw_pairs + 2 * base}, (int)a.tiles));
  ulong best = 0;
  for (int64_t k = 0; k < a.tiles; ++k) best = races[base + k] > best ? races[base + k] : best;
  const int32_t token = (int32_t)topk_key_id(best);
  const float lse = rows[row].lse;
  const float d = raw_lse - lse;  // sample_raw_side
  results[row].token = token;
  results[row].processed_logprob = z[(int64_t)row * a.V + token] - kept_lse;
  results[row].logprob = logits[(int64_t)row * a.V + token] - lse;
  results[row].kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
}
