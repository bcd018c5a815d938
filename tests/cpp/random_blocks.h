// Random quantized blocks for the C++ tests: every byte drawn from rng (the
// f16 scales too; tests that need small finite scales overwrite them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>

namespace muser_test {

template <class Block>
Block random_block(std::mt19937& rng) {
  Block b;
  auto* p = reinterpret_cast<uint8_t*>(&b);
  for (size_t i = 0; i < sizeof(Block); ++i) p[i] = (uint8_t)rng();
  return b;
}

}  // namespace muser_test
