// The order every top-k keeps (device.h: best first, ties to the lower id,
// NaN never ahead of a number) as one 64-bit key per (logit, id): the float's
// bits made monotonic in the high word (NaN lowest, -0 folded onto +0) and
// 0xFFFFFFFF - id in the low word. A larger key is a better token; keys are
// distinct, so "the largest key below the last one taken" walks the ranking.
// (src/cuda/topk.cu computes the same key.)
#pragma once
#include "platform.h"

namespace muser {

// Logits a device top-k stage takes per chunk (one 32-lane group, 64 each).
MUSER_CONSTANT constexpr int kTopkChunk = 2048;

MUSER_HD uint64_t topk_key(float v, int64_t id) {
  const uint32_t low = 0xFFFFFFFFu - (uint32_t)id;
  if (!(v == v)) return (uint64_t)low;  // NaN: below every number
  uint32_t b = f32_to_bits(v == 0.0f ? 0.0f : v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((uint64_t)b << 32) | (uint64_t)low;
}

MUSER_HD int64_t topk_key_id(uint64_t key) { return (int64_t)(0xFFFFFFFFu - (uint32_t)(key & 0xFFFFFFFFu)); }

}  // namespace muser
