// CPU kernels, one function per node kind. Scalar definitions live in
// kernels.cpp (norms, reference matvec, epilogue) and matvec_scalar.cpp (the
// canonical and q8 matvecs); the matvecs and the canonical epilogue have
// per-ISA twins (matvec_*.cpp, epilogue_*.cpp) chosen at run time by
// matvec_dispatch.cpp. Every twin computes the same bits as its scalar
// definition (tests/test_cpu_kernels.py), so the ISA changes speed only.
#pragma once
#include <cstdint>
#include <vector>

#include "cpu/isa.h"
#include "device.h"
#include "muser/logsumexp.h"
#include "quant_types.h"

namespace muser::cpu {

// ---- f32 activations: the canonical matvec (docs/numerics.md) ----

// y[tok*ldy + r] = dot(W row r, x[tok*ldx ...]) for r in [r0, r1), every
// token, in the canonical lane order. Threads: the caller's.
void matvec_canon(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                  int64_t ldy);
// The same on a named ISA path (tests run every twin); it must be available.
void matvec_canon_isa(Isa isa, const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1,
                      float* y, int64_t ldy);
// The scalar twin of every ISA path (also the definition the tests use).
void matvec_canon_scalar(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                         int64_t ldy);
// The reference oracle: dequantize the row, one f32 accumulator in index order.
void matvec_reference(const WeightView& w, const float* x, int64_t ldx, int t, int64_t r0, int64_t r1, float* y,
                      int64_t ldy);

// ---- int8 activations (acts="q8"): ggml's activation quantization ----

// The normed vectors quantized the way ggml's CPU quantizes src1 of a mul_mat
// for the weight type (its vec_dot_type): Q8_K blocks for Q4_K/Q5_K/Q6_K
// weights, Q8_0 blocks for Q8_0 weights. `q8k`/`q80` hold ggml's own bytes
// (the parity tests compare them with ggml's from_float); the planar arrays
// below are derived from them once per call so that every row's dot product
// reads them without re-deriving anything.
struct ActsQ8 {
  uint32_t weight_type = 0;  // ggml type id of the weights these activations meet
  int64_t cols = 0;          // K: elements per token
  int tokens = 0;
  int64_t blocks = 0;        // activation blocks per token: K/256 (Q8_K) or K/32 (Q8_0)
  std::vector<BlockQ8_K> q8k;  // [tokens][K/256] ggml's bytes (K-quant weights)
  std::vector<BlockQ8_0> q80;  // [tokens][K/32]  ggml's bytes (Q8_0 weights)
  std::vector<int8_t> qs;      // [tokens][K] the quants, element order
  // [tokens][K] Q4_K/Q5_K only: each 256-block's 32-element sub-blocks in the
  // order 0,2,1,3,4,6,5,7 — the order a 64-byte load of Q4_K/Q5_K nibbles
  // yields them (matvec_q8_avx512.cpp), so that kernel needs no shuffle.
  std::vector<int8_t> qs_nibble_order;
  std::vector<uint8_t> qs_biased;  // [tokens][K] Q8_0 only: qs + 128 as u8 (VNNI multiplies u8 by s8)
  std::vector<float> d;            // [tokens][blocks] the block scale the dot uses (Q8_0: its f16 widened)
  std::vector<int16_t> sum32;      // [tokens][K/32] K-quants: sum of each 32 quants (ggml bsums, paired)
  std::vector<int16_t> sum16;      // [tokens][K/16] Q6_K: sum of each 16 quants (ggml bsums)
};

// Quantize t rows of x [t x K] (row stride ldx) for weights of weight_type.
// Reuses out's buffers. K must be a whole number of the activation blocks.
void quantize_acts_q8(uint32_t weight_type, const float* x, int64_t ldx, int64_t K, int t, ActsQ8* out);

// y[tok*ldy + r] = the q8 dot product of W row r with token tok's quantized
// activations, for r in [r0, r1), in the fixed order of docs/numerics.md
// ("q8 activations"): exact integer block sums, then one f32 fma per block in
// block order. Threads: the caller's.
void matvec_q8(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy);
void matvec_q8_isa(Isa isa, const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy);
void matvec_q8_scalar(const WeightView& w, const ActsQ8& a, int64_t r0, int64_t r1, float* y, int64_t ldy);

// Rows a parallel chunk of each matvec should hold: a multiple of the rows
// the active ISA's kernel processes together, so chunk edges cost nothing.
int64_t matvec_row_grain();

// ---- norms over one row of length n (y may alias x) ----
void rms_norm_ggml(const float* x, int64_t n, float eps, float* y);
void rms_norm_canon(const float* x, int64_t n, float eps, float* y);
void layer_norm_ggml(const float* x, int64_t n, float eps, float* y);
void layer_norm_canon(const float* x, int64_t n, float eps, float* y);

// The canonical dot product of two f32 vectors (32 lanes, fmaf, tree).
float dot_canon(const float* a, const float* b, int64_t n);

// ---- element-wise epilogue kernels over n logits ----
void scale_inplace(float* y, int64_t n, float s);
void tanh_inplace(float* y, int64_t n);
void softcap_fused_inplace(float* y, int64_t n, float scale, float cap);
void softcap_reference_inplace(float* y, int64_t n, float cap, float inv_cap);
// The canonical epilogue (canon_epilogue of muser/canonical.h) on the active
// ISA; every twin is bit-equal to the scalar one.
void softcap_canon_inplace(float* y, int64_t n, float scale, float cap, float inv_cap);
void softcap_canon_isa(Isa isa, float* y, int64_t n, float scale, float cap, float inv_cap);
void softcap_canon_scalar(float* y, int64_t n, float scale, float cap, float inv_cap);

// ---- the consumer's reductions over host logits [t x V] (cpu/logsumexp.cpp) ----
// The canonical pair of one tile (lse_tile of muser/logsumexp.h, n <= kLseTile)
// on the active ISA; every twin (logsumexp_avx512/avx2/neon.cpp) is bit-equal
// to the scalar lse_tile.
LsePair lse_tile_cpu(const float* v, int n);
LsePair lse_tile_isa(Isa isa, const float* v, int n);
// y[i] = canon_exp_nonpos(x[i]) (muser/canonical.h) for i < n, on the active ISA
// (every twin bit-equal to the scalar function).
void exp_nonpos_cpu(const float* x, float* y, int64_t n);
void exp_nonpos_isa(Isa isa, const float* x, float* y, int64_t n);
// lse[r] = the canonical logsumexp of row r (muser/logsumexp.h).
void logsumexp_rows(const float* logits, int t, int64_t V, int threads, float* lse);
// logits[r, i] -= lse[r], in place: log-softmax.
void log_softmax_rows(float* logits, int t, int64_t V, const float* lse, int threads);
// How many of the n ids id0 .. id0 + n - 1 with logits row[0, n) rank ahead of
// token tok with logit target (ranks_ahead of muser/logsumexp.h), counted
// without a branch per logit.
int64_t count_ranked_ahead(const float* row, int64_t n, int64_t id0, float target, int64_t tok);
// For ids [t x m]: the logit, logit - lse and the 1-based rank (ties: the lower id
// first; NaN behind every number) of each chosen token.
void score_rows(const float* logits, int t, int64_t V, const int64_t* ids, int m, const float* lse, int threads,
                float* logprobs, float* values, int64_t* ranks);

}  // namespace muser::cpu
