// argmax / top-k of each row of logits on the device, so only the winners
// are read back (the order of muser/topk_key.h, as src/cuda/topk.cu).
//
// topk_stage_f32 / topk_stage_keys: one 32-thread SIMD group per (chunk, row)
// holds kTopkChunk candidates (64 per lane: logits made keys, or the keys a
// previous stage kept) and takes its k best in k passes, each a max over the
// group by xor shuffles (max is order-free, so no tree order matters here)
// of the keys below the last one taken. The chunks' winners are the next
// stage's candidates until one chunk is left; topk_gather_f32 turns its keys
// into ids and reads the exact logits (so -0 stays -0).
// Buffers: stage 0 TopkKargs, 1 logits or keys [rows x n], 2 keys out
// [rows x chunks x k]; grid chunks * rows threadgroups of 32.
// gather 0 TopkKargs (n = V), 1 keys [rows x k], 2 logits, 3 ids (int64),
// 4 vals; grid k * rows threads.
#include "common.h"
#include "muser/topk_key.h"

using namespace muser;

constant constexpr int kTopkPerLane = kTopkChunk / 32;

namespace {

template <bool kFromLogits>
void topk_stage(constant TopkKargs& a, device const float* logits, device const ulong* keys_in,
                device ulong* keys_out, uint group, uint lane) {
  const int64_t chunk = (int64_t)group % a.chunks, row = (int64_t)group / a.chunks;
  const int64_t base = chunk * kTopkChunk;
  ulong item[kTopkPerLane];
  for (int i = 0; i < kTopkPerLane; ++i) {
    const int64_t j = base + i * 32 + lane;
    if (j >= a.n) item[i] = 0;  // below every real key
    else if (kFromLogits) item[i] = topk_key(logits[row * a.n + j], j);
    else item[i] = keys_in[row * a.n + j];
  }
  ulong limit = ~(ulong)0;
  device ulong* out = keys_out + (row * a.chunks + chunk) * a.k;
  for (int pass = 0; pass < a.k; ++pass) {
    ulong best = 0;
    for (int i = 0; i < kTopkPerLane; ++i)
      if (item[i] < limit && item[i] > best) best = item[i];
    best = simd_max_key(best);
    if (lane == 0) out[pass] = best;
    limit = best;
  }
}

}  // namespace

MUSER_KERNEL(topk_stage_f32, MUSER_ARG_CONSTANT(TopkKargs, a, 0), MUSER_ARG_BUFFER_IN(float, logits, 1),
             MUSER_ARG_BUFFER_OUT(ulong, keys_out, 2), MUSER_ARG_TGID(group), MUSER_ARG_LANE(lane)) {
  topk_stage<true>(a, logits, nullptr, keys_out, group, lane);
}

MUSER_KERNEL(topk_stage_keys, MUSER_ARG_CONSTANT(TopkKargs, a, 0), MUSER_ARG_BUFFER_IN(ulong, keys_in, 1),
             MUSER_ARG_BUFFER_OUT(ulong, keys_out, 2), MUSER_ARG_TGID(group), MUSER_ARG_LANE(lane)) {
  topk_stage<false>(a, nullptr, keys_in, keys_out, group, lane);
}

MUSER_KERNEL(topk_gather_f32, MUSER_ARG_CONSTANT(TopkKargs, a, 0), MUSER_ARG_BUFFER_IN(ulong, keys, 1),
             MUSER_ARG_BUFFER_IN(float, logits, 2), MUSER_ARG_BUFFER_OUT(long, ids, 3),
             MUSER_ARG_BUFFER_OUT(float, vals, 4), MUSER_ARG_TID(pos)) {
  const int64_t j = (int64_t)pos % a.k, row = (int64_t)pos / a.k;
  if (row >= a.rows) return;
  const int64_t id = topk_key_id(keys[row * a.k + j]);
  ids[row * a.k + j] = id;
  vals[row * a.k + j] = logits[row * a.n + id];
}
