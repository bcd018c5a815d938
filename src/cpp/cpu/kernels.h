// CPU kernels, one function per node kind. Scalar definitions live in
// kernels.cpp; the matvec has per-ISA twins (matvec_*.cpp) chosen at run time.
#pragma once
#include <cstdint>

#include "cpu/isa.h"
#include "device.h"

namespace muser::cpu {

// y[tok*ldy + r] = dot(W row r, x[tok*ldx ...]) for r in [r0, r1), every
// token, in the canonical lane order (docs/numerics.md). Threads: the caller's.
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

// Norms over one row of length n (y may alias x).
void rms_norm_ggml(const float* x, int64_t n, float eps, float* y);
void rms_norm_canon(const float* x, int64_t n, float eps, float* y);
void layer_norm_ggml(const float* x, int64_t n, float eps, float* y);
void layer_norm_canon(const float* x, int64_t n, float eps, float* y);

// The canonical dot product of two f32 vectors (32 lanes, fmaf, tree).
float dot_canon(const float* a, const float* b, int64_t n);

// Element-wise epilogue kernels over n logits.
void scale_inplace(float* y, int64_t n, float s);
void tanh_inplace(float* y, int64_t n);
void softcap_fused_inplace(float* y, int64_t n, float scale, float cap);
void softcap_reference_inplace(float* y, int64_t n, float cap, float inv_cap);
void softcap_canon_inplace(float* y, int64_t n, float scale, float cap, float inv_cap);

}  // namespace muser::cpu
