// Philox4x32-10, the counter-based generator of Salmon, Moraes, Dror and Shaw,
// "Parallel Random Numbers: As Easy as 1, 2, 3" (SC11), as Random123 defines it:
// a 128-bit counter and a 64-bit key give 128 random bits, with no state, so
// any (seed, position, token) can be drawn on any backend, in any order.
// Integer operations only: the bits are the same on C++, CUDA and Metal.
// Checked against Random123's published known-answer vectors
// (tests/cpp/test_philox.cpp, tests/test_sample.py); docs/numerics.md, "Sampling".
#pragma once
#include "platform.h"

namespace muser {

MUSER_CONSTANT constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multiplier of counter word 0
MUSER_CONSTANT constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  // multiplier of counter word 2
MUSER_CONSTANT constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // key word 0 bump (golden ratio)
MUSER_CONSTANT constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // key word 1 bump (sqrt 3 - 1)
MUSER_CONSTANT constexpr int kPhiloxRounds = 10;

struct PhiloxCounter {
  uint32_t x0, x1, x2, x3;
};
struct PhiloxKey {
  uint32_t k0, k1;
};

// One round: two 32x32 -> 64-bit products, their halves crossed and xor-ed
// with the other two words and the key.
MUSER_HD PhiloxCounter philox_round(PhiloxCounter c, PhiloxKey k) {
  const uint64_t p0 = (uint64_t)kPhiloxM0 * (uint64_t)c.x0;
  const uint64_t p1 = (uint64_t)kPhiloxM1 * (uint64_t)c.x2;
  PhiloxCounter r;
  r.x0 = (uint32_t)(p1 >> 32) ^ c.x1 ^ k.k0;
  r.x1 = (uint32_t)p1;
  r.x2 = (uint32_t)(p0 >> 32) ^ c.x3 ^ k.k1;
  r.x3 = (uint32_t)p0;
  return r;
}

// Ten rounds; the key is bumped (Weyl sequence) before every round but the first.
MUSER_HD PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  c = philox_round(c, k);
  for (int i = 1; i < kPhiloxRounds; ++i) {
    k.k0 += kPhiloxW0;
    k.k1 += kPhiloxW1;
    c = philox_round(c, k);
  }
  return c;
}

// The 32 random bits of sampling's draw for one (seed, position, token):
// key = (seed low word, seed high word), counter = (position low word,
// position high word, token, 0); output word x0.
MUSER_HD uint32_t philox_token_bits(uint64_t seed, uint64_t position, uint32_t token) {
  const PhiloxKey k{(uint32_t)seed, (uint32_t)(seed >> 32)};
  const PhiloxCounter c{(uint32_t)position, (uint32_t)(position >> 32), token, 0u};
  return philox4x32_10(c, k).x0;
}

// A uniform in (0, 1) from 32 bits: the top 23 bits b, u = (2b + 1) / 2^24,
// exact in float32 (an odd integer below 2^24 times a power of two), so
// 2^-24 <= u <= 1 - 2^-24: never 0, never 1.
MUSER_HD float philox_uniform(uint32_t bits) {
  return (float)((bits >> 8) | 1u) * 5.9604644775390625e-08f;  // 2^-24
}

}  // namespace muser
