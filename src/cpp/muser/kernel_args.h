// The scalar arguments of each kernel, one struct per op, shared by the host
// launchers and the kernels of every backend (ggml-metal-impl.h's kargs):
// CUDA's argument structs (src/cuda/kernels.h) are one of these plus their
// device pointers; Metal passes them with setBytes and reads them as
// `constant MatvecKargs&`. No pointers here (their width and address space
// differ per backend); the size of each struct is asserted so the host and
// the shader compilers cannot disagree about the layout.
#pragma once
#include "platform.h"

namespace muser {

// The LM-head matvec, logits y[k * ldy + r] = W[r] . x[k * ldx ...] for r < rows, k < t.
struct MatvecKargs {
  int64_t rows = 0;       // V: weight rows, logits per token
  int64_t cols = 0;       // H: elements per row
  int64_t row_bytes = 0;  // bytes of one GGUF row
  int64_t ldx = 0;        // floats between tokens' x (f32 activations)
  int64_t ldy = 0;        // floats between tokens' logits
  uint32_t type = 0;      // ggml type id of W
  int32_t t = 0;          // tokens
};
static_assert(sizeof(MatvecKargs) == 48, "MatvecKargs is 48 bytes on every backend");

// acts="q8": where the quantized activations of the t tokens lie.
struct Q8ActsKargs {
  int64_t xq_pitch = 0;        // bytes between tokens' quants: cols rounded up to 256
  int64_t meta_per_token = 0;  // block records per token (matvec_q8.cuh)
};
static_assert(sizeof(Q8ActsKargs) == 16, "Q8ActsKargs is 16 bytes on every backend");

// An element-wise epilogue node over n logits, y[i] = f(y[i]).
struct EpilogueKargs {
  int64_t n = 0;       // logits
  float scale = 0;     // logit scale (scale nodes, softcaps)
  float cap = 0;       // soft cap; <= 0 disables it (canonical)
  float inv_cap = 0;   // 1/cap rounded to f32 once, on the host
  float pad_ = 0;      // explicit: the struct is 8-byte aligned everywhere
};
static_assert(sizeof(EpilogueKargs) == 24, "EpilogueKargs is 24 bytes on every backend");

// The most logits a device top-k ranks per row; a larger k ranks on the host.
MUSER_CONSTANT constexpr int kTopkMax = 1024;

}  // namespace muser
