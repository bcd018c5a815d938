// The block decoders (vectorizable loops) and the element decoders
// (q5k_quant & co., used where one lane needs one element) define the same
// weights, element for element.
#include <gtest/gtest.h>

#include <random>

#include "muser/dequant.h"
#include "random_blocks.h"

namespace {

using muser_test::random_block;

uint16_t small_f16(std::mt19937& rng) { return muser::f32_to_f16(std::uniform_real_distribution<float>(-0.01f, 0.01f)(rng)); }

}  // namespace

TEST(Dequant, Q5KBlockEqualsElementDecode) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    auto b = random_block<muser::BlockQ5_K>(rng);
    b.d = small_f16(rng);
    b.dmin = small_f16(rng);
    float out[256], d1[8], m1[8];
    muser::dequant_block_q5_k(&b, out);
    muser::kquant_sub_scales(b.scales, b.d, b.dmin, d1, m1);
    for (int i = 0; i < 256; ++i)
      ASSERT_EQ(muser::f32_to_bits(out[i]),
                muser::f32_to_bits(d1[i / 32] * (float)muser::q5k_quant(&b, i) - m1[i / 32]))
          << "element " << i;
  }
}

TEST(Dequant, Q4KBlockEqualsElementDecode) {
  std::mt19937 rng(2);
  for (int trial = 0; trial < 200; ++trial) {
    auto b = random_block<muser::BlockQ4_K>(rng);
    b.d = small_f16(rng);
    b.dmin = small_f16(rng);
    float out[256], d1[8], m1[8];
    muser::dequant_block_q4_k(&b, out);
    muser::kquant_sub_scales(b.scales, b.d, b.dmin, d1, m1);
    for (int i = 0; i < 256; ++i)
      ASSERT_EQ(muser::f32_to_bits(out[i]),
                muser::f32_to_bits(d1[i / 32] * (float)muser::q4k_quant(&b, i) - m1[i / 32]));
  }
}

TEST(Dequant, Q6KBlockEqualsElementDecode) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    auto b = random_block<muser::BlockQ6_K>(rng);
    b.d = small_f16(rng);
    float out[256];
    muser::dequant_block_q6_k(&b, out);
    const float d = muser::f16_to_f32(b.d);
    for (int i = 0; i < 256; ++i)
      ASSERT_EQ(muser::f32_to_bits(out[i]),
                muser::f32_to_bits((d * (float)b.scales[i / 16]) * (float)muser::q6k_quant(&b, i)));
  }
}

TEST(Dequant, FmaGivesTheSameKQuantWeights) {
  // docs/numerics.md: d1*q is exact, so fmaf(d1, q, -m1) rounds once like d1*q - m1.
  std::mt19937 rng(4);
  for (int trial = 0; trial < 200; ++trial) {
    auto b = random_block<muser::BlockQ5_K>(rng);
    b.d = small_f16(rng);
    b.dmin = small_f16(rng);
    float d1[8], m1[8];
    muser::kquant_sub_scales(b.scales, b.d, b.dmin, d1, m1);
    for (int i = 0; i < 256; ++i) {
      const float q = (float)muser::q5k_quant(&b, i);
      ASSERT_EQ(muser::f32_to_bits(std::fma(d1[i / 32], q, -m1[i / 32])),
                muser::f32_to_bits(d1[i / 32] * q - m1[i / 32]));
    }
  }
}
