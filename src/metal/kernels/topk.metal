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

template <bool kFromLogits>
kernel void topk_stage(constant TopkKargs& a [[buffer(0)]], device const void* in [[buffer(1)]],
                       device ulong* keys_out [[buffer(2)]], uint group [[threadgroup_position_in_grid]],
                       ushort lane [[thread_index_in_simdgroup]]) {
  const int64_t chunk = (int64_t)group % a.chunks, row = (int64_t)group / a.chunks;
  const int64_t base = chunk * kTopkChunk;
  ulong item[kTopkPerLane];
  for (int i = 0; i < kTopkPerLane; ++i) {
    const int64_t j = base + i * 32 + lane;
    if (j >= a.n) item[i] = 0;  // below every real key
    else if (kFromLogits) item[i] = topk_key(((device const float*)in)[row * a.n + j], j);
    else item[i] = ((device const ulong*)in)[row * a.n + j];
  }
  ulong limit = ~(ulong)0;
  device ulong* out = keys_out + (row * a.chunks + chunk) * a.k;
  for (int pass = 0; pass < a.k; ++pass) {
    ulong best = 0;
    for (int i = 0; i < kTopkPerLane; ++i)
      if (item[i] < limit && item[i] > best) best = item[i];
    for (ushort off = 16; off >= 1; off >>= 1) {
      const uint hi = metal::simd_shuffle_xor((uint)(best >> 32), off);
      const uint lo = metal::simd_shuffle_xor((uint)(best & 0xFFFFFFFFu), off);
      const ulong o = ((ulong)hi << 32) | (ulong)lo;
      best = o > best ? o : best;
    }
    if (lane == 0) out[pass] = best;
    limit = best;
  }
}

typedef decltype(topk_stage<true>) topk_stage_t;
MUSER_KERNEL_INSTANCE("topk_stage_f32", topk_stage_t, topk_stage<true>)
MUSER_KERNEL_INSTANCE("topk_stage_keys", topk_stage_t, topk_stage<false>)

kernel void topk_gather_f32(constant TopkKargs& a [[buffer(0)]], device const ulong* keys [[buffer(1)]],
                            device const float* logits [[buffer(2)]], device long* ids [[buffer(3)]],
                            device float* vals [[buffer(4)]], uint pos [[thread_position_in_grid]]) {
  const int64_t j = (int64_t)pos % a.k, row = (int64_t)pos / a.k;
  if (row >= a.rows) return;
  const int64_t id = topk_key_id(keys[row * a.k + j]);
  ids[row * a.k + j] = id;
  vals[row * a.k + j] = logits[row * a.n + id];
}
