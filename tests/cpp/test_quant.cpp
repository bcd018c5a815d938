// Scalar conversions, K-quant scale unpacking and the quantizers' round trip.
// Bit-equality with gguf/ggml is tested from Python (tests/test_quant.py);
// these tests pin the pieces every backend shares.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "errors.h"
#include "muser/dequant.h"
#include "quantize.h"

namespace muser {
namespace {

TEST(F16, EveryHalfRoundTripsThroughF32) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32((uint16_t)h);
    const bool is_nan = ((h & 0x7c00u) == 0x7c00u) && (h & 0x3ffu);
    if (is_nan) {
      ASSERT_TRUE(std::isnan(f)) << h;
      // a NaN stays a NaN (quieted; the payload is not promised)
      ASSERT_EQ(f32_to_f16(f) & 0x7c00u, 0x7c00u) << h;
      ASSERT_NE(f32_to_f16(f) & 0x3ffu, 0u) << h;
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), (uint16_t)h) << "half 0x" << std::hex << h;
  }
}

TEST(F16, DecodesKnownValues) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));
  EXPECT_EQ(f16_to_f32(0x7c00), std::numeric_limits<float>::infinity());
}

TEST(F16, RoundsToNearestEven) {
  // Halfway between two halves goes to the even mantissa.
  const float ulp1 = std::ldexp(1.0f, -10);  // half ulp at 1.0 is 2^-11
  EXPECT_EQ(f32_to_f16(1.0f + ulp1 / 2), 0x3c00);              // tie -> even (1.0)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * ulp1 / 2), 0x3c02);          // tie -> even (1 + 2 ulp)
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + ulp1 / 2, 2.0f)), 0x3c01);  // just above the tie
  // Subnormal ties: 2^-25 is half the smallest subnormal -> 0; 3 * 2^-25 -> 2 * 2^-24.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -26)), 0x8000);  // signed zero kept
  // Rounding carries across the subnormal/normal and normal/inf boundaries.
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // below the tie with 65536
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // the tie rounds to even: infinity
  EXPECT_EQ(f32_to_f16(-1e9f), 0xfc00);
}

TEST(F16, MatchesDoubleRoundingReferenceOnRandomFloats) {
  // Reference: the nearest half in value (ties to even mantissa), by search.
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits(0x30000000u, 0x47800000u);  // 2^-31 .. 2^16
  for (int i = 0; i < 20000; ++i) {
    const float f = bits_to_f32(bits(rng));
    const uint16_t h = f32_to_f16(f);
    if ((h & 0x7c00u) == 0x7c00u) {
      ASSERT_GE(f, 65520.0f);
      continue;
    }
    const double got = f16_to_f32(h);
    const double below = f16_to_f32((uint16_t)(h == 0 ? 0 : h - 1));
    const double above = f16_to_f32((uint16_t)(h + 1));
    ASSERT_LE(std::fabs(got - f), std::fabs(below - f)) << f;
    ASSERT_LE(std::fabs(got - f), std::fabs(above - f)) << f;
  }
}

TEST(BF16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000u)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001u)), 0x3f81);
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7f80u) == 0x7f80u && (h & 0x7fu)) continue;  // NaN
    ASSERT_EQ(f32_to_bf16(bf16_to_f32((uint16_t)h)), h);
  }
}

TEST(KScaleMin, UnpacksTheTwelveByteField) {
  // Pack 8 known (scale, min) pairs as ggml does, then unpack each.
  const uint8_t sc[8] = {0, 1, 31, 63, 17, 32, 48, 63};
  const uint8_t mn[8] = {63, 2, 5, 40, 0, 33, 15, 62};
  uint8_t packed[12] = {};
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      packed[j] = sc[j];
      packed[j + 4] = mn[j];
    } else {
      packed[j + 4] = (uint8_t)((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
      packed[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
      packed[j] |= (uint8_t)((mn[j] >> 4) << 6);
    }
  }
  for (int j = 0; j < 8; ++j) {
    uint8_t s, m;
    k_scale_min(j, packed, &s, &m);
    EXPECT_EQ(s, sc[j]) << j;
    EXPECT_EQ(m, mn[j]) << j;
  }
}

TEST(KScaleMin, MatchesTheBitDiagram) {
  // Bytes 0-3: EEAAAAAA (scale j low 6 bits; top 2 = high bits of scale j+4);
  // bytes 4-7: the mins likewise; bytes 8-11: low nibbles of scale/min j+4.
  uint8_t q[12] = {0xC1, 0x02, 0x03, 0x04, 0x45, 0x06, 0x07, 0x88, 0xA9, 0x00, 0x00, 0xF0};
  uint8_t s, m;
  k_scale_min(0, q, &s, &m);
  EXPECT_EQ(s, 0x01);
  EXPECT_EQ(m, 0x05);
  k_scale_min(4, q, &s, &m);  // scale = 0x9 | (0xC1 >> 6) << 4; min = 0xA | (0x45 >> 6) << 4
  EXPECT_EQ(s, 0x39);
  EXPECT_EQ(m, 0x1A);
  k_scale_min(7, q, &s, &m);  // scale = 0x0 | (0x04 >> 6) << 4; min = 0xF | (0x88 >> 6) << 4
  EXPECT_EQ(s, 0x00);
  EXPECT_EQ(m, 0x2F);
}

std::vector<float> gaussian(size_t n, unsigned seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& f : v) f = dist(rng);
  return v;
}

TEST(Q5K, RoundTripErrorWithinHalfAStepPerSubBlock) {
  const int64_t cols = 256 * kQK_K;  // enough samples for a stable RMS
  const std::vector<float> x = gaussian(cols, 11);
  std::vector<uint8_t> q((size_t)quantized_row_bytes(GgmlType::Q5_K, cols));
  quantize_row(GgmlType::Q5_K, x.data(), cols, q.data());
  std::vector<float> y(cols);
  ASSERT_TRUE(dequant_row((uint32_t)GgmlType::Q5_K, q.data(), cols, y.data()));
  double sq_err = 0, sq_x = 0;
  for (int64_t b = 0; b < cols / kQK_K; ++b) {
    const BlockQ5_K& blk = reinterpret_cast<const BlockQ5_K*>(q.data())[b];
    float d1[8], m1[8];
    kquant_sub_scales(blk.scales, blk.d, blk.dmin, d1, m1);
    for (int i = 0; i < kQK_K; ++i) {
      const int64_t k = b * kQK_K + i;
      const float err = std::fabs(y[k] - x[k]);
      // Inside the sub-block's range the nearest step is at most d1/2 away;
      // a value outside [-m1, 31*d1 - m1] is clamped, so bound by the range too.
      const float lo = -m1[i >> 5], hi = 31 * d1[i >> 5] - m1[i >> 5];
      const float outside = std::max(0.0f, std::max(lo - x[k], x[k] - hi));
      EXPECT_LE(err, d1[i >> 5] / 2 + outside + 1e-6f) << "block " << b << " element " << i;
      sq_err += (double)err * err;
      sq_x += (double)x[k] * x[k];
    }
  }
  // Measured 0.0361 on N(0, 1) (tests/test_quant.py has the table for every type).
  EXPECT_LT(std::sqrt(sq_err / sq_x), 0.038);
}

TEST(Q5K, ZeroAndConstantRows) {
  std::vector<float> x(kQK_K, 0.0f), y(kQK_K);
  BlockQ5_K blk;
  quantize_block_q5_k(x.data(), &blk);
  dequant_block_q5_k(&blk, y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);

  for (float c : {0.37f, -2.5f, 100.0f}) {
    std::fill(x.begin(), x.end(), c);
    quantize_block_q5_k(x.data(), &blk);
    dequant_block_q5_k(&blk, y.data());
    // A constant is one point: the fit puts it on a grid step, leaving only
    // the f16 rounding of the scales (relative 2^-11 on each of d*sc, dmin*m).
    // Constants this large keep d and dmin normal halves; tiny ones (whose
    // scales go subnormal) are covered by the Python tests.
    for (float v : y) EXPECT_NEAR(v, c, std::fabs(c) * 2e-3f) << c;
  }
}

TEST(Quantize, RejectsBadArguments) {
  std::vector<float> x(kQK_K, 1.0f);
  std::vector<uint8_t> out(1024);
  EXPECT_THROW(quantize_row(GgmlType::Q5_K, x.data(), 100, out.data()), ArgValueError);
  EXPECT_THROW(quantize_row(GgmlType::Q4_0, x.data(), 32, out.data()), ArgValueError);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(quantize_row(GgmlType::Q8_0, x.data(), 32, out.data()), ArgValueError);
  x[17] = 1e9f;  // finite, but amax / 127 overflows the f16 scale
  EXPECT_THROW(quantize(GgmlType::Q8_0, x.data(), 1, 32, out.data()), ArgValueError);
  try {
    quantize(GgmlType::Q5_K, x.data(), 1, 200, out.data());
    FAIL() << "expected ArgValueError";
  } catch (const ArgValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("200"), std::string::npos) << msg;
  }
}

TEST(Quantize, TypeNames) {
  EXPECT_EQ(ggml_type_from_name("Q5_K"), GgmlType::Q5_K);
  EXPECT_EQ(ggml_type_from_name("q8_0"), GgmlType::Q8_0);
  EXPECT_EQ(ggml_type_from_name("bf16"), GgmlType::BF16);
  EXPECT_EQ(ggml_type_from_name("Q4_0"), GgmlType::Q4_0);  // known, not quantizable
  EXPECT_FALSE(can_quantize(GgmlType::Q4_0));
  EXPECT_FALSE(ggml_type_from_name("Q9_K").has_value());
  EXPECT_EQ(quantized_row_bytes(GgmlType::Q5_K, 6656), 26 * 176);
}

}  // namespace
}  // namespace muser
