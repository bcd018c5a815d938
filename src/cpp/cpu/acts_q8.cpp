// acts="q8": the normed vector quantized to int8 exactly as ggml's x86 CPU
// backend quantizes the activations (src1) of a mul_mat, so that muser's q8
// logits differ from llama.cpp's only by the order of the float sums inside
// the dot product. The rules, read from ggml-cpu and checked byte for byte
// against the installed ggml's from_float (tests/test_cpu_kernels.py):
//
//   Q8_K (vec_dot_type of Q4_K, Q5_K, Q6_K; quantize_row_q8_K_ref, which x86
//   uses): per 256-block, max = the signed value of largest magnitude (first
//   one on ties), iscale = -127/max, q = min(127, nearest_int(iscale*x)) with
//   nearest_int's round-half-even magic add, d = 1/iscale (f32), bsums = sums
//   of each 16 quants. An all-zero block stores d = 0 and zero quants.
//
//   Q8_0 (vec_dot_type of Q8_0; the AVX/AVX2 quantize_row_q8_0 that x86
//   builds run): per 32-block, amax = max |x|, d = amax/127 stored as f16,
//   id = amax ? 127/amax : 0 (not 1/d), q = round-half-even(x*id). ggml's
//   portable reference differs (id = 1/d, roundf) on ties and on 1-ulp
//   differences of id; muser follows the code llama.cpp runs on x86.
//
// Quantization is O(t*K) once per call; it runs single-threaded in scalar
// code, which is both exact and far below the matvec's cost.
#include <cmath>
#include <cstring>

#include "cpu/kernels.h"
#include "errors.h"
#include "muser/q8_dot.h"
#include "quant_types.h"

namespace muser::cpu {

namespace {

// One activation block quantized by the shared bodies (muser/q8_dot.h), the
// same code the GPU kernels run; the CPU adds ggml's bsums.
void quantize_block_q8_k(const float* x, BlockQ8_K* y) {
  y->d = q8_quantize_block_q8_k(x, y->qs);
  for (int g = 0; g < kQK_K / 16; ++g) {
    int sum = 0;
    for (int i = 0; i < 16; ++i) sum += y->qs[16 * g + i];
    y->bsums[g] = (int16_t)sum;
  }
}

void quantize_block_q8_0(const float* x, BlockQ8_0* y) { y->d = q8_quantize_block_q8_0(x, y->qs); }

// The 32-element sub-block order of a Q4_K/Q5_K 64-byte nibble load.
constexpr int kNibbleOrder[8] = {0, 2, 1, 3, 4, 6, 5, 7};

}  // namespace

void quantize_acts_q8(uint32_t weight_type, const float* x, int64_t ldx, int64_t K, int t, ActsQ8* a) {
  if (!is_q8_type(weight_type))
    throw ArgValueError("acts='q8' needs weights of one of " + q8_type_list() + "; got " +
                        (type_traits(weight_type).name ? type_traits(weight_type).name : "an unknown type"));
  const bool kquant = weight_type != (uint32_t)GgmlType::Q8_0;
  const int block = kquant ? kQK_K : kQK8_0;
  if (K % block) throw ArgValueError("acts='q8': K=" + std::to_string(K) + " is not a multiple of " + std::to_string(block));
  a->weight_type = weight_type;
  a->cols = K;
  a->tokens = t;
  a->blocks = K / block;
  const size_t nq = (size_t)t * (size_t)K;
  a->qs.resize(nq);
  a->d.resize((size_t)t * (size_t)a->blocks);
  if (kquant) {
    a->q8k.resize((size_t)t * (size_t)a->blocks);
    a->sum32.resize(nq / 32);
    for (int k = 0; k < t; ++k) {
      for (int64_t b = 0; b < a->blocks; ++b) {
        BlockQ8_K& q = a->q8k[(size_t)(k * a->blocks + b)];
        quantize_block_q8_k(x + k * ldx + b * kQK_K, &q);
        memcpy(&a->qs[(size_t)(k * K + b * kQK_K)], q.qs, kQK_K);
        a->d[(size_t)(k * a->blocks + b)] = q.d;
        for (int j = 0; j < 8; ++j) a->sum32[(size_t)(k * K / 32 + b * 8 + j)] = (int16_t)(q.bsums[2 * j] + q.bsums[2 * j + 1]);
      }
    }
    if (weight_type == (uint32_t)GgmlType::Q6_K) {
      a->sum16.resize(nq / 16);
      for (size_t i = 0; i < a->q8k.size(); ++i) memcpy(&a->sum16[i * 16], a->q8k[i].bsums, 32);
    }
    if (weight_type == (uint32_t)GgmlType::Q4_K || weight_type == (uint32_t)GgmlType::Q5_K) {
      a->qs_nibble_order.resize(nq);
      for (size_t b = 0; b < nq / kQK_K; ++b)
        for (int s = 0; s < 8; ++s)
          memcpy(&a->qs_nibble_order[b * kQK_K + 32 * s], &a->qs[b * kQK_K + 32 * kNibbleOrder[s]], 32);
    }
  } else {
    a->q80.resize((size_t)t * (size_t)a->blocks);
    a->qs_biased.resize(nq);
    for (int k = 0; k < t; ++k) {
      for (int64_t b = 0; b < a->blocks; ++b) {
        BlockQ8_0& q = a->q80[(size_t)(k * a->blocks + b)];
        quantize_block_q8_0(x + k * ldx + b * kQK8_0, &q);
        memcpy(&a->qs[(size_t)(k * K + b * kQK8_0)], q.qs, kQK8_0);
        a->d[(size_t)(k * a->blocks + b)] = f16_to_f32(q.d);
      }
    }
    for (size_t i = 0; i < nq; ++i) a->qs_biased[i] = (uint8_t)(a->qs[i] + 128);
  }
}

}  // namespace muser::cpu
