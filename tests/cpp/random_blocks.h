// Random quantized blocks for the C++ tests: every byte drawn from rng (the
// f16 scales too; tests that need small finite scales overwrite them).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "muser/quant_blocks.h"
#include "quant_types.h"

namespace muser_test {

template <class Block>
Block random_block(std::mt19937& rng) {
  Block b;
  auto* p = reinterpret_cast<uint8_t*>(&b);
  for (size_t i = 0; i < sizeof(Block); ++i) p[i] = (uint8_t)rng();
  return b;
}

// A small positive f16 scale (0.001 .. 0.011): finite, well-conditioned blocks.
inline uint16_t small_f16(std::mt19937& rng) { return muser::f32_to_f16(0.001f + 0.01f * (float)(rng() % 1000) / 1000.0f); }

// rows x cols elements of `type` as GGUF rows: random quants with small scales,
// N(0, 0.5) floats for the float types.
inline std::vector<uint8_t> random_rows(muser::GgmlType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  const muser::TypeTraits tt = muser::type_traits((uint32_t)type);
  const int64_t row_bytes = cols / tt.block_elems * tt.block_bytes;
  std::vector<uint8_t> w((size_t)(rows * row_bytes));
  std::normal_distribution<float> nd(0.0f, 0.5f);
  auto put = [&](auto blk, size_t at) { memcpy(&w[at], &blk, sizeof(blk)); };
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / tt.block_elems; ++b) {
      const size_t at = (size_t)(r * row_bytes + b * tt.block_bytes);
      switch (type) {
        case muser::GgmlType::Q5_K: { auto k = random_block<muser::BlockQ5_K>(rng); k.d = small_f16(rng); k.dmin = small_f16(rng); put(k, at); break; }
        case muser::GgmlType::Q4_K: { auto k = random_block<muser::BlockQ4_K>(rng); k.d = small_f16(rng); k.dmin = small_f16(rng); put(k, at); break; }
        case muser::GgmlType::Q6_K: { auto k = random_block<muser::BlockQ6_K>(rng); k.d = small_f16(rng); put(k, at); break; }
        case muser::GgmlType::Q8_0: { auto k = random_block<muser::BlockQ8_0>(rng); k.d = small_f16(rng); put(k, at); break; }
        case muser::GgmlType::F32: { const float v = nd(rng); memcpy(&w[at], &v, 4); break; }
        case muser::GgmlType::F16: { const uint16_t v = muser::f32_to_f16(nd(rng)); memcpy(&w[at], &v, 2); break; }
        case muser::GgmlType::BF16: { const uint16_t v = (uint16_t)(muser::f32_to_bits(nd(rng)) >> 16); memcpy(&w[at], &v, 2); break; }
        default: ADD_FAILURE();
      }
    }
  return w;
}

}  // namespace muser_test
