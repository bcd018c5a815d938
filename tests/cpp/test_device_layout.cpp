// The GPU device layout (src/cpp/muser/device_layout.h) is plain host-callable code:
// checked here, on every CI machine, without a GPU. The block permutation
// puts each element where device_layout.h says and undoes exactly; the row tiles
// give every (row, block) its own place, 16 rows' block b back to back.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <set>

#include "muser/dequant.h"
#include "muser/device_layout.h"
#include "random_blocks.h"

using muser_test::random_block;

TEST(DeviceLayout, Q5KRepackPlacesEveryElementAndUndoes) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 100; ++trial) {
    const auto b = random_block<muser::BlockQ5_K>(rng);
    uint8_t packed[sizeof b];
    std::memcpy(packed, &b, sizeof b);
    muser::repack_block_q5_k(packed);
    ASSERT_EQ(0, std::memcmp(packed, &b, muser::kKQuantHeaderBytes)) << "the header keeps its place";
    for (int l = 0; l < 32; ++l)
      for (int c = 0; c < 4; ++c) {
        const uint8_t qs = packed[muser::kQ5KQuantsOffset + 4 * l + c];
        const uint8_t qh = packed[muser::kQ5KHighBitsOffset + l];
        const int lo = (qs & 0xf) | (((qh >> c) & 1) << 4), hi = (qs >> 4) | (((qh >> (4 + c)) & 1) << 4);
        ASSERT_EQ(lo, muser::q5k_quant(&b, 64 * c + l)) << "lane " << l << " pair " << c;
        ASSERT_EQ(hi, muser::q5k_quant(&b, 64 * c + 32 + l)) << "lane " << l << " pair " << c;
      }
    muser::BlockQ5_K back;
    muser::unpack_block_q5_k(packed, &back);
    ASSERT_EQ(0, std::memcmp(&back, &b, sizeof b));
  }
}

TEST(DeviceLayout, Q4KRepackPlacesEveryElementAndUndoes) {
  std::mt19937 rng(4);
  for (int trial = 0; trial < 100; ++trial) {
    const auto b = random_block<muser::BlockQ4_K>(rng);
    uint8_t packed[sizeof b];
    std::memcpy(packed, &b, sizeof b);
    muser::repack_block_q4_k(packed);
    for (int l = 0; l < 32; ++l)
      for (int c = 0; c < 4; ++c) {
        const uint8_t qs = packed[muser::kQ4KQuantsOffset + 4 * l + c];
        ASSERT_EQ(qs & 0xf, muser::q4k_quant(&b, 64 * c + l));
        ASSERT_EQ(qs >> 4, muser::q4k_quant(&b, 64 * c + 32 + l));
      }
    muser::BlockQ4_K back;
    muser::unpack_block_q4_k(packed, &back);
    ASSERT_EQ(0, std::memcmp(&back, &b, sizeof b));
  }
}

TEST(DeviceLayout, RowTilesGiveEveryBlockItsOwnPlace) {
  using muser::kTileRows;
  using muser::tiled_row_offset;
  for (const int64_t block_bytes : {34, 144, 176, 210}) {
    for (const int64_t rows : {1, 15, 16, 17, 37, 64}) {
      const int64_t blocks = 5, row_bytes = blocks * block_bytes;
      const int64_t padded = (rows + kTileRows - 1) / kTileRows * kTileRows * row_bytes;
      std::set<int64_t> seen;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < blocks; ++b) {
          const int64_t off = tiled_row_offset(r, row_bytes, block_bytes) + b * kTileRows * block_bytes;
          ASSERT_EQ(off % block_bytes, 0);
          ASSERT_GE(off, 0);
          ASSERT_LE(off + block_bytes, padded) << "inside the padded tiles";
          ASSERT_TRUE(seen.insert(off).second) << "row " << r << " block " << b << " shares a place";
          if (r % kTileRows != kTileRows - 1 && r + 1 < rows)  // the next row of the tile follows at once
            ASSERT_EQ(tiled_row_offset(r + 1, row_bytes, block_bytes) + b * kTileRows * block_bytes, off + block_bytes);
        }
    }
  }
}

TEST(DeviceLayout, QuantizedTypesAreTiledFloatsAreNot) {
  using muser::GgmlType;
  for (const auto t : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0})
    EXPECT_TRUE(muser::is_tiled_type((uint32_t)t));
  for (const auto t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16})
    EXPECT_FALSE(muser::is_tiled_type((uint32_t)t));
}
