// The 6-bit (scale, min) pairs of a Q4_K/Q5_K block unpacked into bytes for
// the SIMD twins: muser/quant_blocks.h's one unpacker (kquant_scale_words,
// four 32-bit mask-and-shift steps, as ggml's SIMD dot products do it) on the
// block's 12 scale bytes.
#pragma once
#include <cstdint>
#include <cstring>

#include "muser/quant_blocks.h"

namespace muser::cpu {
// Internal linkage: each ISA file compiles its own copy with its own flags.
namespace {

// out[0..7] = scales, out[8..15] = mins (ggml's utmp arrangement; equal to
// k_scale_min for every j).
inline void kquant_scale_bytes(const uint8_t* packed, uint8_t out[16]) {
  uint32_t u[3];
  memcpy(u, packed, 12);
  const KScaleWords k = kquant_scale_words(u[0], u[1], u[2]);
  const uint32_t words[4] = {k.sc[0], k.sc[1], k.m[0], k.m[1]};
  memcpy(out, words, 16);
}

}  // namespace
}  // namespace muser::cpu
