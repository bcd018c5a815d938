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

namespace muser {

// A final norm over t rows of n elements: y[k * ld + i], x[k * ld + i].
struct NormKargs {
  int64_t n = 0;     // H: elements per row
  int64_t ld = 0;    // floats between rows (of x and y)
  float eps = 0;     // the norm's epsilon
  int32_t gamma = 0; // 1: multiply by gamma in the same pass (norm + gamma fused)
  int32_t t = 0;     // rows (tokens)
  int32_t pad_ = 0;  // explicit: the struct is 8-byte aligned everywhere
};
static_assert(sizeof(NormKargs) == 32, "NormKargs is 32 bytes on every backend");

// acts="q8" on Metal: where token k's quants, block scales and 32-element sums lie.
struct Q8MetalKargs {
  int64_t cols = 0;    // K: elements (and quant bytes) per token
  int64_t blocks = 0;  // activation blocks per token: K/256 (Q8_K) or K/32 (Q8_0)
  int64_t ldx = 0;     // floats between tokens' normed activations
  int32_t t = 0;       // tokens
  int32_t pad_ = 0;
};
static_assert(sizeof(Q8MetalKargs) == 32, "Q8MetalKargs is 32 bytes on every backend");

// One stage of the device top-k: each of `rows` rows has n candidates
// (logits or keys) taken in chunks of kTopkChunk; each chunk yields its k best.
struct TopkKargs {
  int64_t n = 0;       // candidates per row
  int64_t chunks = 0;  // chunks per row (keys written per row: chunks * k)
  int32_t k = 0;
  int32_t rows = 0;
};
static_assert(sizeof(TopkKargs) == 24, "TopkKargs is 24 bytes on every backend");


// The consumer's kernels over `rows` rows of V logits in tiles of kLseTile ids
// (Metal's vocab_reduce.metal and sample.metal).
struct TileRowsKargs {
  int64_t V = 0;
  int64_t tiles = 0;        // per row: ceil(V / kLseTile)
  int32_t rows = 0;
  int32_t m = 0;            // score: chosen ids a row; sample: top_k's candidates a row (0: no top_k)
  int32_t has_bias = 0;     // sample: a logit_bias buffer is bound
  int32_t has_allowed = 0;  // sample: an allowed mask is bound
};
static_assert(sizeof(TileRowsKargs) == 32, "TileRowsKargs is 32 bytes on every backend");
// A row's state between sample.metal's kernels: the largest z, the logits'
// logsumexp, the order cut (the key of the last kept token; 0: none).
struct SampleTileRow {
  float m = 0;
  float lse = 0;
  uint64_t cut = 0;
};
static_assert(sizeof(SampleTileRow) == 16, "SampleTileRow is 16 bytes on every backend");

// The Metal read-bandwidth probe (bandwidth.metal): n 32-bit words read by a
// grid of `stride` threads.
struct ReadKargs {
  int64_t n = 0;       // words in the buffer
  int64_t stride = 0;  // threads in the grid
};
static_assert(sizeof(ReadKargs) == 16, "ReadKargs is 16 bytes on every backend");

}  // namespace muser
