// The 6-bit (scale, min) pairs of a Q4_K/Q5_K block unpacked into bytes, the
// way ggml's SIMD dot products do it (four 32-bit mask-and-shift steps rather
// than eight calls of k_scale_min). Shared by every SIMD twin.
#pragma once
#include <cstdint>
#include <cstring>

namespace muser::cpu {
// Internal linkage: each ISA file compiles its own copy with its own flags.
namespace {

// Unpack the 8 (scale, min) pairs of a Q4_K/Q5_K block into their bytes:
// out[0..7] = scales, out[8..15] = mins (ggml's utmp arrangement; equal to
// k_scale_min for every j).
inline void kquant_scale_bytes(const uint8_t* packed, uint8_t out[16]) {
  uint32_t u[4];
  memcpy(u, packed, 12);
  const uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t mins_lo = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = mins_lo;
  u[0] &= kmask1;
  memcpy(out, u, 16);
}

}  // namespace
}  // namespace muser::cpu
