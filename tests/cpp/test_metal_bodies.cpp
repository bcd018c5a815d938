// The Metal kernels' shared bodies (muser/lanes.h, norm.h, q8_dot.h) run on
// the host, one lane at a time, with the SIMD group's butterfly done
// serially: the logits, norms and q8 quants they give are the CPU's, bit for
// bit. (The kernels only map threads to these calls; the emulator runs the
// kernels themselves, tests/test_metal.py.)
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "cpu/kernels.h"
#include "muser/lanes.h"
#include "muser/norm.h"
#include "muser/q8_dot.h"
#include "muser/q8_step.h"
#include "random_blocks.h"

using namespace muser;

namespace {

// 32 lane partials joined as a SIMD group's xor shuffles join them; every lane must agree.
float butterfly(std::vector<float> a) {
  for (int off = 16; off >= 1; off >>= 1) {
    std::vector<float> b(32);
    for (int l = 0; l < 32; ++l) b[l] = canon_join(a[l], a[l ^ off], l, off);
    a = b;
  }
  for (int l = 1; l < 32; ++l) EXPECT_EQ(f32_to_bits(a[l]), f32_to_bits(a[0])) << "lane " << l;
  return a[0];
}


// One lane's partials of row r for nt tokens, as matvec.metal's Row policies call them.
void lane_row(GgmlType type, const uint8_t* row, int64_t cols, int lane, const float* x, int64_t ldx, int nt,
              float* acc) {
  switch (type) {
    case GgmlType::Q5_K: canon_lane_kquant<LaneQ5K>((const BlockQ5_K*)row, cols / kQK_K, lane, x, ldx, nt, acc); return;
    case GgmlType::Q4_K: canon_lane_kquant<LaneQ4K>((const BlockQ4_K*)row, cols / kQK_K, lane, x, ldx, nt, acc); return;
    case GgmlType::Q6_K: canon_lane_kquant<LaneQ6K>((const BlockQ6_K*)row, cols / kQK_K, lane, x, ldx, nt, acc); return;
    case GgmlType::Q8_0: canon_lane_q8_0((const BlockQ8_0*)row, cols / kQK8_0, lane, x, ldx, nt, acc); return;
    case GgmlType::F32: canon_lane_float<WidenF32>((const float*)row, cols, lane, x, ldx, nt, acc); return;
    case GgmlType::F16: canon_lane_float<WidenF16>((const uint16_t*)row, cols, lane, x, ldx, nt, acc); return;
    case GgmlType::BF16: canon_lane_float<WidenBF16>((const uint16_t*)row, cols, lane, x, ldx, nt, acc); return;
    default: ADD_FAILURE();
  }
}

}  // namespace

TEST(MetalBodies, CanonicalLanesEqualCpuMatvec) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const GgmlType types[] = {GgmlType::Q5_K, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0,
                            GgmlType::F16,  GgmlType::BF16, GgmlType::F32};
  for (GgmlType type : types) {
    const bool kq = type == GgmlType::Q5_K || type == GgmlType::Q4_K || type == GgmlType::Q6_K;
    const int64_t cols = kq ? 512 : type == GgmlType::Q8_0 ? 96 : 77, rows = 5;
    const int t = 3;
    auto w = muser_test::random_rows(type, rows, cols, rng);
    std::vector<float> x((size_t)(t * cols));
    for (float& v : x) v = nd(rng);
    const TypeTraits tt = type_traits((uint32_t)type);
    const WeightView view{(uint32_t)type, rows, cols, cols / tt.block_elems * tt.block_bytes, w.data()};
    std::vector<float> want((size_t)(t * rows));
    cpu::matvec_canon_scalar(view, x.data(), cols, t, 0, rows, want.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<std::vector<float>> acc(32, std::vector<float>(t, 0.0f));
      for (int l = 0; l < 32; ++l) lane_row(type, w.data() + r * view.row_bytes, cols, l, x.data(), cols, t, acc[l].data());
      for (int k = 0; k < t; ++k) {
        std::vector<float> a(32);
        for (int l = 0; l < 32; ++l) a[l] = acc[l][k];
        EXPECT_EQ(f32_to_bits(butterfly(a)), f32_to_bits(want[(size_t)(k * rows + r)])) << tt.name << " row " << r;
      }
    }
  }
}

TEST(MetalBodies, CanonicalNormsEqualCpu) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.5f, 2.0f);
  for (int64_t n : {31, 32, 100, 2048}) {
    std::vector<float> x((size_t)n), want((size_t)n);
    for (float& v : x) v = nd(rng);
    const float eps = 1e-5f;
    std::vector<float> p(32);
    // RMSNorm
    for (int l = 0; l < 32; ++l) p[l] = lane_sum_squares_fma(x.data(), n, l);
    const float r = norm_inv_rms(butterfly(p), n, eps);
    cpu::rms_norm_canon(x.data(), n, eps, want.data());
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(f32_to_bits(x[j] * r), f32_to_bits(want[j])) << n << " " << j;
    // LayerNorm
    for (int l = 0; l < 32; ++l) p[l] = lane_sum(x.data(), n, l);
    const float mean = butterfly(p) / (float)n;
    for (int l = 0; l < 32; ++l) p[l] = lane_sum_dev_squares_fma(x.data(), n, mean, l);
    const float rl = norm_inv_rms(butterfly(p), n, eps);
    cpu::layer_norm_canon(x.data(), n, eps, want.data());
    for (int64_t j = 0; j < n; ++j) ASSERT_EQ(f32_to_bits((x[j] - mean) * rl), f32_to_bits(want[j])) << n << " " << j;
  }
}

TEST(MetalBodies, Q8QuantsAndDotEqualCpu) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (GgmlType type : {GgmlType::Q5_K, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    const bool kq = type != GgmlType::Q8_0;
    const int64_t cols = 512, rows = 4, block = kq ? kQK_K : kQK8_0, blocks = cols / block;
    const int t = 2;
    auto w = muser_test::random_rows(type, rows, cols, rng);
    std::vector<float> x((size_t)(t * cols));
    for (float& v : x) v = nd(rng);
    for (int j = 0; j < 32; ++j) x[(size_t)(cols + j)] = 0.0f;  // an all-zero block of token 1 (Q8_0)
    const TypeTraits tt = type_traits((uint32_t)type);
    const WeightView view{(uint32_t)type, rows, cols, cols / tt.block_elems * tt.block_bytes, w.data()};
    cpu::ActsQ8 acts;
    cpu::quantize_acts_q8((uint32_t)type, x.data(), cols, cols, t, &acts);
    std::vector<float> want((size_t)(t * rows));
    cpu::matvec_q8_scalar(view, acts, 0, rows, want.data(), rows);
    // the Metal quantizer's blocks
    std::vector<int8_t> qs((size_t)(t * cols));
    std::vector<float> dx((size_t)(t * blocks));
    std::vector<int32_t> s32((size_t)(t * cols / 32));
    for (int k = 0; k < t; ++k)
      for (int64_t b = 0; b < blocks; ++b) {
        int8_t* q = &qs[(size_t)(k * cols + b * block)];
        const float* xs = &x[(size_t)(k * cols + b * block)];
        dx[(size_t)(k * blocks + b)] = kq ? q8_quantize_block_q8_k(xs, q) : f16_to_f32(q8_quantize_block_q8_0(xs, q));
        for (int j = 0; j < block / 32; ++j) {
          int s = 0;
          for (int i = 0; i < 32; ++i) s += q[32 * j + i];
          s32[(size_t)(k * cols / 32 + b * (block / 32) + j)] = s;
        }
      }
    ASSERT_EQ(0, memcmp(qs.data(), acts.qs.data(), qs.size())) << tt.name;
    for (size_t i = 0; i < dx.size(); ++i) ASSERT_EQ(f32_to_bits(dx[i]), f32_to_bits(acts.d[i])) << tt.name << " " << i;
    for (int64_t r = 0; r < rows; ++r)
      for (int k = 0; k < t; ++k) {
        const uint8_t* row = w.data() + r * view.row_bytes;
        const int8_t* xk = &qs[(size_t)(k * cols)];
        const int32_t* sk = &s32[(size_t)(k * cols / 32)];
        float sum_q = 0.0f, sum_m = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const float d = dx[(size_t)(k * blocks + b)];
          if (type == GgmlType::Q5_K) {
            const BlockQ5_K* blk = (const BlockQ5_K*)row + b;
            sum_q = q8_block_step(sum_q, d, f16_to_f32(blk->d), q8_isum_q5_k(blk, xk + b * kQK_K));
            sum_m = q8_block_step(sum_m, d, f16_to_f32(blk->dmin), q8_msum_kquant(blk, sk + b * 8));
          } else if (type == GgmlType::Q4_K) {
            const BlockQ4_K* blk = (const BlockQ4_K*)row + b;
            sum_q = q8_block_step(sum_q, d, f16_to_f32(blk->d), q8_isum_q4_k(blk, xk + b * kQK_K));
            sum_m = q8_block_step(sum_m, d, f16_to_f32(blk->dmin), q8_msum_kquant(blk, sk + b * 8));
          } else if (type == GgmlType::Q6_K) {
            const BlockQ6_K* blk = (const BlockQ6_K*)row + b;
            sum_q = q8_block_step(sum_q, d, f16_to_f32(blk->d), q8_isum_q6_k(blk, xk + b * kQK_K));
          } else {
            const BlockQ8_0* blk = (const BlockQ8_0*)row + b;
            sum_q = q8_0_block_step(sum_q, q8_isum_q8_0(blk, xk + b * kQK8_0), f16_to_f32(blk->d), d);
          }
        }
        const float got = kq && type != GgmlType::Q6_K ? q8_kquant45_result(sum_q, sum_m) : sum_q;
        EXPECT_EQ(f32_to_bits(got), f32_to_bits(want[(size_t)(k * rows + r)])) << tt.name << " row " << r;
      }
  }
}
