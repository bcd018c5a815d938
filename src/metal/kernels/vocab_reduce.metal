// The consumer's reductions over rows of logits on the device (score,
// logsumexp), in the canonical order of muser/logsumexp.h, so the CPU's bits:
//   lse_tile_pairs_f32  one SIMD group per (tile, row): lane l pushes the
//                       tile's ids l, l + 32, ... in increasing order
//                       (lse_push), then the lanes' butterfly (lane l joins
//                       lane l + off for off = 16 .. 1: lse_join_lanes)
//   lse_join_f32        one thread per row: the tile tree (lse_tree, in place
//                       on the pairs) and its logsumexp
//   log_softmax_f32     one thread per logit: logit - logsumexp, in place
//   score_values_f32    one thread per (row, chosen id): the logit and
//                       logit - logsumexp
//   score_ranks_f32     one SIMD group per (row, chosen id): 1 + the ids that
//                       rank ahead (ranks_ahead: a larger logit, or an equal
//                       one at a lower id; NaN behind every number) -- an
//                       integer count, so the order of its sum is free
// Buffers: 0 TileRowsKargs, 1 logits [rows x V], 2 pairs [rows x tiles] ((m, s) floats),
// 3 lse [rows], 4 ids [rows x m] (int64), 5 values, 6 logprobs [rows x m],
// 7 ranks [rows x m] (int64).
// Grids: tiles * rows threadgroups of 32 (pairs, ranks: rows * m), rows and
// rows, rows * V and rows * m threads (join, log_softmax, values).
#include "common.h"
#include "muser/logsumexp.h"

using namespace muser;

MUSER_KERNEL(lse_tile_pairs_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_BUFFER_IN(float, logits, 1),
             MUSER_ARG_BUFFER_OUT(float, pairs, 2), MUSER_ARG_TGID(group), MUSER_ARG_LANE(lane)) {
  const int64_t tile = (int64_t)group % a.tiles, row = (int64_t)group / a.tiles;
  const int64_t i0 = tile * kLseTile;
  const int n = (int)(a.V - i0 < kLseTile ? a.V - i0 : kLseTile);
  device const float* v = logits + row * a.V + i0;
  LsePair p = lse_empty();
  for (int i = (int)lane; i < n; i += kCanonLanes) p = lse_push(p, v[i]);
  p = simd_lse_join(p, (ushort)lane);
  if (lane == 0) DevicePairs{pairs}[(int)(row * a.tiles + tile)] = p;
}

MUSER_KERNEL(lse_join_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, pairs, 2),
             MUSER_ARG_BUFFER_OUT(float, lse, 3), MUSER_ARG_TID(row)) {
  if ((int)row >= a.rows) return;
  lse[row] = lse_value(lse_tree(DevicePairs{pairs + 2 * (int64_t)row * a.tiles}, (int)a.tiles));
}

// logits[row, i] - lse[row], in place: log-softmax (one thread per logit).
MUSER_KERNEL(log_softmax_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, logits, 1),
             MUSER_ARG_BUFFER_IN(float, lse, 3), MUSER_ARG_TID(pos)) {
  const int64_t row = (int64_t)pos / a.V;
  if (row >= a.rows) return;
  logits[pos] = logits[pos] - lse[row];
}

MUSER_KERNEL(score_values_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_BUFFER_IN(float, logits, 1),
             MUSER_ARG_BUFFER_IN(float, lse, 3), MUSER_ARG_BUFFER_IN(long, ids, 4),
             MUSER_ARG_BUFFER_OUT(float, values, 5), MUSER_ARG_BUFFER_OUT(float, logprobs, 6), MUSER_ARG_TID(q)) {
  const int64_t row = (int64_t)q / a.m;
  if (row >= a.rows) return;
  const float v = logits[row * a.V + ids[q]];
  values[q] = v;
  logprobs[q] = v - lse[row];
}

MUSER_KERNEL(score_ranks_f32, MUSER_ARG_CONSTANT(TileRowsKargs, a, 0), MUSER_ARG_BUFFER_IN(float, logits, 1),
             MUSER_ARG_BUFFER_IN(long, ids, 4), MUSER_ARG_BUFFER_OUT(long, ranks, 7), MUSER_ARG_TGID(q),
             MUSER_ARG_LANE(lane)) {
  const int64_t row = (int64_t)q / a.m, tok = ids[q];
  device const float* y = logits + row * a.V;
  const float target = y[tok];
  uint ahead = 0;
  for (int64_t i = lane; i < a.V; i += kCanonLanes) ahead += ranks_ahead(y[i], i, target, tok) ? 1u : 0u;
  for (ushort off = 16; off >= 1; off >>= 1) ahead += metal::simd_shuffle_xor(ahead, off);
  if (lane == 0) ranks[q] = 1 + (long)ahead;
}
